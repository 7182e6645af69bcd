"""The step-level decoding engine: a request's answer through the engine, alone or sharing its model calls
with other requests (different prompt lengths, strategies, lengths, blocks, sampling, arrival steps), is
token for token the answer `generate_ids` gives it alone with the same config and seed."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import biglm  # noqa: F401  (registers the Auto classes)
from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import DecodingConfig, generate_ids
from biglm.generation.engine import DecodeEngine, EngineEvent

# an all-mask answer after an empty prompt is nearly translation-invariant: its slots' confidences nearly tie, so
# float rounding of a merged call may rank them either way; the empty prompt is tested alone
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [14, 15, 16, 17], [], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
CONFIGS = [
    DecodingConfig(max_new_tokens=12, steps=5),
    DecodingConfig(max_new_tokens=9, strategy="confidence", steps=9),
    DecodingConfig(max_new_tokens=10, strategy="threshold", threshold=0.07),
    DecodingConfig(max_new_tokens=12, strategy="confidence", block_length=4, steps=6),
    DecodingConfig(max_new_tokens=12, strategy="mask-predict", block_length=5, steps=6, block_suffix="rest"),
    DecodingConfig(max_new_tokens=11, strategy="threshold", threshold=0.1, block_length=3, block_suffix="rest"),
    DecodingConfig(max_new_tokens=8, steps=4, temperature=1.0, top_k=20, seed=7),
    DecodingConfig(max_new_tokens=10, strategy="confidence", steps=5, temperature=0.8, top_p=0.9, seed=3,
                   block_length=5),
    DecodingConfig(max_new_tokens=12, steps=4, length_beam=3),
    DecodingConfig(max_new_tokens=12, strategy="confidence", block_length=4, steps=6, block_cache="append"),
    DecodingConfig(max_new_tokens=12, steps=6, length_beam=2, block_length=4, block_suffix="rest"),
]


@pytest.fixture(scope="module")
def model() -> BiGLMForMaskedLM:
    # a larger init std than training's gives peaked, varied predictions free of near-ties (as in test_generation)
    torch.manual_seed(0)
    return BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", initializer_range=0.2)).eval()


def _alone(model, prompt: list[int], config: DecodingConfig) -> list[int]:
    return generate_ids(model, torch.tensor([prompt], dtype=torch.long), config=config).token_lists()[0]


def _drain(engine: DecodeEngine, arrivals: dict[int, list[tuple[str, list[int], DecodingConfig]]],
           ) -> dict[str, list[EngineEvent]]:
    """Step the engine until every request (submitted at the step number it is keyed by) finished."""
    events: dict[str, list[EngineEvent]] = {}
    t = 0
    while t <= max(arrivals) or engine.num_running or engine.num_waiting:
        for rid, prompt, cfg in arrivals.get(t, []):
            engine.submit(rid, prompt, cfg)
        for e in engine.step():
            events.setdefault(e.request_id, []).append(e)
        t += 1
        assert t < 500
    return events


@pytest.mark.parametrize("k", range(len(CONFIGS)))
def test_alone_equals_generate_ids(model, k):
    cfg = CONFIGS[k]
    events = _drain(DecodeEngine(model), {0: [("r", PROMPTS[0], cfg)]})["r"]
    empty = _drain(DecodeEngine(model), {0: [("r", PROMPTS[3], cfg)]})["r"]
    assert empty[-1].token_ids == _alone(model, PROMPTS[3], cfg)
    assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1].token_ids == _alone(model, PROMPTS[0], cfg)


def test_mixed_batch_equals_each_request_alone(model):
    """Eleven requests of five prompt lengths (one empty) and every strategy, arriving at steps 0-5, with a
    row budget that makes some wait: each answer equals its solo decode, and each step is one model call."""
    arrivals: dict[int, list] = {}
    expected = {}
    for i, cfg in enumerate(CONFIGS):
        prompt = PROMPTS[[1, 0, 2, 4, 0, 1, 2, 4, 0, 2, 1][i]]
        arrivals.setdefault(i // 2, []).append((f"r{i}", prompt, cfg))
        expected[f"r{i}"] = _alone(model, prompt, cfg)
    calls: list[int] = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))  # encode_prefix runs the inner model only
    engine = DecodeEngine(model, max_batch_rows=6)
    try:
        steps = 0
        sizes: list[int] = []
        events: dict[str, list[EngineEvent]] = {}
        while steps <= max(arrivals) or engine.num_running or engine.num_waiting:
            for rid, prompt, cfg in arrivals.get(steps, []):
                engine.submit(rid, prompt, cfg)
            before = len(calls)
            out = engine.step()
            assert len(calls) - before == (1 if out else 0)  # one merged model call for all running requests
            assert sum(r.rows for r in engine._running.values()) <= 6
            sizes.append(len(out))
            for e in out:
                events.setdefault(e.request_id, []).append(e)
            steps += 1
    finally:
        hook.remove()
    assert {rid: ev[-1].token_ids for rid, ev in events.items()} == expected
    assert max(sizes) >= 3  # requests really shared model calls


def test_the_pooled_cache_serves_calls_in_place_as_requests_come_and_go(model, monkeypatch):
    """The engine keeps its requests' caches as rows of one pool (`_CachePool`): a step's call reads them in place, no
    request's cache is copied into a merged one (`PrefixCache.merge` is never called), the calls write their keys into
    the rows' room (`PrefixCache.room`), and rows move when a request before them finishes or is cancelled (length
    beams of 2 and 3 rows among them); every answer is its solo decode."""
    from biglm.model.modeling import PrefixCache

    def refuse(*a, **k):
        raise AssertionError("merged by copying")

    monkeypatch.setattr(PrefixCache, "merge", staticmethod(refuse))
    configs = [CONFIGS[8], CONFIGS[0], CONFIGS[9], CONFIGS[1], CONFIGS[3], CONFIGS[10], CONFIGS[6]]
    prompts = [PROMPTS[i] for i in (0, 1, 2, 4, 0, 1, 2)]
    engine = DecodeEngine(model, max_batch_rows=8)
    rooms, batch = [], engine._pool.batch

    def seen(reqs, call, **kw):
        cache = batch(reqs, call, **kw)
        rooms.append(cache is not None and cache.room is not None)
        return cache

    engine._pool.batch = seen
    events: dict[str, list[EngineEvent]] = {}
    arrivals = {0: [0, 1, 2], 1: [3], 2: [4, 5], 4: [6]}
    t, moved = 0, 0
    while t <= max(arrivals) or engine.num_running or engine.num_waiting:
        for i in arrivals.get(t, []):
            engine.submit(f"r{i}", prompts[i], configs[i])
        if t == 3:
            engine.cancel("r1")
        slots = {r.id: r.slot for r in engine._pool.members}
        for e in engine.step():
            events.setdefault(e.request_id, []).append(e)
        moved += sum(r.slot < slots.get(r.id, r.slot) for r in engine._pool.members)
        rows = [r.rows for r in engine._pool.members]
        assert [r.slot for r in engine._pool.members] == [0, *itertools.accumulate(rows)][:len(rows)]  # from row 0
        t += 1
        assert t < 200
    assert moved >= 2 and not engine._pool.members
    assert sum(rooms) > len(rooms) // 2, rooms
    assert events["r1"][-1].finish_reason == "cancelled"
    for i, (p, c) in enumerate(zip(prompts, configs)):
        if i != 1:
            assert events[f"r{i}"][-1].token_ids == _alone(model, p, c), i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_runs_draw_in_one_pass_what_each_draws_alone(model, dtype):
    """`decoding.draw_greedy`: greedy runs that ban the same tokens draw from their logits stacked in one pass, and
    each run then holds bitwise what its own `advance` over its part writes (tokens and confidences; float32 and
    bfloat16 logits); runs that ban other tokens, or sample, are refused."""
    from biglm.generation.decoding import DecodeRun, draw_greedy

    def run(**kw):
        cfg = DecodingConfig(max_new_tokens=6, strategy="confidence", steps=3, **kw)
        return DecodeRun(model.config, config=cfg, cand_len=torch.tensor([[6]]), generator=torch.Generator())

    batched, alone = [run() for _ in range(3)], [run() for _ in range(3)]
    counts = [int(r.pending.where.sum()) for r in batched]
    logits = torch.randn(sum(counts), model.config.vocab_size, generator=torch.Generator().manual_seed(0)).to(dtype)
    for r, part in zip(alone, logits.clone().split(counts)):
        r.advance(part)
    for r, d in zip(batched, draw_greedy(batched, logits, counts)):
        r.advance(drawn=d)
    for a, b in zip(alone, batched):
        assert torch.equal(a.progress.answer, b.progress.answer) and torch.equal(a.progress.probs, b.progress.probs)
    for other in (run(ignore_eos=True), run(temperature=1.0, seed=1)):
        with pytest.raises(ValueError, match="greedy runs that ban the same tokens"):
            draw_greedy([batched[0], other], logits, [1, 1])


def test_the_engine_draws_its_greedy_requests_together(model, monkeypatch):
    """A step draws its greedy requests' tokens in one pass per set of banned tokens (EOS banned or not), a sampled
    request alone; every answer is its solo decode (float32)."""
    import biglm.generation.engine as E

    passes: list[int] = []
    draw = E.draw_greedy
    monkeypatch.setattr(E, "draw_greedy", lambda runs, *a: passes.append(len(runs)) or draw(runs, *a))
    configs = [CONFIGS[1], CONFIGS[1], dataclasses.replace(CONFIGS[1], ignore_eos=True),
               dataclasses.replace(CONFIGS[3], ignore_eos=True), CONFIGS[6], CONFIGS[9]]
    arrivals = {0: [(f"r{i}", PROMPTS[i % 3], c) for i, c in enumerate(configs)]}
    events = _drain(DecodeEngine(model), arrivals)
    for i, c in enumerate(configs):
        assert events[f"r{i}"][-1].token_ids == _alone(model, PROMPTS[i % 3], c), i
    assert passes and max(passes) == 3 and min(passes) >= 2  # (each pass two or three requests, none of them sampled)


def test_stable_ids_grow_and_end_as_the_answer(model):
    mask_id = model.config.mask_token_id
    for cfg in (CONFIGS[1], CONFIGS[3], CONFIGS[4]):
        events = _drain(DecodeEngine(model), {0: [("r", PROMPTS[2], cfg)]})["r"]
        for a, b in zip(events, events[1:]):
            assert b.stable_ids[: len(a.stable_ids)] == a.stable_ids  # never changes, only grows
        for e in events:
            assert mask_id not in e.token_ids and e.token_ids[: len(e.stable_ids)] == e.stable_ids
        assert events[-1].stable_ids == events[-1].token_ids and events[-1].finish_reason in ("length", "stop")
        if cfg.strategy == "mask-predict":  # only committed blocks are stable: block multiples before the end
            assert all(len(e.stable_ids) % cfg.block_length == 0 for e in events[:-1])
            assert any(len(e.stable_ids) > 0 for e in events[:-1])
        assert events[-1].steps == generate_ids(model, torch.tensor([PROMPTS[2]]), config=cfg).steps or \
            events[-1].finish_reason == "stop"


def test_eos_ends_a_request_early_with_the_same_answer(model):
    """With EOS made the likeliest token, the committed run reaches an EOS early and the request stops there."""
    cfg = DecodingConfig(max_new_tokens=12, strategy="confidence", steps=12)
    eos = model.config.eos_token_id
    with torch.no_grad():
        saved = model.lm_head.weight[eos].clone()
        model.lm_head.weight[eos] = model.lm_head.weight[40] * 1.5  # EOS behaves like a likely token
    try:
        expected = generate_ids(model, torch.tensor([PROMPTS[0]]), config=cfg)
        events = _drain(DecodeEngine(model), {0: [("r", PROMPTS[0], cfg)]})["r"]
    finally:
        with torch.no_grad():
            model.lm_head.weight[eos] = saved
    assert int(expected.lengths[0]) < 12  # the answer does hold an EOS
    assert events[-1].token_ids == expected.token_lists()[0] and events[-1].finish_reason == "stop"
    assert events[-1].steps < expected.steps


def test_cancel_waiting_and_running(model):
    engine = DecodeEngine(model, max_batch_rows=1)
    engine.submit("a", PROMPTS[0], CONFIGS[0])
    engine.submit("b", PROMPTS[1], CONFIGS[1])
    engine.submit("c", PROMPTS[2], CONFIGS[2])
    assert [e.request_id for e in engine.step()] == ["a"] and (engine.num_running, engine.num_waiting) == (1, 2)
    engine.cancel("a")
    engine.cancel("b")
    engine.cancel("nobody")  # unknown ids are ignored
    first = engine.step()
    assert [(e.request_id, e.finished, e.finish_reason) for e in first[:2]] == [
        ("a", True, "cancelled"), ("b", True, "cancelled")]
    assert first[2].request_id == "c"
    events = _drain(engine, {0: []})
    assert events["c"][-1].token_ids == _alone(model, PROMPTS[2], CONFIGS[2])


def test_bad_requests_fail_at_submit(model):
    engine = DecodeEngine(model)
    engine.submit("x", [5], DecodingConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="already in the engine"):
        engine.submit("x", [5], DecodingConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="exceed the model's window"):
        engine.submit("y", [5] * 10, DecodingConfig(max_new_tokens=model.config.max_position_embeddings))
    with pytest.raises(ValueError, match=r"prompt token ids must lie in \[0, vocab_size"):
        engine.submit("y", [model.config.vocab_size], DecodingConfig())
    with pytest.raises(ValueError, match="stop strings need the tokenizer"):
        engine.submit("y", [5], DecodingConfig(stop=["\n"]))
    with pytest.raises(ValueError, match="has no length head"):
        engine.submit("y", [5], DecodingConfig(length_head=True))
    with pytest.raises(ValueError, match="exceeds the engine's max_batch_rows=2"):
        DecodeEngine(model, max_batch_rows=2).submit("y", [5], DecodingConfig(length_beam=3))
    with pytest.raises(TypeError, match="must be a DecodingConfig"):
        engine.submit("y", [5], {"max_new_tokens": 4})
    assert engine.num_waiting == 1


def test_positions_count_what_the_merged_calls_compute(model):
    """``engine.positions`` (the server's /health ``stats.positions``, a benchmark's cost per token) is the query
    positions its merged decoding calls computed: counted where the model computes them (the first decoder layer's
    rows x width in every call against a cache), and what the same requests cost alone (`generate_ids`' own count,
    less each prompt's encode: queries of one width merge without padding)."""
    seen: list[int] = []
    layer = model.model.layers[0]  # called as layer(x, rope, mask, past): past is None only when a prompt is encoded
    hook = layer.register_forward_pre_hook(lambda _m, a: seen.append(a[0].shape[0] * a[0].shape[1]) if a[3] is not None
                                           else None)
    cfg = DecodingConfig(max_new_tokens=8, steps=4)
    try:
        engine = DecodeEngine(model)
        _drain(engine, {0: [("a", PROMPTS[0], cfg)], 1: [("b", PROMPTS[1], cfg)]})
    finally:
        hook.remove()
    alone = sum(generate_ids(model, torch.tensor([p]), config=cfg).positions - len(p) for p in PROMPTS[:2])
    assert engine.positions == sum(seen) == alone == 2 * 4 * 8, (engine.positions, sum(seen), alone)


@pytest.fixture(scope="module")
def shift_model() -> BiGLMForMaskedLM:
    # a converted (shift) model at its default init: no weights scaled to avoid near-ties (sampled configs below)
    torch.manual_seed(1)
    return BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", shift_logits=True)).eval()


SAMPLED = [DecodingConfig(max_new_tokens=8, steps=4, temperature=0.7, seed=1),
           DecodingConfig(max_new_tokens=9, strategy="confidence", steps=9, temperature=0.7, seed=2),
           DecodingConfig(max_new_tokens=8, strategy="confidence", steps=8, block_length=2,
                          temperature=1.0, seed=3)]


@pytest.mark.parametrize("k", range(len(SAMPLED)))
def test_a_shift_models_empty_prompt_gets_its_solo_answer_beside_others(shift_model, k):
    """A shift model predicts an empty prompt's first slot from that slot's own row (no prompt token to shift from):
    decoded beside other requests (merged engine calls; a left-padded `generate_ids` batch, cached and not), the empty
    prompt's sampled answer is the one it gets alone (float32)."""
    from biglm.generation.decoding import left_pad
    from biglm.model.modeling import PrefixCache

    cfg = SAMPLED[k]
    alone = _alone(shift_model, [], cfg)
    with pytest.MonkeyPatch.context() as mp:  # the empty prompt's rows are read in place in the pool, like any other
        mp.setattr(PrefixCache, "merge", staticmethod(lambda *a, **kw: pytest.fail("merged by copying")))
        events = _drain(DecodeEngine(shift_model), {0: [("e", [], cfg), ("o", PROMPTS[0], SAMPLED[0])],
                                                    1: [("p", PROMPTS[2], cfg)]})
    assert events["e"][-1].token_ids == alone
    assert events["o"][-1].token_ids == _alone(shift_model, PROMPTS[0], SAMPLED[0])
    ids, mask = left_pad([[], PROMPTS[2]], pad_id=0)
    for use_cache in (True, False):  # (greedy: a batch's rows share one random stream)
        greedy = cfg.override(temperature=0.0, use_cache=use_cache)
        out = generate_ids(shift_model, ids, mask, config=greedy).token_lists()
        assert out[0] == _alone(shift_model, [], greedy), use_cache


@pytest.mark.parametrize("kind", ["plain", "shift", "causal"])
@pytest.mark.parametrize("chunk", [1, 7, 40, 63, 500])
def test_a_prompt_encoded_over_steps_gives_the_one_pass_cache(model, shift_model, kind, chunk):
    """A BiGLM prompt is one bidirectional prefix (its first tokens' keys depend on its last ones), so `_Prefill` cuts
    its pass by layers and query rows, never causally: in float32 the cache (keys, values, a shift model's hidden
    states) equals `encode_prefix`'s, whatever the share each `advance` does. A causal model's (`biglm convert`'s)
    prompt is read causally by both, and its cache is not the bidirectional one."""
    import copy

    from biglm.generation.engine import _Prefill

    shift = kind != "plain"
    m = model if kind == "plain" else shift_model
    if kind == "causal":
        m = copy.deepcopy(shift_model)
        m.config.prefix_attention, m.config.prefix_block_lengths = "causal", [1]
    ids = torch.randint(3, 500, (1, 61), generator=torch.Generator().manual_seed(chunk))
    with torch.inference_mode():
        whole = m.encode_prefix(ids)
        pre, calls = _Prefill(m, ids), 0
        while pre.left:
            left = pre.left
            assert pre.advance(chunk) == min(chunk, left)
            calls += 1
        got = pre.cache()
    assert calls == -(-61 * m.config.num_hidden_layers // chunk)
    for a, b in zip(got.keys + got.values, whole.keys + whole.values):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert (got.hidden is None) == (not shift)
    if shift:
        torch.testing.assert_close(got.hidden, whole.hidden, rtol=1e-5, atol=1e-5)
    assert got.key_valid.all() and not got.padded
    if kind == "causal":
        with torch.inference_mode():
            both_ways = shift_model.encode_prefix(ids)
        assert not torch.allclose(both_ways.keys[-1][..., :-1, :], got.keys[-1][..., :-1, :], atol=1e-3)
        torch.testing.assert_close(both_ways.keys[0][..., -1, :], got.keys[0][..., -1, :])  # layer 0's keys: no mixing



def test_a_prompt_encoded_over_steps_gives_the_one_pass_cache_on_the_real_model(real_smol, real_invariant):
    """The real SmolLM2-135M (a causal conversion), a 150-token prompt encoded over steps of 37 token-layers: in
    float32 the cache equals `encode_prefix`'s within the rounding real sums need (other matrix shapes sum in another
    order: measured up to 2.7e-5 apart, held to 1e-4), and a wrong rule is far outside it (the prompt read both ways:
    up to ~1 apart); in bfloat16 with ``batch_invariant`` it is the same bits (the mode's attention kernel in both)."""
    from biglm.checkpoint import load_model
    from biglm.generation.engine import _Prefill

    torch.set_num_threads(1)
    text = " ".join(["The river crossed the old city, and every bridge had a name of its own."] * 10)

    def both(m, ids):
        with torch.inference_mode():
            pre = _Prefill(m, ids)
            while pre.left:
                pre.advance(37)
            return pre.cache(), m.encode_prefix(ids)

    model, tok = load_model(real_smol)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][:150]])
    assert ids.shape[1] == 150 and model.config.prefix_attention == "causal"
    got, whole = both(model, ids)
    for a, b in zip(got.keys + got.values + [got.hidden], whole.keys + whole.values + [whole.hidden]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with torch.inference_mode():
        bidirectional = model.model(ids, return_cache=True)["cache"]
    assert (bidirectional.keys[-1] - whole.keys[-1]).abs().max() > 1e-2  # the tolerance tells the rules apart
    model, _ = real_invariant  # load_model(real_smol, dtype=torch.bfloat16, batch_invariant=True), shared
    got, whole = both(model, ids)
    assert all(torch.equal(a, b) for a, b in zip(got.keys + got.values + [got.hidden],
                                                 whole.keys + whole.values + [whole.hidden]))


SPECULATIVE = DecodingConfig(max_new_tokens=8, strategy="confidence", draft_length=2, temperature=1.0, seed=5)


@pytest.mark.filterwarnings("ignore:speculative decoding")
@pytest.mark.parametrize("m", ["model", "shift_model"])
def test_a_long_prompt_does_not_hold_up_short_requests(m, request):
    """Chunked prefill: a long prompt is encoded over steps, ``prefill_chunk`` x layers token-layers a step (plus a
    ``prefill_chunk`` piece always granted to the oldest), beside
    the running requests' decoding calls. Short requests sent a step after it take as many engine steps as alone
    whatever its length (two lengths), and every answer (the long ones', one speculative, too) is its solo
    `generate_ids` answer;
    `num_prefilling` counts the long one while it is encoded."""
    mdl = request.getfixturevalue(m)
    # (no block decoding: the exact cache's block passes would count as work beside the decoding calls)
    cfgs = [CONFIGS[0], CONFIGS[6], CONFIGS[1]] if m == "model" else [SAMPLED[0], SAMPLED[1], CONFIGS[6]]
    chunk, layers = 16, mdl.config.num_hidden_layers

    def run(long_len: int | None) -> tuple[dict[str, int], dict[str, list[int]], list[int], int]:
        engine = DecodeEngine(mdl, prefill_chunk=chunk)
        arrivals: dict[int, list] = {1: [(f"s{i}", PROMPTS[i], cfgs[i]) for i in range(3)]}
        if long_len is not None:
            long_prompt = torch.randint(3, 500, (long_len,), generator=torch.Generator().manual_seed(0)).tolist()
            arrivals[0] = [("long", long_prompt, cfgs[1]), ("spec", long_prompt, SPECULATIVE)]
        done: dict[str, int] = {}
        answers: dict[str, list[int]] = {}
        prefilling, work = [], []
        rows: list[int] = []  # token-layers the model computed: rows through each layer's MLP
        hooks = [layer.mlp.register_forward_hook(lambda mod, args, out: rows.append(args[0].shape[:-1].numel()))
                 for layer in mdl.model.layers]
        t = 0
        try:
            while t <= 1 or engine.num_running or engine.num_waiting:
                for rid, prompt, cfg in arrivals.get(t, []):
                    engine.submit(rid, prompt, cfg)
                before, positions, rows[:] = engine.prefill_work, engine.positions, []
                for e in engine.step():
                    if e.finished:
                        done[e.request_id], answers[e.request_id] = t, e.token_ids
                work.append(sum(rows) - (engine.positions - positions) * layers)  # what was not the decoding call
                assert work[-1] == engine.prefill_work - before
                prefilling.append(engine.num_prefilling)
                t += 1
                assert t < 300
        finally:
            for h in hooks:
                h.remove()
        if long_len is not None:
            assert answers["long"] == _alone(mdl, long_prompt, cfgs[1])
            assert answers["spec"] == _alone(mdl, long_prompt, SPECULATIVE)
        return done, answers, prefilling, max(work)

    alone, answers, _, _ = run(None)
    for long_len in (100, 200):
        done, got, prefilling, most = run(long_len)
        assert {k: done[k] for k in alone} == alone  # the short ones' latency in steps: as alone
        assert {k: got[k] for k in alone} == answers
        assert most <= chunk * (layers + 1)  # a step's share, and the oldest prompt's guaranteed piece
        assert sum(prefilling) >= long_len * layers // (chunk * layers) - 1 and prefilling[-1] == 0
    for i in range(3):
        assert answers[f"s{i}"] == _alone(mdl, PROMPTS[i], cfgs[i])


@pytest.mark.parametrize("which", ["model", "shift_model"])
def test_a_prompt_sent_again_is_not_encoded_again_and_gets_the_same_answer(which, request):
    """The engine's prompt cache (`_PromptCache`): a prompt seen before starts from its stored cache (no prompt pass,
    no prefill work), beside requests that encode theirs, and its answer equals the first one's and generate_ids'
    (float32); the stored tensors are not written by the requests that grow from them; a bounded cache drops the least
    recently used prompt; 0 MB turns it off."""
    from biglm.generation.engine import _PromptCache

    model = request.getfixturevalue(which)
    cfg = DecodingConfig(max_new_tokens=8, strategy="confidence", block_length=1, steps=8)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    alone = [generate_ids(model, torch.tensor([p]), config=cfg).token_lists()[0] for p in prompts]
    engine = DecodeEngine(model, max_batch_rows=4)
    answers, work = {}, []
    for round_ in range(2):
        for i, p in enumerate(prompts):
            engine.submit(f"{round_}-{i}", p, cfg)
        stored = {k: [t.clone() for t in c.keys] for k, (c, _) in engine.prompt_cache.entries.items()}
        while engine.num_running or engine.num_waiting:
            answers.update({e.request_id: e.token_ids for e in engine.step() if e.finished})
        for k, keys in stored.items():  # never written
            assert all(torch.equal(a, b) for a, b in zip(keys, engine.prompt_cache.entries[k][0].keys))
        work.append(engine.prefill_work)
    layers = model.config.num_hidden_layers
    assert work == [8 * layers, 8 * layers] and engine.prompt_cache.hits == 2  # each prompt encoded once
    for i in range(2):
        assert answers[f"0-{i}"] == answers[f"1-{i}"] == alone[i]
    # bounded: the least recently used prompt goes first
    one = engine.prompt_cache.entries[tuple(prompts[0])][0]
    small = _PromptCache(int(_PromptCache._size(one) * 1.5))
    small.put(prompts[0], one)
    small.put(prompts[1], engine.prompt_cache.entries[tuple(prompts[1])][0])
    assert list(small.entries) == [tuple(prompts[1])] and small.used <= small.limit
    off = DecodeEngine(model, max_batch_rows=4, prompt_cache_mb=0)
    off.submit("a", prompts[0], cfg)
    while off.num_running or off.num_waiting:
        off.step()
    assert not off.prompt_cache.entries
    for bad in (-1, float("inf"), float("nan"), "8"):
        with pytest.raises(ValueError, match="prompt_cache_mb"):
            DecodeEngine(model, prompt_cache_mb=bad)


def test_a_causal_models_held_block_beside_a_speculative_request_is_read_causally():
    """A causal model's (`biglm convert`'s) block-decoding request beside a speculative one: the merged call says every
    row as an attention rule, and the held block's queries must see it causally there too (as its prefix split reads
    it alone): the answer equals the one alone, in float32. (Read bidirectionally, the real SmolLM2's "Hello" with
    blocks of 4 wrote other tokens beside the speculative requests, in bfloat16 with ``batch_invariant`` too.)"""
    torch.manual_seed(0)
    config = BiGLMConfig.from_preset("tiny", initializer_range=0.2, shift_logits=True, prefix_attention="causal",
                                     prefix_block_lengths=[1], attn_backend="sdpa")
    model = BiGLMForMaskedLM(config).eval()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 400, (n,), generator=g).tolist() for n in (9, 5, 13)]
    blocks = DecodingConfig(max_new_tokens=12, strategy="confidence", block_length=4, steps=6)
    drafted = DecodingConfig(max_new_tokens=12, strategy="confidence", draft_length=2)
    requests = [("b0", prompts[0], blocks), ("s", prompts[1], drafted), ("b1", prompts[2], blocks)]
    together, alone = {}, {}
    for group, out in (([requests], together), ([[r] for r in requests], alone)):
        for reqs in group:
            engine = DecodeEngine(model, max_batch_rows=16)
            for rid, p, cfg in reqs:
                engine.submit(rid, p, cfg)
            while engine.num_running or engine.num_waiting:
                out.update({e.request_id: e.token_ids for e in engine.step() if e.finished})
    assert together == alone
