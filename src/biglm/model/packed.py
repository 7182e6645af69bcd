"""Prepacked oneDNN linear layers for inference on a CPU: the weights reordered once into the blocked layout the
matrix kernels read, instead of on every call.

Why: a decoding call at a real model's shape multiplies a few rows (the masks of one block, 1-64 per request) by every
weight matrix, so it is bound by reading the weights. PyTorch's `F.linear` on a CPU packs the weight on each call
for small row counts; oneDNN's prepacked linear (``torch.ops.mkldnn._linear_pointwise``, what inductor's
freezing emits on CPU) reads it as it lies. Measured at the SmolLM2-135M shape, one thread, AMD EPYC (AVX512-BF16),
10 rows: 576 x 1536 bfloat16 82 -> 53 us, float32 260 -> 87 us; the 49153 x 576 output layer bfloat16 4.2 -> 2.6 ms
(docs/LOG.md 2026-11-26 night). The results equal `F.linear`'s in bfloat16 at those shapes and differ by float32
summation order in float32.

Batch invariance (`BiGLMModel.batch_invariant`) needs a row's result not to depend on the rows beside it. In
bfloat16 the prepacked kernels' rows were measured independent of the row count (1-256 rows, a row at the first, middle
and last place, one and two threads, every SmolLM2-135M shape; `F.linear`'s too). In float32 they are not: a one-row
call takes another kernel than two rows, and `F.linear` (MKL) differs from 4 rows on; so the mode is bfloat16's.

Only for inference: the packed copy does not follow later changes to the weight (training, loading weights
afterwards). `pack_linears` leaves a model as it is where oneDNN is missing or refuses the layout.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS_HINT = 16  # the row count oneDNN tunes the layout for (any row count runs)


class PackedLinear(nn.Module):
    """An `nn.Linear` whose weight is also held prepacked for oneDNN; ``weight`` and ``bias`` stay the original
    parameters (state_dict, dtype and device queries see them unchanged)."""

    def __init__(self, linear: nn.Linear, *, rows_hint: int = ROWS_HINT) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows_hint)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.packed.dtype or torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)  # autocast or a gradient asked for: the plain path
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def _packable(linear: nn.Linear) -> bool:
    w = linear.weight
    if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return False
    try:  # oneDNN present and taking this layout: check on a tiny copy, once per layer shape
        probe = torch.zeros(2, linear.in_features, dtype=w.dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach()[:2].contiguous(), 2)
        torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
        return True
    except (RuntimeError, AttributeError):
        return False


@torch.no_grad()
def pack_linears(model: nn.Module, *, rows_hint: int = ROWS_HINT) -> int:
    """Swap every `nn.Linear` of an inference model on a CPU for a `PackedLinear` (the model's weights must not change
    afterwards); returns how many were swapped (0 off a CPU, or without oneDNN)."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear]
    if not swaps or not torch.backends.mkldnn.is_available() or not _packable(swaps[0][2]):
        return 0
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child, rows_hint=rows_hint))
    return len(swaps)
