"""`biglm convert`: a random tiny Llama / Qwen2 saved by transformers becomes a BiGLM whose logits equal the source's
under the causal test switch (every position) and under BiGLM attention (one-token inputs); what BiGLM cannot
represent is refused in one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from biglm.checkpoint.convert import ConvertError, convert_checkpoint
from biglm.model import BiGLMForMaskedLM

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=5000.0)
TEXT = ["the quick brown fox jumps over the lazy dog", "a small tokenizer for a small model", "pack my box with five"] * 20


@pytest.fixture(scope="module")
def tok_with_mask():
    from biglm.data.tokenizer import train_tokenizer

    return train_tokenizer(texts=TEXT, vocab_size=300)


@pytest.fixture(scope="module")
def tok_without_mask():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=290, special_tokens=["<s>", "</s>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


def _save_source(root: Path, kind: str, tok, **overrides) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls_cfg, cls_model = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    cfg = cls_cfg(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id, **{**SHAPE, **overrides})
    torch.manual_seed(0)
    model = cls_model(cfg).float()
    with torch.no_grad():  # norms and biases away from their 1/0 init, so a wrong mapping shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    out = root / kind
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _check_logits(src: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
    vocab = source.config.vocab_size
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = source(ids).logits
        ref1 = source(ids[:, :1]).logits
        for backend in ("eager", "sdpa", "flex"):
            model = BiGLMForMaskedLM.from_pretrained(out, dtype=torch.float32).eval()
            model.set_attn_backend(backend)
            got = model(ids, causal=True).logits
            torch.testing.assert_close(got[..., :vocab], ref, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(model(ids[:, :1]).logits[..., :vocab], ref1, rtol=1e-4, atol=1e-4)
        # without the switch, attention is bidirectional: earlier positions change
        assert not torch.allclose(model(ids).logits[:, 0, :vocab], ref[:, 0], atol=1e-3)


@pytest.mark.parametrize("tied", [True, False])
def test_llama_converts_with_equal_logits(tmp_path, tok_with_mask, tied, capsys):
    src = _save_source(tmp_path, "llama", tok_with_mask, tie_word_embeddings=tied)
    out = convert_checkpoint(src, tmp_path / "biglm")
    model = BiGLMForMaskedLM.from_pretrained(out)
    cfg = model.config
    assert (cfg.tie_word_embeddings, cfg.num_key_value_heads, cfg.rope_theta, cfg.rms_norm_eps) == (tied, 2, 5000.0, 1e-6)
    assert cfg.mask_token_id == tok_with_mask.mask_token_id and cfg.vocab_size == len(tok_with_mask)
    assert not cfg.attention_bias and model.model.layers[0].self_attn.q_proj.bias is None
    assert "added" not in capsys.readouterr().out
    _check_logits(src, out)


@pytest.mark.parametrize("tied", [True, False])
def test_mask_and_pad_tokens_added_from_mean_embedding(tmp_path, tok_without_mask, tied, capsys):
    """The hub's Llama-family tokenizers have neither a mask nor a pad token: convert adds both, so the model has
    every row the tokenizer will ever ask for (training adds nothing more)."""
    from transformers import AutoTokenizer

    from biglm.data import load_tokenizer

    assert tok_without_mask.mask_token is None and tok_without_mask.pad_token is None
    src = _save_source(tmp_path, "llama", tok_without_mask, tie_word_embeddings=tied)
    out = convert_checkpoint(src, tmp_path / "biglm")
    printed = capsys.readouterr().out
    assert "no mask and no pad token: added '<mask>'" in printed and "'<pad>'" in printed and "mean" in printed
    assert ("lm_head rows" in printed) == (not tied)
    tok = AutoTokenizer.from_pretrained(out)
    model = BiGLMForMaskedLM.from_pretrained(out)
    n = len(tok_without_mask)
    assert tok.mask_token == "<mask>" and tok.mask_token_id == n == model.config.mask_token_id
    assert tok.pad_token == "<pad>" and tok.pad_token_id == n + 1 == model.config.pad_token_id
    assert model.config.vocab_size == n + 2 == len(load_tokenizer(out))  # training's tokenizer: nothing to add
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    emb = model.model.embed_tokens.weight
    for row in (n, n + 1):
        torch.testing.assert_close(emb[row], source.model.embed_tokens.weight.mean(0))
        if not tied:
            torch.testing.assert_close(model.lm_head.weight[row], source.lm_head.weight.mean(0))
    torch.testing.assert_close(emb[:n], source.model.embed_tokens.weight)
    _check_logits(src, out)


def test_qwen2_attention_biases(tmp_path, tok_with_mask):
    src = _save_source(tmp_path, "qwen2", tok_with_mask, tie_word_embeddings=False)
    out = convert_checkpoint(src, tmp_path / "biglm")
    model = BiGLMForMaskedLM.from_pretrained(out)
    attn = model.model.layers[1].self_attn
    assert model.config.attention_bias and attn.k_proj.bias is not None and attn.o_proj.bias is None
    _check_logits(src, out)


def _save_config(root: Path, kind: str, **overrides) -> Path:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[kind]
    out = root / kind
    cls(vocab_size=300, **{**SHAPE, **overrides}).save_pretrained(out)
    return out


@pytest.mark.parametrize("kind, overrides, field", [
    ("mistral", dict(sliding_window=16), "sliding_window=16"),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16), "use_sliding_window=True"),
    ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling="),
    ("llama", dict(attention_bias=True), "attention_bias=True"),
    ("llama", dict(mlp_bias=True), "mlp_bias=True"),
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_unmappable_features_refused_in_one_line(tmp_path, kind, overrides, field, capsys):
    from biglm.cli import main

    src = _save_config(tmp_path, kind, **overrides)  # no weights: the refusal comes before any is read
    with pytest.raises(ConvertError, match=field.replace("[", r"\[")) as e:
        convert_checkpoint(src, tmp_path / "out")
    assert "\n" not in str(e.value)
    assert main(["convert", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err
    assert not (tmp_path / "out").exists()


def test_mistral_without_window_converts(tmp_path, tok_with_mask):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    src = tmp_path / "mistral"
    MistralForCausalLM(MistralConfig(vocab_size=len(tok_with_mask), sliding_window=None, **SHAPE)).save_pretrained(src)
    tok_with_mask.save_pretrained(src)
    _check_logits(src, convert_checkpoint(src, tmp_path / "biglm"))


def test_cli_help():
    from biglm.cli import main

    assert main(["convert", "--help"]) == 0


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
def test_shift_predicts_position_i_with_the_sources_next_token_logits_at_i_minus_1(tmp_path, tok_with_mask, backend):
    """`--shift`: the converted model's logits at position i are its source's at i-1 (the next-token prediction
    there), under the causal test switch; position 0 predicts from itself."""
    from transformers import AutoModelForCausalLM

    src = _save_source(tmp_path, "llama", tok_with_mask, tie_word_embeddings=False)
    out = convert_checkpoint(src, tmp_path / "biglm", shift=True)
    source = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
    model = BiGLMForMaskedLM.from_pretrained(out, dtype=torch.float32).eval()
    model.set_attn_backend(backend)
    assert model.config.shift_logits
    vocab = source.config.vocab_size
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = source(ids).logits
        got = model(ids, causal=True).logits[..., :vocab]
    torch.testing.assert_close(got[:, 1:], ref[:, :-1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[:, 0], ref[:, 0], rtol=1e-4, atol=1e-4)


def test_cli_shift_option(tmp_path, tok_with_mask, capsys):
    from biglm.checkpoint.convert import SHIFT_DEFAULT
    from biglm.cli import main
    from biglm.model import BiGLMConfig

    src = _save_source(tmp_path, "llama", tok_with_mask)
    for args, shift in (([], SHIFT_DEFAULT), (["--shift"], True), (["--shift", "false"], False)):
        out = tmp_path / f"out-{len(args)}"
        assert main(["convert", str(src), str(out), *args]) == 0
        assert BiGLMConfig.from_pretrained(out).shift_logits is shift
        assert ("(shift)" in capsys.readouterr().out) is shift


# --- GGUF files (llama.cpp / Ollama) and hub ids ---------------------------------------------------------------------
def _write_gguf(path: Path, tok, *, tied: bool = False, pad_id: int | None = None) -> "torch.nn.Module":
    """Write a random tiny Llama and ``tok`` (a byte-level BPE) as a float32 GGUF file the way llama.cpp lays one out
    (its tensor names; q/k rows permuted for its RoPE, which transformers' reader undoes); return the Llama."""
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    from biglm.checkpoint.gguf_write import write_llama_gguf

    cfg = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=tied, **SHAPE)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float().eval()
    write_llama_gguf(path, model, json.loads(tok.backend_tokenizer.to_str())["model"], SHAPE,
                     specials=set(tok.all_special_tokens), bos_id=tok.bos_token_id, eos_id=tok.eos_token_id,
                     pad_id=pad_id)
    return model


def _check_gguf_logits(gguf_file: Path, out: Path, *, length: int = 12, atol: float = 1e-4, source=None) -> None:
    """Under the causal switch the BiGLM's logits equal transformers' LlamaForCausalLM read from the same file
    (``source``: that model already read, else read here)."""
    from transformers import AutoModelForCausalLM

    if source is None:
        source = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32,
                                                      attn_implementation="eager").eval()
    model = BiGLMForMaskedLM.from_pretrained(out, dtype=torch.float32).eval()
    vocab = source.config.vocab_size
    ids = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, got = source(ids).logits, model(ids, causal=True).logits[..., :vocab]
    shift = int(model.config.shift_logits)
    torch.testing.assert_close(got[:, shift:], ref[:, :length - shift], rtol=1e-4, atol=atol)


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_file_converts_with_equal_logits(tmp_path, tok_without_mask, tied, capsys):
    import json

    from biglm.checkpoint.layout import file_sha256
    from biglm.cli import main

    f = tmp_path / "tiny-llama.F32.gguf"
    original = _write_gguf(f, tok_without_mask, tied=tied)
    out = tmp_path / "biglm"
    assert main(["convert", str(f), str(out), "--shift", "false"]) == 0
    _check_gguf_logits(f, out)
    # the GGUF reader gives back the very Llama that was written (llama.cpp's q/k layout undone)
    model = BiGLMForMaskedLM.from_pretrained(out).eval()
    ids = torch.randint(0, len(tok_without_mask), (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, causal=True).logits[..., :len(tok_without_mask)], original(ids).logits,
                                   rtol=1e-4, atol=1e-4)
    source = json.loads((out / "biglm_source.json").read_text())
    from transformers import AutoTokenizer

    from biglm.data.tokenizer import tokenizer_fingerprint

    assert source == {"kind": "gguf", "name": f.name, "sha256": file_sha256(f), "shift": False,
                      "tokenizer_fingerprint": tokenizer_fingerprint(AutoTokenizer.from_pretrained(out))}
    assert str(tmp_path) not in json.dumps(source)  # a file name, never a local path
    assert "GGUF file `tiny-llama.F32.gguf`" in capsys.readouterr().out


def test_gguf_special_tokens_are_the_files_whatever_transformers_reads(tmp_path, tok_without_mask, monkeypatch, capsys):
    """transformers 5.17 reads SmolLM2's GGUF tokenizer with no pad and EOS = <|im_start|> (5.24: the file's own), so the
    same file converted to two tokenizers and shards of one were refused by the other. The file's special tokens win:
    a conversion whose tokenizer reader gets them wrong ends with the file's (said in a line), one that gets them right
    is left as it is."""
    import transformers

    from biglm.checkpoint.convert import gguf_special_ids
    from biglm.checkpoint.source import resolve_source
    from biglm.cli import main
    from biglm.data import load_tokenizer
    from biglm.data.tokenizer import tokenizer_fingerprint
    from biglm.model import BiGLMConfig

    eos, pad = tok_without_mask.eos_token_id, tok_without_mask.eos_token_id  # SmolLM2: pad = EOS = <|im_end|>
    f = tmp_path / "named.gguf"
    _write_gguf(f, tok_without_mask, pad_id=pad)
    assert gguf_special_ids(resolve_source(str(f))) == {"bos_token": tok_without_mask.bos_token_id,
                                                        "eos_token": eos, "pad_token": pad}
    assert main(["convert", str(f), str(tmp_path / "right")]) == 0
    assert "the GGUF file names" not in capsys.readouterr().out  # this transformers reads them right: nothing changed
    right = load_tokenizer(tmp_path / "right")
    assert (right.eos_token_id, right.pad_token_id) == (eos, pad)

    real = transformers.AutoTokenizer.from_pretrained

    def misread(*args, **kwargs):  # what transformers 5.17 does with SmolLM2's file
        tok = real(*args, **kwargs)
        tok.eos_token, tok.pad_token = tok.bos_token, None
        return tok

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", misread)
    assert main(["convert", str(f), str(tmp_path / "misread")]) == 0
    said = capsys.readouterr().out
    assert "the GGUF file names eos_token" in said and "the GGUF file names pad_token" in said
    monkeypatch.undo()
    fixed = load_tokenizer(tmp_path / "misread")
    assert (fixed.eos_token_id, fixed.pad_token_id, len(fixed)) == (eos, pad, len(right))
    assert BiGLMConfig.from_pretrained(tmp_path / "misread").pad_token_id == pad
    assert tokenizer_fingerprint(fixed) == tokenizer_fingerprint(right)


def test_gguf_in_a_folder_and_bad_sources_said_in_one_line(tmp_path, tok_without_mask, capsys):
    from biglm.checkpoint.source import resolve_source
    from biglm.cli import main

    folder = tmp_path / "ollama"
    folder.mkdir()
    _write_gguf(folder / "m.gguf", tok_without_mask)
    assert resolve_source(str(folder)).gguf_file == "m.gguf"  # a folder with one GGUF file: that file
    assert resolve_source("HuggingFaceTB/SmolLM2-135M").ref.hub_id == "HuggingFaceTB/SmolLM2-135M"
    (tmp_path / "notes.txt").write_text("x")
    for bad, said in ((tmp_path / "notes.txt", "not a GGUF file"), (tmp_path / "missing" / "x", "no such file"),
                      (tmp_path, "neither a transformers checkpoint directory")):
        assert main(["convert", str(bad), str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
    assert not (tmp_path / "out").exists()


REAL_GGUF = Path(__file__).resolve().parents[2] / "shared" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


# real_smol (the real SmolLM2 converted once per session): tests/conftest.py


@pytest.fixture(scope="module")
def real_source(real_smol):
    """The source of `real_smol`: transformers' LlamaForCausalLM read from the same GGUF file (float32, dequantized),
    read once for this module's tests (reading and dequantizing the file is the costly part; its header parsed once a
    session: `real_gguf_read_once`). The tests only read it."""
    from transformers import AutoModelForCausalLM

    from conftest import real_gguf_read_once

    with real_gguf_read_once():
        return AutoModelForCausalLM.from_pretrained(REAL_GGUF.parent, gguf_file=REAL_GGUF.name,
                                                    dtype=torch.float32).eval()


def test_real_smollm2_gguf_converts_with_equal_logits(real_smol, real_source):
    """The shipped SmolLM2-135M-Instruct (Q4_1, dequantized to float32 by transformers' reader): the converted BiGLM
    (shift on, `biglm convert`'s default) reproduces the source's next-token logits under the causal switch."""
    import json

    from transformers import AutoTokenizer

    out = real_smol
    # 30 layers of float32 sums: 2e-3 on logits of ~20
    _check_gguf_logits(REAL_GGUF, out, length=8, atol=2e-3, source=real_source)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.mask_token == "<mask>" and tok.pad_token is not None and tok.chat_template
    assert json.loads((out / "biglm_source.json").read_text())["sha256"].startswith("b179c9523d0e6a0f")


def test_padless_maskless_llama_through_convert_adapt_export_generate(tmp_path, tok_without_mask, capsys):
    """The hub's Llama-family tokenizers have no pad and no mask token: the converted model trains with
    `blocks-adapt --init_from` (the tokenizer and the model agree on the vocabulary: nothing is added later), exports
    with a card naming the source by file name, and generates."""
    import json

    import yaml

    from biglm.cli import main
    from biglm.data import load_tokenizer

    f = tmp_path / "padless.gguf"
    _write_gguf(f, tok_without_mask)
    conv, run, export = tmp_path / "conv", tmp_path / "run", tmp_path / "export"
    assert main(["convert", str(f), str(conv)]) == 0
    tok = load_tokenizer(conv)
    assert BiGLMForMaskedLM.from_pretrained(conv).config.vocab_size == len(tok)
    assert main(["pretrain", "blocks-adapt", "--init_from", str(conv), "--out_dir", str(run), "--steps", "2",
                 "--seq_len", "32", "--micro_batch", "2", "--global_batch", "2", "--warmup_steps", "1",
                 "--save_every", "2", "--eval_every", "0", "--log_every", "1", "--objective.prefix_blocks", "4,8",
                 "--model.max_position_embeddings", "64"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("kind") == "train"] == [1, 2]
    assert main(["export", str(run), str(export)]) == 0
    card = (export / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert "base_model" not in front  # a GGUF file is not a hub id: named in the card's text instead
    assert "padless.gguf" in card and str(tmp_path) not in card
    assert json.loads((export / "biglm_source.json").read_text())["name"] == "padless.gguf"  # lineage kept
    capsys.readouterr()
    assert main(["generate", str(export), "--prompt", "the quick brown", "--max_new_tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### prompt 1: the quick brown\n") and len(out.splitlines()) >= 2


DECODE_TEXTS = ["Once upon a time, there was a little girl named Lily. She loved to",
                "The sun was shining and the birds were singing. Tom went to the park with his",
                "Water boils at a lower temperature on a mountain because",
                "My favourite thing to do on a rainy day is"]


def _cached_decisions(model, prompts, answers, *, after_step=None) -> tuple[list[list[int]], int]:
    """The token ``model`` writes at each slot of ``answers`` given the slots before it (teacher-forced), one token per
    call as `generate_ids` decodes at blocks of 1 with the append cache, through its `AnswerDenoiser`: the prompts
    encoded once, then each call runs the token written before against the cache (the shift model's one-position
    path). Returns the decisions and how many model passes ran positions against a cache (a cached call)."""
    from biglm.generation import left_pad
    from biglm.generation.decoding import AnswerDenoiser, Commit

    c = model.config
    ids, mask = left_pad(prompts, pad_id=c.pad_token_id)
    y = torch.tensor(answers)
    R, n = y.shape
    denoise = AnswerDenoiser(model, prompt_ids=ids, prompt_mask=mask, rows=torch.arange(R), use_cache=True,
                             valid=torch.ones(R, n, dtype=torch.bool), block_length=1, block_cache="append")
    banned = sorted({c.mask_token_id, c.pad_token_id, c.eos_token_id})  # what the decodes below never write
    cached = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, args, kw: cached.append(kw.get("prefix_cache") is not None and args[0].shape[1] > 0), with_kwargs=True)
    decisions = []
    try:
        with torch.no_grad():
            for t in range(n):
                answer = torch.cat((y[:, :t], torch.full((R, n - t), c.mask_token_id)), dim=1)
                where = torch.zeros(R, n, dtype=torch.bool)
                where[:, t] = True
                commit = Commit(t - 1, t, y[:, t - 1:t]) if t else None
                logits = denoise(answer, where, start=t, end=t + 1, commit=commit).float()
                logits[:, banned] = float("-inf")
                decisions.append(logits.argmax(-1))
                if after_step is not None:
                    after_step()
    finally:
        hook.remove()
    return torch.stack(decisions, dim=1).tolist(), sum(cached)


def _decisions_agreeing(model, tok, other, *, n: int, after_step=None) -> int:
    """``model`` answers `DECODE_TEXTS` greedily, one token per call (blocks of 1, the append cache: every call after
    the first runs the token just written against the cache), ``n`` tokens each; then ``other()`` (built after that
    answer) writes each slot of it given the slots before (`_cached_decisions`): how many of its ``4 n`` decisions are
    ``model``'s. ``after_step`` runs after each. Asserted on the way: the teacher-forced path writes ``model``'s own
    answer exactly (it is the decode's), and ``other`` ran cached calls (n - 1: one per token after the first)."""
    import warnings

    from biglm.generation import generate_ids, left_pad

    prompts = [tok(t)["input_ids"] for t in DECODE_TEXTS]
    with warnings.catch_warnings():  # the append cache on a bidirectional-prefix model: an approximation, said once
        warnings.simplefilter("ignore")
        reference = generate_ids(model, *left_pad(prompts, pad_id=model.config.pad_token_id), max_new_tokens=n,
                                 strategy="confidence", block_length=1, block_cache="append",
                                 suppress_ids=[model.config.eos_token_id]).tokens.tolist()
    assert _cached_decisions(model, prompts, reference)[0] == reference  # the decode's own path, teacher-forced
    other = other()
    decisions, cached = _cached_decisions(other, prompts, reference, after_step=after_step)
    assert cached == n - 1, cached  # every call after the first ran a position against the cache
    return sum(d == y for ds, ys in zip(decisions, reference) for d, y in zip(ds, ys))


def test_bfloat16_decoding_agrees_with_float32_on_the_real_model(real_smol):
    """A trained model's decodes in bfloat16 (`biglm export --dtype bfloat16`, `--dtype bfloat16`) against the fp32
    eager path, decision by decision (`_decisions_agreeing`, 4 prompts x 16 tokens, cached calls): the share of steps
    where bf16 writes the fp32 token. bf16 rounds a logit of ~20 to within ~0.1, so near-ties flip; the unadapted
    converted model is unsure (its text is poor: the adaptation is issue 32's), which makes near-ties common. Measured
    on this CPU (AMD EPYC, torch 2.13): 56 of 64 (88%). Asserted: >= 70% (a cast gone wrong agrees on few if any)."""
    from biglm.checkpoint import load_model

    model, tok = load_model(real_smol)
    agree = _decisions_agreeing(model, tok, lambda: model.to(torch.bfloat16), n=16)
    print(f"bf16 vs fp32: {agree}/64 decisions agree")
    assert agree >= 45, agree


def test_compiled_decoding_agrees_with_eager_on_the_real_model(real_smol):
    """`load_model(compile=True)` (`--compile`: each decoder layer under `torch.compile`, dynamic shapes) against the
    fp32 eager path on the same trained model's decodes, as the bf16 test above (4 prompts x 12 tokens, cached calls).
    Compilation changes only fp32 summation order (fused kernels), so near-ties alone may flip: measured on this CPU
    (AMD EPYC, torch 2.13) 48 of 48. Asserted: >= 44 (a wrong fusion agrees on few). The loop compiles once: calls
    with a growing cache add no graph after the first few shapes (dynamic shapes), which `unique_graphs` counts."""
    from torch._dynamo.utils import counters

    from biglm.checkpoint import load_model

    model, tok = load_model(real_smol)
    n, graphs = 12, []

    def compiled():
        torch._dynamo.reset()
        return load_model(real_smol, compile=True)[0]

    agree = _decisions_agreeing(model, tok, compiled, n=n,
                                after_step=lambda: graphs.append(counters["stats"]["unique_graphs"]))
    print(f"compiled vs eager: {agree}/{4 * n} decisions agree; graphs after each step: {graphs}")
    assert graphs[-1] > 0  # it did compile
    assert graphs[-1] == graphs[n // 2], graphs  # no new graph in the second half: not one compilation per call
    assert agree >= 4 * n - 4, agree


# --- issue 37 items 7, 8, 12: OUT checked first and written whole; an unreadable GGUF said in one line --------------
def test_convert_refuses_a_run_or_a_non_empty_out_before_any_work_and_overwrite_replaces_a_model(tmp_path,
                                                                                                 tok_with_mask, capsys):
    from biglm.cli import main

    src = _save_source(tmp_path, "llama", tok_with_mask)
    run = tmp_path / "run"  # what `biglm pretrain` leaves: its config.json must not be rewritten
    (run / "checkpoints" / "step_0000006").mkdir(parents=True)
    (run / "config.json").write_text('{"prefix_attention": "blocks"}')
    (run / "run.lock").write_text("")
    capsys.readouterr()
    for args in ([], ["--overwrite"]):
        assert main(["convert", str(src), str(run), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{run} holds a training run (checkpoints)" in err, err
        assert (run / "config.json").read_text() == '{"prefix_attention": "blocks"}'
    out = tmp_path / "biglm"
    assert main(["convert", str(src), str(out)]) == 0
    (out / "stale.txt").write_text("old")
    capsys.readouterr()
    assert main(["convert", str(src), str(out), "--shift", "false"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not empty" in err and "--overwrite" in err, err
    assert main(["convert", str(src), str(out), "--shift", "false", "--overwrite"]) == 0
    from biglm.model import BiGLMConfig

    assert BiGLMConfig.from_pretrained(out).shift_logits is False and not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["biglm", "llama", "run"]  # no temporary folder left


def test_a_convert_that_fails_mid_write_leaves_no_out(tmp_path, tok_with_mask, capsys, monkeypatch):
    import errno

    import biglm.checkpoint.convert as convert
    from biglm.cli import main

    src = _save_source(tmp_path, "llama", tok_with_mask)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("biglm.checkpoint.source.write_source", full)  # after the weights and the tokenizer
    capsys.readouterr()
    assert main(["convert", str(src), str(tmp_path / "out")]) == 2
    err = "\n".join(line for line in capsys.readouterr().err.splitlines() if "Traceback" in line or "[biglm]" in line)
    assert len(err.splitlines()) == 1 and "no space left on device" in err and "nothing was left" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]


def test_a_truncated_or_foreign_gguf_is_refused_in_one_line(tmp_path, tok_without_mask, capsys):
    from biglm.cli import main

    good = tmp_path / "m.gguf"
    _write_gguf(good, tok_without_mask)
    data = good.read_bytes()
    cases = {"foreign.gguf": b"not a gguf file at all\n", "header.gguf": data[:64], "half.gguf": data[:len(data) // 2],
             "tail.gguf": data[:-100]}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        capsys.readouterr()
        assert main(["convert", str(tmp_path / name), str(tmp_path / "out")]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{name} is not a readable GGUF file" in err, (name, err)
        assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_default_decoding_of_a_drafting_model_writes_one_token_per_calls_text_on_the_real_model(real_smol):
    """The real SmolLM2 weights seen as a drafting model (prefix blocks of 1, as `blocks-adapt` sets them before its
    first step): its default decoding (n-gram drafts, `drafting_default`) writes, in float32 greedy, token
    for token what one token per call writes, for a left-padded batch of three kinds of prompts (a continuation, a
    chat turn, a rewrite), through `generate_ids` and through the server's engine beside a one-token-per-call request,
    in fewer calls; each call after the first runs cached positions only. The engine at its default ``draft_rows``:
    the requests start speculatively while it is idle, then more arrive and the load moves them into the pool (one
    token per call from where they stand), and their answers stay one token per call's."""
    from transformers import AutoTokenizer

    from biglm.generation import DecodeEngine, generate_ids, left_pad
    from biglm.generation.config import model_decoding

    tok = AutoTokenizer.from_pretrained(real_smol)
    model = BiGLMForMaskedLM.from_pretrained(real_smol, dtype=torch.float32).eval()
    model.config.prefix_attention, model.config.prefix_block_lengths = "blocks", [1, 8, 16, 32]
    chat = lambda text: tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,  # noqa: E731
                                                add_generation_prompt=True)
    texts = [DECODE_TEXTS[0], chat("What is the capital of France?"),
             chat("Rewrite in simpler words: The committee deliberated at length before reaching a consensus.")]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    N = 24
    default = model_decoding(model.config, {"max_new_tokens": N})
    assert default.draft_length >= 1 and default.draft_ngram >= 1 and default.strategy == "confidence"
    plain = model_decoding(model.config, {"max_new_tokens": N, "strategy": "confidence", "block_length": 1,
                                          "steps": N, "draft_length": 0})
    assert plain.draft_length == 0
    ids, mask = left_pad(prompts, pad_id=model.config.pad_token_id)
    ref = generate_ids(model, ids, mask, config=plain)
    out = generate_ids(model, ids, mask, config=default)
    assert out.token_lists() == ref.token_lists()
    assert sum(out.calls_per_row()) < sum(len(t) for t in out.token_lists())  # fewer calls than tokens
    assert out.forward_calls == out.steps + 1  # the prompts' one pass, then cached calls only
    engine = DecodeEngine(model, max_batch_rows=8)  # (the default draft_rows: the move into the pool runs)
    moved, real = [], engine._one_per_call
    engine._one_per_call = lambda req: (moved.append(req.id), real(req))[1]
    for i, p in enumerate(prompts):
        engine.submit(str(i), p, default)
    done = {}
    for _ in range(2):  # idle: they start speculatively
        done.update({e.request_id: e for e in engine.step() if e.finished})
    engine.submit("plain", prompts[0], plain)
    engine.submit("plain2", prompts[1], plain)  # now more rows than draft_rows
    while engine.num_running or engine.num_waiting:
        done.update({e.request_id: e for e in engine.step() if e.finished})
    assert sorted(moved) == ["0", "1", "2"], moved  # each default request moved into the pool
    assert [done[str(i)].token_ids for i in range(3)] == ref.token_lists()
    assert done["plain"].token_ids == ref.token_lists()[0] and done["plain2"].token_ids == ref.token_lists()[1]


# --- issue 49 item 1: a converted model writes its source's greedy text from step 0 ---------------------------------
def _source_greedy(lm, prompts: list[list[int]], n: int, eos: int) -> list[list[int]]:
    """The source's own greedy answers (transformers' `generate` of the GGUF, ``lm``: `real_source`, float32, EOS
    suppressed), one prompt at a time as a user runs it."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, suppress_tokens=[eos], eos_token_id=None, pad_token_id=eos)
            out.append(gen[0, len(p):].tolist())
    return out


def test_a_converted_model_writes_its_sources_greedy_text_one_token_per_call_and_by_default(real_smol, real_source):
    """`biglm convert`'s model (the text read causally, the shift) before any training: one token per call writes, token
    for token in float32, what transformers' greedy `generate` of the source writes (EOS suppressed alike), for a
    left-padded batch of three kinds of prompts (a continuation, a chat turn, a rewrite) through `generate_ids` with
    cached calls, and through the server's engine; its default decoding (drafts checked exactly) writes the same in
    fewer calls. With the bidirectional prompt of a paper-style conversion the first tokens already differ."""
    from transformers import AutoTokenizer

    from biglm.generation import DecodeEngine, generate_ids, left_pad
    from biglm.generation.config import model_decoding

    tok = AutoTokenizer.from_pretrained(real_smol)
    model = BiGLMForMaskedLM.from_pretrained(real_smol, dtype=torch.float32).eval()
    assert model.config.prefix_attention == "causal" and model.config.shift_logits
    chat = lambda text: tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,  # noqa: E731
                                                add_generation_prompt=True)
    texts = [DECODE_TEXTS[2], chat("What is the capital of France?"),
             chat("Rewrite in simpler words: The committee deliberated at length before reaching a consensus.")]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    N, eos = 20, model.config.eos_token_id
    source = _source_greedy(real_source, prompts, N, eos)
    plain = model_decoding(model.config, {"max_new_tokens": N, "strategy": "confidence", "block_length": 1,
                                          "steps": N, "draft_length": 0, "ignore_eos": True})
    default = model_decoding(model.config, {"max_new_tokens": N, "ignore_eos": True})
    assert default.draft_length >= 1 and plain.draft_length == 0
    ids, mask = left_pad(prompts, pad_id=model.config.pad_token_id)
    one = generate_ids(model, ids, mask, config=plain)
    assert one.token_lists() == source
    assert one.forward_calls == N + 1  # the prompts' one pass, then one cached call a token
    fast = generate_ids(model, ids, mask, config=default)
    assert fast.token_lists() == source
    assert sum(fast.calls_per_row()) < 3 * N
    engine = DecodeEngine(model, max_batch_rows=8)
    for i, p in enumerate(prompts):
        engine.submit(f"plain{i}", p, plain)
        engine.submit(f"default{i}", p, default)
    done = {}
    while engine.num_running or engine.num_waiting:
        done.update({e.request_id: e for e in engine.step() if e.finished})
    assert [done[f"plain{i}"].token_ids for i in range(3)] == source
    assert [done[f"default{i}"].token_ids for i in range(3)] == source
    # the paper's reading of the same weights (a bidirectional prompt) is not the source: the check can fail
    model.config.prefix_attention, model.config.prefix_block_lengths = "blocks", [1]
    assert generate_ids(model, ids, mask, config=plain).token_lists() != source


# --- issue 49 item 2: adaptation adds (mask adapters) and never takes away (the text path) ----------------------------
def test_blocks_adapt_of_a_converted_model_trains_its_mask_adapters_alone_and_keeps_the_sources_text(tmp_path,
                                                                                                      tok_with_mask):
    """`biglm pretrain blocks-adapt --init_from` a causal conversion: the run gains mask adapters and trains them
    alone (every other tensor bitwise the converted one's), so the logits of text positions read causally are
    unchanged, float32 bitwise, and one token per call still writes the source's greedy text; the masks' predictions
    did move (the adapters learned), and text positions stay unchanged whatever the adapters hold (the gate)."""
    from transformers import AutoModelForCausalLM

    from biglm.checkpoint import load_model
    from biglm.cli import main
    from biglm.generation import generate_ids, left_pad

    src = _save_source(tmp_path, "llama", tok_with_mask)
    conv, run = tmp_path / "conv", tmp_path / "run"
    assert main(["convert", str(src), str(conv)]) == 0
    assert main(["pretrain", "blocks-adapt", "--init_from", str(conv), "--out_dir", str(run), "--steps", "4",
                 "--seq_len", "32", "--micro_batch", "2", "--global_batch", "2", "--warmup_steps", "1", "--adapter_lr", "1e-2",
                 "--save_every", "4", "--eval_every", "0", "--log_every", "1", "--objective.draft_tree_every", "2",
                 "--objective.draft_groups", "2", "--model.max_position_embeddings", "64"]) == 0
    before, _ = load_model(conv)
    after, _ = load_model(run)
    assert after.config.prefix_attention == "causal" and after.config.mask_adapter_rank > 0
    new = after.state_dict()
    for name, w in before.state_dict().items():
        assert torch.equal(new[name], w), name  # every converted tensor as it was
    adapters = {k: v for k, v in new.items() if "_adapter." in k}
    assert adapters and any(v.abs().sum() > 0 for k, v in adapters.items() if k.endswith("up.weight"))
    mask = after.config.mask_token_id
    ids = torch.randint(5, len(tok_with_mask) - 5, (2, 16), generator=torch.Generator().manual_seed(3))
    with_masks = torch.cat((ids, torch.full((2, 6), mask)), dim=1)
    with torch.no_grad():
        b, a = before(with_masks, prefix_len=16).logits, after(with_masks, prefix_len=16).logits
    assert torch.equal(a[:, :17], b[:, :17])  # text positions and the slot after them: bitwise unchanged
    assert not torch.allclose(a[:, 17:], b[:, 17:])  # the masks' drafts moved
    source = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    prompts = [ids[0, :9].tolist(), ids[1].tolist()]
    with torch.no_grad():
        ref = [source.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                               suppress_tokens=[after.config.eos_token_id])[0, len(p):].tolist() for p in prompts]
    got = generate_ids(after, *left_pad(prompts, pad_id=after.config.pad_token_id), max_new_tokens=10,
                       strategy="confidence", block_length=1, steps=10, suppress_ids=[after.config.eos_token_id])
    assert got.token_lists() == ref
    # the gate is what keeps the text: a call without mask tokens runs no adapter, and larger adapters leave text alone
    with torch.no_grad():
        everywhere = after(with_masks[:, :16], prefix_len=16)  # no mask token in the call: no gate, no adapters
        assert torch.equal(everywhere.logits, b[:, :16])
        for layer in after.model.layers:
            layer.self_attn.qkv_adapter.up.weight.add_(0.5)
        moved = after(with_masks, prefix_len=16).logits
    assert torch.equal(moved[:, :17], b[:, :17])  # still gated: text unchanged whatever the adapters hold


def test_adapter_lr_is_refused_on_a_run_that_trains_every_weight(tmp_path, synthetic_data):
    """--adapter_lr sets the lr of a causal model's mask adapters trained alone; a run that trains every weight has
    none, and the option is refused before any step rather than ignored."""
    from conftest import tiny_train_config

    from biglm.config import ConfigError
    from biglm.training import Trainer
    from biglm.training.distributed import DistInfo

    cfg = tiny_train_config(tmp_path / "run", data={str(synthetic_data / "shards"): 1.0},
                            tokenizer=str(synthetic_data / "tok"), adapter_lr=1e-3)
    with pytest.raises(ConfigError, match="--adapter_lr 0.001: this run trains every weight"):
        Trainer(cfg, info=DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")), echo=lambda s: None)
