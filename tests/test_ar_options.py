"""Issue 23's options for a model adapted from an autoregressive one: the "shift" and attention annealing.

- `BiGLMConfig.shift_logits`: position i's logits come from position i-1's final hidden state (position 0 from its
  own). The exact prefix cache stays exact (it carries the prefix's hidden states through select / first / extend /
  merge / empty), sparse logits agree with dense, and shift off is today's model.
- `TrainConfig.attention_anneal_steps`: at step 0 the training attention is exactly causal, from step N on exactly the
  objective's; in between, the rule with a lookahead. The same in every backend; a killed run resumes exactly;
  validation always uses the objective's attention.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_train_config

import biglm  # noqa: F401  (registers the Auto classes)
from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.model.attention import AttentionMask
from biglm.model.modeling import PrefixCache
from biglm.objective.masking import annealed_lookahead
from biglm.training import Trainer
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
BACKENDS = ("eager", "sdpa", "flex")
TOL = dict(atol=1e-5, rtol=1e-5)


def _models(backend: str = "eager") -> tuple[BiGLMForMaskedLM, BiGLMForMaskedLM]:
    """The same random tiny weights without and with the shift."""
    torch.manual_seed(0)
    plain = BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", attn_backend=backend)).eval()
    shifted = BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", attn_backend=backend, shift_logits=True)).eval()
    shifted.load_state_dict(plain.state_dict())
    return plain, shifted


def _ids(b: int, l: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, 512, (b, l), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- the shift
def test_shift_is_off_by_default_and_survives_save_and_load(tmp_path):
    assert BiGLMConfig.from_preset("tiny").shift_logits is False
    _, shifted = _models()
    shifted.save_pretrained(tmp_path)
    assert BiGLMForMaskedLM.from_pretrained(tmp_path).config.shift_logits is True


@pytest.mark.parametrize("prefix_len", [None, 7])
def test_shifted_logits_are_the_previous_positions(prefix_len):
    plain, shifted = _models()
    ids = _ids(2, 16)
    with torch.no_grad():
        a = plain(ids, prefix_len=prefix_len).logits
        b = shifted(ids, prefix_len=prefix_len).logits
    torch.testing.assert_close(b[:, 1:], a[:, :-1], **TOL)
    torch.testing.assert_close(b[:, 0], a[:, 0], **TOL)  # the first position predicts from itself
    assert not torch.allclose(b[:, 1:], a[:, 1:], atol=1e-3)


def test_shift_sparse_logits_agree_with_dense():
    _, shifted = _models()
    ids = _ids(2, 16)
    pick = torch.zeros_like(ids, dtype=torch.bool)
    pick[0, 0], pick[0, 3], pick[1, 9], pick[1, 15] = True, True, True, True
    labels = torch.where(pick, ids, torch.full_like(ids, -100))
    with torch.no_grad():
        dense = shifted(ids, prefix_len=6).logits
        by_bool = shifted(ids, prefix_len=6, logits_positions=pick).logits
        by_index = shifted(ids, prefix_len=6, logits_positions=pick.reshape(-1).nonzero().squeeze(1)).logits
        by_labels = shifted(ids, prefix_len=6, labels=labels)
    for got in (by_bool, by_index, by_labels.logits):
        torch.testing.assert_close(got, dense[pick], **TOL)
    torch.testing.assert_close(by_labels.loss, torch.nn.functional.cross_entropy(dense[pick], ids[pick]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_shift_prefix_cache_is_exact_at_every_suffix_position(backend):
    _, model = _models(backend)
    ids, P = _ids(2, 30), 12
    with torch.no_grad():
        full = model(ids, prefix_len=P).logits[:, P:]
        cache = model.encode_prefix(ids[:, :P])
        assert cache.hidden is not None and cache.hidden.shape == (2, P, model.config.hidden_size)
        torch.testing.assert_close(model(ids[:, P:], prefix_cache=cache).logits, full, **TOL)
        rows = torch.tensor([1, 0, 1])  # select: several continuations share one context
        torch.testing.assert_close(model(ids[rows, P:], prefix_cache=cache.select(rows)).logits, full[rows], **TOL)
        # sparse selection with a cached prefix, the suffix's first position included
        pick = torch.zeros(2, 30 - P, dtype=torch.bool)
        pick[0, 0], pick[1, 0], pick[1, 5] = True, True, True
        sparse = model(ids[:, P:], prefix_cache=cache, logits_positions=pick).logits
        torch.testing.assert_close(sparse, full[pick], **TOL)
        # an empty prompt: the suffix's first position is the sequence's first, predicted from itself
        empty = PrefixCache.empty(model.config, batch=2, device="cpu", dtype=torch.float32)
        torch.testing.assert_close(model(ids, prefix_cache=empty).logits, model(ids).logits, **TOL)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_shift_cache_extend_first_and_merge_stay_exact(backend):
    """Block decoding's operations: a block appended (`extend`, by encode_prefix(past=) or by the fused call's
    `first`) and caches of different lengths merged (left-padded): the last prefix hidden state stays each row's."""
    _, model = _models(backend)
    ids, P1, P = _ids(2, 30), 8, 14
    with torch.no_grad():
        # what the uncached forward computes for prompt P1 + one committed block (the blocks rule)
        ref = model(ids, prefix_len=P, prompt_len=P1, block_len=P - P1).logits[:, P:]
        c1 = model.encode_prefix(ids[:, :P1])
        grown = model.encode_prefix(ids[:, P1:P], past=c1)
        torch.testing.assert_close(model(ids[:, P:], prefix_cache=grown).logits, ref, **TOL)
        # the fused call: the block rides as prefix on a suffix pass, its part of the cache taken with `first`
        out = model(ids[:, P1:], prefix_cache=c1, prefix_len=P, return_cache=True)
        folded = c1.extend(out["cache"].first(P - P1))
        torch.testing.assert_close(folded.hidden, grown.hidden, **TOL)
        torch.testing.assert_close(model(ids[:, P:], prefix_cache=folded).logits, ref, **TOL)
        # merged caches of 8 and 14 tokens: each row continues from its own last prefix position
        a, b = model.encode_prefix(ids[:1, :P1]), model.encode_prefix(ids[1:, :P])
        merged = PrefixCache.merge([a, b])
        suffix = ids[:, P:P + 6]
        pos = torch.stack([torch.arange(P1, P1 + 6), torch.arange(P, P + 6)])
        got = model(suffix, prefix_cache=merged, position_ids=pos).logits
        torch.testing.assert_close(got[0], model(suffix[:1], prefix_cache=a).logits[0], **TOL)
        torch.testing.assert_close(got[1], model(suffix[1:], prefix_cache=b).logits[0], **TOL)


def test_shift_refuses_a_cache_without_hidden_states():
    plain, shifted = _models()
    ids = _ids(1, 20)
    with torch.no_grad():
        cache = plain.encode_prefix(ids[:, :8])  # built by a model without the shift: no hidden states
        assert cache.hidden is None
        with pytest.raises(ValueError, match="no hidden states"):
            shifted(ids[:, 8:], prefix_cache=cache)


@pytest.mark.parametrize("extra", [dict(steps=6), dict(steps=6, block_length=4)])
def test_decoding_a_shift_model_is_the_same_with_and_without_the_cache(extra):
    """Decoding knows nothing of the shift: the model and its cache carry it (left-padded prompts, a length beam,
    blocks that grow the cache)."""
    from biglm.generation import generate_ids, left_pad

    torch.manual_seed(0)
    model = BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", initializer_range=0.2, shift_logits=True)).eval()
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]], pad_id=0)
    runs = [generate_ids(model, ids, mask, max_new_tokens=12, strategy="confidence", lengths=[12, 9],
                         use_cache=use_cache, **extra) for use_cache in (True, False)]
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].lengths, runs[1].lengths)



def test_a_shift_model_predicts_the_position_after_its_input():
    """`logits_positions` with one column more than the input: the position after it, from the input's last row (or
    the cache's last hidden state with no input). Equal to the logits of a mask appended as suffix, which the prefix
    never sees, so its row changes nothing before it."""
    _, model = _models()
    ids = _ids(2, 6)
    mask = torch.full((2, 1), model.config.mask_token_id)
    last = torch.zeros(2, 7, dtype=torch.bool)
    last[:, 6] = True
    with torch.no_grad():
        want = model(torch.cat((ids, mask), 1), prefix_len=6, logits_positions=last).logits
        torch.testing.assert_close(model(ids, prefix_len=6, logits_positions=last).logits, want, **TOL)
        cache = model.encode_prefix(ids)
        got = model(ids[:, :0], prefix_cache=cache, logits_positions=last[:, 6:]).logits  # no input: no pass at all
        torch.testing.assert_close(got, want, **TOL)
        with pytest.raises(ValueError, match="nothing to predict"):
            model(ids[:, :0], logits_positions=last[:, 6:])


def _blocks_shift(seed: int = 0) -> BiGLMForMaskedLM:
    torch.manual_seed(seed)
    return BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", initializer_range=0.2, shift_logits=True,
                                                    prefix_attention="blocks", prefix_block_lengths=[1, 4])).eval()


@pytest.mark.parametrize("block_cache", ["append", "exact"])
def test_one_slot_calls_of_a_shift_model_run_one_position_per_token(block_cache, monkeypatch):
    """Blocks of one slot on a shift model: each call runs the held token only (the slot's own row is read by no
    one), so the append cache computes one position per written token after the prompt, as an autoregressive model;
    the tokens are those of calls that run the slot's row too (`AnswerDenoiser.trims` off)."""
    from biglm.generation import generate_ids, left_pad
    from biglm.generation.decoding import AnswerDenoiser

    model = _blocks_shift()
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]], pad_id=0)
    kw = dict(max_new_tokens=10, strategy="confidence", block_length=1, block_cache=block_cache, steps=10)
    fast = generate_ids(model, ids, mask, **kw)
    monkeypatch.setattr(AnswerDenoiser, "trims", lambda self, query, commit=None: False)
    slow = generate_ids(model, ids, mask, **kw)
    assert torch.equal(fast.tokens, slow.tokens) and torch.equal(fast.lengths, slow.lengths)
    assert fast.positions == slow.positions - 3 * 10  # one row fewer per call, in each of the 3 rows
    if block_cache == "append":  # the prompts once, then the 9 held tokens (the last is never encoded)
        assert fast.positions == 3 * 7 + 3 * 9


def test_the_engine_mixes_one_slot_shift_calls_with_others_each_as_alone():
    """The server's engine merges requests whose calls run without the slot's row (blocks of one on a shift model)
    with requests that run full windows (blocks of 4, no blocks, a length beam), arriving at different steps: every
    answer is the one `generate_ids` gives it alone."""
    from biglm.generation import DecodeEngine, DecodingConfig, generate_ids

    model = _blocks_shift()
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15, 16, 17], [18, 19]]
    configs = [DecodingConfig(max_new_tokens=8, steps=8, strategy="confidence", block_length=1),
               DecodingConfig(max_new_tokens=8, steps=4, strategy="confidence", block_length=4),
               DecodingConfig(max_new_tokens=6, steps=6, strategy="confidence", block_length=1, temperature=1.0, seed=3),
               DecodingConfig(max_new_tokens=8, steps=4),
               DecodingConfig(max_new_tokens=8, steps=8, strategy="confidence", block_length=1, length_beam=2,
                              length_head=False)]
    alone = [generate_ids(model, torch.tensor([p]), config=c).token_lists()[0] for p, c in zip(prompts, configs)]
    engine = DecodeEngine(model, max_batch_rows=8)
    arrivals, done, t = {0: [0, 1], 1: [2], 2: [3, 4]}, {}, 0
    while t <= max(arrivals) or engine.num_running or engine.num_waiting:
        for i in arrivals.get(t, []):
            engine.submit(str(i), prompts[i], configs[i])
        done.update({e.request_id: e.token_ids for e in engine.step() if e.finished})
        t += 1
        assert t < 100
    assert [done[str(i)] for i in range(len(prompts))] == alone


# ---------------------------------------------------------------------------------------- attention annealing
def test_lookahead_schedule():
    L, N = 32, 5
    got = [annealed_lookahead(s, anneal_steps=N, seq_len=L) for s in range(8)]
    assert got == [0, 6, 12, 18, 24, None, None, None]
    assert annealed_lookahead(0, anneal_steps=0, seq_len=L) is None  # 0: switch at once


def _rule(prefix_len: torch.Tensor, L: int, lookahead: int | None) -> torch.Tensor:
    """The explicit rule, written out: BiGLM (query i sees key j iff i >= p or j < p), and j <= i + lookahead."""
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    p = prefix_len[:, None, None]
    ok = (i >= p) | (j < p)
    return ok if lookahead is None else ok & (j <= i + lookahead)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lookahead_zero_is_causal_in_every_backend(backend):
    plain, _ = _models(backend)
    ids = _ids(2, 24)
    with torch.no_grad():
        causal = plain(ids, causal=True).logits
        torch.testing.assert_close(plain(ids, prefix_len=9, lookahead=0).logits, causal, **TOL)
        # a lookahead as long as the window is the rule itself
        torch.testing.assert_close(plain(ids, prefix_len=9, lookahead=23).logits, plain(ids, prefix_len=9).logits,
                                   **TOL)
        mid = plain(ids, prefix_len=9, lookahead=4).logits
        eager = _models("eager")[0](ids, prefix_len=9, lookahead=4).logits
    torch.testing.assert_close(mid, eager, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(mid, causal, atol=1e-3)


def _trainer(data, out, **kw) -> Trainer:
    cfg = tiny_train_config(out, data={str(data / "shards"): 1.0}, **kw)
    return Trainer(cfg, info=SINGLE, echo=lambda s: None)


def test_annealed_training_masks_go_from_causal_to_the_objectives(synthetic_data, tmp_path):
    trainer = _trainer(synthetic_data, tmp_path, attention_anneal_steps=4)
    L = trainer.cfg.seq_len
    seen = {}
    for step in (0, 2, 4, 5):
        trainer.step = step
        micro, _ = trainer.step_batches()
        batch = micro[0][0]
        args = batch.attention()
        mask = AttentionMask(batch=batch.input_ids.shape[0], q_len=L, k_len=L, prefix_len=args["prefix_len"],
                             lookahead=args.get("lookahead"))
        dense = mask.dense(torch.device("cpu"))[:, 0]
        seen[step] = args.get("lookahead")
        assert torch.equal(dense, _rule(batch.prefix_len, L, seen[step])), step
        if step == 0:  # exactly causal, whatever the drawn prefix lengths
            assert torch.equal(dense, torch.ones(L, L, dtype=torch.bool).tril().expand_as(dense))
        if step >= 4:  # exactly the BiGLM mask: the batch carries no lookahead at all
            assert "lookahead" not in args
    assert seen == {0: 0, 2: (2 * (L - 1)) // 4, 4: None, 5: None}
    trainer.step = 0


def test_annealed_run_resumes_exactly(synthetic_data, tmp_path):
    full = _trainer(synthetic_data, tmp_path / "full", attention_anneal_steps=5).train()

    class Killed(Exception):
        pass

    def kill(trainer, step):
        if step == 4:
            raise Killed

    cfg = tiny_train_config(tmp_path / "crashed", data={str(synthetic_data / "shards"): 1.0}, attention_anneal_steps=5)
    with pytest.raises(Killed):
        Trainer(cfg, info=SINGLE, echo=lambda s: None, after_step=kill).train()  # checkpoint of step 3 is the newest
    resumed = _trainer(synthetic_data, tmp_path / "crashed", attention_anneal_steps=5).train()
    assert [s for s, _ in resumed.losses] == [4, 5, 6]
    assert resumed.losses == [(s, l) for s, l in full.losses if s > 3]  # exact, step for step
    # annealing changed the training: the same run without it has other losses
    plain = _trainer(synthetic_data, tmp_path / "plain").train()
    assert plain.losses[0][1] != full.losses[0][1]


def test_validation_uses_the_objectives_attention(synthetic_data, tmp_path):
    annealed = _trainer(synthetic_data, tmp_path / "a", attention_anneal_steps=6)
    plain = _trainer(synthetic_data, tmp_path / "b")
    assert annealed.step_batches()[0][0][0].lookahead == 0  # training at step 0 is causal...
    assert annealed.validate() == plain.validate()  # ...validation is not (same seed, same weights)


def test_seq2seq_length_path_shifts_its_token_logits_too():
    """The CMLM model's length-logits forward gives the same token logits as its masked-LM forward under the shift."""
    from biglm import BiGLMConfig
    from biglm.model import BiGLMForConditionalGeneration

    torch.manual_seed(0)
    model = BiGLMForConditionalGeneration(BiGLMConfig.from_preset("tiny", shift_logits=True)).eval()
    ids = torch.randint(5, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        joint = model(ids, prefix_len=5, return_length_logits=True).logits.reshape(2, 12, -1)
        plain = model(ids, prefix_len=5).logits
    torch.testing.assert_close(joint, plain, atol=1e-5, rtol=1e-5)


def test_model_card_says_the_model_predicts_from_the_previous_position():
    from biglm import BiGLMConfig
    from biglm.checkpoint.model_card import _architecture

    assert "previous position" in "\n".join(_architecture(BiGLMConfig.from_preset("tiny", shift_logits=True)))
    assert "previous position" not in "\n".join(_architecture(BiGLMConfig.from_preset("tiny")))
