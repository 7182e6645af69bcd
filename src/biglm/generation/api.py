"""Text in, text out: `generate` tokenises prompts, runs `decoding.generate_ids`, and cleans answers.

Options travel as one `DecodingConfig` (built, and so validated, once at the entry point);
keyword arguments to `generate` are a convenience that builds that object. The default is the
published Mask-Predict, T model calls; ``early_stop=True`` is the opt-in speed option.
`generate_from_ids` is the same for prompts already encoded by the caller (the lm-eval adapter
conditions on its own encoding, the one its likelihood scoring uses).

Prompts are encoded without special tokens: BiGLM pre-training windows are raw document text
(each document followed by EOS, no BOS), so a prompt should look like the start of a window.
Answers are cut at the first EOS, decoded without special tokens, then cut at the first stop
string (the stop string itself is dropped, as in transformers and vLLM).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .config import DecodingConfig, model_decoding
from .decoding import StepCallback, generate_ids, left_pad, require_mask_token, uses_length_head


def encode_prompts(tokenizer, prompts: Sequence[str], *, max_prompt_tokens: int) -> list[list[int]]:
    """Token ids of each prompt, truncated from the LEFT to ``max_prompt_tokens`` with a warning
    (the end of a prompt is what the answer continues, so the start is what goes)."""
    out = []
    for i, text in enumerate(prompts):
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(ids) > max_prompt_tokens:
            warnings.warn(f"prompt {i} has {len(ids)} tokens but only {max_prompt_tokens} fit beside the answer "
                          f"(max_position_embeddings minus max_new_tokens): keeping its last {max_prompt_tokens}.",
                          stacklevel=3)
            ids = ids[len(ids) - max_prompt_tokens:]
        out.append(ids)
    return out


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string (which is dropped)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
    return text[:cut]


def generate(
    model: torch.nn.Module,
    tokenizer,
    prompts: list[str],
    *,
    config: DecodingConfig | None = None,
    on_step: StepCallback | None = None,
    **overrides: Any,
) -> list[str]:
    """Continue each prompt with an answer of up to ``max_new_tokens`` tokens written by iterative unmasking.

    Args:
        model: a `BiGLMForMaskedLM` in eval mode (e.g. from `biglm.checkpoint.load_model`).
        tokenizer: its tokenizer (a transformers tokenizer).
        prompts: the texts to continue; different lengths are batched with left padding.
        config: the decoding options (`DecodingConfig`: strategy, steps, sampling, length beam,
            stop strings, ``early_stop``...); default: the model's (`config.model_decoding` with ``overrides``: the
            published Mask-Predict with T = 10 model calls, or a drafting model's exact speculative decoding).
        on_step: called with a `decoding.StepInfo` after every model call.
        **overrides: `DecodingConfig` fields set on top of ``config``, e.g.
            ``generate(model, tok, prompts, steps=8, early_stop=True)``; validated with it, once.

    Returns:
        One answer string per prompt (the continuation only, not the prompt).
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError("prompts must be a list of strings (wrap a single prompt in a list).")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one prompt.")
    # no config: the model's decoding, as every entry point builds it (a drafting model's own default included)
    cfg = config.override(**overrides) if config is not None else model_decoding(model.config, overrides)
    room = _check_model(model, cfg)
    encoded = encode_prompts(tokenizer, prompts, max_prompt_tokens=room)
    return generate_from_ids(model, tokenizer, encoded, config=cfg, on_step=on_step)


def generate_from_ids(
    model: torch.nn.Module,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    *,
    config: DecodingConfig,
    moved_whitespace: Sequence[str] | None = None,
    on_step: StepCallback | None = None,
) -> list[str]:
    """`generate` for prompts the caller has encoded (and fitted to the window) itself.

    ``moved_whitespace[i]``, when given, is whitespace the caller cut from the end of prompt i's
    text before encoding it (HFLM's convention: a word's leading space belongs to the word). An
    answer that starts with it has it removed, so the answer continues the prompt *as written*;
    stop strings apply after that, so a prompt ending in ``"\n"`` with ``stop=["\n"]`` is not cut
    to nothing.
    """
    if len(prompt_ids) == 0:
        raise ValueError("prompts is empty: pass at least one prompt.")
    if moved_whitespace is not None and len(moved_whitespace) != len(prompt_ids):
        raise ValueError(f"moved_whitespace has {len(moved_whitespace)} entries for {len(prompt_ids)} prompts.")
    _check_model(model, config)
    model_cfg = model.config
    pad_id = model_cfg.pad_token_id if model_cfg.pad_token_id is not None else 0
    device = next(model.parameters()).device
    ids, mask = left_pad(prompt_ids, pad_id=pad_id, device=device)
    # ids past the tokenizer's vocabulary (a model vocab padded for speed) cannot be decoded
    extra = list(range(len(tokenizer), model_cfg.vocab_size))
    out = generate_ids(model, ids, mask, config=config, suppress_ids=extra, on_step=on_step)
    texts = tokenizer.batch_decode(out.token_lists(), skip_special_tokens=True)
    if moved_whitespace is not None:
        texts = [t[len(w):] if w and t.startswith(w) else t for t, w in zip(texts, moved_whitespace)]
    return [cut_at_stop(t, config.stop) for t in texts] if config.stop else texts


def _check_model(model: torch.nn.Module, config: DecodingConfig) -> int:
    """Refuse a model that cannot decode with ``config``; return the prompt tokens that fit beside the answer."""
    model_cfg = model.config
    require_mask_token(model_cfg)
    answer = config.max_new_tokens
    if uses_length_head(model, config):  # (length_head=True on a model without one fails here, before any work)
        answer = min(answer, int(getattr(model_cfg, "max_target_length", answer)))  # the head's longest answer
    room = model_cfg.max_position_embeddings - answer
    if room < 0:
        raise ValueError(f"max_new_tokens={config.max_new_tokens} exceeds the model's max_position_embeddings="
                         f"{model_cfg.max_position_embeddings}.")
    return room
