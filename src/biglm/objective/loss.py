"""The one loss of biglm: cross-entropy over token predictions, summed and divided by a count the caller keeps
on device (the masked tokens of the whole global batch, under accumulation and ranks). Pre-training calls
`masked_lm_loss` on a `MaskedBatch`; the model's Hugging Face ``labels`` path calls `token_loss`, so a
``transformers.Trainer`` computes exactly this loss too. ``IGNORE_INDEX`` marks a position without a target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .masking import MaskedBatch

IGNORE_INDEX = -100


def token_loss(logits: torch.Tensor, targets: torch.Tensor, *, weight: torch.Tensor | None = None,
               normalizer: torch.Tensor | int | None = None) -> torch.Tensor:
    """Cross-entropy of ``logits`` (M, V) against ``targets`` (M,), times ``weight`` (M,) if given, summed and divided
    by ``normalizer`` (default: the number of targets that are not ``IGNORE_INDEX``; at least 1). Computed in fp32."""
    ce = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="none")
    if weight is not None:
        ce = ce * weight
    if normalizer is None:
        normalizer = (targets != IGNORE_INDEX).sum()
    denom = torch.as_tensor(normalizer, device=ce.device)
    return ce.sum() / denom.clamp(min=1)


def masked_lm_loss(logits: torch.Tensor, batch: "MaskedBatch", *, normalizer: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Summed (weighted) cross-entropy over a batch's masked tokens divided by a device-side count.

    ``logits`` are either dense (B, L, V) or sparse (M, V) in row-major order of the masked positions
    (what `BiGLMForMaskedLM` returns with labels). ``normalizer`` overrides ``batch.normalizer``, e.g. with
    the global count over gradient-accumulation micro-batches and ranks.
    """
    if batch.positions is not None and logits.dim() == 2:  # sparse logits selected by index: no host sync
        targets = batch.labels.reshape(-1).index_select(0, batch.positions)
        weight = None if batch.loss_weight is None else batch.loss_weight.reshape(-1).index_select(0, batch.positions)
    else:
        select = batch.labels != IGNORE_INDEX
        targets = batch.labels[select]
        if logits.dim() == 3:
            logits = logits[select]
        weight = None if batch.loss_weight is None else batch.loss_weight[select]
    return token_loss(logits, targets, weight=weight, normalizer=batch.normalizer if normalizer is None else normalizer)
