"""Prepacked oneDNN linear layers for CPU inference (`biglm.model.packed`): the same model, the same answers."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import generate_ids, left_pad
from biglm.model.packed import FusedPackedLinear, PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")
# oneDNN packs bfloat16 weights only on CPUs with bf16 support (AVX512-BF16/AMX); elsewhere `pack_linears` leaves the
# model as it is, as documented, and the bf16 cases have nothing to compare
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU's oneDNN has no bfloat16 kernels"))]


def _model(seed: int = 0, **overrides) -> BiGLMForMaskedLM:
    torch.manual_seed(seed)
    config = BiGLMConfig.from_preset("tiny", initializer_range=0.2, prefix_attention="blocks",
                                     prefix_block_lengths=[1, 4, 8], **overrides)
    return BiGLMForMaskedLM(config).eval()


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_model_gives_the_same_logits_and_answers(dtype):
    plain = _model().to(dtype)
    packed = _model().to(dtype)
    linears = sum(type(m) is nn.Linear for m in packed.modules())
    assert pack_linears(packed) == linears > 0
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert packed.lm_head.weight is packed.model.embed_tokens.weight  # the tie is kept
    assert packed.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(5, plain.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        a, b = plain(ids, prefix_len=8).logits.float(), packed(ids, prefix_len=8).logits.float()
    torch.testing.assert_close(b, a, atol=1e-4 if dtype == torch.float32 else 0.05, rtol=1e-4 if dtype == torch.float32 else 0.02)
    prompts, mask = left_pad([[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]], pad_id=plain.config.pad_token_id)
    for kw in (dict(strategy="confidence", block_length=1), dict(strategy="confidence", steps=8, block_length=4)):
        want = generate_ids(plain, prompts, mask, max_new_tokens=16, **kw).token_lists()
        assert generate_ids(packed, prompts, mask, max_new_tokens=16, **kw).token_lists() == want


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_projections_give_the_unfused_packed_logits_bitwise(dtype):
    """q/k/v and gate/up as one prepacked product each (`FusedPackedLinear`): the same logits bit for bit as the parts
    one by one, for 1 to 33 rows and a prompt's encoding; the parts alone (a long prompt's encoding by layers) still
    answer, through `F.linear`."""
    fused, parts = _model().to(dtype), _model().to(dtype)
    pack_linears(fused)
    for parent in list(parts.modules()):  # the same prepacked parts, called one by one
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child))
    layer = fused.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, FusedPackedLinear) and isinstance(layer.mlp.gate_up_proj,
                                                                                  FusedPackedLinear)
    assert layer.self_attn.q_proj.packed is None and fused.state_dict().keys() == _model().state_dict().keys()
    g = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for rows in (1, 2, 7, 33):
            ids = torch.randint(5, fused.config.vocab_size, (rows, 9), generator=g)
            assert torch.equal(fused(ids, prefix_len=4).logits, parts(ids, prefix_len=4).logits)
        x = torch.randn(3, fused.config.hidden_size, generator=g).to(dtype)
        attn, ref = layer.self_attn, parts.model.layers[0].self_attn
        assert torch.equal(attn.qkv_proj(x), torch.cat([ref.q_proj(x), ref.k_proj(x), ref.v_proj(x)], -1))
        torch.testing.assert_close(attn.q_proj(x), ref.q_proj(x))  # a part alone: `F.linear`, the same product


def test_a_packed_model_still_trains_through_the_plain_path():
    """With gradients on, `PackedLinear` runs `F.linear` on the live weight, so a gradient reaches it (the packed copy
    would be stale after a step)."""
    model = _model()
    pack_linears(model)
    model.train()
    ids = torch.randint(5, model.config.vocab_size, (2, 12))
    labels = ids.clone()
    model(ids, prefix_len=4, labels=labels).loss.backward()
    assert all(m.weight.grad is not None for m in model.modules() if isinstance(m, PackedLinear))


def test_load_model_packs_only_when_asked(checkpoint):
    from biglm.checkpoint import load_model

    assert not any(isinstance(m, PackedLinear) for m in load_model(checkpoint)[0].modules())
    assert any(isinstance(m, PackedLinear) for m in load_model(checkpoint, pack=True)[0].modules())


@pytest.mark.parametrize("kernels", [True, False])
def test_bfloat16_weights_compute_in_float32_where_the_cpu_has_no_bfloat16_kernels(checkpoint, tmp_path, monkeypatch,
                                                                                   kernels):
    """A bfloat16 export loaded for inference (``pack``) on a CPU without oneDNN's bfloat16 kernels computes in float32,
    packed, with a warning; with the kernels, or with ``dtype`` asked for, it stays bfloat16."""
    import biglm.model.packed as packed
    from biglm.checkpoint import load_model

    model, tokenizer = load_model(checkpoint, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    monkeypatch.setattr(packed, "reduced_precision_kernels", lambda dtype: kernels or dtype == torch.float32)
    if kernels:
        held = load_model(tmp_path / "bf16", pack=True)[0]
        assert next(held.parameters()).dtype == torch.bfloat16
    else:
        with pytest.warns(UserWarning, match="no torch.bfloat16 matrix kernels.*compute in float32"):
            held = load_model(tmp_path / "bf16", pack=True)[0]
        assert next(held.parameters()).dtype == torch.float32
        assert any(isinstance(m, PackedLinear) and m.packed is not None for m in held.modules())
        from biglm.model.cpu_kernels import bf16_linear_kernel

        # the weights, bfloat16 values, read as bfloat16 by biglm's kernel where it runs (`cpu_kernels`)
        products = [m.packed for m in held.modules() if getattr(m, "packed", None) is not None]
        assert all(p.bf16 for p in products) == (bf16_linear_kernel() is not None)
    asked = load_model(tmp_path / "bf16", pack=True, dtype=torch.bfloat16)[0]
    assert next(asked.parameters()).dtype == torch.bfloat16
    assert next(load_model(tmp_path / "bf16")[0].parameters()).dtype == torch.bfloat16  # (no pack: the weights as held)


def test_reduced_precision_kernels_answers_for_float32_always():
    from biglm.model.packed import reduced_precision_kernels

    assert reduced_precision_kernels(torch.float32)
    assert reduced_precision_kernels(torch.bfloat16) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_a_mask_adapters_low_rank_products_stay_unpacked_and_the_logits_hold():
    """`pack_linears` prepacks every linear layer but a mask adapter's low-rank ones (oneDNN's per-call cost outweighs
    packing at rank 32: docs/LOG.md), and a call with mask tokens (the adapters on) gives the unpacked model's logits
    (float32, 1e-4)."""
    from biglm.model.modeling import BiGLMMaskAdapter

    plain, packed = _model(mask_adapter_rank=4), _model(mask_adapter_rank=4)
    for m in list(plain.modules()) + list(packed.modules()):  # adapters that change something (``up`` starts at 0)
        if isinstance(m, BiGLMMaskAdapter):
            torch.nn.init.normal_(m.up.weight, std=0.2, generator=torch.Generator().manual_seed(3))
    adapters = sum(type(c) is nn.Linear for m in packed.modules() if isinstance(m, BiGLMMaskAdapter)
                   for c in m.children())
    linears = sum(type(m) is nn.Linear for m in packed.modules())
    assert adapters == 4 * 2 * packed.config.num_hidden_layers
    assert pack_linears(packed) == linears - adapters
    assert all(type(c) is nn.Linear for m in packed.modules() if isinstance(m, BiGLMMaskAdapter) for c in m.children())
    ids = torch.randint(5, plain.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    ids[:, 8:] = plain.config.mask_token_id
    with torch.inference_mode():
        a, b = plain(ids, prefix_len=8).logits, packed(ids, prefix_len=8).logits
    assert not torch.equal(a, _model()(ids, prefix_len=8).logits)  # (the adapters act)
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
