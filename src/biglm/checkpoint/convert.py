"""`convert_checkpoint`: a checkpoint of the Llama family (a GGUF file, a transformers directory or a hub id) -> a
BiGLM Hugging Face directory; what `biglm convert` runs (`cli_convert`). The why: docs/concepts/conversion.md.

BiGLM is Llama's architecture with bidirectional attention and Llama's parameter names, so the weights map one to
one (``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``, the two
RMSNorms per block, ``model.norm``, ``lm_head`` tied or untied). Accepted: ``model_type`` llama (Llama, SmolLM),
mistral without a sliding window, and qwen2 (its q/k/v biases become ``BiGLMConfig.attention_bias``). Whatever BiGLM
cannot represent is refused in one line naming the field: a sliding window, attention biases outside qwen2, an o_proj
bias, MLP biases, any ``rope_scaling``, an activation other than SiLU, a head dimension other than hidden/heads. A
tokenizer without a mask token gets ``<mask>``, one without a pad token ``<pad>``, their embedding rows (and
``lm_head`` rows when untied) starting as the mean of the source's rows. The source is named in
``OUT/biglm_source.json`` as a hub id or a file name with its sha256 (`checkpoint.source`), never a local path.

``shift`` (`BiGLMConfig.shift_logits`): position i is predicted from position i-1's final hidden state, as the source
predicted the next token (Dream's and DiffuLLaMA's "shift"); off, from its own position, as a BiGLM trained from
scratch. ``causal`` (`BiGLMConfig.prefix_attention` "causal", with the shift): the text, prompt and written answer,
is read as the source read it, so the slot after the text gets the source's next-token logits and one token per call
writes the source's greedy text before any training; the mask slots see everything and are what adaptation trains.
`biglm convert` turns both on by default (`SHIFT_DEFAULT`, `CAUSAL_DEFAULT`; the shift measured the better:
docs/LOG.md); `convert_checkpoint` itself keeps ``shift=False`` unless asked, the plain weight map whose logits equal
the source's position for position.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .output import check_output_dir, staged_output

MODEL_TYPES = ("llama", "mistral", "qwen2")
SHIFT_DEFAULT = True  # `biglm convert`'s default: measured better (see above)
CAUSAL_DEFAULT = True  # `biglm convert`'s default: the source's text and scores from step 0


class ConvertError(ValueError):
    """The source checkpoint has something BiGLM cannot represent (the message names it, in one line)."""


def _rope(src: Any) -> tuple[float, dict | None]:
    """(rope θ, the scaling dict or None) from a transformers config of either layout (v4 fields, v5 rope_parameters)."""
    params = dict(getattr(src, "rope_parameters", None) or {})
    scaling = getattr(src, "rope_scaling", None)
    if scaling and scaling is not getattr(src, "rope_parameters", None):
        params = {**params, **scaling}
    theta = float(params.get("rope_theta", getattr(src, "rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, (None if kind in (None, "default") else params)


@contextlib.contextmanager
def _reading(where: Any) -> Iterator[None]:
    """A GGUF file that transformers' reader fails on (truncated, or not GGUF at all: it raises whatever the parse
    hit, a ValueError, an IndexError...) -> `ConvertError` in one line. Other sources keep their errors (a hub id
    that cannot be reached is an OSError the CLI reports)."""
    try:
        yield
    except ConvertError:
        raise
    except Exception as e:
        if where.gguf_file is None:
            raise
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ConvertError(f"{where.gguf_file} is not a readable GGUF file ({first}): it is truncated or not a GGUF "
                           "file; download it again (or check its size and sha256 against the source's)") from None


GGUF_SPECIAL = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                "pad_token": "padding_token_id"}


def gguf_special_ids(where: Any) -> dict[str, int]:
    """The special tokens a GGUF source names (``tokenizer.ggml.eos_token_id``, ...) as {"eos_token": id, ...}; {} for
    a source that is not a GGUF file. transformers' GGUF tokenizer reads them differently across versions (5.17 leaves
    the pad unset and takes ``<|im_start|>`` as SmolLM2's EOS; 5.24 reads the file's), so `convert_checkpoint` takes
    the file's own: one file converts to the same special tokens whichever transformers is installed."""
    if where.gguf_file is None:
        return {}
    from gguf import GGUFReader
    from transformers.utils import cached_file

    fields = GGUFReader(cached_file(where.location, where.gguf_file)).fields
    found = {}
    for name, key in GGUF_SPECIAL.items():
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None and field.data:
            found[name] = int(field.parts[field.data[0]][0])
    return found


def check_convertible(src: Any) -> None:
    """Refuse (`ConvertError`, one line naming the field) a source config BiGLM cannot represent."""
    mt = getattr(src, "model_type", None)
    if mt not in MODEL_TYPES:
        raise ConvertError(f"model_type={mt!r} is not supported: biglm convert takes {', '.join(MODEL_TYPES)}.")
    if mt == "qwen2" and getattr(src, "use_sliding_window", False):
        raise ConvertError(f"use_sliding_window=True (sliding_window={src.sliding_window}): BiGLM attends to the "
                           "whole window; it has no sliding window.")
    if mt == "mistral" and getattr(src, "sliding_window", None) is not None:
        raise ConvertError(f"sliding_window={src.sliding_window}: BiGLM attends to the whole window; it has no "
                           "sliding window (set sliding_window to null in config.json if the model never used it).")
    if mt != "qwen2" and getattr(src, "attention_bias", False):
        raise ConvertError(f"attention_bias=True on a {mt} model: BiGLM has q/k/v biases only for qwen2 checkpoints "
                           "and never an o_proj bias.")
    if getattr(src, "mlp_bias", False):
        raise ConvertError("mlp_bias=True: BiGLM's MLP (gate/up/down_proj) has no biases.")
    act = getattr(src, "hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"hidden_act={act!r}: BiGLM's MLP is SwiGLU (silu) only.")
    _, scaling = _rope(src)
    if scaling is not None:
        raise ConvertError(f"rope_scaling={scaling}: BiGLM's RoPE has no scaling (only rope_theta).")
    head_dim = getattr(src, "head_dim", None)
    if head_dim is not None and head_dim != src.hidden_size // src.num_attention_heads:
        raise ConvertError(f"head_dim={head_dim} != hidden_size/num_attention_heads="
                           f"{src.hidden_size // src.num_attention_heads}: BiGLM derives the head dimension.")


def convert_checkpoint(src: str | os.PathLike[str], out: str | os.PathLike[str], *, shift: bool = False,
                       causal: bool = False, log: Callable[[str], None] = print, overwrite: bool = False) -> Path:
    """Convert ``src`` — a GGUF file (llama.cpp / Ollama; read through transformers' GGUF loader, quantized weights
    dequantized to float32), a transformers checkpoint directory or a hub id — of a Llama-family model (Llama,
    SmolLM, Mistral without a sliding window, Qwen2) to a BiGLM Hugging Face directory ``out`` (config, weights,
    tokenizer, ``biglm_source.json`` naming the source portably); return ``out``. ``shift``: the model predicts
    position i from position i-1, as its source did (`BiGLMConfig.shift_logits`; `biglm convert` turns it on by
    default, `SHIFT_DEFAULT`). ``causal`` (needs ``shift``): the text is read as the source read it
    (``BiGLMConfig.prefix_attention="causal"``), so one token per call writes the source's greedy text from step 0
    and scoring gives the source's log-likelihoods; without it the prefix is the paper's bidirectional one, which the
    source's weights never saw (`biglm convert` turns it on by default, `CAUSAL_DEFAULT`).

    A tokenizer without a mask token gets ``<mask>``, one without a pad token ``<pad>`` (as `load_tokenizer` would at
    training time, so the converted vocabulary is the one every later step uses). Raises `ConvertError` (one line
    naming the field) for what cannot be mapped, before any weight is read, and for a GGUF file that cannot be read
    (truncated, or no GGUF at all). ``out`` is checked first and written whole or not at all (`staged_output`: never
    over a training run; a non-empty folder only with ``overwrite``, and then only a model folder).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..data.tokenizer import MASK, PAD, tokenizer_fingerprint
    from ..model import BiGLMConfig, BiGLMForMaskedLM
    from .model_card import convert_card
    from .source import resolve_source, write_source

    if causal and not shift:
        raise ConvertError("causal=True reads the text as the source did and needs shift=True (the next token from "
                           "the last text position); pass causal=False with shift=False")
    out = Path(out)
    check_output_dir(out, overwrite=overwrite)
    try:
        where = resolve_source(str(src))
    except ValueError as e:
        raise ConvertError(str(e)) from None
    kw = where.load_kwargs()
    with _reading(where):
        src_cfg = AutoConfig.from_pretrained(where.location, **kw)
    check_convertible(src_cfg)
    with _reading(where):
        tok = AutoTokenizer.from_pretrained(where.location, **kw)
        source = AutoModelForCausalLM.from_pretrained(where.location, dtype="auto", **kw)
    state = source.state_dict()
    dtype = source.get_input_embeddings().weight.dtype
    biased = [k for k in state if k.endswith("o_proj.bias")]
    if biased:
        raise ConvertError(f"{biased[0]}: BiGLM's o_proj has no bias.")
    theta, _ = _rope(src_cfg)
    vocab = src_cfg.vocab_size
    for name, token_id in gguf_special_ids(where).items():  # the file's own special tokens (see gguf_special_ids)
        if 0 <= token_id < len(tok) and getattr(tok, f"{name}_id") != token_id:
            token = tok.convert_ids_to_tokens(token_id)
            log(f"[biglm] the GGUF file names {name} {token!r} (id {token_id}); transformers read "
                f"{getattr(tok, name)!r}: the file's is kept")
            setattr(tok, name, token)
    added = {name: token for name, token in (("mask_token", MASK), ("pad_token", PAD)) if getattr(tok, name) is None}
    if added:
        tok.add_special_tokens(added)
    mask_id = tok.mask_token_id
    vocab_size = max(vocab, len(tok))
    tied = bool(getattr(src_cfg, "tie_word_embeddings", False))
    pad_id = tok.pad_token_id
    cfg = BiGLMConfig(
        vocab_size=vocab_size, hidden_size=src_cfg.hidden_size, intermediate_size=src_cfg.intermediate_size,
        num_hidden_layers=src_cfg.num_hidden_layers, num_attention_heads=src_cfg.num_attention_heads,
        num_key_value_heads=getattr(src_cfg, "num_key_value_heads", None) or src_cfg.num_attention_heads,
        max_position_embeddings=src_cfg.max_position_embeddings, rope_theta=theta, rms_norm_eps=src_cfg.rms_norm_eps,
        initializer_range=getattr(src_cfg, "initializer_range", 0.02), tie_word_embeddings=tied,
        attention_bias=src_cfg.model_type == "qwen2", pad_token_id=pad_id, bos_token_id=src_cfg.bos_token_id,
        eos_token_id=src_cfg.eos_token_id, mask_token_id=mask_id, shift_logits=shift,
        prefix_attention="causal" if causal else "bidirectional",
    )
    with torch.device("meta"):
        model = BiGLMForMaskedLM(cfg)
    model = model.to_empty(device="cpu").to(dtype)
    model.model.rotary_emb.inv_freq.copy_(
        1.0 / (theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float) / cfg.head_dim)))
    expected = set(model.state_dict())
    if tied:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        expected.discard("lm_head.weight")
    extra = sorted(set(state) - expected)
    if extra:
        raise ConvertError(f"{extra[0]}: no BiGLM parameter of that name ({len(extra)} unmapped in all).")
    missing = sorted(expected - set(state))
    if missing:
        raise ConvertError(f"{missing[0]}: missing from the source checkpoint ({len(missing)} in all).")

    def grow(w: torch.Tensor) -> torch.Tensor:
        if w.shape[0] == vocab_size:
            return w
        return torch.cat((w, w.new_zeros(vocab_size - w.shape[0], w.shape[1])))

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in state:
                w = state[name]
                param.copy_(grow(w) if name in ("model.embed_tokens.weight", "lm_head.weight") else w)
        rows = [model.model.embed_tokens.weight] + ([] if tied else [model.lm_head.weight])
        for w in rows:  # every new row (mask, pad, the tokenizer's added tokens past the source's vocabulary)
            w[vocab:] = w[:vocab].float().mean(0).to(w.dtype)
    if tied:
        model.tie_weights()
    with staged_output(out, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_source(tmp, where.ref, shift=shift, tokenizer_fingerprint=tokenizer_fingerprint(tok))
        (tmp / "README.md").write_text(convert_card(config=cfg, source=where.ref, name=out.name))
    log(f"[biglm] {src_cfg.model_type} {where.ref.describe()} -> BiGLM {out}: {cfg.num_hidden_layers} layers, hidden "
        f"{cfg.hidden_size}, heads {cfg.num_attention_heads}/{cfg.num_key_value_heads} kv, rope_theta {theta:g}, "
        f"{'tied' if tied else 'untied'} head" + (", q/k/v biases" if cfg.attention_bias else "")
        + (", predicts position i from i-1 (shift)" if shift else ", predicts each position from itself (no shift)")
        + (", reads its text causally (one token per call writes the source's greedy text)" if causal
           else ", a bidirectional prefix (adapt it before it writes well)"))
    if added:
        said = ("its embedding row" if len(added) == 1 else "their embedding rows") + ("" if tied else " and lm_head rows")
        log(f"[biglm] the tokenizer had no {' and no '.join(k.split('_')[0] for k in added)} token: added "
            + " and ".join(f"{t!r} as id {tok.convert_tokens_to_ids(t)}" for t in added.values())
            + f"; {said} initialised from the mean of the source's rows")
    log(f"[biglm] mask token {tok.mask_token!r} (id {mask_id}), pad token {tok.pad_token!r} (id {pad_id})")
    return out
