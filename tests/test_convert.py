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
def test_mask_token_added_from_mean_embedding(tmp_path, tok_without_mask, tied, capsys):
    from transformers import AutoTokenizer

    assert tok_without_mask.mask_token is None
    src = _save_source(tmp_path, "llama", tok_without_mask, tie_word_embeddings=tied)
    out = convert_checkpoint(src, tmp_path / "biglm")
    printed = capsys.readouterr().out
    assert "no mask token: added '<mask>'" in printed and "mean embedding" in printed
    assert ("lm_head row" in printed) == (not tied)
    tok = AutoTokenizer.from_pretrained(out)
    model = BiGLMForMaskedLM.from_pretrained(out)
    n = len(tok_without_mask)
    assert tok.mask_token == "<mask>" and tok.mask_token_id == n == model.config.mask_token_id
    assert model.config.vocab_size == n + 1
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    emb = model.model.embed_tokens.weight
    torch.testing.assert_close(emb[n], source.model.embed_tokens.weight.mean(0))
    torch.testing.assert_close(emb[:n], source.model.embed_tokens.weight)
    if not tied:
        torch.testing.assert_close(model.lm_head.weight[n], source.lm_head.weight.mean(0))
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
