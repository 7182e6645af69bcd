"""Likelihood estimators (biglm.scoring.estimators): exactness, cache equivalence, grouping, bad input; ``append``
against one-token-per-call decoding (`generate_ids`)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import generate_ids, left_pad
from biglm.scoring import ESTIMATORS, rolling_requests, score_requests, score_rolling
from biglm.scoring.estimators import append_layout

MASK = 4


@pytest.fixture(scope="module")
def vocab8_model() -> BiGLMForMaskedLM:
    """A random tiny BiGLM over 8 token ids, so every continuation of length 2-3 can be enumerated."""
    torch.manual_seed(0)
    cfg = BiGLMConfig.from_preset("tiny", vocab_size=8, attn_backend="eager", mask_token_id=MASK,
                                  initializer_range=0.5)  # large init: peaked, position-dependent outputs
    return BiGLMForMaskedLM(cfg).eval()


@pytest.fixture(scope="module")
def model() -> BiGLMForMaskedLM:
    torch.manual_seed(1)
    cfg = BiGLMConfig.from_preset("tiny", vocab_size=64, attn_backend="eager", initializer_range=0.2)
    return BiGLMForMaskedLM(cfg).eval()


def _direct(model: BiGLMForMaskedLM, ctx: list[int], suffix: list[int]) -> torch.Tensor:
    """log-softmax at the suffix positions of one unpadded full-sequence call under the BiGLM mask, over the tokens a
    model writes (the mask token is never text)."""
    ids = torch.tensor([ctx + suffix])
    with torch.no_grad():
        logits = model(ids, prefix_len=len(ctx)).logits[0, len(ctx):].float()
    logits[:, model.config.mask_token_id] = float("-inf")
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("length", [2, 3])
def test_chain_is_a_distribution(vocab8_model, length):
    ctx = [1, 5, 6, 7, 2]
    conts = [[(i // 8 ** j) % 8 for j in range(length)] for i in range(8 ** length)]
    scores = score_requests(vocab8_model, [(ctx, c) for c in conts], estimator="chain", row_batch_size=512)
    total = sum(math.exp(ll) for ll, _ in scores)
    assert abs(total - 1.0) < 1e-4
    # exactly one continuation is what greedy left-to-right unmasking writes
    assert sum(g for _, g in scores) == 1


def test_pll_is_not_a_distribution(vocab8_model):
    """The check above can fail: PLL scores do not sum to 1 (they double-count consistent strings)."""
    ctx = [1, 5, 6, 7, 2]
    conts = [[a, b, c] for a in range(8) for b in range(8) for c in range(8)]
    scores = score_requests(vocab8_model, [(ctx, c) for c in conts], estimator="pll", row_batch_size=512)
    assert abs(sum(math.exp(ll) for ll, _ in scores) - 1.0) > 1e-3


def _requests() -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(3)
    reqs = []
    for n_ctx, conts in [(7, [3, 1, 4]), (2, [2, 5]), (11, [1]), (0, [3, 2])]:  # ragged, one empty context
        ctx = torch.randint(5, 64, (n_ctx,), generator=g).tolist()
        reqs += [(ctx, torch.randint(5, 64, (n,), generator=g).tolist()) for n in conts]
    return reqs


@pytest.mark.filterwarnings("ignore:the append scorer:UserWarning")  # tested in test_append_warns_once_...
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_cache_equals_full_sequence(model, estimator):
    reqs = _requests()
    cached = score_requests(model, reqs, estimator=estimator, batch_size=2, row_batch_size=5, mc_samples=4)
    full = score_requests(model, reqs, estimator=estimator, batch_size=3, row_batch_size=7, mc_samples=4,
                          use_cache=False)
    for (a, ga), (b, gb) in zip(cached, full):
        assert a == pytest.approx(b, abs=1e-4)
        assert ga == gb


def test_one_pass_chain_pll_match_manual(model):
    reqs = [r for r in _requests() if r[0]]  # the direct reference below needs a prefix
    one = score_requests(model, reqs, estimator="one-pass", batch_size=2)
    chain = score_requests(model, reqs, estimator="chain", batch_size=2)
    pll = score_requests(model, reqs, estimator="pll", batch_size=2)
    for (ctx, y), (o, og), (c, _), (p, _) in zip(reqs, one, chain, pll):
        n = len(y)
        lp = _direct(model, ctx, [MASK] * n)
        assert o == pytest.approx(sum(lp[t, y[t]].item() for t in range(n)), abs=1e-4)
        assert og == all(int(lp[t].argmax()) == y[t] for t in range(n))
        manual_chain = sum(_direct(model, ctx, y[:t] + [MASK] * (n - t))[t, y[t]].item() for t in range(n))
        assert c == pytest.approx(manual_chain, abs=1e-4)
        manual_pll = sum(_direct(model, ctx, y[:t] + [MASK] + y[t + 1:])[t, y[t]].item() for t in range(n))
        assert p == pytest.approx(manual_pll, abs=1e-4)


@pytest.mark.filterwarnings("ignore:the append scorer:UserWarning")  # tested in test_append_warns_once_...
def test_single_token_estimators_coincide(model):
    """With |Y| = 1 every estimator is log P(y | X) exactly (mc: k = 1 always, weight 1)."""
    reqs = [([9, 10, 11], [t]) for t in (12, 13, 40)]
    ref = score_requests(model, reqs, estimator="chain")
    for est in ESTIMATORS:
        for (a, _), (b, _) in zip(score_requests(model, reqs, estimator=est, mc_samples=3), ref):
            assert a == pytest.approx(b, abs=1e-5)


def test_mc_seeded_and_order_independent(model):
    reqs = _requests()
    a = score_requests(model, reqs, estimator="mc", mc_samples=6, seed=7)
    b = score_requests(model, reqs[::-1], estimator="mc", mc_samples=6, seed=7, batch_size=1)[::-1]
    c = score_requests(model, reqs, estimator="mc", mc_samples=6, seed=8)
    assert [x for x, _ in a] == pytest.approx([x for x, _ in b], abs=1e-5)
    assert any(abs(x - y) > 1e-6 for (x, _), (y, _) in zip(a, c))


def test_contexts_encoded_once_per_batch(model, monkeypatch):
    calls: list[int] = []
    real = model.encode_prefix

    def counting(ids, attention_mask=None):
        calls.append(ids.shape[0])
        return real(ids, attention_mask)

    monkeypatch.setattr(model, "encode_prefix", counting)
    ctxs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    reqs = [(c, [20 + k, 30 + k]) for c in ctxs for k in range(4)]  # 3 questions x 4 choices
    score_requests(model, reqs, estimator="chain", batch_size=1)
    assert calls == [1, 1, 1]  # one encode per question, shared by its 4 choices and their variants
    calls.clear()
    score_requests(model, reqs, estimator="pll", batch_size=8)
    assert calls == [3]


def test_bad_input(model):
    with pytest.raises(ValueError, match="empty continuation"):
        score_requests(model, [([5, 6], [])])
    with pytest.raises(ValueError, match="does not fit"):
        score_requests(model, [([5], [7] * 20)], max_length=16)
    with pytest.raises(ValueError, match="unknown estimator"):
        score_requests(model, [([5], [7])], estimator="beam")


def test_long_context_truncated_from_left(model):
    ctx, cont = list(range(5, 45)), [50, 51, 52]
    with pytest.warns(UserWarning, match="truncated from the left"):
        (long_ll, _), = score_requests(model, [(ctx, cont)], estimator="chain", max_length=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (short_ll, _), = score_requests(model, [(ctx[-13:], cont)], estimator="chain", max_length=16)
    assert long_ll == pytest.approx(short_ll, abs=1e-5)


def test_rolling_windows_cover_every_token_once():
    tokens = list(range(10, 47))
    pairs = rolling_requests(tokens, prefix_token=2, max_length=12, chunk=5)
    assert [t for _, c in pairs for t in c] == tokens
    assert pairs[0][0] == [2]
    for ctx, cont in pairs:
        assert len(ctx) + len(cont) <= 12
        nxt = tokens.index(cont[0])
        assert ctx == ([2] + tokens)[max(0, nxt + 1 - (12 - len(cont))):nxt + 1]  # the tokens right before


def test_score_rolling_sums_windows(model):
    text = list(range(5, 30))
    (total,) = score_rolling(model, [text], prefix_token=2, estimator="one-pass", chunk=4, max_length=16)
    pairs = rolling_requests(text, prefix_token=2, max_length=16, chunk=4)
    assert total == pytest.approx(sum(ll for ll, _ in score_requests(model, pairs, estimator="one-pass",
                                                                      max_length=16)), abs=1e-4)


def test_mixed_lengths_that_each_fit_score_in_one_batch(model):
    window = model.config.max_position_embeddings
    reqs = [([5] * (window - 2), [6, 7]), ([8, 9], [10] * (window - 4))]  # each fits the window exactly
    alone = score_requests(model, reqs, estimator="one-pass", batch_size=1)
    together = score_requests(model, reqs, estimator="one-pass", batch_size=2)
    for (a, _), (b, _) in zip(alone, together):
        assert a == pytest.approx(b, abs=1e-4)


def test_blocks_spans_chain_to_one_pass_and_matches_manual(model):
    """``blocks``: block length 1 is ``chain``, one block as long as the answer is ``one-pass``; in between, each block's
    slots are scored in one row with the earlier blocks visible (checked against direct full-sequence calls)."""
    reqs = [r for r in _requests() if r[0]]
    chain = score_requests(model, reqs, estimator="chain")
    one = score_requests(model, reqs, estimator="one-pass")
    assert [a for a, _ in score_requests(model, reqs, estimator="blocks", score_block=1)] == pytest.approx(
        [a for a, _ in chain], abs=1e-5)
    assert [a for a, _ in score_requests(model, reqs, estimator="blocks", score_block=8)] == pytest.approx(
        [a for a, _ in one], abs=1e-5)
    two = score_requests(model, reqs, estimator="blocks", score_block=2)
    for (ctx, y), (got, greedy) in zip(reqs, two):
        n, total, hits = len(y), 0.0, True
        for t0 in range(0, n, 2):
            lp = _direct(model, ctx, y[:t0] + [MASK] * (n - t0))
            for t in range(t0, min(n, t0 + 2)):
                total += lp[t, y[t]].item()
                hits &= int(lp[t].argmax()) == y[t]
        assert got == pytest.approx(total, abs=1e-4) and greedy == hits
    with pytest.raises(ValueError, match="score_block=0"):
        score_requests(model, reqs, estimator="blocks", score_block=0)


@pytest.mark.filterwarnings("ignore:the append scorer:UserWarning")  # tested in test_append_warns_once_...
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_batched_equals_one_request_at_a_time(model, estimator):
    """Batching across requests and answer choices (contexts grouped, one encode per context, rows of several
    requests in one pass) changes no score: each request scored alone gives the same log-likelihood (1e-4)."""
    reqs = _requests()
    reqs += [(reqs[0][0], [7, 8, 9, 10]), (reqs[0][0], [11])]  # more choices sharing the first context
    batched = score_requests(model, reqs, estimator=estimator, batch_size=16, row_batch_size=64, mc_samples=4,
                             score_block=2)
    for req, (ll, greedy) in zip(reqs, batched):
        [(alone, alone_greedy)] = score_requests(model, [req], estimator=estimator, batch_size=1, row_batch_size=1,
                                                 mc_samples=4, score_block=2)
        assert ll == pytest.approx(alone, abs=1e-4) and greedy == alone_greedy


def _blocks_model(*, shift: bool = False, seed: int = 0, **overrides) -> BiGLMForMaskedLM:
    """A random tiny `biglm-blocks` model trained (by its config) on blocks of 1, 4, 8, as tests/test_speculative.py
    builds; ``shift``: its shift_logits variant (a model converted from an AR checkpoint)."""
    torch.manual_seed(seed)
    overrides = {"prefix_block_lengths": [1, 4, 8], "attn_backend": "eager", "initializer_range": 0.2, **overrides}
    cfg = BiGLMConfig.from_preset("tiny", prefix_attention="blocks", shift_logits=shift, **overrides)
    return BiGLMForMaskedLM(cfg).eval()


def _converted_model(seed: int = 0) -> BiGLMForMaskedLM:
    """A random tiny model as `biglm convert` writes one: shift_logits on, the paper's bidirectional prefix (never
    adapted on blocks), so its one-token-per-call decoding re-encodes the prefix (the exact cache)."""
    torch.manual_seed(seed)
    cfg = BiGLMConfig.from_preset("tiny", shift_logits=True, attn_backend="eager", initializer_range=0.2)
    return BiGLMForMaskedLM(cfg).eval()


def _never_proposes(model: BiGLMForMaskedLM, ids: list[int]) -> None:
    """Give ``ids`` logit -inf in the head. Decoding renormalises over the tokens it may write (mask, pad and
    suppressed ids banned), every estimator over the whole vocabulary: with a head that never proposes the banned ids
    the two are the same number, so decoding's log-probs can be compared with the scorer's exactly."""
    banned = torch.tensor(sorted(set(ids)))
    model.lm_head.register_forward_hook(lambda _m, _i, out: out.index_fill(-1, banned, float("-inf")))


def test_append_layout_equals_hand_written():
    T, F = True, False
    # no shift, n = 3: tokens y0 y1, then checks k0 k1 k2 (slots 0, 1, 2)
    expected = torch.tensor([
        # y0 y1 k0 k1 k2
        [T, F, F, F, F],  # y0: itself (a block of one)
        [T, T, F, F, F],  # y1: y0, itself
        [F, F, T, F, F],  # k0: itself only (slot 0 after the context)
        [T, F, F, T, F],  # k1: y0, itself
        [T, T, F, F, T],  # k2: y0, y1, itself
    ])
    rule, slots = append_layout(tokens=2, length=5)
    assert torch.equal(rule, expected) and slots.tolist() == [0, 1, 0, 1, 2]
    rule, slots = append_layout(tokens=3, length=3)  # shift: tokens only, causal
    assert torch.equal(rule, torch.ones(3, 3, dtype=torch.bool).tril()) and slots.tolist() == [0, 1, 2]


@pytest.mark.parametrize("shift", [False, True])
def test_append_equals_one_token_per_call_decoding(shift):
    """Greedy confidence decoding at block_length=1 (the append cache) of a left-padded batch writes Y with
    avg_logprob; ``append`` scores (X, Y) as exactly N * avg_logprob and greedy, and no longer greedy once a token of
    Y changes. For the shift_logits variant too (decoding supports it at block_length=1)."""
    model = _blocks_model(shift=shift)
    c = model.config
    _never_proposes(model, [c.mask_token_id, c.pad_token_id, c.eos_token_id])
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, c.vocab_size, (n,), generator=g).tolist() for n in (7, 3, 11)]
    ids, mask = left_pad(prompts, pad_id=c.pad_token_id)
    N = 6
    out = generate_ids(model, ids, mask, max_new_tokens=N, strategy="confidence", block_length=1,
                       suppress_ids=[c.eos_token_id])
    answers = out.tokens.tolist()
    assert out.steps == N and out.lengths.tolist() == [N] * 3  # one token per call, all of them written
    scores = score_requests(model, list(zip(prompts, answers)), estimator="append", batch_size=2)
    for (ll, greedy), avg in zip(scores, out.avg_logprob.tolist()):
        assert ll == pytest.approx(avg * N, abs=1e-4) and greedy
    changed = [a[:2] + [a[2] + 1 if a[2] + 1 < c.vocab_size else 5] + a[3:] for a in answers]
    assert not any(g for _, g in score_requests(model, list(zip(prompts, changed)), estimator="append"))


@pytest.mark.parametrize("cache", ["append", "exact"])
@pytest.mark.parametrize("shift", [False, True])
def test_append_is_a_distribution(shift, cache):
    """exp(append) over all 8² continuations of a vocabulary-8 blocks model sums to 1, and exactly one is greedy;
    under either cache (the exact one: a converted or paper model's decoding)."""
    model = _blocks_model(shift=shift, vocab_size=8, mask_token_id=MASK, initializer_range=0.5)
    conts = [[a, b] for a in range(8) for b in range(8)]
    scores = score_requests(model, [([1, 5, 6, 7, 2], y) for y in conts], estimator="append", row_batch_size=512,
                            block_cache=cache)
    assert abs(sum(math.exp(ll) for ll, _ in scores) - 1.0) < 1e-4
    assert sum(g for _, g in scores) == 1


@pytest.mark.parametrize("make", [lambda: _blocks_model(shift=True, vocab_size=64), _converted_model])
def test_append_shift_cache_and_batching(make):
    """The shift_logits layouts (append cache: tokens only, logits from the row before; exact cache: the converted
    model's) through the ESTIMATORS-wide checks above: the cache equals the full sequence, and batching changes no
    score."""
    model = make()
    reqs = _requests() + [(_requests()[0][0], [7, 8, 9, 10])]
    cached = score_requests(model, reqs, estimator="append", batch_size=2, row_batch_size=5)
    full = score_requests(model, reqs, estimator="append", batch_size=3, row_batch_size=7, use_cache=False)
    for req, (a, ga), (b, gb) in zip(reqs, cached, full):
        [(alone, galone)] = score_requests(model, [req], estimator="append", batch_size=1, row_batch_size=1)
        assert a == pytest.approx(b, abs=1e-4) and a == pytest.approx(alone, abs=1e-4) and ga == gb == galone


def test_append_warns_once_on_a_model_never_trained_on_blocks_of_1(model):
    """``append`` under the append cache reads answer tokens as blocks of 1: a paper model (bidirectional prefix) asked
    for that cache, or a blocks model without 1 in its prefix_block_lengths (whose decoding runs it), gets one warning
    per call naming the adaptation that trains them; a model trained on them, a model converted from an AR checkpoint
    (shift_logits, trained on blocks of 1 or not), a paper model under its own exact cache, or another estimator, gets
    none."""
    reqs = _requests()
    without_1 = _blocks_model(prefix_block_lengths=[4, 8], vocab_size=64)
    for untrained, command, kw in [(model, "1,8,16,32", {"block_cache": "append"}), (without_1, "1,4,8", {})]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            score_requests(untrained, reqs, estimator="append", batch_size=1, row_batch_size=1, **kw)
        said = [str(w.message) for w in caught]
        assert len(said) == 1 and said[0].startswith("the append scorer reads every answer token as a block of 1")
        assert f"biglm pretrain blocks-adapt --init_from MODEL --objective.prefix_blocks {command}" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        score_requests(_blocks_model(vocab_size=64), reqs, estimator="append")
        score_requests(_blocks_model(shift=True, vocab_size=64), reqs, estimator="append")
        score_requests(_blocks_model(shift=True, vocab_size=64, prefix_block_lengths=[4, 8]), reqs, estimator="append")
        score_requests(_converted_model(), reqs, estimator="append", block_cache="append")
        score_requests(model, reqs, estimator="append")
        score_requests(model, reqs, estimator="chain")



@pytest.mark.parametrize("kind", ["converted", "blocks", "blocks-shift"])
def test_auto_scorer_scores_what_one_token_per_call_decoding_writes(kind):
    """``scorer=auto`` on a model it picks ``append`` for (a converted model; a blocks model trained on blocks of 1):
    the score of a greedy one-token-per-call answer (confidence, block_length=1, each model's default cache: exact for
    the converted model, append for the blocks ones) is the sum of the log-probs decoding assigned to the tokens it
    wrote, and greedy; under the other cache it is not (the test can tell them apart). Float32, a left-padded batch."""
    from biglm.scoring.estimators import append_cache, default_estimator

    model = _converted_model() if kind == "converted" else _blocks_model(shift=kind == "blocks-shift")
    c = model.config
    _never_proposes(model, [c.mask_token_id, c.pad_token_id, c.eos_token_id])
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(5, c.vocab_size, (n,), generator=g).tolist() for n in (7, 3, 11)]
    N = 6
    out = generate_ids(model, *left_pad(prompts, pad_id=c.pad_token_id), max_new_tokens=N, strategy="confidence",
                       block_length=1, suppress_ids=[c.eos_token_id])
    assert out.steps == N and out.lengths.tolist() == [N] * 3
    auto = default_estimator(c)
    scores = score_requests(model, list(zip(prompts, out.tokens.tolist())), estimator=auto, batch_size=2)
    for (ll, greedy), written in zip(scores, out.token_logprobs.sum(1).tolist()):
        assert ll == pytest.approx(written, abs=1e-4) and greedy
    assert auto == "append" and append_cache(c) == ("exact" if kind == "converted" else "append")
    other = "append" if kind == "converted" else "exact"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        elsewhere = score_requests(model, list(zip(prompts, out.tokens.tolist())), estimator=auto, block_cache=other)
    assert all(abs(ll - w) > 1e-2 for (ll, _), w in zip(elsewhere, out.token_logprobs.sum(1).tolist()))
