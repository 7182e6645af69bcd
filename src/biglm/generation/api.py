"""Text in, text out: `generate` tokenises prompts, runs `decoding.generate_ids`, and cleans answers.

Prompts are encoded without special tokens: BiGLM pre-training windows are raw document text
(each document followed by EOS, no BOS), so a prompt should look like the start of a window.
Answers are cut at the first EOS, decoded without special tokens, then cut at the first stop
string (the stop string itself is dropped, as in transformers and vLLM).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from .decoding import StepCallback, candidate_lengths, generate_ids, left_pad


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
    max_new_tokens: int = 64,
    steps: int | None = None,
    strategy: str = "mask-predict",
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    length_beam: int = 1,
    block_length: int | None = None,
    threshold: float = 0.9,
    stop: str | Sequence[str] | None = None,
    use_cache: bool = True,
    on_step: StepCallback | None = None,
) -> list[str]:
    """Continue each prompt with an answer of up to ``max_new_tokens`` tokens written by iterative unmasking.

    Args:
        model: a `BiGLMForMaskedLM` in eval mode (e.g. from `biglm.checkpoint.load_model`).
        tokenizer: its tokenizer (a transformers tokenizer).
        prompts: the texts to continue; different lengths are batched with left padding.
        max_new_tokens: answer slots N; the answer is cut at the first EOS, so it may be shorter.
        steps: model calls T (default: 10 for mask-predict, N for confidence/threshold).
        strategy: "mask-predict", "confidence" (LLaDA low-confidence remasking) or "threshold" (Fast-dLLM).
        temperature, top_k, top_p, seed: sampling; temperature 0 is greedy, and a seed fixes the draw.
        length_beam: decode this many candidate lengths in [ceil(N/2), N] and keep the most likely.
        block_length: semi-autoregressive blocks for confidence/threshold (None = one block).
        threshold: τ of the threshold rule.
        stop: string(s) at which the decoded answer is cut.
        use_cache: exact prefix cache (the prompt is encoded once); False recomputes it every step.
        on_step: called with a `decoding.StepInfo` after every model call.

    Returns:
        One answer string per prompt (the continuation only, not the prompt).
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError("prompts must be a list of strings (wrap a single prompt in a list).")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one prompt.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1.")
    if steps is not None and steps < 1:
        raise ValueError(f"steps={steps} must be >= 1.")
    config = model.config
    if getattr(config, "mask_token_id", None) is None:
        raise ValueError("the model has no mask_token_id: set model.config.mask_token_id = tokenizer.mask_token_id "
                         "(iterative unmasking starts from an all-mask answer).")
    room = config.max_position_embeddings - max_new_tokens
    if room < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} exceeds the model's max_position_embeddings="
                         f"{config.max_position_embeddings}.")
    stops = [stop] if isinstance(stop, str) else list(stop or [])

    encoded = encode_prompts(tokenizer, prompts, max_prompt_tokens=room)
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    device = next(model.parameters()).device
    ids, mask = left_pad(encoded, pad_id=pad_id, device=device)
    # ids past the tokenizer's vocabulary (a model vocab padded for speed) cannot be decoded
    extra = list(range(len(tokenizer), config.vocab_size))
    out = generate_ids(
        model, ids, mask, max_new_tokens=max_new_tokens, steps=steps, strategy=strategy, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed,
        lengths=candidate_lengths(max_new_tokens=max_new_tokens, length_beam=length_beam),
        block_length=block_length, threshold=threshold, use_cache=use_cache, suppress_ids=extra, on_step=on_step,
    )
    texts = tokenizer.batch_decode(out.token_lists(), skip_special_tokens=True)
    return [cut_at_stop(t, stops) if stops else t for t in texts]
