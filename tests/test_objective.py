"""The BiGLM objective: exact counts, statistics, determinism, variants, loss, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from biglm.objective import OBJECTIVES, ObjectiveConfig, get_objective, mask_batch, masked_lm_loss

MASK = 4


def _windows(b=256, l=200, seed=0):
    return torch.randint(5, 1000, (b, l), generator=torch.Generator().manual_seed(seed))


def _round(x):
    return torch.floor(x + 0.5).long()


def test_biglm_exact_counts_and_ranges():
    obj = get_objective("biglm")
    w = _windows()
    B, L = w.shape
    b = mask_batch(w, obj, mask_token_id=MASK, seed=0, step=3, rank=1)
    p = b.split
    assert torch.equal(b.prefix_len, p)
    assert int(p.min()) >= round(0.2 * L) and int(p.max()) <= round(0.8 * L)
    masked = b.labels != -100
    pos = torch.arange(L)[None]
    n_x = (masked & (pos < p[:, None])).sum(1)
    n_y = (masked & (pos >= p[:, None])).sum(1)
    beta_x, beta_y = b.ratios[:, 0], b.ratios[:, 1]
    assert torch.equal(n_y, _round(beta_y * (L - p)).clamp(min=1))
    assert torch.equal(n_x, _round(beta_x * p))
    torch.testing.assert_close(beta_x, 0.3 - 0.2 * beta_y)
    # masked positions carry the mask token and their label; the rest is untouched
    assert torch.equal(b.input_ids[masked], torch.full_like(b.input_ids[masked], MASK))
    assert torch.equal(b.labels[masked], w[masked])
    assert torch.equal(b.input_ids[~masked], w[~masked])
    assert int(b.normalizer) == int(masked.sum())


def test_biglm_statistics_over_many_draws():
    obj = get_objective("biglm")
    L = 100
    w = _windows(4096, L)
    b = mask_batch(w, obj, mask_token_id=MASK, seed=7)
    p, masked = b.split, b.labels != -100
    pos = torch.arange(L)[None]
    frac_x = (masked & (pos < p[:, None])).sum(1) / p
    frac_y = (masked & (pos >= p[:, None])).sum(1) / (L - p)
    # E[β_Y] = 0.5, E[β_X] = 0.3 - 0.2·0.5 = 0.2; p uniform on {20..80}: mean 50, both ends reached
    assert abs(frac_y.mean().item() - 0.5) < 0.02
    assert abs(frac_x.mean().item() - 0.2) < 0.01
    assert frac_x.min() >= 0.1 - 1 / 20 and frac_x.max() <= 0.3 + 1 / 20
    assert abs(p.float().mean().item() - 50) < 1.0
    assert int(p.min()) == 20 and int(p.max()) == 80
    # uniform positions: every suffix-relative position is masked about equally often
    per_pos = masked.float().mean(0)
    assert per_pos[85:].std() < 0.05


def test_ablation_knobs_change_ratios():
    obj = get_objective("biglm", alpha=0.4, suffix_ratio=(0.3, 0.7), prefix_lambda=(0.5, 0.4))
    assert obj.prefix_ratio_range == pytest.approx((0.22, 0.38))
    b = mask_batch(_windows(2048, 100), obj, mask_token_id=MASK, seed=1)
    assert int(b.split.min()) == 40 and int(b.split.max()) == 60
    assert 0.3 <= b.ratios[:, 1].min() and b.ratios[:, 1].max() <= 0.7
    torch.testing.assert_close(b.ratios[:, 0], 0.5 - 0.4 * b.ratios[:, 1])


def test_determinism_and_independence():
    obj = get_objective("biglm")
    w = _windows(8, 64)
    a = mask_batch(w, obj, mask_token_id=MASK, seed=5, step=10, rank=0)
    again = mask_batch(w, obj, mask_token_id=MASK, seed=5, step=10, rank=0)
    assert torch.equal(a.input_ids, again.input_ids) and torch.equal(a.split, again.split)
    for kw in (dict(seed=6, step=10, rank=0), dict(seed=5, step=11, rank=0), dict(seed=5, step=10, rank=1)):
        other = mask_batch(w, obj, mask_token_id=MASK, **kw)
        assert not torch.equal(a.labels, other.labels), kw


def test_no_attn_variant_has_same_masks_full_attention():
    w = _windows(16, 64)
    a = mask_batch(w, get_objective("biglm"), mask_token_id=MASK, seed=3)
    b = mask_batch(w, get_objective("biglm-no-attn"), mask_token_id=MASK, seed=3)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert a.prefix_len is not None and b.prefix_len is None and torch.equal(a.split, b.split)


def test_mlm_variant():
    w = _windows(64, 200)
    b = mask_batch(w, get_objective("mlm"), mask_token_id=MASK, seed=0)
    assert b.prefix_len is None and b.split is None
    assert torch.equal((b.labels != -100).sum(1), torch.full((64,), 30))  # round(0.15·200)
    c = mask_batch(w, get_objective("mlm", corruption=(0.8, 0.1, 0.1)), mask_token_id=MASK, vocab_size=1000, seed=0)
    masked = c.labels != -100
    share_mask = (c.input_ids[masked] == MASK).float().mean().item()
    share_keep = (c.input_ids[masked] == w[masked]).float().mean().item()
    assert abs(share_mask - 0.8) < 0.05 and abs(share_keep - 0.1) < 0.04


def test_diffusion_variant():
    w = _windows(2048, 100)
    b = mask_batch(w, get_objective("diffusion"), mask_token_id=MASK, seed=0)
    t = b.ratios[:, 0]
    frac = (b.labels != -100).float().mean(1)
    assert abs((frac - t).mean().item()) < 0.01
    torch.testing.assert_close(b.loss_weight[:, 0], 1 / t)
    assert float(b.normalizer) == 2048 * 100


def test_loss_is_mean_ce_over_masked_tokens():
    torch.manual_seed(0)
    w = _windows(4, 32)
    b = mask_batch(w, get_objective("biglm"), mask_token_id=MASK, seed=0)
    logits = torch.randn(4, 32, 1000)
    masked = b.labels != -100
    expected = torch.nn.functional.cross_entropy(logits[masked], w[masked])
    torch.testing.assert_close(masked_lm_loss(logits, b), expected)
    torch.testing.assert_close(masked_lm_loss(logits[masked], b), expected)  # sparse logits
    torch.testing.assert_close(masked_lm_loss(logits, b, normalizer=b.normalizer * 2), expected / 2)
    d = mask_batch(w, get_objective("diffusion"), mask_token_id=MASK, seed=0)
    dm = d.labels != -100
    ce = torch.nn.functional.cross_entropy(logits[dm], w[dm], reduction="none")
    torch.testing.assert_close(masked_lm_loss(logits, d), (ce * d.loss_weight[dm]).sum() / (4 * 32))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(alpha=0.5), "alpha=0.5 must lie in"),
        (dict(alpha=0.0), "alpha=0.0 must lie in"),
        (dict(prefix_lambda=(1.2, 0.1)), "outside \\[0, 1\\]"),
        (dict(prefix_lambda=(0.1, 0.5)), "outside \\[0, 1\\]"),
        (dict(suffix_ratio=(0.8, 0.2)), "need 0 <= lo <= hi <= 1"),
        (dict(suffix_ratio=(0.0, 1.5)), "need 0 <= lo <= hi <= 1"),
        (dict(decompose=False), "prefix_attention=True needs decompose=True"),
    ],
)
def test_bad_objective_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ObjectiveConfig(**kwargs)


def test_named_variants_and_unknown():
    assert set(OBJECTIVES) == {"biglm", "biglm-no-attn", "mlm", "diffusion", "biglm-blocks"}
    with pytest.raises(KeyError, match="unknown objective"):
        get_objective("t5")
    with pytest.raises(ValueError, match="too short"):
        mask_batch(_windows(1, 1), get_objective("biglm"), mask_token_id=MASK, seed=0)


def test_masking_stays_on_device_dtype():
    w = _windows(2, 16)
    b = mask_batch(w, get_objective("biglm"), mask_token_id=MASK, seed=0)
    assert b.input_ids.device == w.device and b.input_ids.dtype == w.dtype
    assert b.normalizer.dim() == 0 and b.normalizer.device == w.device
    assert math.isfinite(float(b.ratios.sum()))
