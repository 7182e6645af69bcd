"""`FinetuneConfig`: the loop's settings for any task (the task's own settings are its own dataclass,
given on the command line as ``--task.FIELD value``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config import ConfigError


@dataclass
class FinetuneConfig:
    """A fine-tuning run: the pre-trained model, epochs, optimiser and systems settings."""

    model: str = ""
    """the pre-trained BiGLM: a `biglm export` / Hugging Face directory or a `biglm pretrain` run directory"""
    name: str = ""
    """run name (default: the task's name); the default output directory is runs/finetune-NAME"""
    out_dir: str | None = None
    """where checkpoints, metrics, the best epoch's model (OUT/best) go"""
    epochs: int = 5
    """passes over the training set; validation after each, the best epoch kept (paper: 5 for MNLI and SQuAD)"""
    lr: float = 2e-5
    """peak learning rate"""
    min_lr: float = 0.0
    """learning rate at the end of the decay"""
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    """decay after the linear warm-up"""
    warmup_ratio: float = 0.06
    """share of all steps spent warming up"""
    global_batch: int = 32
    """training items per optimizer step over all ranks and accumulation steps (a last partial batch of an
    epoch is dropped)"""
    micro_batch: int = 8
    """items per forward/backward on one rank"""
    group_by_length: bool = True
    """sort each global batch by item length before splitting it over ranks and micro-batches: the same items
    and the same loss per step, fewer padded tokens"""
    weight_decay: float = 0.01
    """AdamW weight decay (matrices only)"""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas"""
    grad_clip: float = 1.0
    """global gradient-norm clipping"""
    seed: int = 0
    """seed of the data order, new heads and dropout"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where to train (auto: cuda when available)"""
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 autocast on GPU, fp32 on CPU"""
    compile: Literal["auto", "yes", "no"] = "auto"
    """torch.compile the blocks (auto: on GPU)"""
    attn_backend: Literal["auto", "eager", "sdpa", "flex"] = "auto"
    """auto: flex on GPU (sdpa with attention dropout), sdpa on CPU"""
    parallel: Literal["auto", "ddp", "fsdp"] = "auto"
    """data parallelism under torchrun: ddp, fsdp (FSDP2: parameters, gradients and optimizer state sharded per
    block; validation and export gather a full copy) or auto (fsdp on GPU, ddp on CPU)"""
    eval_batch_size: int = 32
    """items per forward pass in validation"""
    log_every: int = 10
    """steps between log lines"""
    save_every: int = 0
    """steps between checkpoints inside an epoch (0: at the end of every epoch only; also on SIGINT/SIGTERM)"""
    keep_last: int = 2
    """complete checkpoints kept"""
    tensorboard: bool = False
    """also write TensorBoard scalars"""

    def output_dir(self, task_name: str) -> Path:
        return Path(self.out_dir or Path("runs") / f"finetune-{self.name or task_name}")

    def validate(self, *, world_size: int = 1) -> None:
        if not self.model:
            raise ConfigError("missing --model: a pre-trained BiGLM (a `biglm export` directory or a run directory)")
        if not Path(self.model).exists():
            raise ConfigError(f"--model {self.model}: no such directory; pass a `biglm export` or `biglm pretrain` "
                              "output (hub names: download with `huggingface-cli download` first)")
        if self.global_batch % (self.micro_batch * world_size):
            raise ConfigError(f"--global_batch {self.global_batch} is not divisible by --micro_batch {self.micro_batch} "
                              f"x ranks {world_size}")
        for name in ("epochs", "micro_batch", "global_batch", "eval_batch_size", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"--warmup_ratio {self.warmup_ratio} must lie in [0, 1)")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ConfigError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if self.save_every < 0:
            raise ConfigError(f"--save_every must be >= 0, got {self.save_every}")
