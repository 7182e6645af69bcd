"""Choosing tokens from logits: greedy, temperature, top-k, top-p (nucleus), seeded.

Kept apart from the decoding loops (litgpt style) so every loop in `decoding.py` shares one
sampler. The confidence a loop ranks tokens by is the *model's* probability of the chosen
token, softmax(logits) at temperature 1 and before any top-k/top-p filtering, as in
Mask-Predict and LLaDA's low-confidence remasking. Filtering only decides which token is drawn;
measuring confidence on the filtered distribution would make every top-k=1 token certain
(p = 1) and destroy the ranking that decides what gets re-masked or committed.
The settings are checked once, by `config.DecodingConfig`, not here.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf. ``logits`` (M, V).

    The nucleus keeps the smallest set of most likely tokens whose probability reaches ``top_p``
    (the token that crosses the threshold is kept, so the set is never empty).
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the mass *before* it already reaches top_p
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` (M, V); return ``(tokens (M,) long, probs (M,) float32)``.

    ``temperature == 0`` is greedy (argmax; top-k/top-p cannot change an argmax). Otherwise the
    logits are divided by the temperature, filtered by top-k then top-p, and one token is drawn
    with ``generator`` (seeded by the caller, so a run is reproducible). ``probs`` is the model's
    probability of each chosen token (softmax at temperature 1, unfiltered): the confidence used
    to rank positions.
    """
    logits = logits.float()
    if temperature == 0.0:
        tokens = logits.argmax(dim=-1)
    else:
        filtered = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
        probs = filtered.softmax(dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1) if logits.shape[0] else \
            torch.empty(0, dtype=torch.long, device=logits.device)
    confidence = logits.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1).exp()
    return tokens, confidence
