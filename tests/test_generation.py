"""Generation by iterative unmasking: exact prefix cache, strategies' schedules, sampling, text API, CLI,
and the one `DecodingConfig` that carries every option from each entry point to the decoder."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import biglm  # noqa: F401  (registers the Auto classes)
from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import (
    AnswerDenoiser,
    DecodingConfig,
    StepInfo,
    candidate_lengths,
    cut_at_stop,
    filter_logits,
    generate,
    generate_from_ids,
    generate_ids,
    left_pad,
    mask_predict_count,
    sample,
)
from biglm.generation.cli import main as cli_main
from biglm.generation.decoding import Commit

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]  # different lengths: left padding matters


def _model(seed: int = 0, **overrides) -> BiGLMForMaskedLM:
    # a larger init std than training's 0.02 gives peaked, varied predictions (p ~ 0.04-0.14 at random
    # init rather than ~1/V everywhere), closer to a trained model and free of near-ties in confidence
    torch.manual_seed(seed)
    overrides = {"initializer_range": 0.2, **overrides}
    return BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", **overrides)).eval()


@pytest.fixture(scope="module")
def model() -> BiGLMForMaskedLM:
    return _model()


def _batch():
    return left_pad(PROMPTS, pad_id=0)


def _record(steps: list[StepInfo]):
    return steps.append


# --- exact prefix cache --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_denoiser_cache_matches_full_forward(backend):
    model = _model(attn_backend=backend)
    ids, mask = _batch()
    rows = torch.tensor([0, 0, 1, 2])  # a length beam repeats prompt rows
    answer = torch.randint(5, 512, (4, 10), generator=torch.Generator().manual_seed(3))
    answer[:, ::3] = model.config.mask_token_id
    valid = torch.ones(4, 10, dtype=torch.bool)
    valid[1, 7:] = False  # a shorter candidate: its tail is padding
    where = (answer == model.config.mask_token_id) & valid
    with torch.no_grad():
        kw = dict(prompt_ids=ids, prompt_mask=mask, rows=rows, valid=valid)
        cached = AnswerDenoiser(model, use_cache=True, **kw)(answer, where)
        full = AnswerDenoiser(model, use_cache=False, **kw)(answer, where)
    assert cached.shape == (int(where.sum()), 512)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("strategy, extra", [
    ("mask-predict", dict(steps=5)),
    ("confidence", dict(steps=6)),
    ("confidence", dict(steps=6, block_length=4)),
    ("threshold", dict(threshold=0.07)),
])
def test_cache_equals_no_cache(model, strategy, extra):
    ids, mask = _batch()
    runs = {}
    for use_cache in (True, False):
        steps: list[StepInfo] = []
        out = generate_ids(model, ids, mask, max_new_tokens=12, strategy=strategy, lengths=[12, 9],
                           use_cache=use_cache, on_step=_record(steps), **extra)
        runs[use_cache] = out, steps
    (a, sa), (b, sb) = runs[True], runs[False]
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)
    assert len(sa) == len(sb) > 1
    for x, y in zip(sa, sb):  # every step: same inputs, same choices, close probabilities
        assert torch.equal(x.output_ids, y.output_ids) and torch.equal(x.committed, y.committed)
        torch.testing.assert_close(x.probs, y.probs, atol=1e-6, rtol=1e-4)


# --- block decoding with a growing prefix cache -------------------------------------------------------------


def _denoiser_after_two_blocks(model, *, use_cache: bool, block_cache: str):
    """A denoiser over the padded batch (a length beam repeats rows) with blocks 0-3 and 4-7 committed."""
    ids, mask = _batch()
    rows = torch.tensor([0, 0, 1, 2])
    answer = torch.randint(5, 512, (4, 12), generator=torch.Generator().manual_seed(3))
    valid = torch.ones(4, 12, dtype=torch.bool)
    valid[1, 10:] = False  # a shorter candidate: its tail is padding
    den = AnswerDenoiser(model, prompt_ids=ids, prompt_mask=mask, rows=rows, valid=valid, use_cache=use_cache,
                         block_length=4, block_cache=block_cache)
    for s0 in (0, 4):
        den.extend(Commit(s0, s0 + 4, answer[:, s0:s0 + 4]))
    answer[:, 8:] = model.config.mask_token_id
    where = (answer == model.config.mask_token_id) & valid
    return den, (ids, mask, rows, answer, valid, where)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_exact_growing_cache_is_the_grown_prefix_recomputed(backend):
    """After two committed blocks, the cached window pass and the uncached one both equal a plain forward of
    prompt + answer with the BiGLM split at the window (prefix = prompt + both blocks), written out here; the
    block-causal ``append`` cache does not (it is an approximation, and this test can tell)."""
    model = _model(attn_backend=backend)
    with torch.no_grad():
        cached, (ids, mask, rows, answer, valid, where) = _denoiser_after_two_blocks(model, use_cache=True,
                                                                                     block_cache="exact")
        full = torch.cat((ids[rows], answer), dim=1)
        keys = torch.cat((mask[rows], valid.long()), dim=1)
        at = torch.cat((torch.zeros_like(ids[rows], dtype=torch.bool), where), dim=1)
        want = model(full, prefix_len=ids.shape[1] + 8, attention_mask=keys, logits_positions=at).logits
        got = cached(answer, where, start=8, end=12)
        uncached, _ = _denoiser_after_two_blocks(model, use_cache=False, block_cache="exact")
        append, _ = _denoiser_after_two_blocks(model, use_cache=True, block_cache="append")
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(uncached(answer, where, start=8, end=12), want, atol=1e-5, rtol=1e-5)
        assert (append(answer, where, start=8, end=12) - want).abs().max() > 1e-2


@pytest.mark.parametrize("block_cache", ["exact", "append"])
@pytest.mark.parametrize("suffix", ["block", "rest"])
@pytest.mark.parametrize("strategy, extra", [
    ("mask-predict", dict(steps=6)),  # two Mask-Predict iterations per block
    ("confidence", dict(steps=6)),
    ("threshold", dict(threshold=0.07)),
])
def test_growing_cache_equals_uncached_blocks(model, strategy, extra, suffix, block_cache):
    """Block decoding of a batch of three prompt lengths (left-padded) and two candidate lengths: the growing
    cache and recomputing prompt + committed blocks at every call give the same tokens at every step."""
    ids, mask = _batch()
    runs = {}
    for use_cache in (True, False):
        steps: list[StepInfo] = []
        out = generate_ids(model, ids, mask, max_new_tokens=12, strategy=strategy, lengths=[12, 9], block_length=4,
                           block_suffix=suffix, block_cache=block_cache, use_cache=use_cache,
                           on_step=_record(steps), **extra)
        runs[use_cache] = out, steps
    (a, sa), (b, sb) = runs[True], runs[False]
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)
    assert {s.block for s in sa} == {0, 1, 2} and len(sa) == len(sb)
    for x, y in zip(sa, sb):  # every step: same inputs, same choices, close probabilities
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.output_ids, y.output_ids)
        assert torch.equal(x.committed, y.committed)
        torch.testing.assert_close(x.probs, y.probs, atol=1e-6, rtol=1e-4)


def test_block_suffix_decides_what_a_step_runs(model, monkeypatch):
    """``block``: a step runs the current block only; ``rest``: the block and every mask after it."""
    ids, mask = _batch()
    call = AnswerDenoiser.__call__
    for suffix, widths in (("block", [4, 4, 4]), ("rest", [12, 8, 4])):
        seen = []

        def spy(self, answer, positions, *, start=0, end=None, _seen=seen, **kw):
            _seen.append((start, end))
            return call(self, answer, positions, start=start, end=end, **kw)

        monkeypatch.setattr(AnswerDenoiser, "__call__", spy)
        generate_ids(model, ids, mask, max_new_tokens=12, strategy="confidence", steps=3, block_length=4,
                     block_suffix=suffix)
        assert [start for start, _ in seen] == [0, 4, 8], suffix
        assert [end - start for start, end in seen] == widths, suffix


@pytest.mark.parametrize("strategy", ["mask-predict", "confidence"])
def test_padded_batch_equals_one_prompt_at_a_time(model, strategy):
    ids, mask = _batch()
    batch = generate_ids(model, ids, mask, max_new_tokens=10, steps=4, strategy=strategy)
    for i, p in enumerate(PROMPTS):
        alone = generate_ids(model, torch.tensor([p]), max_new_tokens=10, steps=4, strategy=strategy)
        assert torch.equal(batch.tokens[i], alone.tokens[0]), i


# --- Mask-Predict ----------------------------------------------------------------------------------------


def test_mask_predict_remasks_lowest_probability_tokens(model):
    N, T = 13, 6
    ids, mask = _batch()
    steps: list[StepInfo] = []
    # sampling at temperature 1 from a random model changes tokens every iteration: no early stop
    out = generate_ids(model, ids, mask, max_new_tokens=N, steps=T, temperature=1.0, seed=1, on_step=_record(steps))
    assert out.steps == T == len(steps)
    counts = [s.num_masked.tolist() for s in steps]
    assert counts == [[mask_predict_count(length=N, step=t, steps=T)] * 3 for t in range(T)]
    assert counts[0] == [N] * 3 and counts[1] == [math.floor(N * (T - 1) / T)] * 3
    probs = torch.zeros(3, N)
    prev = None
    for t, s in enumerate(steps):
        if t > 0:
            # re-masked = the n_t lowest probabilities so far; the others keep token and probability
            lowest = probs.argsort(dim=1, stable=True)[:, : s.num_masked[0]]
            assert torch.equal(s.predicted, torch.zeros_like(s.predicted).scatter(1, lowest, True))
            assert torch.equal(s.output_ids[~s.predicted], prev[~s.predicted])
            assert bool((s.input_ids[s.predicted] == model.config.mask_token_id).all())
        probs = torch.where(s.predicted, s.probs, probs)
        prev = s.output_ids
    assert bool((prev != model.config.mask_token_id).all())


def test_early_stop_opt_in_ends_converged_rows(model):
    ids, mask = _batch()
    steps: list[StepInfo] = []
    out = generate_ids(model, ids, mask, max_new_tokens=12, steps=30, early_stop=True, on_step=_record(steps))
    assert out.steps == len(steps) < 30  # greedy on a fixed model converges
    for prev, cur in zip(steps, steps[1:]):
        unchanged = ~(cur.output_ids != prev.output_ids).any(1)
        # a row whose iteration changed nothing is never re-masked again
        later = [s.num_masked for s in steps[steps.index(cur) + 1:]]
        for r in unchanged.nonzero().flatten().tolist():
            assert all(int(n[r]) == 0 for n in later)
    full = generate_ids(model, ids, mask, max_new_tokens=12, steps=30)  # the default: no early stop
    assert full.steps == 28  # every iteration with n_t > 0 runs (N < T: n_t = 0 from t = 28 on)


def _count_calls(model):
    """(list that grows by one per model forward, hook handle); `encode_prefix` is not a forward."""
    calls: list[int] = []
    return calls, model.register_forward_hook(lambda *_: calls.append(1))


def _first_unchanged_step(steps: list[StepInfo]) -> int:
    """1-based step after which no row's answer changed (the point where early stop would end a 1-row batch)."""
    return next(cur.step for prev, cur in zip(steps, steps[1:]) if not bool((cur.output_ids != prev.output_ids).any()))


def test_default_mask_predict_makes_exactly_T_model_calls(saved):
    """The published algorithm: T iterations = T model calls, even once the predictions stop changing."""
    _, model, tok = saved
    N, T = 16, 10
    calls, hook = _count_calls(model)
    steps: list[StepInfo] = []
    try:
        generate(model, tok, ["a dog"], max_new_tokens=N, steps=T, on_step=_record(steps))
    finally:
        hook.remove()
    assert _first_unchanged_step(steps) < T  # greedy converged early: an early stop would have ended here
    assert len(calls) == len(steps) == T
    assert [s.num_masked.tolist() for s in steps] == [[mask_predict_count(length=N, step=t, steps=T)] for t in range(T)]
    assert DecodingConfig().early_stop is False and DecodingConfig().num_steps(N) == 10


def test_early_stop_is_opt_in_and_makes_fewer_calls(saved):
    _, model, tok = saved
    N, T = 16, 10
    full_steps: list[StepInfo] = []
    full = generate(model, tok, ["a dog"], config=DecodingConfig(max_new_tokens=N, steps=T), on_step=_record(full_steps))
    stop_at = _first_unchanged_step(full_steps)
    calls, hook = _count_calls(model)
    try:
        config = DecodingConfig(max_new_tokens=N, steps=T, early_stop=True)
        early = generate(model, tok, ["a dog"], config=config)
        same = generate(model, tok, ["a dog"], max_new_tokens=N, steps=T, early_stop=True)  # keyword form
    finally:
        hook.remove()
    # the row ends right after the first iteration that changed nothing: the same trajectory up to there
    assert len(calls) == 2 * stop_at and stop_at < T
    assert early == same and len(full) == len(early) == 1


def test_decoding_config_validates_once_with_clear_messages():
    c = DecodingConfig(temperature=1, stop="\n")  # an int temperature is a float; a lone stop string a list
    assert c.temperature == 1.0 and isinstance(c.temperature, float) and c.stop == ["\n"]
    assert DecodingConfig(strategy="confidence").num_steps(24) == 24 and DecodingConfig(steps=3).num_steps(24) == 3
    bad = [
        (dict(steps=0), "steps=0 must be >= 1"),
        (dict(steps=-2), "steps=-2 must be >= 1"),
        (dict(max_new_tokens=0), "max_new_tokens=0 must be >= 1"),
        (dict(top_p=0.0), r"top_p=0.0 must lie in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p=1.5 must lie in \(0, 1\]"),
        (dict(top_k=0), "top_k=0 must be >= 1"),
        (dict(temperature=-0.5), "temperature=-0.5 must be"),
        (dict(temperature=float("nan")), "temperature=nan must be a finite number"),
        (dict(strategy="beam"), "strategy='beam': choose one of mask-predict, confidence, threshold"),
        (dict(length_beam=0), "length_beam=0 must be >= 1"),
        (dict(block_suffix="all"), "block_suffix='all': choose one of block, rest"),
        (dict(length_head="yes"), "length_head='yes' must be true or false"),
        (dict(strategy="confidence", block_length=0), "block_length=0 must be >= 1"),
        (dict(threshold=1.5), r"threshold=1.5 must lie in \[0, 1\]"),
        (dict(strategy="confidence", early_stop=True), "early_stop applies to mask-predict only"),
        (dict(steps="5"), "steps='5' must be an integer"),
        (dict(early_stop="yes"), "early_stop='yes' must be true or false"),
        (dict(stop=[1]), r"stop=\[1\] must be a list of strings"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            DecodingConfig(**kwargs)
    with pytest.raises(ValueError, match="unknown decoding option.* num_beams: choose from max_new_tokens, steps"):
        DecodingConfig().override(num_beams=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.steps = 3  # validated once, then fixed
    assert c.override(steps=3).steps == 3 and c.steps is None


def test_generate_from_ids_strips_moved_whitespace_before_stop(saved):
    _, model, tok = saved
    config = DecodingConfig(max_new_tokens=8, steps=3)
    ids = [tok("the cat sat on", add_special_tokens=False)["input_ids"]]
    (plain,) = generate_from_ids(model, tok, ids, config=config)
    lead = plain[:2]  # stands for whitespace a caller moved out of the prompt
    (moved,) = generate_from_ids(model, tok, ids, config=config.override(stop=[lead]), moved_whitespace=[lead])
    assert moved == cut_at_stop(plain[2:], [lead]) and moved != ""  # not cut to nothing at the moved text
    (kept,) = generate_from_ids(model, tok, ids, config=config, moved_whitespace=["zebra"])
    assert kept == plain  # an answer that does not start with the moved text is left as it is


def test_length_beam_picks_most_likely_candidate(model):
    ids, mask = _batch()
    lengths = [12, 9, 6]
    beam = generate_ids(model, ids, mask, max_new_tokens=12, steps=4, lengths=lengths)
    singles = [generate_ids(model, ids, mask, max_new_tokens=n, steps=4) for n in lengths]
    scores = torch.stack([s.avg_logprob for s in singles], dim=1)  # (B, K)
    best = scores.argmax(1)
    assert beam.candidate_length.tolist() == [lengths[k] for k in best.tolist()]
    for i, k in enumerate(best.tolist()):
        n = lengths[k]
        assert torch.equal(beam.tokens[i, :n], singles[k].tokens[i])
    torch.testing.assert_close(beam.avg_logprob, scores.max(1).values)
    assert candidate_lengths(max_new_tokens=12, length_beam=3) == [12, 9, 6]
    assert candidate_lengths(max_new_tokens=1, length_beam=4) == [1]


# --- confidence-ordered commit and the threshold rule ------------------------------------------------------


def test_confidence_commits_k_per_step_and_never_remasks(model):
    N, T = 16, 4
    ids, mask = _batch()
    steps: list[StepInfo] = []
    out = generate_ids(model, ids, mask, max_new_tokens=N, steps=T, strategy="confidence", on_step=_record(steps))
    assert out.steps == T
    mask_id = model.config.mask_token_id
    for s in steps:
        assert s.committed.sum(1).tolist() == [N // T] * 3
        # committed = the k most confident predictions
        conf = torch.where(s.predicted, s.probs, -1.0)
        kth = conf.topk(N // T, dim=1).values[:, -1:]
        assert bool((conf[s.committed] >= kth.expand_as(conf)[s.committed]).all())
        # never re-mask: whatever was written stays
        written = s.input_ids != mask_id
        assert torch.equal(s.output_ids[written], s.input_ids[written])
        assert bool((s.output_ids[~written & ~s.committed] == mask_id).all())
    assert bool((steps[-1].output_ids != mask_id).all())


def test_confidence_blocks_fill_left_to_right(model):
    ids, mask = _batch()
    steps: list[StepInfo] = []
    generate_ids(model, ids, mask, max_new_tokens=12, steps=6, strategy="confidence", block_length=4,
                 on_step=_record(steps))
    assert [s.block for s in steps] == [0, 0, 1, 1, 2, 2]
    for s in steps:
        block = torch.zeros(12, dtype=torch.bool)
        block[4 * s.block: 4 * s.block + 4] = True
        assert not bool(s.committed[:, ~block].any())  # only the current block is written
        assert s.committed.sum(1).tolist() == [2, 2, 2]
        assert bool((s.output_ids[:, : 4 * s.block] != model.config.mask_token_id).all())


@pytest.mark.parametrize("tau", [0.0, 0.07, 1.0])
def test_threshold_rule(model, tau):
    N = 10
    ids, mask = _batch()
    steps: list[StepInfo] = []
    out = generate_ids(model, ids, mask, max_new_tokens=N, strategy="threshold", threshold=tau, on_step=_record(steps))
    left = N
    for s in steps:
        above = ((s.probs > tau) & s.predicted).sum(1)
        c = s.committed.sum(1)
        active = s.num_masked > 0
        assert bool((c[active] >= 1).all())  # at least one per step
        assert bool((c >= above).all())  # every prediction above τ is committed
        assert bool(((s.probs > tau) & s.predicted & ~s.committed).sum() == 0)
        left = s.num_masked - c
    assert bool((left == 0).all())
    if tau == 0.0:
        assert out.steps == 1  # everything is above 0: one step
    if tau == 1.0:
        assert out.steps == N and all(s.committed.sum(1).tolist() == [1, 1, 1] for s in steps)


# --- sampling --------------------------------------------------------------------------------------------


def test_sample_greedy_topk_topp():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    tok, p = sample(logits)
    assert tok.tolist() == [1, 0]
    torch.testing.assert_close(p, logits.softmax(-1)[[0, 1], [1, 0]])
    assert torch.isinf(filter_logits(logits, top_k=2)[0, [0, 2]]).all()
    kept = torch.isfinite(filter_logits(logits[:1], top_p=0.7))[0].tolist()
    assert kept == [False, True, False, True]  # p = .64, .24, ...: the crossing token is kept
    g = torch.Generator().manual_seed(0)
    draws = {int(sample(logits[:1], temperature=1.0, top_k=2, generator=g)[0]) for _ in range(50)}
    assert draws == {1, 3}


def test_seeded_sampling_is_deterministic(model):
    ids, mask = _batch()
    kw = dict(max_new_tokens=10, steps=4, temperature=1.0)
    a = generate_ids(model, ids, mask, seed=7, **kw).tokens
    b = generate_ids(model, ids, mask, seed=7, **kw).tokens
    c = generate_ids(model, ids, mask, seed=8, **kw).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("strategy", ["mask-predict", "confidence"])
def test_top_k_1_equals_greedy(model, strategy):
    ids, mask = _batch()
    greedy = generate_ids(model, ids, mask, max_new_tokens=10, steps=4, strategy=strategy)
    topk1 = generate_ids(model, ids, mask, max_new_tokens=10, steps=4, strategy=strategy, temperature=1.5, top_k=1, seed=3)
    assert torch.equal(greedy.tokens, topk1.tokens)


# --- answers: length, EOS, stop strings ---------------------------------------------------------------------


def test_max_new_tokens_and_eos_trimming():
    model = _model()
    model.config.eos_token_id = None
    ids, mask = _batch()
    kw = dict(max_new_tokens=14, steps=5, temperature=1.0, seed=2)
    full = generate_ids(model, ids, mask, **kw)
    assert full.tokens.shape == (3, 14) and full.lengths.tolist() == [14] * 3
    # make a token that first appears mid-answer the EOS: the same answer must be cut right there
    row = full.tokens[0].tolist()
    k = next(i for i in range(3, 14) if row[i] not in row[:i])
    model.config.eos_token_id = row[k]
    cut = generate_ids(model, ids, mask, **kw)
    assert torch.equal(cut.tokens, full.tokens)
    assert cut.lengths[0] == k and cut.token_lists()[0] == row[:k]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny BiGLM and a word-level tokenizer saved as a Hugging Face directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-biglm")
    text = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog ran far away"] * 20
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(text, trainers.WordLevelTrainer(special_tokens=["<pad>", "<s>", "</s>", "<unk>", "<mask>"]))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>", mask_token="<mask>",
                                     model_input_names=["input_ids", "attention_mask"])
    hf_tok.save_pretrained(path)
    model = _model(vocab_size=len(hf_tok), mask_token_id=hf_tok.mask_token_id, eos_token_id=None)
    model.save_pretrained(path)
    return path, model, hf_tok


def test_generate_text_and_stop_strings(saved):
    _, model, tok = saved
    prompts = ["the cat sat on", "a dog"]
    kw = dict(max_new_tokens=12, steps=4, temperature=1.0, seed=0)
    texts = generate(model, tok, prompts, **kw)
    assert len(texts) == 2
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) <= 12 for t in texts)
    # a word that first appears after the start of some answer: cutting there must shorten that answer
    stop = next(w for t in texts for i, w in enumerate(t.split()) if i > 0 and w not in t.split()[:i])
    cut = generate(model, tok, prompts, stop=[stop, "zebra"], **kw)
    assert cut == [t[: t.find(stop)] if stop in t else t for t in texts]
    assert sum(map(len, cut)) < sum(map(len, texts))
    assert cut_at_stop("a b c b", ["b", "c"]) == "a " and cut_at_stop("abc", []) == "abc"
    assert generate(model, tok, prompts, use_cache=False, **kw) == texts


def test_empty_prompt_in_a_batch(saved):
    # an empty prompt is a fully padded row: it must decode exactly as when it runs alone (no prefix at all)
    _, model, tok = saved
    kw = dict(max_new_tokens=8, steps=3)
    batch = generate(model, tok, ["", "the cat sat on"], **kw)
    assert batch == generate(model, tok, ["", "the cat sat on"], use_cache=False, **kw)
    assert batch[0] == generate(model, tok, [""], **kw)[0]
    assert batch[1] == generate(model, tok, ["the cat sat on"], **kw)[0]


def test_bad_inputs(saved):
    _, model, tok = saved
    with pytest.raises(ValueError, match="prompts is empty"):
        generate(model, tok, [])
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        generate(model, tok, ["the cat"], max_new_tokens=0)
    with pytest.raises(ValueError, match="steps=0"):
        generate(model, tok, ["the cat"], steps=0)
    with pytest.raises(ValueError, match="strategy='beam'"):
        generate(model, tok, ["the cat"], strategy="beam")
    with pytest.raises(ValueError, match="length_head=True but BiGLMForMaskedLM has no length head"):
        generate(model, tok, ["the cat"], length_head=True)
    with pytest.raises(TypeError, match="list of strings"):
        generate(model, tok, "the cat")
    with pytest.warns(UserWarning, match="keeping its last 6"):
        out = generate(model, tok, ["the cat sat on the mat " * 50], max_new_tokens=250, steps=2)
    assert len(out) == 1
    no_mask = _model(vocab_size=len(tok), mask_token_id=None)
    with pytest.raises(ValueError, match="no mask_token_id"):
        generate(no_mask, tok, ["the cat"])


# --- CLI ---------------------------------------------------------------------------------------------------


def test_cli_end_to_end(saved, capsys):
    path, model, tok = saved
    rc = cli_main([str(path), "--prompt", "the cat sat", "--prompt", "a dog", "--max-new-tokens", "6",
                   "--steps", "3", "--show-steps"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "### prompt 1: the cat sat" in out and "### prompt 2: a dog" in out
    assert "[step 1/3] prompt 1, 6 masked: _ _ _ _ _ _" in out
    expected = generate(model, tok, ["the cat sat", "a dog"], max_new_tokens=6, steps=3)
    assert out.splitlines()[-3:] == [expected[0], "### prompt 2: a dog", expected[1]]
    rc = cli_main([str(path), "--prompt", "the cat", "--strategy", "confidence", "--max-new-tokens", "4",
                   "--show-steps", "--use_cache", "false"])
    out = capsys.readouterr().out
    assert rc == 0 and "[step 4/4] prompt 1, 1 masked:" in out and "_" in out.splitlines()[0]


def test_cli_errors(tmp_path, saved, capsys):
    rc = cli_main([str(tmp_path / "nope"), "--prompt", "hi"])
    assert rc == 2 and "no checkpoint at" in capsys.readouterr().err
    rc = cli_main([str(saved[0]), "--prompt", "hi", "--steps", "0"])
    assert rc == 2 and "steps=0" in capsys.readouterr().err
    # options are checked before the model is loaded: a bad value wins over a missing checkpoint
    rc = cli_main([str(tmp_path / "nope"), "--prompt", "hi", "--strategy", "confidence", "--early-stop"])
    assert rc == 2 and "early_stop applies to mask-predict only" in capsys.readouterr().err


def test_a_refused_saved_setting_says_it_is_the_models_and_how_to_clear_it(saved, tmp_path, capsys):
    """`biglm generate FT_RUN --strategy confidence --draft_length 3` on a model saved with steps=10: the user gave no
    --steps, so the refusal says the value is the model's saved setting (where it was read) and the flag that clears
    it; with that flag the command runs. A value the user gave is refused as the user's own, as before."""
    _, _, tok = saved
    model = _model(vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=None, prefix_attention="blocks",
                   prefix_block_lengths=[1, 4])
    model.config.task_specific_params = {"seq2seq": {"steps": 10, "max_new_tokens": 6}}
    tuned = tmp_path / "tuned"
    model.save_pretrained(tuned)
    tok.save_pretrained(tuned)
    argv = [str(tuned), "--prompt", "the cat", "--strategy", "confidence", "--draft_length", "3", "--device", "cpu"]
    capsys.readouterr()
    assert cli_main(argv) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("biglm generate:")]
    assert len(said) == 1 and "steps=10 does not apply" in said[0]
    assert (f"steps=10 is not an option given here but the model's saved decoding setting "
            f"(task_specific_params.seq2seq in {tuned / 'config.json'}): clear it with --steps none." in said[0])
    assert cli_main([*argv, "--steps", "none"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # the header and the answer
    assert cli_main([*argv, "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "steps=4 does not apply" in err and "saved" not in err
    # the one function every entry point builds its settings with: each value's origin, the refusal's field
    from biglm.generation.config import DecodingError, model_decoding

    with pytest.raises(DecodingError, match="model's saved decoding setting") as e:
        model_decoding(model.config, {"strategy": "confidence", "draft_length": 3}, clear="--decoding.{name} {value}")
    assert e.value.option == "steps" and str(e.value).endswith("clear it with --decoding.steps none.")
    model.config.task_specific_params = {"seq2seq": {"length_beam": 3}}  # a saved value that has a default to give
    with pytest.raises(DecodingError, match=r"length_beam=3 is not an option given here.*override it with "
                                            r"--length_beam 1\.$"):
        model_decoding(model.config, {"strategy": "confidence", "draft_length": 3})
    model.config.task_specific_params = {"seq2seq": {"steps": 10, "max_new_tokens": 6}}
    cleared = model_decoding(model.config, {"strategy": "confidence", "draft_length": 3, "steps": None})
    assert cleared.steps is None and cleared.max_new_tokens == 6  # the other saved value stays


def _spy_decoder(monkeypatch) -> list[DecodingConfig]:
    """Record the `DecodingConfig` that reaches `decoding.generate_ids` (through `api`), then decode as usual."""
    import biglm.generation.api as api

    seen: list[DecodingConfig] = []
    real = api.generate_ids

    def spy(*args, config, **kwargs):
        seen.append(config)
        return real(*args, config=config, **kwargs)

    monkeypatch.setattr(api, "generate_ids", spy)
    return seen


def test_cli_early_stop_flag_reaches_decoder(saved, capsys, monkeypatch):
    path, model, tok = saved
    path = str(path)
    trajectory: list[StepInfo] = []
    generate(model, tok, ["a dog"], max_new_tokens=16, steps=10, on_step=_record(trajectory))
    seen = _spy_decoder(monkeypatch)
    argv = [path, "--prompt", "a dog", "--max-new-tokens", "16", "--steps", "10", "--show-steps"]
    assert cli_main(argv) == 0
    full = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[step ")]
    assert cli_main(argv + ["--early-stop"]) == 0
    early = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[step ")]
    assert [c.early_stop for c in seen] == [False, True]
    assert len(full) == 10 and full[-1].startswith("[step 10/10]")  # the published algorithm: T model calls
    assert len(early) == _first_unchanged_step(trajectory) < 10  # the row stops once it converged


def test_cli_options_are_the_decoding_config_fields(saved, capsys, monkeypatch):
    """Every `DecodingConfig` field is a flag with its docstring as help, and each one reaches the decoder."""
    from biglm.config import field_docs

    assert cli_main(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(DecodingConfig):
        assert f"--{f.name} " in help_text, f.name
        assert field_docs(DecodingConfig)[f.name][:40] in help_text, f.name
    seen = _spy_decoder(monkeypatch)
    expected = DecodingConfig(max_new_tokens=7, steps=3, strategy="confidence", temperature=0.5, top_k=4, top_p=0.9,
                              seed=11, length_beam=2, block_length=4, threshold=0.3, stop=["x", "y"], use_cache=False,
                              block_suffix="rest", block_cache="append", length_head=False, ignore_eos=True)
    argv = [str(saved[0]), "--prompt", "a dog", "--max-new-tokens", "7", "--steps", "3", "--strategy", "confidence",
            "--temperature", "0.5", "--top-k", "4", "--top_p", "0.9", "--seed", "11", "--length-beam", "2",
            "--block-length", "4", "--threshold", "0.3", "--stop", "x", "--stop", "y", "--use_cache", "false",
            "--block-suffix", "rest", "--block-cache", "append", "--length-head", "false", "--ignore_eos"]
    assert cli_main(argv) == 0
    assert seen == [expected]
    assert {f.name for f in dataclasses.fields(DecodingConfig)} == {
        "max_new_tokens", "steps", "strategy", "temperature", "top_k", "top_p", "seed", "length_beam", "block_length",
        "threshold", "stop", "use_cache", "early_stop", "block_suffix", "block_cache", "length_head", "ignore_eos",
        "draft_length", "draft_ngram", "draft_model", "draft_fill", "draft_measure", "draft_branches", "draft_accept"}


# --- the strategy registry ----------------------------------------------------------------------------------


def test_every_registered_strategy_is_reachable_from_the_cli_and_an_unknown_one_is_refused(saved, capsys,
                                                                                             monkeypatch):
    """The registry is the one list of strategies: a new one is one class and one `register` call, after which
    `--help` lists it, `--strategy NAME` reaches the decoder and `DecodingConfig` accepts it; an unknown name is
    refused (config and CLI alike) with the registered names."""
    from biglm.generation import STRATEGIES, DecodingStrategy, register

    assert list(STRATEGIES)[:3] == ["mask-predict", "confidence", "threshold"]

    class OneShot(DecodingStrategy):  # every slot in one call, every prediction kept (the base class's commit)
        name = "one-shot"

        @classmethod
        def default_steps(cls, answer_length: int) -> int:
            return 1

    register(OneShot)
    try:
        names = list(STRATEGIES)
        assert names[-1] == "one-shot"
        assert cli_main(["--help"]) == 0
        assert f"--strategy ({{{'|'.join(names)}}}" in capsys.readouterr().out
        seen = _spy_decoder(monkeypatch)
        for name in names:
            assert cli_main([str(saved[0]), "--prompt", "a dog", "--strategy", name, "--max-new-tokens", "4"]) == 0
            assert seen[-1].strategy == name and DecodingConfig(strategy=name).strategy == name
        capsys.readouterr()
        ids, mask = _batch()
        out = generate_ids(_model(), ids, mask, max_new_tokens=6, strategy="one-shot")
        assert out.steps == 1 and out.forward_calls == 2  # the prompt pass, then one call wrote the whole answer
        listed = ", ".join(names)
        with pytest.raises(ValueError, match=f"strategy='beam': choose one of {listed}\\."):
            DecodingConfig(strategy="beam")
        assert cli_main([str(saved[0]), "--prompt", "a dog", "--strategy", "beam"]) == 2
        assert f"strategy='beam': choose one of {listed}." in capsys.readouterr().err
    finally:
        STRATEGIES.pop("one-shot", None)
    with pytest.raises(ValueError, match="strategy='one-shot': choose one of mask-predict, confidence, threshold"):
        DecodingConfig(strategy="one-shot")


def test_a_strategy_chooses_which_predictions_to_keep():
    """`DecodingStrategy.choose` picks the kept predictions: a strategy keeping the least confident writes, at each
    step, exactly the slots the default would have left masked (seen through `on_step`)."""
    from biglm.generation import STRATEGIES, register
    from biglm.generation.strategies import Confidence, rank

    class LeastConfident(Confidence):
        name = "least-confident"

        def choose(self, predicted, conf, k):
            return (rank(torch.where(predicted, conf, float("inf")), descending=False) < k[:, None]) & predicted

    register(LeastConfident)
    try:
        ids, mask = _batch()
        for name in ("confidence", "least-confident"):
            steps: list = []
            generate_ids(_model(), ids, mask, max_new_tokens=8, steps=4, strategy=name, on_step=steps.append)
            assert len(steps) == 4
            for s in steps:
                assert s.committed.sum(1).tolist() == [2] * ids.shape[0]  # k = 2 per row either way
                for r in range(ids.shape[0]):  # every kept one above (default) or below (least-confident) the rest
                    kept, left = s.probs[r][s.committed[r]], s.probs[r][s.predicted[r] & ~s.committed[r]]
                    if left.numel():
                        assert (kept.min() >= left.max()) if name == "confidence" else (kept.max() <= left.min())
    finally:
        STRATEGIES.pop("least-confident", None)


def test_ignore_eos_writes_every_slot_without_the_eos_token():
    """``ignore_eos`` (what benchmark clients send): the end-of-text token is never written, so the answer runs to
    max_new_tokens; without it the same model stops at its first EOS."""
    model = _model()
    ids, mask = _batch()
    eos = 3
    model.config.eos_token_id = eos
    with torch.no_grad():  # make EOS the model's favourite everywhere
        model.lm_head.weight[eos] = model.lm_head.weight.abs().max(0).values * 10
    kw = dict(max_new_tokens=10, steps=5)
    stopped = generate_ids(model, ids, mask, **kw)
    assert stopped.lengths.max() < 10
    full = generate_ids(model, ids, mask, ignore_eos=True, **kw)
    assert full.lengths.tolist() == [10] * 3 and not (full.tokens == eos).any()
    spec = generate_ids(model, ids, mask, max_new_tokens=10, strategy="confidence", draft_length=2, ignore_eos=True)
    assert spec.lengths.tolist() == [10] * 3 and not (spec.tokens == eos).any()
