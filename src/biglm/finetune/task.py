"""The contract between the fine-tuning loop and a task, and the export every task shares.

One loop trains every task (`biglm.finetune.loop`); a task (from a family module of `biglm.finetune.tasks`) is a
plug-in that supplies what differs:
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

import json
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import torch

TASK_FILE = "biglm_task.json"  # written beside an exported model: the task, its settings (and template)


@runtime_checkable
class FinetuneTask(Protocol):
    """What a task gives the fine-tuning loop. See `biglm.finetune.tasks.classification` for a complete one."""

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


def save_task_export(model: torch.nn.Module, tokenizer: Any, out_dir: Path, *, record: dict[str, Any],
                     params_key: str | None = None, params: dict[str, Any] | None = None) -> None:
    """Write an exported task model: ``model`` and ``tokenizer`` through ``save_pretrained`` into ``out_dir``, and
    ``record`` (the task's `describe`) as `TASK_FILE` beside them. With ``params_key``, ``params`` first go into
    the model config's ``task_specific_params[params_key]``, where the exported model's pipeline or decoding
    reads them."""
    out_dir = Path(out_dir)
    if params_key is not None:
        task_params = dict(getattr(model.config, "task_specific_params", None) or {})
        task_params[params_key] = params
        model.config.task_specific_params = task_params
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / TASK_FILE).write_text(json.dumps(record, indent=2))
