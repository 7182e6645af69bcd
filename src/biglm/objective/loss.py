"""The one loss of biglm: cross-entropy over token predictions, summed and divided by a count the caller keeps
on device (the masked tokens of the whole global batch, under accumulation and ranks). Pre-training calls
`masked_lm_loss` on a `MaskedBatch`; the model's Hugging Face ``labels`` path calls `token_loss`, so a
``transformers.Trainer`` computes exactly this loss too. ``IGNORE_INDEX`` marks a position without a target.
`linear_cross_entropy` is the same loss fused with the output projection, a chunk of rows at a time, so the
(M, V) logits never exist at once (the model's ``loss_chunk`` path, what pre-training uses).
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


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i·CE(h_i·Wᵀ, t_i) / n over chunks of rows; the gradients are computed chunk by chunk in the forward
    (Liger's fused linear cross-entropy), so neither pass holds more than one chunk's logits and nothing is
    recomputed."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale, chunk, dtype):
        M = hidden.shape[0]
        h, w = hidden.to(dtype), weight.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1]
                  else None)
        for s in range(0, M, chunk):
            hc, tc, sc = h[s:s + chunk], targets[s:s + chunk], scale[s:s + chunk]
            logits = (hc @ w.t()).float()  # as lm_head then .float(): the logits rounded to `dtype` first
            lse = logits.logsumexp(-1)
            safe = tc.clamp(min=0)
            target_logit = logits.gather(1, safe[:, None]).squeeze(1)
            total += ((lse - target_logit) * sc).sum()
            if grad_h is not None or grad_w is not None:
                g = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                g[torch.arange(g.shape[0], device=g.device), safe] -= 1.0
                g = (g * sc[:, None]).to(dtype)
                if grad_h is not None:
                    grad_h[s:s + chunk] = (g @ w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w += (g.t() @ hc).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        gh = None if grad_h is None else grad_h * grad_out.to(grad_h.dtype)
        gw = None if grad_w is None else (grad_w * grad_out).to(ctx.weight_dtype)
        return gh, gw, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         loss_weight: torch.Tensor | None = None, normalizer: torch.Tensor | int | None = None,
                         chunk: int = 1024) -> torch.Tensor:
    """`token_loss` of the logits ``hidden @ weight.T`` ((M, h) rows, an (V, h) output projection), without the
    (M, V) logits: ``chunk`` rows at a time, each chunk's logits in the autocast dtype (if autocast is on) and their
    cross-entropy in fp32, as `token_loss` after a linear layer. Same loss and gradients up to summation order."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be at least 1.")
    dev = hidden.device.type
    try:
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else hidden.dtype
    except TypeError:  # torch < 2.4: no device-type argument
        on = torch.is_autocast_cpu_enabled() if dev == "cpu" else torch.is_autocast_enabled()
        auto = torch.get_autocast_cpu_dtype() if dev == "cpu" else torch.get_autocast_gpu_dtype()
        dtype = auto if on else hidden.dtype
    if normalizer is None:
        normalizer = (targets != IGNORE_INDEX).sum()
    denom = torch.as_tensor(normalizer, device=hidden.device).float().clamp(min=1)
    scale = (targets != IGNORE_INDEX).float() / denom
    if loss_weight is not None:
        scale = scale * loss_weight.float()
    with torch.autocast(dev, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, targets, scale, chunk, dtype)


def masked_targets(batch: "MaskedBatch") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The targets (M,) and loss weights (M,) or None of a batch's masked positions (``batch.positions``, found)."""
    targets = batch.labels.reshape(-1).index_select(0, batch.positions)
    weight = None if batch.loss_weight is None else batch.loss_weight.reshape(-1).index_select(0, batch.positions)
    return targets, weight


def masked_lm_loss(logits: torch.Tensor, batch: "MaskedBatch", *, normalizer: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Summed (weighted) cross-entropy over a batch's masked tokens divided by a device-side count.

    ``logits`` are either dense (B, L, V) or sparse (M, V) in row-major order of the masked positions
    (what `BiGLMForMaskedLM` returns with labels). ``normalizer`` overrides ``batch.normalizer``, e.g. with
    the global count over gradient-accumulation micro-batches and ranks.
    """
    if batch.positions is not None and logits.dim() == 2:  # sparse logits selected by index: no host sync
        targets, weight = masked_targets(batch)
    else:
        select = batch.labels != IGNORE_INDEX
        targets = batch.labels[select]
        if logits.dim() == 3:
            logits = logits[select]
        weight = None if batch.loss_weight is None else batch.loss_weight[select]
    return token_loss(logits, targets, weight=weight, normalizer=batch.normalizer if normalizer is None else normalizer)
