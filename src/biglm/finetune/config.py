"""`FinetuneConfig`: the loop's settings for any task (the task's own settings are its own dataclass,
given on the command line as ``--task.FIELD value``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config import ConfigError
from ..training.config import LoopConfig


@dataclass
class FinetuneConfig(LoopConfig):
    """A fine-tuning run: the pre-trained model, epochs and schedule (the optimiser and systems settings are the
    loop's, `LoopConfig`; a partial last global batch of an epoch is dropped)."""

    model: str = ""
    """the pre-trained BiGLM: a `biglm export` / Hugging Face directory or a `biglm pretrain` run directory"""
    name: str = ""
    """run name (default: the task's name); the default output directory is runs/finetune-NAME"""
    out_dir: str | None = None
    """where checkpoints, metrics, the best epoch's model (OUT/best) go"""
    epochs: int = 5
    """passes over the training set; validation after each, the best epoch kept (paper: 5 for MNLI and SQuAD)"""
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    """decay after the linear warm-up"""
    warmup_ratio: float = 0.06
    """share of all steps spent warming up"""
    group_by_length: bool = True
    """sort each global batch by item length before splitting it over ranks and micro-batches: the same items
    and the same loss per step, fewer padded tokens"""
    eval_batch_size: int = 32
    """items per forward pass in validation"""

    def output_dir(self, task_name: str) -> Path:
        return Path(self.out_dir or Path("runs") / f"finetune-{self.name or task_name}")

    def check(self, *, world_size: int) -> None:
        if not self.model:
            raise ConfigError("missing --model: a pre-trained BiGLM (a `biglm export` directory or a run directory)")
        if not Path(self.model).exists():
            raise ConfigError(f"--model {self.model}: no such directory; pass a `biglm export` or `biglm pretrain` "
                              "output (hub names: download with `huggingface-cli download` first)")
        super().check(world_size=world_size)
        for name in ("epochs", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"--warmup_ratio {self.warmup_ratio} must lie in [0, 1)")
