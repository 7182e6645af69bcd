"""The batch-invariant mode (`load_model(..., batch_invariant=True)`, `--batch_invariant`): a request's answer does not
depend on what it is decoded beside, in bfloat16 too: the kernels (attention, the prepacked linears), a tiny model
through the engine and `generate`, and the real SmolLM2 converted from its GGUF file."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import biglm  # noqa: F401  (registers the Auto classes)
from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import DecodingConfig, generate_ids, left_pad
from biglm.generation.engine import DecodeEngine
from biglm.model.attention import AttentionMask, batch_invariant_attention
from biglm.model.packed import RowByRowLinear, pack_linears, row_count_dependent

def test_attention_row_is_the_same_alone_and_beside_padded_rows():
    """A row's attention alone (one row, no padding) equals the same row in a batch of three whose cache is padded to
    the longest and followed by the call's own keys (the engine's pooled layout: padding between a row's real keys; or
    left-padded, a merged cache), with more queries (padded) than the row has. The default kernels differ here (the fused one for a single row,
    `grouped_attention` with the keys shifted for a batch: a few rows in 150 differ in bfloat16)."""
    g = torch.Generator().manual_seed(0)
    H, Hkv, D = 9, 3, 64
    r = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    for t in range(300):  # short rows too: 15 real keys alone vs 4 padding after them once differed (a vector's tail)
        w, n, pad, extra_q = (int(torch.randint(lo, hi, (), generator=g))
                              for lo, hi in ((1, 13), (1, 40) if t % 2 else (5, 300), (0, 60), (0, 4)))
        q, k, v = r(1, H, w, D), r(1, Hkv, n + w, D), r(1, Hkv, n + w, D)
        alone = batch_invariant_attention(q, k, v, AttentionMask(batch=1, q_len=w, k_len=n + w, q_offset=n,
                                                                 batch_invariant=True))
        B, W, L = 3, w + extra_q, n + pad + w + extra_q
        Q, K, V = r(B, H, W, D), r(B, Hkv, L, D), r(B, Hkv, L, D)
        Q[0, :, :w] = q[0]
        left = t % 3 == 0  # the cache left-padded (a merged cache, beside a speculative request) or right-padded (pooled)
        for big, small in ((K, k), (V, v)):
            big[0, :, pad * left:n + pad * left], big[0, :, n + pad:n + pad + w] = small[0, :, :n], small[0, :, n:]
        valid = torch.ones(B, L, dtype=torch.bool)
        valid[0, slice(0, pad) if left else slice(n, n + pad)] = False
        valid[0, n + pad + w:] = False
        mask = AttentionMask(batch=B, q_len=W, k_len=L, q_offset=n + pad, key_valid=valid, batch_invariant=True)
        given = K.clone(), V.clone()
        assert torch.equal(batch_invariant_attention(Q, K, V, mask)[0, :, :w], alone[0]), (w, n, pad, extra_q, left)
        assert torch.equal(K, given[0]) and torch.equal(V, given[1])  # laid out in a copy: the cache is untouched


def test_attention_takes_long_queries_in_chunks_with_the_same_rows():
    """A call longer than a query chunk (a prompt's encoding) gives each query what a short call gives it."""
    import biglm.model.attention as A

    torch.manual_seed(0)
    L = A.INVARIANT_QUERY_CHUNK + 40
    q, k, v = (torch.randn(1, h, L, 64, dtype=torch.bfloat16) for h in (9, 3, 3))
    full = batch_invariant_attention(q, k, v, AttentionMask(batch=1, q_len=L, k_len=L, batch_invariant=True))
    tail = batch_invariant_attention(q[:, :, -5:], k, v, AttentionMask(batch=1, q_len=5, k_len=L, q_offset=L - 5,
                                                                       batch_invariant=True))
    assert torch.equal(full[:, :, -5:], tail)


def _skewed_linear(real):
    """A planted row-count-dependent kernel: calls of several rows round large outputs one step differently (what a
    real model's SwiGLU rows met in the prepacked bfloat16 down_proj; random rows give no output that large)."""
    def linear(x, w, b=None):
        out = real(x, w, b)
        if x.reshape(-1, x.shape[-1]).shape[0] > 1:
            out = out + (out.abs() > 4).to(out.dtype) * out * 2 ** -7
        return out
    return linear


def _activations(model, ids) -> dict[str, torch.Tensor]:
    """Each linear layer's input rows (R, in) as ``model`` reads ``ids``: real activations."""
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: seen.__setitem__(
        name, args[0].reshape(-1, args[0].shape[-1]).clone()) if name not in seen else None)
        for name, m in model.named_modules() if isinstance(m, (torch.nn.Linear, RowByRowLinear))]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return seen


# real_invariant (the real SmolLM2 loaded once per session, bfloat16, batch_invariant=True): tests/conftest.py


def test_linear_row_in_bfloat16_does_not_depend_on_the_row_count(real_invariant, monkeypatch):
    """Real activations (each linear layer's inputs as SmolLM2-135M reads a text in the mode: SwiGLU outputs, large and
    sparse-ish, where random rows had hidden the prepacked down_proj's row-count dependence): every layer of a model
    loaded with ``batch_invariant=True`` gives a row alone the bits it gives at the first, middle or last place of 2-24
    rows. And the load's measurement is what makes it so: a planted kernel that rounds several rows' large outputs
    differently is found on real rows (random rows through a random layer, the old check, miss it) and a `RowByRowLinear` of it is row-invariant."""
    torch.set_num_threads(1)
    model, tok = real_invariant
    ids = torch.tensor([tok("The three laws of robotics are, first, that a robot may not injure a human being",
                            add_special_tokens=False)["input_ids"] + [model.config.mask_token_id] * 3])
    seen = _activations(model, ids)
    last = len(model.model.layers) - 1
    names = [n for n in seen if ".mlp.down_proj" in n or f"layers.{last}." in n or "layers.0." in n or n == "lm_head"]
    for name in names:
        layer, xs = model.get_submodule(name), seen[name]
        alone = [layer(x[None])[0] for x in xs]
        for M in (2, 3, 5, 8, 13, 24):
            for start in range(0, xs.shape[0] - M + 1, M):
                out = layer(xs[start:start + M])
                assert all(torch.equal(out[i], alone[start + i]) for i in range(M)), (name, M, start)
    down = model.model.layers[3].mlp.down_proj
    rows = seen["model.layers.3.mlp.down_proj"][-6:]
    monkeypatch.setattr(torch.nn.functional, "linear", _skewed_linear(torch.nn.functional.linear))
    assert row_count_dependent(down, rows) > 0  # found with real rows ...
    torch.manual_seed(0)  # ... and not by the old check: random rows through a random layer
    random = torch.nn.Linear(down.in_features, down.out_features, bias=False).to(torch.bfloat16)
    assert row_count_dependent(random, torch.randn(6, down.in_features).to(torch.bfloat16)) == 0
    assert row_count_dependent(RowByRowLinear(down), rows) == 0


def _tiny_bf16(*, batch_invariant: bool, blocks: bool = False) -> BiGLMForMaskedLM:
    # a shift model (a converted one's one-position path) with peaked predictions, in bfloat16, prepacked; or a
    # biglm-blocks model (trained on blocks of 1: speculative decoding's)
    torch.manual_seed(0)
    kind = dict(prefix_attention="blocks", prefix_block_lengths=[1, 4, 8]) if blocks else dict(shift_logits=True)
    model = BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", initializer_range=0.2, attn_backend="sdpa",
                                                     **kind)).to(torch.bfloat16).eval()
    if torch.backends.mkldnn.is_available():
        pack_linears(model)
    model.model.batch_invariant = batch_invariant
    return model


MIXED = [DecodingConfig(max_new_tokens=10, strategy="confidence", block_length=1, block_cache="append"),
         DecodingConfig(max_new_tokens=10, strategy="confidence", block_length=1, block_cache="append",
                        temperature=0.9, seed=3),
         DecodingConfig(max_new_tokens=9, strategy="confidence", steps=9),
         DecodingConfig(max_new_tokens=10, steps=4, temperature=1.0, top_k=20, seed=7),
         DecodingConfig(max_new_tokens=10, strategy="confidence", draft_length=3),
         DecodingConfig(max_new_tokens=10, strategy="confidence", draft_length=2, temperature=0.8, seed=5),
         DecodingConfig(max_new_tokens=12, strategy="confidence", block_length=4, steps=6),
         DecodingConfig(max_new_tokens=8, steps=4, length_beam=2)]


def _answers(model, requests, *, together: bool, **engine_kw) -> dict[str, list[int]]:
    """Each request's answer from the engine: all submitted at once (``together``), or each alone."""
    groups = [requests] if together else [[r] for r in requests]
    answers = {}
    with warnings.catch_warnings():  # the append cache on a bidirectional-prefix model: an approximation, said once
        warnings.simplefilter("ignore")
        for group in groups:
            engine = DecodeEngine(model, max_batch_rows=64, **engine_kw)
            for rid, prompt, cfg in group:
                engine.submit(rid, prompt, cfg)
            while engine.num_running or engine.num_waiting:
                answers.update({e.request_id: e.token_ids for e in engine.step() if e.finished})
    return answers


def _requests(prompts: list[list[int]], configs: list[DecodingConfig] = MIXED):
    return [(str(i), p, configs[i % len(configs)]) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("blocks", [False, True], ids=["shift", "blocks"])
def test_engine_answers_alone_equal_batched_in_bfloat16_on_a_tiny_model(blocks):
    """Greedy and seeded sampling, one position per token, iterative unmasking, blocks, a length beam and speculative
    decoding (mixed settings and prompt lengths, three of them >= 64 tokens, encoded over steps by chunked prefill),
    in bfloat16, on a shift and a biglm-blocks model: each answer decoded beside the others is its answer alone, and a
    long prompt's chunked prefill gives the cache `encode_prefix` gives it, bit for bit. `generate_ids` over the same
    prompts left-padded into one batch writes each prompt's greedy answer alone too, speculative decoding included
    (every RoPE position counted per row: planting the padding back into the speculative answer positions leaves 1
    of 10 equal)."""
    from biglm.generation.engine import _Prefill

    model = _tiny_bf16(batch_invariant=True, blocks=blocks)
    g = torch.Generator().manual_seed(1)
    V = model.config.vocab_size
    lengths = (3, 17, 9, 30, 1, 12, 70, 6, 100, 21, 66)
    prompts = [torch.randint(5, V - 1, (n,), generator=g).tolist() for n in lengths]
    requests = _requests(prompts)
    chunk = dict(prefill_chunk=16)  # the long prompts are encoded over several steps
    assert _answers(model, requests, together=True, **chunk) == _answers(model, requests, together=False)
    long = torch.tensor([prompts[8]])
    prefill = _Prefill(model, long)
    while prefill.left:
        prefill.advance(16)
    mine, whole = prefill.cache(), model.encode_prefix(long)
    assert all(torch.equal(a, b) for a, b in zip(mine.keys + mine.values, whole.keys + whole.values))
    for cfg in MIXED[0], MIXED[2], MIXED[4]:  # greedy (a batch samples from one generator: its rows draw in turn)
        alone = [generate_ids(model, torch.tensor([p]), config=cfg).token_lists()[0] for p in prompts]
        batched = generate_ids(model, *left_pad(prompts, pad_id=model.config.pad_token_id), config=cfg).token_lists()
        assert batched == alone, cfg


def test_load_model_and_the_commands_refuse_what_the_mode_cannot_keep(checkpoint, capsys):
    from biglm.checkpoint import load_model
    from biglm.generation.cli import main as generate_main

    with pytest.raises(ValueError, match="batch_invariant runs on a CPU without compile"):
        load_model(checkpoint, compile=True, batch_invariant=True)
    with pytest.raises(ValueError, match="batch_invariant is measured for bfloat16 weights, and these are torch.float32"):
        load_model(checkpoint, batch_invariant=True)  # float32 weights
    capsys.readouterr()
    assert generate_main([str(checkpoint), "--prompt", "the", "--batch_invariant", "--compile"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--batch_invariant runs on a CPU without --compile" in err, err
    model, _ = load_model(checkpoint, dtype=torch.bfloat16, batch_invariant=True)
    assert model.model.batch_invariant and load_model(checkpoint, pack=True)[0].model.batch_invariant is False


def test_generate_and_serve_take_batch_invariant(checkpoint, tmp_path, capsys, monkeypatch):
    """`biglm generate --batch_invariant` prints, for a prompt beside another (left-padded), what it prints for it
    alone: with ``--strategy confidence``, and with a drafting model's own default (speculative decoding, n-gram
    drafts: its answer positions once counted the padding, and a row beside a longer prompt wrote other text); `biglm
    serve --batch_invariant` loads the model in the mode."""
    from transformers import PreTrainedTokenizerFast

    from biglm.generation import speculative
    from biglm.generation.cli import main as generate_main
    from biglm.serving.cli import ServeArgs, build_app
    from conftest import save_random_model

    drafting = save_random_model(tmp_path / "blocks", PreTrainedTokenizerFast.from_pretrained(checkpoint),
                                 prefix_attention="blocks", prefix_block_lengths=[1, 4, 8], initializer_range=0.2)
    decodes = []
    real = speculative.SpeculativeDecode.__init__
    monkeypatch.setattr(speculative.SpeculativeDecode, "__init__",
                        lambda self, *a, **k: (real(self, *a, **k), decodes.append(self))[0])
    flags = ["--batch_invariant", "--dtype", "bfloat16", "--max_new_tokens", "12"]
    short = "the king the king the king"
    for model, extra in ((checkpoint, ["--strategy", "confidence"]), (drafting, [])):
        outs = []
        for prompts in ([short], [short, "a long prompt of several words to pad the other one, and more words"]):
            assert generate_main([str(model), *sum((["--prompt", p] for p in prompts), []), *flags, *extra]) == 0
            outs.append(capsys.readouterr().out.split("### prompt 2:")[0])
        assert outs[0] == outs[1]
    assert len(decodes) == 2  # the drafting model's default ran speculative decoding, alone and batched
    assert decodes[1].B == 2 and not bool(decodes[1].start.eq(decodes[1].P).all())  # left-padded: real counts
    app = build_app(ServeArgs(checkpoint=str(checkpoint), batch_invariant=True, dtype="bfloat16"))
    assert app.state.scheduler.engine.model.model.batch_invariant


REAL_TOKENS = 4  # the real model's answers (see below)


def test_engine_is_batch_invariant_in_bfloat16_on_the_real_model(real_invariant):
    """The real SmolLM2-135M (converted from its GGUF file), in bfloat16 with `load_model(..., batch_invariant=True)`:
    eight requests of mixed prompt lengths and settings (greedy and seeded sampling, one position per token, iterative
    unmasking, speculative decoding) decoded together by the engine answer exactly what each answers alone (without
    the mode 3-4 of 8 differ: docs/serving.md), and `generate_ids`' left-padded speculative batch writes each
    prompt's answer alone (four of the prompts, 1-8 tokens: the longest, the issue's "In 1492, Columbus", beside three
    rows left-padded by 1, 4 and 7). Answers of at most `REAL_TOKENS` = 4 tokens (`MIXED`'s settings otherwise): in
    this mode each row of a merged call costs what it costs alone (and the speculative requests widen every call to
    20 rows), while what the test catches shows early: loaded without the mode, the 2 of the 8 answers that differ
    differ at their second token (the same 2 at 6 tokens and at `MIXED`'s 8-12), and the planted padding bug below
    shows at the second and third token (at 4, 6 and 12 tokens; measured on this CPU, AMD EPYC, torch 2.13)."""
    torch.set_num_threads(1)
    model, tok = real_invariant
    texts = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "In 1492, Columbus",
             "Water boils at a temperature of", "My favourite recipe for pancakes starts with", "Hello",
             "The three laws of robotics are"]
    configs = [dataclasses.replace(c, max_new_tokens=min(c.max_new_tokens, REAL_TOKENS)) for c in MIXED]
    requests = _requests([tok(t, add_special_tokens=False)["input_ids"] for t in texts], configs)
    together = _answers(model, requests, together=True)
    assert together == _answers(model, requests, together=False)
    assert len({tuple(a) for a in together.values()}) == len(texts)  # real answers, not one degenerate string
    # `generate`'s left-padded batch, speculative (its answer positions count each row's real tokens: counting the
    # padding, 1 of 10 such answers was the one alone), greedy; every padded row can show that bug, so four prompts of
    # four lengths (three rows padded) keep the check at half the eight's cost: that bug planted back, 2 of the 3
    # padded rows differ from their answer alone (bf16, on a conversion of the same file; at 12 tokens as at 4: at
    # the second and third token)
    prompts = [requests[i][1] for i in (3, 5, 0, 6)]
    assert len({len(p) for p in prompts}) == 4
    cfg = DecodingConfig(max_new_tokens=REAL_TOKENS, strategy="confidence", draft_length=3)
    alone = [generate_ids(model, torch.tensor([p]), config=cfg).token_lists()[0] for p in prompts]
    assert generate_ids(model, *left_pad(prompts, pad_id=model.config.pad_token_id), config=cfg).token_lists() == alone
