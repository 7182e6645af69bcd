"""The contract between the fine-tuning loop and a task (DESIGN §9).

One loop trains every task (`biglm.finetune.loop`); a task is a plug-in that supplies what differs:
a model built from the pre-trained BiGLM (the MLM head itself, or a new head), its training
features, a collate function, the loss, the evaluation metric and the export. The loop owns the
rest: epochs, shuffling, batching, accumulation, the optimiser and schedule, mixed precision,
DDP/FSDP, checkpoints with exact resume, keeping the best epoch, metrics.jsonl.

Notable features
- Loss normalisation without a host sync: `FinetuneTask.loss` returns the *summed* loss of a
  micro-batch and the number of items it covers (device tensors); the loop divides by the
  count of the whole global batch, which it knows from the collated batches before any forward.
- Optional attribute ``batch_coupled_loss`` (default False): True when the loss of an item depends on the
  other items of its micro-batch (retrieval's in-batch negatives); the loop then keeps the drawn batches
  as they are instead of grouping each global batch by length.
- Features are plain dicts of Python lists/ints (what `datasets.Dataset.map` yields), so the
  loop can shuffle, shard across ranks and resume by index alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class FinetuneTask(Protocol):
    """What a task gives the fine-tuning loop. See `biglm.finetune.classification` for a complete one."""

    name: str
    """registry name (``biglm tasks``)"""
    metric: str
    """the key of `evaluate`'s result that picks the best epoch (e.g. ``accuracy``, ``f1``, ``ndcg@10``)"""
    higher_is_better: bool
    """whether a larger `metric` is better"""

    def prepare(self, tokenizer: Any) -> None:
        """Load and check the data against ``tokenizer`` (before any model is built); raise a clear error
        naming the file/field and the fix on bad input."""

    def build_model(self, base: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        """The model to fine-tune, built from the pre-trained `BiGLMForMaskedLM` ``base`` (reusing its weights)."""

    def train_features(self) -> Sequence[dict[str, Any]]:
        """Training items (the loop shuffles and batches them by index)."""

    def collate(self, features: Sequence[dict[str, Any]], *, device: torch.device) -> dict[str, torch.Tensor]:
        """A micro-batch of tensors on ``device``; must include ``num_items`` (a Python int: how many loss items
        the batch holds, e.g. examples or answer slots), which the loop sums over the global batch."""

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The summed (not averaged) loss over the batch's ``num_items`` items, a device scalar."""

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, *, batch_size: int, device: torch.device) -> dict[str, float]:
        """Metrics on the validation split (``metric`` among them); called on the main process, model in eval mode."""

    def export(self, model: torch.nn.Module, tokenizer: Any, out_dir: Path) -> None:
        """Write a directory usable without biglm's trainer (the right HF class, tokenizer, template...)."""

    def describe(self) -> dict[str, Any]:
        """What the run directory records about the task (name, data, template), JSON-serialisable."""
