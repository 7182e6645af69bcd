"""The `biglm-blocks` variant: its attention rule in every backend, its objective's draws, and block decoding
whose append cache is exact for a model trained with it (prefix_attention="blocks")."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import DecodingConfig, StepInfo, generate_ids, left_pad
from biglm.generation.config import for_model
from biglm.model.attention import BACKENDS, AttentionMask, eager_attention
from biglm.objective import draw_masks, get_objective, make_generator

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]


def _hand_mask(L: int, p: int, q: int, blk: int) -> torch.Tensor:
    """The rule of DESIGN's biglm-blocks, written out one (query, key) pair at a time."""
    m = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for j in range(L):
            if i >= p:
                m[i, j] = True  # suffix: everything
            elif i < q:
                m[i, j] = j < q  # prompt: the prompt, both ways
            else:
                s = q + (i - q) // blk * blk  # the block [s, e) holding i
                m[i, j] = j < min(s + blk, p)
    return m


DRAWS = [(12, 5, 3), (12, 0, 4), (12, 12, 4), (11, 4, 8), (9, 2, 1)]  # (p, q, block); q = p is the paper's rule


def test_mask_rule_equals_hand_written():
    L = 16
    p, q, b = (torch.tensor(col) for col in zip(*DRAWS))
    mask = AttentionMask(batch=len(DRAWS), q_len=L, k_len=L, prefix_len=p, prompt_len=q, block_len=b)
    dense = mask.dense(torch.device("cpu"))[:, 0]
    for r, (pp, qq, bb) in enumerate(DRAWS):
        assert torch.equal(dense[r], _hand_mask(L, pp, qq, bb)), (pp, qq, bb)
    # q = p is exactly the paper's prefix rule
    paper = AttentionMask(batch=1, q_len=L, k_len=L, prefix_len=torch.tensor([12])).dense(torch.device("cpu"))[0, 0]
    assert torch.equal(dense[2], paper)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_applies_the_rule(backend):
    """Each backend's output under the rule equals eager attention under the hand-written mask (flex: forward,
    as on CPU it has no backward)."""
    torch.manual_seed(0)
    B, H, Hkv, L, D = len(DRAWS), 4, 2, 16, 8
    q_, k_, v_ = torch.randn(B, H, L, D), torch.randn(B, Hkv, L, D), torch.randn(B, Hkv, L, D)
    p, q, b = (torch.tensor(col) for col in zip(*DRAWS))
    rule = AttentionMask(batch=B, q_len=L, k_len=L, prefix_len=p, prompt_len=q, block_len=b)
    hand = AttentionMask(batch=B, q_len=L, k_len=L, prefix_len=p)
    hand._dense = torch.stack([_hand_mask(L, *d) for d in DRAWS])[:, None]
    with torch.no_grad():
        got = BACKENDS[backend](q_, k_, v_, rule)
        want = eager_attention(q_, k_, v_, hand)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_model_refuses_bad_block_arguments():
    model = BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny")).eval()
    ids = torch.randint(5, 512, (2, 10))
    with pytest.raises(ValueError, match="need prefix_len"):
        model(ids, prompt_len=2, block_len=4)
    with pytest.raises(ValueError, match="come together"):
        model(ids, prefix_len=6, prompt_len=2)
    with pytest.raises(ValueError, match="0 <= prompt_len <= prefix_len"):
        model(ids, prefix_len=6, prompt_len=7, block_len=4)


# --- the objective -------------------------------------------------------------------------------------------


def _draw(name: str, seed: int = 1, step: int = 3, rank: int = 0):
    gen = make_generator(seed=seed, step=step, rank=rank, device="cpu")
    return draw_masks(64, 128, get_objective(name), generator=gen, device="cpu")


def test_blocks_objective_keeps_the_paper_masks_and_draws_boundaries():
    paper, blocks = _draw("biglm"), _draw("biglm-blocks")
    # the block draws come after the paper's: same masked positions and splits for the same (seed, step, rank)
    assert torch.equal(paper.masked, blocks.masked) and torch.equal(paper.split, blocks.split)
    assert paper.prompt_len is None
    q, p = blocks.prompt_len, blocks.split
    assert bool(((q >= 0) & (q <= p)).all())
    assert set(blocks.block_len.tolist()) <= {8, 16, 32}
    assert 0 < int((q == p).sum()) < 64 and int((q < p).sum()) > 32  # some windows plain, most cut into blocks
    again = _draw("biglm-blocks")
    assert torch.equal(again.prompt_len, q) and torch.equal(again.block_len, blocks.block_len)
    other = _draw("biglm-blocks", rank=1)
    assert not torch.equal(other.prompt_len, q)


def test_blocks_objective_batch_carries_the_rule():
    from biglm.objective import apply_masks

    pattern = _draw("biglm-blocks")
    batch = apply_masks(torch.randint(5, 512, (64, 128)), pattern, mask_token_id=4)
    kw = batch.attention()
    assert set(kw) == {"prefix_len", "prompt_len", "block_len"} and torch.equal(kw["prompt_len"], pattern.prompt_len)
    assert set(apply_masks(torch.randint(5, 512, (64, 128)), _draw("biglm"), mask_token_id=4).attention()) == {"prefix_len"}
    with pytest.raises(ValueError, match="prefix_attention=True"):
        get_objective("biglm-no-attn", prefix_blocks=(8,))


# --- decoding ------------------------------------------------------------------------------------------------


def test_one_block_suffix_windows_are_block_decodings_condition():
    gen = lambda: make_generator(seed=1, step=3, rank=0, device="cpu")  # noqa: E731
    objective = get_objective("biglm-blocks", prefix_blocks=(2, 4, 8))
    base = draw_masks(256, 128, objective, generator=gen(), device="cpu")
    mixed = draw_masks(256, 128, objective.replace(suffix_block_prob=0.5), generator=gen(), device="cpu")
    one = mixed.split != base.split  # windows turned into "prompt + blocks + one block being written"
    assert 64 < int(one.sum()) < 192
    assert torch.equal(mixed.split[one], 128 - mixed.block_len[one])  # the suffix is exactly one block
    # drawn after everything else: the other windows keep every draw, the chosen keep their block length and ratios
    assert torch.equal(mixed.block_len, base.block_len) and torch.equal(mixed.ratios, base.ratios)
    for name in ("masked", "prompt_len"):
        assert torch.equal(getattr(mixed, name)[~one], getattr(base, name)[~one])
    # the chosen windows' masks follow the new split: round(β_Y·B) >= 1 suffix masks, round(β_X·p) prefix masks
    rows = one.nonzero().flatten()
    for r in rows.tolist():
        p, b = int(mixed.split[r]), int(mixed.block_len[r])
        beta_x, beta_y = mixed.ratios[r].tolist()
        assert int(mixed.masked[r, p:].sum()) == max(1, math.floor(beta_y * b + 0.5))
        assert int(mixed.masked[r, :p].sum()) == math.floor(beta_x * p + 0.5)
        assert 0 <= int(mixed.prompt_len[r]) <= p
    again = draw_masks(256, 128, objective.replace(suffix_block_prob=0.5), generator=gen(), device="cpu")
    assert torch.equal(again.masked, mixed.masked) and torch.equal(again.prompt_len, mixed.prompt_len)
    with pytest.raises(ValueError, match="needs prefix_blocks|prefix_blocks"):
        get_objective("biglm", suffix_block_prob=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        get_objective("biglm-blocks", suffix_block_prob=1.5)


def _blocks_model(seed: int = 0, **overrides) -> BiGLMForMaskedLM:
    torch.manual_seed(seed)
    config = BiGLMConfig.from_preset("tiny", initializer_range=0.2, prefix_attention="blocks",
                                     prefix_block_lengths=[4, 8], **overrides)
    return BiGLMForMaskedLM(config).eval()


def test_decoding_defaults_follow_the_model():
    blocks = _blocks_model()
    cfg = for_model(DecodingConfig(), blocks.config)
    assert (cfg.block_cache, cfg.block_length) == ("append", 8)
    paper = BiGLMConfig.from_preset("tiny")
    cfg = for_model(DecodingConfig(), paper)
    assert (cfg.block_cache, cfg.block_length) == ("exact", None)
    with pytest.warns(UserWarning, match="approximation"):
        for_model(DecodingConfig(block_length=4, block_cache="append"), paper)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for_model(DecodingConfig(block_length=4, block_cache="append"), blocks.config)  # exact here: no warning
    with pytest.raises(ValueError, match="prefix_block_lengths"):
        BiGLMConfig.from_preset("tiny", prefix_attention="blocks")


@pytest.mark.parametrize("suffix", ["block", "rest"])
@pytest.mark.parametrize("strategy, extra", [
    ("mask-predict", dict(steps=6)),
    ("confidence", dict(steps=6)),
    ("threshold", dict(threshold=0.07)),
])
def test_append_cache_equals_uncached_for_a_blocks_model(strategy, extra, suffix):
    """A blocks model's defaults (append cache, blocks of 4 here) on a left-padded batch of three prompt lengths
    and two candidate lengths: the cache and recomputing prompt + blocks under the blocks rule at every call give
    the same tokens at every step."""
    model = _blocks_model()
    ids, mask = left_pad(PROMPTS, pad_id=0)
    runs = {}
    for use_cache in (True, False):
        steps: list[StepInfo] = []
        out = generate_ids(model, ids, mask, max_new_tokens=12, strategy=strategy, lengths=[12, 9], block_length=4,
                           block_suffix=suffix, use_cache=use_cache, on_step=steps.append, **extra)
        runs[use_cache] = out, steps
    (a, sa), (b, sb) = runs[True], runs[False]
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)
    assert {s.block for s in sa} == {0, 1, 2} and len(sa) == len(sb)
    for x, y in zip(sa, sb):
        assert torch.equal(x.output_ids, y.output_ids) and torch.equal(x.committed, y.committed)
        torch.testing.assert_close(x.probs, y.probs, atol=1e-6, rtol=1e-4)


def test_finished_blocks_cache_equals_a_forward_under_the_rule():
    """Prompt, then two blocks appended one at a time: every layer's cached keys/values equal those of one
    from-scratch forward of prompt + blocks under the biglm-blocks mask (prompt_len = P, blocks of 4)."""
    model = _blocks_model()
    ids, mask = left_pad(PROMPTS, pad_id=0)
    P = ids.shape[1]
    blocks = torch.randint(5, 512, (3, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model.encode_prefix(ids, mask)
        for s in (0, 4):
            cache = model.encode_prefix(blocks[:, s:s + 4], past=cache)
        full = torch.cat((ids, blocks), dim=1)
        keys = torch.cat((mask, torch.ones_like(blocks)), dim=1)
        ref = model.model(full, prefix_len=P + 8, prompt_len=P, block_len=4, attention_mask=keys,
                          return_cache=True)["cache"]
        bidir = model.model(full, prefix_len=P + 8, attention_mask=keys, return_cache=True)["cache"]
    real = keys.bool()
    for layer in range(model.config.num_hidden_layers):
        for got, want in ((cache.keys[layer], ref.keys[layer]), (cache.values[layer], ref.values[layer])):
            torch.testing.assert_close(got.transpose(1, 2)[real], want.transpose(1, 2)[real], atol=1e-5, rtol=1e-5)
    # the paper's bidirectional prefix differs (so this test can tell the rules apart)
    last = model.config.num_hidden_layers - 1
    assert (cache.values[last].transpose(1, 2)[real] - bidir.values[last].transpose(1, 2)[real]).abs().max() > 1e-3


def test_pretrain_blocks_records_the_variant_and_decodes_exactly(synthetic_data, tmp_path):
    """`--objective biglm-blocks` trains (loss falls), the exported model says prefix_attention="blocks" with its
    block lengths, and its default decoding (append cache, blocks) equals the uncached blocks rule."""
    from transformers import AutoTokenizer

    from biglm.checkpoint import export_checkpoint
    from biglm.training import Trainer, TrainConfig
    from biglm.training.config import ModelArgs
    from biglm.training.distributed import DistInfo

    cfg = TrainConfig(name="b", out_dir=str(tmp_path / "run"), preset="tiny", model=ModelArgs(max_position_embeddings=64),
                      data={str(synthetic_data / "shards"): 1.0}, tokenizer=str(synthetic_data / "tok"), seq_len=64,
                      micro_batch=8, global_batch=8, steps=16, lr=1e-2, min_lr=1e-3, warmup_steps=1, log_every=1,
                      eval_every=16, eval_windows=8, save_every=16, objective=get_objective("biglm-blocks"))
    single = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    result = Trainer(cfg, info=single, echo=lambda s: None).train()
    losses = [loss for _, loss in result.losses]
    assert sum(losses[-3:]) < sum(losses[:3])
    out = export_checkpoint(tmp_path / "run", tmp_path / "hf")
    model = BiGLMForMaskedLM.from_pretrained(out).eval()
    assert model.config.prefix_attention == "blocks" and model.config.prefix_block_lengths == [8, 16, 32]
    tok = AutoTokenizer.from_pretrained(out)
    ids, mask = left_pad([tok("the cat")["input_ids"], tok("a dog and")["input_ids"]], pad_id=tok.pad_token_id)
    kw = dict(max_new_tokens=40, strategy="confidence", steps=20)
    cached = generate_ids(model, ids, mask, **kw)
    assert for_model(DecodingConfig(**kw), model.config).block_length == 8  # 2 tokens per call: the smallest trained
    assert torch.equal(cached.tokens, generate_ids(model, ids, mask, use_cache=False, **kw).tokens)


@pytest.mark.parametrize("suffix", ["block", "rest"])
@pytest.mark.parametrize("strategy, extra", [("confidence", dict(steps=6)), ("mask-predict", dict(steps=6)),
                                             ("threshold", dict(threshold=0.07))])
def test_folded_append_pass_gives_the_same_answer_in_fewer_calls(strategy, extra, suffix):
    """A finished block's append pass riding on the next block's first step: the same tokens and step
    probabilities as a separate pass, one forward call fewer per block after the first, fewer positions than
    the re-encoding cache."""
    model = _blocks_model()
    ids, mask = left_pad(PROMPTS, pad_id=0)
    kw = dict(max_new_tokens=12, strategy=strategy, lengths=[12, 9], block_length=4, block_suffix=suffix, **extra)
    runs = {}
    for fold in (True, False):
        steps: list[StepInfo] = []
        runs[fold] = generate_ids(model, ids, mask, fold_blocks=fold, on_step=steps.append, **kw), steps
    (a, sa), (b, sb) = runs[True], runs[False]
    assert torch.equal(a.tokens, b.tokens) and a.steps == b.steps
    for x, y in zip(sa, sb):
        assert torch.equal(x.output_ids, y.output_ids)
        torch.testing.assert_close(x.probs, y.probs, atol=1e-5, rtol=1e-4)
    # prompt pass + steps (+ 2 separate block passes unfolded; the last block is never encoded)
    assert a.forward_calls == 1 + a.steps and b.forward_calls == 1 + b.steps + 2
    assert a.positions == b.positions
    exact = generate_ids(model, ids, mask, block_cache="exact", **kw)
    assert exact.positions > a.positions


def test_cache_and_prefix_len_together_are_a_fused_append_pass():
    """model(block + window, prefix_cache, prefix_len = cache + block): the block's keys equal an append pass,
    the window's logits equal a step after that append pass."""
    model = _blocks_model()
    ids = torch.randint(5, 512, (2, 6), generator=torch.Generator().manual_seed(2))
    block = torch.randint(5, 512, (2, 4), generator=torch.Generator().manual_seed(3))
    window = torch.full((2, 4), model.config.mask_token_id)
    with torch.no_grad():
        cache = model.encode_prefix(ids)
        appended = model.encode_prefix(block, past=cache)
        want = model(window, prefix_cache=appended).logits
        out = model(torch.cat((block, window), 1), prefix_cache=cache, prefix_len=6 + 4, return_cache=True)
        with pytest.raises(ValueError, match="must be >= 6"):
            model(window, prefix_cache=cache, prefix_len=3)
    torch.testing.assert_close(out.logits[:, 4:], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["cache"].first(4).keys[1], appended.keys[1][:, :, 6:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shift", [False, True])
def test_engine_folds_blocks_and_equals_generate_ids(shift):
    """The server's engine on a blocks model (append cache by default): each request's answer equals its solo
    `generate_ids`, alone and sharing calls with others, and a held block rides on the next step (the inner model
    runs once per prompt and once per step, no separate block passes). Also for a model that predicts from the
    previous position (``shift_logits``: the folded block's cache keeps its hidden states)."""
    from biglm.generation.engine import DecodeEngine

    model = _blocks_model(shift_logits=shift)
    cfgs = [DecodingConfig(max_new_tokens=12, strategy="confidence", steps=6, block_length=4),
            DecodingConfig(max_new_tokens=10, strategy="mask-predict", steps=6, block_length=5, block_suffix="rest"),
            DecodingConfig(max_new_tokens=12, strategy="confidence", steps=6)]  # the model's default blocks (8)
    want = {f"r{i}": generate_ids(model, torch.tensor([PROMPTS[i]]), config=c).token_lists()[0]
            for i, c in enumerate(cfgs)}
    calls: list[int] = []
    hook = model.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        engine = DecodeEngine(model)
        engine.submit("r0", PROMPTS[0], cfgs[0])
        steps, got = 0, {}
        while engine.num_running or engine.num_waiting or steps == 0:
            if steps == 1:
                engine.submit("r1", PROMPTS[1], cfgs[1])
                engine.submit("r2", PROMPTS[2], cfgs[2])
            got.update({e.request_id: e.token_ids for e in engine.step() if e.finished})
            steps += 1
    finally:
        hook.remove()
    assert got == want
    assert len(calls) == 3 + steps  # three prompt encodings, one merged call per step


def test_default_block_is_the_smallest_trained_one_that_holds_a_calls_tokens():
    """A biglm-blocks model decodes in blocks of the smallest trained length >= ceil(N / steps) (fewer positions per
    call), the largest when none is that long; a block length given is kept; a paper model keeps one block."""
    from types import SimpleNamespace

    blocks = SimpleNamespace(prefix_attention="blocks", prefix_block_lengths=[1, 8, 16, 32])
    for steps, want in ((None, 1), (64, 1), (32, 8), (8, 8), (6, 16), (4, 16), (3, 32), (1, 32)):
        cfg = DecodingConfig(max_new_tokens=64, strategy="confidence", steps=steps)
        assert for_model(cfg, blocks).block_length == want, steps
    assert for_model(DecodingConfig(max_new_tokens=64, steps=32, block_length=4), blocks).block_length == 4
    without_1 = SimpleNamespace(prefix_attention="blocks", prefix_block_lengths=[8, 16, 32])
    assert for_model(DecodingConfig(max_new_tokens=64, strategy="confidence"), without_1).block_length == 8
    paper = SimpleNamespace(prefix_attention="bidirectional", prefix_block_lengths=[])
    assert for_model(DecodingConfig(max_new_tokens=64, steps=32), paper).block_length is None
