"""Speculative decoding (`generation.speculative`): confidence decoding at blocks of 1, one token per call, written
in fewer calls with drafts checked under that condition in the same pass."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import Decode, DecodingConfig, generate_ids, left_pad
from biglm.generation.speculative import _accept, _one_more, tree_offsets, tree_predictions, tree_rule


def _blocks_model(seed: int = 0, **overrides) -> BiGLMForMaskedLM:
    torch.manual_seed(seed)
    overrides = {"prefix_block_lengths": [1, 4, 8], **overrides}
    config = BiGLMConfig.from_preset("tiny", initializer_range=0.2, prefix_attention="blocks", **overrides)
    return BiGLMForMaskedLM(config).eval()


def _batch(model: BiGLMForMaskedLM, lengths=(7, 3, 11)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    return left_pad(prompts, pad_id=model.config.pad_token_id)


def test_tree_rule_equals_hand_written():
    T, F = True, False
    # m = 1 (W = 2): pending c, d1; group j = its check kj, then a block of two masks bj0 (at kj's slot), bj1
    expected = torch.tensor([
        # c  d1 k0 b00 b01 k1 b10 b11
        [T, F, F, F, F, F, F, F],  # c: itself
        [T, T, F, F, F, F, F, F],  # d1: c and itself
        [T, F, T, F, F, F, F, F],  # check 0 (slot after c): c, itself
        [T, F, F, T, T, F, F, F],  # block 0: c and the block
        [T, F, F, T, T, F, F, F],
        [T, T, F, F, F, T, F, F],  # check 1 (slot after d1): c, d1, itself
        [T, T, F, F, F, F, T, T],  # block 1: c, d1 and the block
        [T, T, F, F, F, F, T, T],
    ])
    assert torch.equal(tree_rule(pending=2, width=2), expected)
    assert tree_offsets(pending=2, width=2).tolist() == [-1, 0, 0, 0, 1, 1, 1, 2]
    assert tree_predictions(pending=2, width=2).tolist() == [2, 4, 5, 7]  # checks and the drafts after them
    # the first call: no pending tokens, one group after the prompt
    assert torch.equal(tree_rule(pending=0, width=2), torch.tensor([[T, F, F], [F, T, T], [F, T, T]]))
    assert tree_offsets(pending=0, width=2).tolist() == [0, 0, 1]


def test_shift_tree_layout_equals_hand_written():
    """A shift model (logits of a row = the previous row's hidden state) needs no check rows: group j is a block of
    W masks from the slot after d_j, and its check is read at row j + 1 (pending token j's hidden state)."""
    T, F = True, False
    expected = torch.tensor([
        # c  d1 b00 b01 b10 b11
        [T, F, F, F, F, F],  # c: itself
        [T, T, F, F, F, F],  # d1: c and itself
        [T, F, T, T, F, F],  # block 0 (slots 0, 1): c and the block
        [T, F, T, T, F, F],
        [T, T, F, F, T, T],  # block 1 (slots 1, 2): c, d1 and the block
        [T, T, F, F, T, T],
    ])
    assert torch.equal(tree_rule(pending=2, width=2, checks=False), expected)
    assert tree_offsets(pending=2, width=2, checks=False).tolist() == [-1, 0, 0, 1, 1, 2]
    # check 0 at row 1 (c's hidden), draft at row 3 (b00's); check 1 at row 2 (d1's hidden), draft at row 5
    assert tree_predictions(pending=2, width=2, checks=False).tolist() == [1, 3, 2, 5]
    assert torch.equal(tree_rule(pending=0, width=2, checks=False), torch.ones(2, 2, dtype=torch.bool))
    assert tree_predictions(pending=0, width=2, checks=False).tolist() == [0, 1]  # the prompt's last position


def test_shift_call_checks_each_draft_under_the_one_token_condition():
    """For a shift model, the logits a speculative call reads as check j equal the one-token-per-call forward's
    logits at the slot after d_j (prompt + c + d_1..d_j + one mask, blocks of 1), and group j's drafts equal that
    forward's with a block of W masks."""
    model = _blocks_model(shift_logits=True)
    mask_id, V = model.config.mask_token_id, model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(5, V, (1, 6), generator=g)
    pending = torch.randint(5, V, (1, 3), generator=g)  # c (answer slot 0), d_1, d_2
    W, P = 3, prompt.shape[1]
    with torch.inference_mode():
        cache = model.encode_prefix(prompt)
        rule = tree_rule(pending=W, width=W, checks=False)
        L = rule.shape[0]
        full_rule = torch.cat((torch.ones(L, P, dtype=torch.bool), rule), 1)[None]
        ids = torch.cat((pending, torch.full((1, L - W), mask_id)), 1)
        out = model(ids, prefix_cache=cache, position_ids=P + 1 + tree_offsets(pending=W, width=W, checks=False)[None],
                    attention_rule=full_rule)
        read = out.logits[0, tree_predictions(pending=W, width=W, checks=False)].view(W, W, -1)
        for j in range(W):
            answer = torch.cat((prompt, pending[:, :j + 1], torch.full((1, W), mask_id)), 1)
            split = P + j + 1
            one = model(answer[:, :split + 1], prefix_len=split, prompt_len=P, block_len=1).logits[0, -1]
            block = model(answer, prefix_len=split, prompt_len=P, block_len=1).logits[0, split + 1:]
            torch.testing.assert_close(read[j, 0], one, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(read[j, 1:], block, atol=1e-5, rtol=1e-5)


def test_one_call_checks_each_draft_under_the_one_token_condition():
    """A speculative call's check after d_1..d_j equals the one-token-per-call forward on prompt + c + d_1..d_j +
    one mask; its drafts equal that forward with a block of masks; the pending tokens' keys/values equal a from-scratch
    forward under the biglm-blocks rule at blocks of 1."""
    model = _blocks_model()
    mask_id, V = model.config.mask_token_id, model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(5, V, (1, 6), generator=g)
    pending = torch.randint(5, V, (1, 3), generator=g)  # c (answer slot 0), d_1, d_2
    W, P = 3, prompt.shape[1]
    with torch.inference_mode():
        cache = model.encode_prefix(prompt)
        rule = tree_rule(pending=W, width=W)
        L = rule.shape[0]
        full_rule = torch.cat((torch.ones(L, P, dtype=torch.bool), rule), 1)[None]
        ids = torch.cat((pending, torch.full((1, L - W), mask_id)), 1)
        out = model(ids, prefix_cache=cache, position_ids=P + 1 + tree_offsets(pending=W, width=W)[None],
                    attention_rule=full_rule, return_cache=True)
        for j in range(W):
            answer = torch.cat((prompt, pending[:, :j + 1], torch.full((1, W), mask_id)), 1)
            split = P + j + 1
            one = model(answer[:, :split + 1], prefix_len=split, prompt_len=P, block_len=1).logits[0, -1]
            block = model(answer, prefix_len=split, prompt_len=P, block_len=1).logits[0, split:]
            group = out.logits[0, W + j * (W + 1): W + (j + 1) * (W + 1)]
            torch.testing.assert_close(group[0], one, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(group[1:], block, atol=1e-5, rtol=1e-5)
        scratch = model.model(torch.cat((prompt, pending), 1), prefix_len=P + W, prompt_len=P, block_len=1,
                              return_cache=True)["cache"]
        for mine, ref in zip(out["cache"].keys + out["cache"].values, scratch.keys + scratch.values):
            torch.testing.assert_close(mine[:, :, :W], ref[:, :, P:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_greedy_speculative_equals_one_token_per_call(m, shift):
    """Token for token, a left-padded batch of different prompt lengths, in fewer calls than tokens (drafts kept: a
    shift model of the default vocabulary keeps none, so its case reads 16 tokens, where its drafts and checks agree
    often); a shift model (converted from an AR checkpoint) needs no check rows: W fewer positions per group."""
    model = _blocks_model(shift_logits=shift, **({"vocab_size": 16} if shift else {}))
    ids, mask = _batch(model)
    kw = dict(max_new_tokens=24, strategy="confidence", suppress_ids=[7])
    ref = generate_ids(model, ids, mask, block_length=1, **kw)
    out = generate_ids(model, ids, mask, draft_length=m, **kw)
    assert ref.steps == 24 and out.token_lists() == ref.token_lists()
    assert out.steps < 24 and out.forward_calls == out.steps + 1  # drafts kept; + the prompt's pass
    size = m + 1 + (not shift)  # a group: (the check,) then the block of W = m + 1 masks
    L = (m + 1) + (m + 1) * size
    assert out.positions == ids.numel() + ids.shape[0] * (size + (out.steps - 1) * L)


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_every_draft_kept_writes_m_plus_one_tokens_per_call(shift):
    """With draft_accept near 0 every draft is kept: the first call writes one token, every later one m + 1 (EOS
    suppressed, so no row stops early)."""
    model = _blocks_model(shift_logits=shift)
    ids, mask = _batch(model)
    for m, N in ((2, 24), (3, 10)):
        out = generate_ids(model, ids, mask, max_new_tokens=N, strategy="confidence", draft_length=m,
                           draft_accept=1e-30, suppress_ids=[model.config.eos_token_id])
        assert out.steps == 1 + math.ceil((N - 1) / (m + 1))
        assert all(len(t) == N for t in out.token_lists())


def test_speculative_sampling_keeps_the_checks_distribution():
    """Keep a one-token draft with its probability, else draw from the check without it: the first token written is
    distributed as check 0 (p = [0.5, 0.3, 0.2], draft 0: 0.5, 0.5 * 0.6, 0.5 * 0.4), and the token after a kept draft
    as check 1, the one after it (q = [0.1, 0.2, 0.7]), read as `SpeculativeDecode.answered` reads it (the check after
    the kept drafts: check 0 read there instead, as this test once did, writes p after a kept draft and fails)."""
    n = 40000
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.1, 0.2, 0.7])
    checks = torch.stack((p.log(), q.log())).expand(n, 2, 3).clone()  # check 0, then check 1 (after d_1)
    drafts = torch.zeros(n, 1, dtype=torch.long)
    cfg = DecodingConfig(strategy="confidence", draft_length=1, temperature=1.0)
    g = torch.Generator().manual_seed(0)
    kept, rejected = _accept(checks[:, :1], drafts, cfg, g)
    assert abs(kept.float().mean().item() - 0.5) < 0.01
    last = checks[torch.arange(n), kept]  # the check after the kept drafts (`answered`'s ``checks[rows, kept]``)
    bonus = _one_more(last, cfg, g, kept=kept, rejected=rejected, m=1)
    assert not bool((bonus[kept == 0] == 0).any())  # a rejected draft is never written in its place
    first = torch.where(kept == 1, drafts[:, 0], bonus)
    torch.testing.assert_close(torch.bincount(first, minlength=3).float() / n, p, atol=0.01, rtol=0)
    after = bonus[kept == 1]  # the token written after a kept draft
    torch.testing.assert_close(torch.bincount(after, minlength=3).float() / after.numel(), q, atol=0.015, rtol=0)


def test_sampling_is_seeded():
    model = _blocks_model()
    ids, mask = _batch(model)
    kw = dict(max_new_tokens=16, strategy="confidence", draft_length=2, temperature=1.0)
    a, b = generate_ids(model, ids, mask, seed=3, **kw), generate_ids(model, ids, mask, seed=3, **kw)
    c = generate_ids(model, ids, mask, seed=4, **kw)
    assert a.token_lists() == b.token_lists() != c.token_lists()


def test_bad_speculative_settings_are_refused():
    for kw, match in ((dict(draft_length=2), "strategy='confidence'"),
                      (dict(strategy="confidence", draft_length=2, steps=8), "steps=8"),
                      (dict(strategy="confidence", draft_length=2, block_length=8), "block_length=8"),
                      (dict(strategy="confidence", draft_length=2, block_cache="exact"), "block_cache='exact'"),
                      (dict(strategy="confidence", draft_length=2, length_beam=2), "length_beam=2"),
                      (dict(strategy="confidence", draft_length=-1), "draft_length=-1"),
                      (dict(strategy="confidence", draft_accept=0.5), "draft_length >= 1"),
                      (dict(strategy="confidence", draft_length=2, draft_accept=0.0), r"\(0, 1\]"),
                      (dict(strategy="confidence", draft_length=2, draft_accept=0.5, temperature=1.0), "greedy")):
        with pytest.raises(ValueError, match=match):
            DecodingConfig(**kw)
    model = _blocks_model()
    ids, mask = _batch(model)
    cfg = DecodingConfig(strategy="confidence", draft_length=2)
    with pytest.raises(ValueError, match="candidate lengths"):
        generate_ids(model, ids, mask, config=cfg, lengths=[4])
    with pytest.raises(ValueError, match="SpeculativeDecode"):
        Decode(model, ids, mask, config=cfg)
    torch.manual_seed(0)
    paper = BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny")).eval()
    with pytest.warns(UserWarning, match="approximation"):
        generate_ids(paper, ids, mask, config=cfg.override(max_new_tokens=4))


def test_attention_rule_is_refused_with_a_prefix_split_or_a_wrong_shape():
    model = _blocks_model()
    ids = torch.randint(5, 50, (1, 4))
    rule = torch.ones(1, 4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="without prefix_len"):
        model(ids, prefix_len=2, attention_rule=rule)
    with pytest.raises(ValueError, match=r"\(1, 4, 4\)"):
        model(ids, attention_rule=rule[:, :3])
    # a rule that is the biglm-blocks mask gives that mask's logits
    blocks = model(ids, prefix_len=3, prompt_len=1, block_len=1).logits
    T, F = True, False
    hand = torch.tensor([[[T, F, F, F], [T, T, F, F], [T, T, T, F], [T, T, T, T]]])
    torch.testing.assert_close(model(ids, attention_rule=hand).logits, blocks, atol=1e-5, rtol=1e-5)


ENGINE_PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [14, 15, 16, 17], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40],
                  [20, 21], [44, 45, 46]]
ENGINE_CONFIGS = [
    DecodingConfig(strategy="confidence", draft_length=2, max_new_tokens=14),  # greedy
    DecodingConfig(strategy="confidence", draft_length=2, max_new_tokens=12, temperature=1.0, seed=3),  # sampled
    DecodingConfig(strategy="confidence", block_length=4, steps=6, max_new_tokens=12, block_cache="append"),
    DecodingConfig(max_new_tokens=10, steps=5, temperature=0.9, seed=5),  # Mask-Predict, one block
    DecodingConfig(strategy="confidence", draft_length=2, max_new_tokens=9, draft_accept=1e-30),  # every draft kept
    DecodingConfig(strategy="confidence", block_length=3, max_new_tokens=9, block_cache="append", length_beam=2),
]


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_engine_merges_speculative_and_ordinary_requests_each_as_alone(shift, monkeypatch):
    """The server's engine runs speculative requests (m = 2: greedy, seeded sampling, every draft kept) in the same
    model calls as ordinary ones (blocks with the append cache, whose held blocks ride on the next step; Mask-Predict;
    a length beam), arriving at different steps: each answer is token for token what `generate_ids` gives it alone
    with the same config and seed, each step is one model call, a speculative request takes generate_ids' calls, its
    stable part is what it wrote so far, and ``engine.positions`` is what the calls computed."""
    from biglm.generation import DecodeEngine

    model = _blocks_model(shift_logits=shift)
    alone = [generate_ids(model, torch.tensor([p]), config=c) for p, c in zip(ENGINE_PROMPTS, ENGINE_CONFIGS)]
    seen: list[int] = []
    real = model.forward

    def spy(input_ids, *args, **kwargs):
        if kwargs.get("prefix_cache") is not None:  # a merged decoding call (a prompt's encode runs the inner model)
            seen.append(input_ids.numel())
        return real(input_ids, *args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    # the length beam's 2 rows make some requests wait; drafts at every load (draft_rows: `test_engine_drafts_...`)
    engine = DecodeEngine(model, max_batch_rows=5, draft_rows=5)
    arrivals = {0: [0, 2], 1: [1, 5], 3: [3, 4]}
    spec = {str(i) for i, c in enumerate(ENGINE_CONFIGS) if c.draft_length}
    events: dict[str, list] = {}
    t = mixed = 0
    while t <= max(arrivals) or engine.num_running or engine.num_waiting:
        for i in arrivals.get(t, []):
            engine.submit(str(i), ENGINE_PROMPTS[i], ENGINE_CONFIGS[i])
        before = len(seen)
        out = engine.step()
        assert len(seen) - before == (1 if out else 0)  # one merged call for every running request
        ids = {e.request_id for e in out}
        mixed += bool(ids & spec and ids - spec)
        for e in out:
            events.setdefault(e.request_id, []).append(e)
        t += 1
        assert t < 200
    assert mixed >= 3  # speculative and ordinary requests really shared calls
    for i, want in enumerate(alone):
        got = events[str(i)]
        assert got[-1].finished and got[-1].token_ids == want.token_lists()[0], i
        if ENGINE_CONFIGS[i].draft_length:
            assert got[-1].steps == want.steps
            for a, b in zip(got, got[1:]):
                assert b.stable_ids[:len(a.stable_ids)] == a.stable_ids  # written tokens are final
            assert all(e.stable_ids == e.token_ids for e in got)
    kept = [len(e.stable_ids) for e in events["4"]]
    assert kept == [1, 4, 7, 9] and alone[4].steps == 4  # m + 1 tokens a call after the first
    assert engine.positions == sum(seen)


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_engine_drafts_only_while_a_step_holds_few_rows(shift):
    """Above ``draft_rows`` running rows a new exact speculative request is decoded one token per call, and a running
    one is called without the model's mask drafts (n-gram drafts still checked): every answer stays what
    generate_ids writes alone, greedy, while the calls and positions follow the load."""
    from biglm.generation import DecodeEngine

    model = _blocks_model(shift_logits=shift)
    cfg = DecodingConfig(max_new_tokens=16, strategy="confidence", draft_length=2, draft_ngram=2)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11], [12, 13, 12, 13], [20, 21]]
    alone = [generate_ids(model, torch.tensor([p]), config=cfg) for p in prompts]
    one = cfg.override(draft_length=0, draft_ngram=0, block_length=1)
    plain = [generate_ids(model, torch.tensor([p]), config=one) for p in prompts]
    assert [p.token_lists() for p in plain] == [a.token_lists() for a in alone]
    engine = DecodeEngine(model, max_batch_rows=8, draft_rows=1)
    # (someone draws "0"'s canvas: it stays speculative under load, `test_a_speculative_request_goes_on_...`)
    engine.submit("0", prompts[0], cfg, on_step=lambda info: None)
    engine.step()  # "0" runs alone: it drafts with the model
    for i in (1, 2, 3):
        engine.submit(str(i), prompts[i], cfg)
    done: dict[str, object] = {}
    blocks = []
    while engine.num_running or engine.num_waiting:
        for e in engine.step():
            if e.finished:
                done[e.request_id] = e
        req = engine._running.get("0")
        if req is not None and engine.num_running > 1:
            blocks.append(req.decode.block)
    for i, want in enumerate(alone):
        assert done[str(i)].token_ids == want.token_lists()[0], i
    assert blocks and set(blocks) == {0}  # beside the others, "0" ran without mask drafts
    for i in (1, 2, 3):  # admitted under load: one token per call (its calls, not the drafting ones)
        e = done[str(i)]
        assert e.steps == len(e.token_ids) + (e.finish_reason == "stop"), i  # a call per token (and the EOS)



@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_a_speculative_request_goes_on_one_token_per_call_in_the_pool_once_the_engine_is_loaded(shift, monkeypatch):
    """A burst into an idle engine: its first greedy request starts speculative (alone, drafts pay); once the others
    load the engine it goes on as one token per call in the pool, so every later step is one pooled call instead of
    its own call beside it. Its answer is still what generate_ids writes alone (float32), its streamed tokens never
    change, and its calls count the drafting ones, the one that moved its last token into its cache and one a token
    after. A sampled request stays speculative (its draws would follow the load)."""
    from biglm.generation import DecodeEngine
    from biglm.generation.speculative import SpeculativeDecode

    model = _blocks_model(shift_logits=shift)
    cfg = DecodingConfig(max_new_tokens=16, strategy="confidence", draft_length=2, draft_ngram=2)
    sampled = cfg.override(temperature=0.8, seed=3)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11], [12, 13, 12, 13], [20, 21]]
    alone = [generate_ids(model, torch.tensor([p]), config=cfg) for p in prompts]
    seen: list[int] = []
    real = model.forward

    def spy(input_ids, *args, **kwargs):
        if kwargs.get("prefix_cache") is not None:  # a decoding call (a prompt's or token's encode runs the inner model)
            seen.append(input_ids.numel())
        return real(input_ids, *args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    engine = DecodeEngine(model, max_batch_rows=8, draft_rows=2)
    engine.submit("0", prompts[0], cfg)
    events: dict[str, list] = {}
    for _ in range(2):  # "0" alone: speculative, drafting
        for e in engine.step():
            events.setdefault(e.request_id, []).append(e)
    first = engine._running["0"]
    assert isinstance(first.decode, SpeculativeDecode)
    drafting_calls, written = first.decode.calls, len(first.decode.written_ids())
    assert 1 <= written < 16  # it wrote and is not done
    for i in (1, 2, 3):
        engine.submit(str(i), prompts[i], cfg)
    engine.submit("s", prompts[1], sampled)
    calls_per_step = []
    while engine.num_running or engine.num_waiting:
        before = len(seen)
        for e in engine.step():
            events.setdefault(e.request_id, []).append(e)
        if "0" in engine._running:
            assert isinstance(engine._running["0"].decode, Decode)  # moved at the first loaded step
        calls_per_step.append((len(seen) - before, "s" in engine._running))
    for i, want in enumerate(alone):
        assert events[str(i)][-1].finished and events[str(i)][-1].token_ids == want.token_lists()[0], i
    got = events["0"]
    for a, b in zip(got, got[1:]):
        assert b.stable_ids[:len(a.stable_ids)] == a.stable_ids  # what was streamed stays
    tokens = got[-1].token_ids
    assert got[-1].steps == drafting_calls + 1 + len(tokens) - written + (got[-1].finish_reason == "stop")
    assert len(got[-1].logprobs) == len(tokens)
    assert events["s"][-1].finished and len(events["s"][-1].token_ids) > 0
    # the sampled request kept a call of its own beside the pooled one; once it is gone, one call a step
    assert {n for n, s_running in calls_per_step if not s_running} == {1}


def test_a_request_arriving_just_after_a_loaded_step_starts_as_one_token_per_call(monkeypatch):
    """A wave of requests that started together ends together, and the next wave arrives one by one into an empty
    engine: a request that starts within `LOAD_MEMORY_S` of a step above ``draft_rows`` rows is decoded one token per
    call (it would otherwise need a call of its own beside every pooled call of the wave); later, alone, it drafts
    again. The same answer either way."""
    from biglm.generation import DecodeEngine
    from biglm.generation import engine as engine_module
    from biglm.generation.speculative import SpeculativeDecode

    model = _blocks_model(shift_logits=True)
    cfg = DecodingConfig(max_new_tokens=8, strategy="confidence", draft_length=2, draft_ngram=2)
    now = [100.0]
    monkeypatch.setattr(engine_module.time, "monotonic", lambda: now[0])
    engine = DecodeEngine(model, max_batch_rows=8, draft_rows=1)

    def run(rid, prompt):
        engine.submit(rid, prompt, cfg)
        kinds = []
        while engine.num_running or engine.num_waiting:
            for e in engine.step():
                if e.finished:
                    return e, kinds
            kinds.append(type(engine._running[rid].decode) if rid in engine._running else None)

    for i in range(3):  # a wave of three: above draft_rows
        engine.submit(f"w{i}", [5 + i, 6, 7], cfg)
    while engine.num_running or engine.num_waiting:
        engine.step()
    now[0] += 0.5  # the next request, half a second later: the engine is empty, but was loaded a moment ago
    soon, kinds = run("soon", [9, 10, 9, 10])
    assert kinds and SpeculativeDecode not in kinds
    now[0] += engine_module.LOAD_MEMORY_S + 0.1
    later, kinds = run("later", [9, 10, 9, 10])
    assert kinds and set(kinds) == {SpeculativeDecode}
    assert soon.token_ids == later.token_ids == generate_ids(model, torch.tensor([[9, 10, 9, 10]]),
                                                             config=cfg).token_lists()[0]
    assert soon.steps == len(soon.token_ids) + (soon.finish_reason == "stop")  # a call per token

def test_engine_finishes_a_speculative_request_at_eos_and_at_a_stop_string():
    """EOS made likely: the engine's answer is generate_ids' (cut at the EOS, finish "stop"); a stop string in the
    written tokens finishes the request there, before max_new_tokens."""
    from biglm.generation import DecodeEngine

    model = _blocks_model()
    eos = model.config.eos_token_id
    cfg = DecodingConfig(strategy="confidence", draft_length=2, max_new_tokens=20)
    likely = generate_ids(model, torch.tensor([ENGINE_PROMPTS[0]]), config=cfg).token_lists()[0][3]
    with torch.no_grad():
        model.lm_head.weight[eos] = model.lm_head.weight[likely] * 1.5  # EOS behaves like a likely token
    want = generate_ids(model, torch.tensor([ENGINE_PROMPTS[0]]), config=cfg)
    assert int(want.lengths[0]) < 20  # the answer does hold an EOS
    engine = DecodeEngine(model)
    engine.submit("a", ENGINE_PROMPTS[0], cfg)
    last = None
    while engine.num_running or engine.num_waiting:
        (last,) = engine.step()
    assert last.token_ids == want.token_lists()[0] and last.finish_reason == "stop"

    class Tok:
        def __len__(self):
            return model.config.vocab_size

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids)) + " "

    plain = _blocks_model()
    full = generate_ids(plain, torch.tensor([ENGINE_PROMPTS[2]]), config=cfg, suppress_ids=[eos]).token_lists()[0]
    i = next(i for i in range(4, 20) if full[i] not in full[:i])
    stop = f" {full[i]} "  # a written token's text (its first time): the request stops once it is written
    engine = DecodeEngine(plain, tokenizer=Tok())
    engine.submit("b", ENGINE_PROMPTS[2], cfg.override(stop=[stop], ignore_eos=True))
    events = []
    while engine.num_running or engine.num_waiting:
        events += engine.step()
    assert events[-1].finish_reason == "stop" and events[-1].token_ids == full[:len(events[-1].token_ids)]
    assert i + 1 <= len(events[-1].token_ids) <= i + 3 < 20  # the call that wrote it writes at most m + 1 tokens


def test_batch_files_run_sampled_speculative_rows_in_the_engine():
    """A batch file's sampled rows, speculative and ordinary, go through the engine together, each with its own
    seed: each row's text is the answer it gets alone."""
    from biglm.generation.batch import BatchAnswerer, BatchRow

    model = _blocks_model()

    class Tok:
        def __len__(self):
            return model.config.vocab_size

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    answerer = BatchAnswerer(model, Tok())
    spec = DecodingConfig(strategy="confidence", draft_length=2, max_new_tokens=8, temperature=1.0)
    configs = [spec.override(seed=1), spec.override(seed=2), DecodingConfig(max_new_tokens=8, steps=4, temperature=1.0)]
    rows = [BatchRow(line=i, id=str(i), prompt_ids=[5 + i, 6, 7], config=c) for i, c in enumerate(configs)]
    calls: list[int] = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        got = answerer(rows)
    finally:
        hook.remove()
    for row, out in zip(rows, got):
        alone = generate_ids(model, torch.tensor([row.prompt_ids]), config=row.config, suppress_ids=answerer.suppress)
        assert out["text"] == " ".join(map(str, alone.token_lists()[0]))
    assert len(calls) <= 8  # merged: no more calls than the longest row's (alone they would add up)


def test_serve_takes_draft_length_as_a_served_default(checkpoint, capsys):
    """`biglm serve --decoding.draft_length 2` is a served default (the engine runs it); one that does not fit the
    other options is refused at start, naming the option."""
    from biglm.serving.cli import ServeArgs, main, server_defaults

    assert main([str(checkpoint), "--decoding.draft_length", "2"]) == 2  # speculative decoding needs confidence
    err = capsys.readouterr().err
    assert "draft_length" in err and "strategy='confidence'" in err and "cannot load" not in err

    model = _blocks_model()
    args = ServeArgs(checkpoint="unused", decoding=DecodingConfig(strategy="confidence", draft_length=2))
    defaults = server_defaults(model.config, args, given=["strategy", "draft_length"])
    assert (defaults.strategy, defaults.draft_length) == ("confidence", 2)
    assert server_defaults(model.config, args, given=["strategy"]).draft_length == 0


def test_a_served_drafting_model_decodes_a_request_as_it_names():
    """A drafting model's server defaults are its own default decoding (n-gram drafts); a request that names how to
    decode (plain one token per call: draft_length 0) gets exactly that, not a 400 about the default's n-gram
    drafts, and the same config `biglm generate` builds from those flags; one that names only sampling keeps the
    drafts."""
    from biglm.generation.config import model_decoding, model_default_fields
    from biglm.serving.cli import ServeArgs, server_defaults
    from biglm.serving.protocol import CompletionRequest, decoding_config

    model = _blocks_model()
    defaults = server_defaults(model.config, ServeArgs(checkpoint="unused"), given=[])
    fields = model_default_fields(model.config, {})
    assert defaults.draft_length >= 1 and defaults.draft_ngram >= 1 and "draft_ngram" in fields
    plain = {"strategy": "confidence", "block_length": 1, "steps": 16, "draft_length": 0}
    req = CompletionRequest(model="m", prompt="x", max_tokens=16, **plain)
    got = decoding_config(req, base=defaults, max_steps=64, model_default=fields)
    assert got == model_decoding(model.config, {"max_new_tokens": 16, **plain})
    sampled = decoding_config(CompletionRequest(model="m", prompt="x", temperature=0.7), base=defaults, max_steps=64,
                              model_default=fields)
    assert sampled.draft_length == defaults.draft_length and sampled.temperature == 0.7


def test_engine_counts_requests_being_encoded_when_it_decides_to_draft():
    """Requests that arrive together are admitted together: the ones past ``draft_rows`` rows, counted with those
    whose prompts are still being encoded, start as one token per call (a call per token)."""
    from biglm.generation import DecodeEngine

    model = _blocks_model(shift_logits=True)
    cfg = DecodingConfig(max_new_tokens=12, strategy="confidence", draft_length=2, draft_ngram=2, ignore_eos=True)
    engine = DecodeEngine(model, max_batch_rows=8, draft_rows=2)
    for i in range(4):
        engine.submit(str(i), [5 + i, 6, 7, 5 + i, 6, 7], cfg)
    done = {}
    while engine.num_running or engine.num_waiting:
        done.update({e.request_id: e for e in engine.step() if e.finished})
    assert sorted(e.steps for e in done.values()) == [12] * 4  # 4 rows admitted at once > 2: none drafts


def test_on_step_reports_each_call_and_the_cli_shows_it():
    """Every call reports the slots it wrote (together: the whole answer, each once), as the CLI's --show_steps reads."""
    model = _blocks_model()
    ids, mask = _batch(model)
    steps = []
    out = generate_ids(model, ids, mask, max_new_tokens=12, strategy="confidence", draft_length=2,
                       draft_accept=1e-30, suppress_ids=[model.config.eos_token_id], on_step=steps.append)
    assert len(steps) == out.steps and all(s.strategy == "confidence" for s in steps)
    written = torch.stack([s.committed for s in steps]).long()
    assert torch.equal(written.sum(0), torch.ones_like(written[0]))  # each slot written by exactly one call
    assert torch.equal(steps[-1].output_ids, out.tokens)


def test_a_model_never_trained_on_blocks_of_1_is_warned_once_per_decode():
    """Speculative decoding runs blocks of 1; the default biglm-blocks objective trains 8, 16, 32. A model whose saved
    block lengths (config.prefix_block_lengths) lack 1 gets one warning naming them and the adaptation that trains
    blocks of 1; a model trained with them gets none, and nothing warns without draft_length."""
    ids, mask = _batch(_blocks_model())
    kw = dict(max_new_tokens=12, strategy="confidence", suppress_ids=[7])
    untrained = _blocks_model(prefix_block_lengths=[8, 16, 32])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate_ids(untrained, ids, mask, draft_length=3, **kw)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "trained on prefix blocks of 8, 16, 32 only" in said[0]
    assert "biglm pretrain blocks-adapt --init_from MODEL --objective.prefix_blocks 1,8,16,32" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        generate_ids(_blocks_model(), ids, mask, draft_length=3, **kw)  # trained on 1, 4, 8
        generate_ids(untrained, ids, mask, block_length=8, **kw)  # not speculative


def _two_sample_p(a: torch.Tensor, b: torch.Tensor) -> float:
    """The chi-square test's p-value that two samples of outcome codes come from one distribution."""
    from scipy.stats import chi2_contingency

    k = int(max(a.max(), b.max())) + 1
    table = torch.stack((torch.bincount(a, minlength=k), torch.bincount(b, minlength=k)))
    table = table[:, table.sum(0) > 0]
    return float(chi2_contingency(table.numpy()).pvalue)


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_sampled_speculative_answers_follow_one_token_per_calls_distribution(shift, monkeypatch):
    """Many sampled answers of one prompt (a 12-token vocabulary, so every outcome is seen often), drafted by the model
    and by n-grams: the empirical distribution of the answers' tokens, each position and each pair of neighbours, is
    one-token-per-call decoding's (chi-square, p > 1e-3), while drafts of both sources are kept often. The model's
    drafts run although the batch holds more than `DRAFT_ROWS` rows (its limit raised for this batch: above it a call
    carries no mask drafts, and the model's drafts were never sampled here). The test can fail: keeping a rejected
    draft's token possible in the resample (no residual) is caught."""
    from biglm.generation import speculative

    torch.manual_seed(0)
    config = BiGLMConfig.from_preset("tiny", vocab_size=12, initializer_range=0.5, prefix_attention="blocks",
                                     prefix_block_lengths=[1, 4], shift_logits=shift)
    model = BiGLMForMaskedLM(config).eval()
    n, N = 6000, 4
    monkeypatch.setattr(speculative, "DRAFT_ROWS", n)  # every call carries the model's drafts
    decodes = []
    real_init = speculative.SpeculativeDecode.__init__
    monkeypatch.setattr(speculative.SpeculativeDecode, "__init__",
                        lambda self, *a, **k: (real_init(self, *a, **k), decodes.append(self))[0])
    prompt = torch.tensor([[5, 6, 7, 5, 6, 7, 5]]).expand(n, -1)
    kw = dict(max_new_tokens=N, strategy="confidence", temperature=1.0, ignore_eos=True)
    ref = generate_ids(model, prompt, config=DecodingConfig(block_length=1, seed=1, **kw)).tokens

    def codes(tokens: torch.Tensor) -> list[torch.Tensor]:
        pairs = [tokens[:, i] * 12 + tokens[:, i + 1] for i in range(N - 1)]
        return [tokens[:, i] for i in range(N)] + pairs

    for ngram, source in ((0, "model"), (2, "ngram")):  # the model's drafts alone, then both (n-grams found first)
        cfg = DecodingConfig(draft_length=2, draft_ngram=ngram, seed=2, **kw)
        out = generate_ids(model, prompt, config=cfg)
        kept = decodes[-1].kept_by_source
        assert kept[source] > n // 10, kept  # drafts of the source were kept, often
        assert ngram == 0 or float(out.row_calls.float().mean()) < N - 0.5  # (with n-grams: in fewer calls)
        assert min(_two_sample_p(a, b) for a, b in zip(codes(ref), codes(out.tokens))) > 1e-3

    real = speculative._one_more
    monkeypatch.setattr(speculative, "_one_more", lambda check, cfg, g, *, kept, rejected, m: real(
        check, cfg, g, kept=kept, rejected=None, m=m))  # no residual: the rejected draft may be drawn again
    wrong = generate_ids(model, prompt, config=cfg).tokens
    assert min(_two_sample_p(a, b) for a, b in zip(codes(ref), codes(wrong))) < 1e-6


def test_ngram_draft_takes_what_followed_the_latest_longest_match():
    from biglm.generation.speculative import ngram_draft

    h = torch.tensor([1, 2, 3, 9, 8, 5, 2, 3, 7, 1, 2, 3])
    assert ngram_draft(h, length=2, max_n=3).tolist() == [9, 8]  # the trigram [1, 2, 3] at 0
    assert ngram_draft(h, length=5, max_n=2).tolist() == [7, 1, 2, 3]  # the latest bigram [2, 3], at 6; up to the end
    assert ngram_draft(torch.tensor([4, 5, 6]), length=3, max_n=3) is None  # nothing repeats
    assert ngram_draft(torch.tensor([5]), length=3, max_n=3) is None


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
@pytest.mark.parametrize("ngram,model_drafts", [(0, True), (3, False), (2, True)], ids=["model", "ngram", "both"])
def test_each_draft_source_writes_one_token_per_calls_answer(ngram, model_drafts, shift):
    """Each draft source alone and both: token for token one token per call's answer (float32 greedy, a left-padded
    batch of repetitive and plain prompts), the n-gram drafts kept where the text repeats, and a call without mask
    drafts runs only the pending tokens and their checks."""
    model = _blocks_model(shift_logits=shift)
    g = torch.Generator().manual_seed(1)
    base = torch.randint(5, model.config.vocab_size, (6,), generator=g).tolist()
    ids, mask = left_pad([base * 3, base[:3] * 4 + [9], [11, 12, 13, 14, 15]], pad_id=model.config.pad_token_id)
    kw = dict(max_new_tokens=24, strategy="confidence", suppress_ids=[7])
    ref = generate_ids(model, ids, mask, block_length=1, **kw)
    decodes = []
    from biglm.generation import speculative

    real = speculative.SpeculativeDecode.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        decodes.append(self)

    speculative.SpeculativeDecode.__init__ = spy
    try:
        out = generate_ids(model, ids, mask, draft_length=3, draft_ngram=ngram, draft_model=model_drafts,
                           draft_fill=model_drafts, **kw)  # (draft_fill applies without the model's blocks only)
    finally:
        speculative.SpeculativeDecode.__init__ = real
    assert out.token_lists() == ref.token_lists()
    assert out.calls_per_row() == decodes[0].row_calls.tolist()
    if ngram:
        assert decodes[0].kept_by_source["ngram"] > 0
    if not model_drafts:
        assert decodes[0].kept_by_source["model"] == 0  # (rows beside an n-gram row repeat their last token)
        assert out.positions - ids.numel() <= ids.shape[0] * out.steps * (3 + 1) * (1 + (not shift)) + 3 * out.steps


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
@pytest.mark.parametrize("fill", [True, False])
def test_a_call_with_nothing_to_check_carries_the_models_drafts_with_draft_fill(fill, shift, monkeypatch):
    """n-gram drafts with ``draft_fill``: a call that has no n-gram draft to check (the first, and wherever the text
    never showed its last token before) carries one block of m + 1 masks whose predictions are the next call's drafts;
    every other call carries none. Token for token one token per call's answer either way (float32 greedy, a batch of
    a repetitive and a plain prompt); without ``draft_fill`` no call carries a block and no model draft is kept."""

    model = _blocks_model(shift_logits=shift)
    g = torch.Generator().manual_seed(4)
    base = torch.randint(5, model.config.vocab_size, (5,), generator=g).tolist()
    ids, mask = left_pad([base * 3, [11, 12, 13, 14, 15, 16]], pad_id=model.config.pad_token_id)
    kw = dict(max_new_tokens=20, strategy="confidence", suppress_ids=[7])
    ref = generate_ids(model, ids, mask, block_length=1, **kw)
    calls, decodes = _fill_calls(monkeypatch)
    W = 4
    out = generate_ids(model, ids, mask, draft_length=W - 1, draft_ngram=2, draft_model=False, draft_fill=fill, **kw)
    assert out.token_lists() == ref.token_lists()
    bare = [c for c in calls if c[0] <= 1]  # calls with nothing to check
    assert bare and calls[0][0] == 0
    assert all(block == (W if fill and n <= 1 else 0) for n, block, _ in calls)
    if fill:  # the block's W masks ride after the token (and its check)
        assert all(width == n + (not shift) + W for n, _, width in bare)
    else:
        assert decodes[0].kept_by_source["model"] == 0
        # the token, then its check; a shift model's token alone (its next position read, `next_position`), but on
        # the first call, whose one row carries the prompt's last prediction
        assert all(width == n + (not shift or n == 0) for n, _, width in bare)


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_a_call_without_mask_drafts_checks_each_draft_under_the_one_token_condition(shift):
    """The layout of a call that carries only n-gram drafts (``block`` 0: the pending tokens, then their checks, or
    for a shift model one row after them): the check after d_1..d_j equals the one-token-per-call forward on prompt +
    c + d_1..d_j + one mask, computed apart with the biglm-blocks rule at blocks of 1."""
    model = _blocks_model(shift_logits=shift)
    mask_id, V = model.config.mask_token_id, model.config.vocab_size
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(5, V, (1, 6), generator=g)
    pending = torch.randint(5, V, (1, 4), generator=g)  # c, d_1..d_3
    W, P = 4, prompt.shape[1]
    lay = dict(pending=W, width=W, checks=not shift, block=0)
    with torch.inference_mode():
        cache = model.encode_prefix(prompt)
        rule = tree_rule(**lay)
        L = rule.shape[0]
        assert L == (W + 1 if shift else 2 * W)  # no mask block: the checks alone
        full_rule = torch.cat((torch.ones(L, P, dtype=torch.bool), rule), 1)[None]
        ids = torch.cat((pending, torch.full((1, L - W), mask_id)), 1)
        out = model(ids, prefix_cache=cache, position_ids=P + 1 + tree_offsets(**lay)[None], attention_rule=full_rule)
        read = out.logits[0, tree_predictions(**lay)]
        assert read.shape[0] == W
        for j in range(W):
            answer = torch.cat((prompt, pending[:, :j + 1], torch.full((1, 1), mask_id)), 1)
            split = P + j + 1
            one = model(answer, prefix_len=split, prompt_len=P, block_len=1).logits[0, -1]
            torch.testing.assert_close(read[j], one, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "flex", "eager"])
@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tree_mask_under_each_attention_kernel_equals_each_branch_alone_under_eager(backend, shift, dtype):
    """One speculative call over the whole tree (pending tokens, checks and the W mask groups under one attention
    rule), run by each attention kernel (the explicit rule dense for eager/sdpa's grouped path, a block mask for flex),
    gives every branch the logits eager attention gives that branch called alone: the prompt, its pending tokens as
    blocks of one, then its group's masks (float32 to 1e-5; bfloat16 within its rounding), and the pending tokens'
    keys/values those of a from-scratch eager forward."""
    model = _blocks_model(shift_logits=shift).to(dtype)
    mask_id, V = model.config.mask_token_id, model.config.vocab_size
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(5, V, (1, 7), generator=g)
    pending = torch.randint(5, V, (1, 3), generator=g)
    W, P = 3, prompt.shape[1]
    checks = not shift
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
    with torch.inference_mode():
        model.set_attn_backend("eager")
        cache = model.encode_prefix(prompt)
        branches = []
        for j in range(W):  # each branch alone, eager: the answer if d_1..d_j are right, then W masks
            answer = torch.cat((prompt, pending[:, :j + 1], torch.full((1, W), mask_id)), 1)
            split = P + j + 1
            alone = model(answer, prefix_len=split, prompt_len=P, block_len=1).logits[0]
            one = model(answer[:, :split + 1], prefix_len=split, prompt_len=P, block_len=1).logits[0, -1]
            branches.append((one, alone[split + 1:] if shift else alone[split:]))
        scratch = model.model(torch.cat((prompt, pending), 1), prefix_len=P + W, prompt_len=P, block_len=1,
                              return_cache=True)["cache"]
        model.set_attn_backend(backend)
        rule = tree_rule(pending=W, width=W, checks=checks)
        L = rule.shape[0]
        ids = torch.cat((pending, torch.full((1, L - W), mask_id)), 1)
        out = model(ids, prefix_cache=cache, attention_rule=torch.cat((torch.ones(L, P, dtype=torch.bool), rule), 1)[None],
                    position_ids=P + 1 + tree_offsets(pending=W, width=W, checks=checks)[None], return_cache=True)
        model.set_attn_backend("eager")
    logits = out.logits[0].float()
    if shift:  # check j is pending token j's row, group j's drafts its block's rows 1..m (`tree_predictions`)
        read = logits[tree_predictions(pending=W, width=W, checks=False)].view(W, W, -1)
        for j, (one, block) in enumerate(branches):
            torch.testing.assert_close(read[j, 0], one.float(), **tol)
            torch.testing.assert_close(read[j, 1:], block.float(), **tol)
    else:
        for j, (one, block) in enumerate(branches):
            group = logits[W + j * (W + 1): W + (j + 1) * (W + 1)]
            torch.testing.assert_close(group[0], one.float(), **tol)
            torch.testing.assert_close(group[1:], block.float(), **tol)
    for mine, ref in zip(out["cache"].keys + out["cache"].values, scratch.keys + scratch.values):
        torch.testing.assert_close(mine[:, :, :W].float(), ref[:, :, P:].float(), **tol)


def test_tree_layout_of_a_chain_is_the_chain_layout_and_of_a_tree_sees_ancestors():
    """`tree_layout` of a chain (each pending token the child of the one before) is the layout of a call without mask
    drafts (``block`` 0), with and without check rows; of a tree, each token sees exactly its ancestors and itself,
    at its depth."""
    from biglm.generation.speculative import tree_layout

    chain = torch.tensor([[-1, 0, 1, 2]])
    for checks in (True, False):
        rule, offsets, read = tree_layout(chain, checks=checks)
        lay = dict(pending=4, width=4, checks=checks, block=0)
        assert torch.equal(rule[0], tree_rule(**lay))
        assert torch.equal(offsets[0], tree_offsets(**lay))
        assert torch.equal(read, tree_predictions(**lay))
    #        c   a   b   a2  b2 (a and a2 children of c; b of a; b2 of a2)
    tree = torch.tensor([[-1, 0, 1, 0, 3]])
    rule, offsets, read = tree_layout(tree, checks=True)
    T, F = True, False
    sees = torch.tensor([[T, F, F, F, F], [T, T, F, F, F], [T, T, T, F, F], [T, F, F, T, F], [T, F, F, T, T]])
    assert torch.equal(rule[0, :5, :5], sees) and torch.equal(rule[0, 5:, :5], sees)
    assert torch.equal(rule[0, 5:, 5:], torch.eye(5, dtype=torch.bool)) and not rule[0, :5, 5:].any()
    assert offsets[0].tolist() == [-1, 0, 1, 0, 1, 0, 1, 2, 1, 2] and read.tolist() == [5, 6, 7, 8, 9]
    rule, offsets, read = tree_layout(tree, checks=False)
    assert torch.equal(rule[0, :5, :5], sees) and rule[0, 5].tolist() == [F] * 5 + [T]
    assert offsets[0].tolist() == [-1, 0, 1, 0, 1, 2] and read.tolist() == [1, 2, 3, 4, 5]


def test_ngram_drafts_are_the_latest_different_continuations_longest_match_first():
    from biglm.generation.speculative import ngram_drafts

    h = torch.tensor([5, 1, 2, 3, 5, 1, 4, 6, 5, 1, 2, 7, 5, 1])
    # bigram [5, 1] at 8, 4, 0: [2, 7], [4, 6], then [2, 3] (the unigram [1]'s continuations repeat them)
    got = [d.tolist() for d in ngram_drafts(h, length=2, max_n=2, count=5)]
    assert got == [[2, 7], [4, 6], [2, 3]]
    assert [d.tolist() for d in ngram_drafts(h, length=2, max_n=2, count=2)] == [[2, 7], [4, 6]]
    assert [d.tolist() for d in ngram_drafts(h, length=1, max_n=2, count=5)] == [[2], [4]]  # [2] begins [2, 7]: once


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
@pytest.mark.parametrize("branches,fill", [(2, True), (3, False), (4, True)])
def test_a_tree_of_drafts_writes_one_token_per_calls_answer(branches, fill, shift, monkeypatch):
    """``draft_branches``: several drafts a call (n-gram continuations of different matches, the model's next-best
    first tokens after a fill call) merged into a tree and checked in one call: token for token one token per call's
    answer (float32 greedy, a left-padded batch of repetitive and plain prompts), with calls that hold a real branch
    (the root with two children or more)."""
    from biglm.generation import speculative

    model = _blocks_model(shift_logits=shift)
    g = torch.Generator().manual_seed(2)
    base = torch.randint(5, model.config.vocab_size, (5,), generator=g).tolist()
    alt = base[:2] + torch.randint(5, model.config.vocab_size, (3,), generator=g).tolist()
    ids, mask = left_pad([base * 2 + alt * 2 + base[:2], [11, 12, 13, 14, 15, 16], alt + base + alt[:2]],
                         pad_id=model.config.pad_token_id)
    kw = dict(max_new_tokens=24, strategy="confidence", suppress_ids=[7])
    ref = generate_ids(model, ids, mask, block_length=1, **kw)
    trees = []
    real_segment = speculative.SpeculativeDecode.segment

    def segment(self):
        if self.parents is not None:
            trees.append(bool(((self.parents == 0) & self.node_valid).sum(1).max() > 1))
        return real_segment(self)

    monkeypatch.setattr(speculative.SpeculativeDecode, "segment", segment)
    out = generate_ids(model, ids, mask, draft_length=3, draft_ngram=2, draft_model=False, draft_fill=fill,
                       draft_branches=branches, **kw)
    assert out.token_lists() == ref.token_lists()
    assert any(trees)


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_the_right_draft_on_a_later_branch_is_kept_whole(shift, monkeypatch):
    """A tree whose first branch is wrong and whose second is the answer's next m tokens (n-gram lookup replaced by
    an oracle that knows one token per call's answer): every call keeps the second branch whole (m + 1 tokens a
    call), so the kept path's tokens, their keys/values in the cache and the checks along it are the ones one token
    per call computes (the answer equals it, float32 greedy, a left-padded batch)."""
    from biglm.generation import speculative

    model = _blocks_model(shift_logits=shift)
    V, m, N = model.config.vocab_size, 3, 24
    prompts = [[21, 22, 23, 24, 25, 26, 27], [31, 32, 33], [41, 42, 43, 44, 45]]
    ids, mask = left_pad(prompts, pad_id=model.config.pad_token_id)
    kw = dict(max_new_tokens=N, strategy="confidence", suppress_ids=[7])
    ref = generate_ids(model, ids, mask, block_length=1, **kw).token_lists()

    def oracle(history, *, length, max_n, count=1, min_n=1):
        row = next(i for i, p in enumerate(prompts) if history[:len(p)].tolist() == p)
        done = history.numel() - len(prompts[row])
        right = torch.tensor(ref[row][done:done + length], dtype=torch.long)
        wrong = torch.where(right == 5, 6, 5)  # (never the answer's token at the same slot)
        return [wrong, right][:count] if right.numel() else []

    monkeypatch.setattr(speculative, "ngram_drafts", oracle)
    out = generate_ids(model, ids, mask, draft_length=m, draft_ngram=2, draft_model=False, draft_fill=False,
                       draft_branches=2, **kw)
    assert out.token_lists() == ref
    assert out.calls_per_row() == [1 + math.ceil((N - 1) / (m + 1))] * 3  # the first call writes one token


def test_draft_branches_is_refused_where_it_cannot_apply():
    from biglm.generation.config import DecodingError

    ok = dict(strategy="confidence", draft_length=3, draft_ngram=2, draft_model=False)
    DecodingConfig(**ok, draft_branches=3)
    for bad, word in ((dict(draft_branches=0), ">= 1"), (dict(draft_branches=2, temperature=0.7), "greedily"),
                      (dict(draft_branches=2, draft_model=True), "draft_model=false")):
        with pytest.raises(DecodingError, match=word):
            DecodingConfig(**{**ok, **bad})
    model = _blocks_model()
    with pytest.raises(DecodingError, match="speculative decoding only"):  # (alone it adds to a model's default)
        generate_ids(model, torch.tensor([[5, 6, 7]]), config=DecodingConfig(strategy="confidence", draft_branches=2))
    from biglm.generation.config import drafting_default, model_decoding

    assert drafting_default(model.config)  # (a drafting model: its default is speculative)
    assert model_decoding(model.config, {"draft_branches": 2}).draft_branches == 2
    model.config.prefix_attention = "bidirectional"  # (Mask-Predict by default: nothing to add the tree to)
    assert not drafting_default(model.config)
    with pytest.raises(DecodingError, match="speculative decoding only"):
        model_decoding(model.config, {"draft_branches": 2})
    with pytest.raises(DecodingError, match="draft_fill"):  # (it would be ignored: every call carries mask blocks)
        DecodingConfig(strategy="confidence", draft_length=3, draft_ngram=2, draft_fill=False)


@pytest.mark.parametrize("backend", ["sdpa", "flex", "eager"])
@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_a_tree_call_under_each_attention_kernel_equals_each_path_alone_under_eager(backend, shift):
    """One call over a tree of drafts (`tree_layout`: c with two branches, one of them forking again), run by each
    attention kernel, gives each pending token's check the logits eager attention gives one token per call on the
    prompt and that token's path (float32, to 1e-5), and each token the keys/values of that path encoded alone."""
    from biglm.generation.speculative import tree_layout

    model = _blocks_model(shift_logits=shift)
    mask_id, V = model.config.mask_token_id, model.config.vocab_size
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(5, V, (1, 6), generator=g)
    parents = torch.tensor([[-1, 0, 1, 0, 3, 3, 1]])  # c; a, a-b, a-b2; a2, a2-d, a2-e
    tokens = torch.randint(5, V, (1, 7), generator=g)
    P, n = prompt.shape[1], parents.shape[1]
    path = lambda i: [i] if i == 0 else path(int(parents[0, i])) + [i]  # noqa: E731
    with torch.inference_mode():
        model.set_attn_backend("eager")
        cache = model.encode_prefix(prompt)
        alone = []
        for i in range(n):
            seq = torch.cat((prompt, tokens[:, path(i)], torch.full((1, 1), mask_id)), 1)
            split = seq.shape[1] - 1
            logits = model(seq, prefix_len=split, prompt_len=P, block_len=1).logits[0, -1]
            kv = model.model(seq[:, :split], prefix_len=split, prompt_len=P, block_len=1, return_cache=True)["cache"]
            alone.append((logits, [x[:, :, -1] for x in kv.keys + kv.values]))
        model.set_attn_backend(backend)
        rule, offsets, read = tree_layout(parents, checks=not shift)
        L = rule.shape[1]
        ids = torch.cat((tokens, torch.full((1, L - n), mask_id)), 1)
        out = model(ids, prefix_cache=cache, attention_rule=torch.cat((torch.ones(1, L, P, dtype=torch.bool), rule), 2),
                    position_ids=P + 1 + offsets, return_cache=True)
        model.set_attn_backend("eager")
    for i, (logits, kv) in enumerate(alone):
        torch.testing.assert_close(out.logits[0, read[i]], logits, atol=1e-5, rtol=1e-5)
        for mine, ref in zip(out["cache"].keys + out["cache"].values, kv):
            torch.testing.assert_close(mine[:, :, i], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
def test_engine_runs_trees_of_drafts_beside_other_requests_each_as_alone(shift):
    """Requests with a tree of drafts a call (``draft_branches``), one draft a call, and blocks with the append cache,
    in the same engine calls: each answer and its calls are what `generate_ids` gives it alone (float32 greedy)."""
    from biglm.generation import DecodeEngine

    model = _blocks_model(shift_logits=shift)
    base = [50, 51, 52, 53, 54]
    prompts = [base * 2 + [50, 51, 60, 61] * 2 + base[:2], base + [50, 70], [80, 81, 82, 80, 81, 83, 80, 81]]
    tree = dict(strategy="confidence", draft_length=3, draft_ngram=2, draft_model=False, max_new_tokens=16)
    configs = [DecodingConfig(**tree, draft_branches=3), DecodingConfig(**tree),
               DecodingConfig(strategy="confidence", block_length=4, max_new_tokens=12, block_cache="append"),
               DecodingConfig(**tree, draft_branches=2, draft_fill=False)]
    prompts.append(prompts[0][3:])
    alone = [generate_ids(model, torch.tensor([p]), config=c) for p, c in zip(prompts, configs)]
    engine = DecodeEngine(model, max_batch_rows=8, draft_rows=8)
    for i, (p, c) in enumerate(zip(prompts, configs)):
        engine.submit(str(i), p, c)
    done = {}
    for _ in range(100):
        for e in engine.step():
            if e.finished:
                done[e.request_id] = e
        if len(done) == len(prompts):
            break
    for i, want in enumerate(alone):
        assert done[str(i)].token_ids == want.token_lists()[0], i
        if configs[i].draft_length:
            assert done[str(i)].steps == want.steps, i


def test_a_tree_request_checks_one_draft_a_call_while_the_engine_is_loaded():
    """Above ``draft_rows`` rows a running tree request (kept speculative: someone draws its canvas) goes on with one
    draft a call (a tree's further drafts cost positions, as mask drafts do): the same answer as alone (float32
    greedy), its calls under load without a tree."""
    from biglm.generation import DecodeEngine
    from biglm.generation import speculative

    model = _blocks_model()
    base = [50, 51, 52, 53, 54]
    first = base * 2 + [50, 51, 60, 61] * 2 + base[:2]
    cfg = DecodingConfig(strategy="confidence", draft_length=3, draft_ngram=2, draft_model=False, draft_branches=3,
                         max_new_tokens=16)
    want = generate_ids(model, torch.tensor([first]), config=cfg).token_lists()[0]
    engine = DecodeEngine(model, max_batch_rows=8, draft_rows=1)
    engine.submit("0", first, cfg, on_step=lambda info: None)
    engine.step()
    engine.step()  # alone: its tree rides
    spec = engine._running["0"].decode
    assert isinstance(spec, speculative.SpeculativeDecode) and spec.branches == 3
    for i, p in enumerate(([9, 10, 11], [12, 13, 12, 13]), 1):
        engine.submit(str(i), p, cfg)
    trees_under_load, done = [], {}
    for _ in range(100):
        events = engine.step()
        if "0" in engine._running:
            trees_under_load.append(spec.parents is not None and spec.branches > 1)
        done.update({e.request_id: e for e in events if e.finished})
        if len(done) == 3:
            break
    assert done["0"].token_ids == want
    assert spec.branches == 1 and not any(trees_under_load[1:])


def test_a_shift_models_calls_without_mask_drafts_run_no_mask_adapter():
    """A drafting model (mask adapters) decoding with n-gram drafts alone: its calls carry no mask token (a shift
    model's carrier row, read by no one, holds a plain token), so no adapter runs in any call, and the text is one
    token per call's (float32). With the model's own drafts the adapters run (the count can fail)."""
    from biglm.model.modeling import BiGLMMaskAdapter

    model = _blocks_model(shift_logits=True, mask_adapter_rank=4)
    for m in model.modules():
        if isinstance(m, BiGLMMaskAdapter):
            torch.nn.init.normal_(m.up.weight, std=0.2, generator=torch.Generator().manual_seed(3))
    runs = [0]
    hooks = [m.register_forward_hook(lambda *a: runs.__setitem__(0, runs[0] + 1))
             for m in model.modules() if isinstance(m, BiGLMMaskAdapter)]
    ids, mask = _batch(model, lengths=(9,))
    ids = torch.cat((ids, ids), 1)  # a repeated text: n-gram drafts to check
    plain = generate_ids(model, ids, strategy="confidence", block_length=1, max_new_tokens=12, draft_length=0)
    runs[0] = 0
    ngram = generate_ids(model, ids, strategy="confidence", max_new_tokens=12, draft_length=3, draft_ngram=3,
                         draft_model=False, draft_fill=False)
    assert ngram.token_lists() == plain.token_lists() and runs[0] == 0
    generate_ids(model, ids, strategy="confidence", max_new_tokens=12, draft_length=3, draft_ngram=0,
                 draft_model=True)
    assert runs[0] > 0
    for h in hooks:
        h.remove()


# --- draft_fill's block while it pays (`DraftCosts`) -----------------------------------------------------------


def test_draft_costs_carry_the_block_while_its_drafts_pay_for_it():
    """The table's decision, call by call: a block first, then a call without (each kind measured, its first call
    skipped as a warm-up), the block until its drafts' yield is known, then (1 + kept per check) * t_plain >= t_block;
    a block found not paying rides again every `FILL_PROBE_EVERY` calls; each row count is measured apart."""
    from biglm.generation.speculative import FILL_MIN_CHECKS, FILL_PROBE_EVERY, DraftCosts

    costs = DraftCosts()
    assert costs.pays(1)
    costs.timed(1, True, 50.0)  # (a warm-up: not counted)
    assert costs.pays(1)
    costs.timed(1, True, 2.0)
    assert not costs.pays(1)  # the block measured: now a call without it
    costs.timed(1, False, 50.0)
    costs.timed(1, False, 1.0)
    assert costs.seconds == {(1, True): 2.0, (1, False): 1.0}
    assert costs.pays(1)  # no checks of its drafts yet
    costs.gave(1, FILL_MIN_CHECKS)  # a quarter of a token a check: 1.25 * 1.0 < 2.0
    assert not costs.pays(1)
    probes = [costs.pays(1) for _ in range(2 * FILL_PROBE_EVERY)]
    assert sum(probes) == 2 and probes.index(True) == FILL_PROBE_EVERY - 2  # (the call above waited once)
    costs.gave(5 * FILL_MIN_CHECKS, FILL_MIN_CHECKS)  # now 2.6 tokens a check (decayed sums): it pays
    assert costs.kept / costs.checked > 1.0 and all(costs.pays(1) for _ in range(3))
    assert costs.pays(2)  # two rows: measured afresh, a block first
    costs.timed(2, True, 1.0)
    costs.timed(2, True, 1.0)
    assert not costs.pays(2)  # then a call without


def _fill_calls(monkeypatch) -> tuple[list[tuple[int, int, int]], list]:
    """Each speculative call's pending tokens, mask block and width, and each decode made."""
    from biglm.generation import speculative

    calls, decodes = [], []
    real_segment, real_init = speculative.SpeculativeDecode.segment, speculative.SpeculativeDecode.__init__

    def segment(self):
        call = real_segment(self)
        calls.append((self.pending.shape[1], self.block, call.ids.shape[1]))
        return call

    def init(self, *a, **k):
        real_init(self, *a, **k)
        decodes.append(self)

    monkeypatch.setattr(speculative.SpeculativeDecode, "segment", segment)
    monkeypatch.setattr(speculative.SpeculativeDecode, "__init__", init)
    return calls, decodes


def _frozen_costs(*, pays: bool, rows: int = 1):
    """A table that says the block pays (or not) at ``rows`` rows and does not move with the calls' real times."""
    from biglm.generation.speculative import FILL_MIN_CHECKS, DraftCosts

    costs = DraftCosts(smoothing=0.0, decay=1.0)
    costs.seconds = {(rows, True): 1.0 if pays else 10.0, (rows, False): 1.0}
    costs.seen = {(rows, True): 2, (rows, False): 2}
    costs.gave(0, 100 * FILL_MIN_CHECKS)
    return costs


@pytest.mark.parametrize("shift", [False, True], ids=["own-position", "shift"])
@pytest.mark.parametrize("case", ["pays", "does-not-pay", "measure-off", "sampled", "not-loaded"])
def test_draft_fill_rides_where_the_models_table_says_it_pays(case, shift, monkeypatch):
    """A model loaded for inference (``measure_drafts``) carries draft_fill's block in a call with nothing to check
    only where its table (`DraftCosts`) says it pays; with ``draft_measure=false``, sampling, or a model not loaded
    for inference, in every such call. The answer is one token per call's either way (float32 greedy), and the calls
    with one pending token are timed into the table."""
    model = _blocks_model(shift_logits=shift)
    g = torch.Generator().manual_seed(4)
    base = torch.randint(5, model.config.vocab_size, (5,), generator=g).tolist()
    ids = torch.tensor([base * 2 + [11, 12, 13, 14, 15, 16]])
    kw = dict(max_new_tokens=20, strategy="confidence", suppress_ids=[7],
              temperature=0.7 if case == "sampled" else 0.0)
    ref = generate_ids(model, ids, block_length=1, **kw)
    model.measure_drafts = case != "not-loaded"
    model.draft_costs = costs = _frozen_costs(pays=case != "does-not-pay")
    calls, decodes = _fill_calls(monkeypatch)
    out = generate_ids(model, ids, draft_length=3, draft_ngram=2, draft_model=False,
                       draft_measure=case != "measure-off", **kw)
    bare = [block for n, block, _ in calls if n <= 1]  # calls with nothing to check
    assert bare
    if case != "sampled":
        assert out.token_lists() == ref.token_lists()
    if case == "does-not-pay":
        assert not any(bare) and decodes[0].kept_by_source["model"] == 0
    else:
        assert all(bare)  # the block in every one (the first call's included)
    timed = costs.seen.get((1, True), 0) + costs.seen.get((1, False), 0) - 4
    assert timed == (sum(n == 1 for n, _, _ in calls) if case in ("pays", "does-not-pay") else 0)


def test_the_engine_carries_draft_fill_where_the_table_says_it_pays_and_times_its_calls(monkeypatch):
    """The server's engine asks the same table, for a call of all its rows, and times its calls with nothing to check
    into it: a fresh table measures a block, then a call without; a table that says the block does not pay keeps it
    out; the answer is `generate_ids`' (float32 greedy)."""
    from biglm.generation import DecodeEngine
    from biglm.generation.speculative import DraftCosts

    model = _blocks_model(shift_logits=True)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(5, model.config.vocab_size, (5,), generator=g).tolist() * 2 + [11, 12, 13]
    config = DecodingConfig(strategy="confidence", max_new_tokens=16, draft_length=3, draft_ngram=2, draft_model=False)
    want = generate_ids(model, torch.tensor([prompt]), config=config).token_lists()[0]
    model.measure_drafts = True
    for table, carried in ((DraftCosts(), None), (_frozen_costs(pays=False), False)):
        model.draft_costs = table
        calls, _ = _fill_calls(monkeypatch)
        engine = DecodeEngine(model, draft_rows=4)
        engine.submit("r", prompt, config)
        events = []
        while engine.num_running or engine.num_waiting or engine.num_prefilling:
            events += engine.step()
        assert events[-1].finished and events[-1].token_ids == want
        bare = [block for n, block, _ in calls if n <= 1]
        if carried is None:  # a fresh table: a block first, then one call without (each kind's first is a warm-up)
            assert bare[:2] == [4, 4] and table.seen.get((1, True), 0) >= 1
            assert sum(table.seen.values()) == sum(n == 1 for n, _, _ in calls)
        else:
            assert not any(bare)


def test_next_position_with_indices_reads_what_the_bool_form_reads():
    """``next_position`` (a shift model's speculative call without its carrier row): ``logits_positions`` as indices
    into (B, L + 1) positions give the logits the (B, L + 1) boolean form gives, the last column the position after
    the input; refused for a model without ``shift_logits`` or with a boolean mask."""
    model = _blocks_model(shift_logits=True)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, model.config.vocab_size, (2, 9), generator=g)
    with torch.inference_mode():
        cache = model.encode_prefix(ids[:, :6])
        where = torch.zeros(2, 4, dtype=torch.bool)
        where[0, [1, 3]] = True
        where[1, [0, 2, 3]] = True
        want = model(ids[:, 6:], prefix_cache=cache, logits_positions=where).logits
        got = model(ids[:, 6:], prefix_cache=cache, logits_positions=where.reshape(-1).nonzero().squeeze(1),
                    next_position=True).logits
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        ends = model(ids[:, 6:], prefix_cache=cache, logits_positions=torch.tensor([3, 7]), next_position=True).logits
        torch.testing.assert_close(ends, want[[1, 4]], rtol=1e-5, atol=1e-5)  # (each row's next position)
        assert not torch.allclose(ends[0], ends[1])
        with pytest.raises(ValueError, match="next_position"):
            model(ids[:, 6:], prefix_cache=cache, logits_positions=where, next_position=True)
        with pytest.raises(ValueError, match="next_position"):
            _blocks_model().forward(ids, logits_positions=torch.tensor([0]), next_position=True)
