"""The one fine-tuning loop: epochs over a task's training items, validation after each epoch, the best epoch kept.
Built from the pre-training loop's parts (`biglm.training.parts`, `parallelize`, `Checkpointer`, `lr_at`), with the
task (`biglm.finetune.task.FinetuneTask`) injected; `biglm finetune` runs it.

- Data order is a pure function of (seed, epoch): epoch e visits ``perm(seed, e)`` in global batches, rank r taking
  every world_size-th item, so a killed run resumes exactly and the curve does not depend on the number of ranks
  beyond float rounding. A partial last global batch is dropped (equal work per rank).
- The loss is the task's summed loss over the number of items in the *global* batch, counted before any forward,
  so micro-batching and ranks do not change it. Each global batch is sorted by length before it is cut into shards
  and micro-batches (``group_by_length``, on by default: fewer padded tokens, the same loss), except for a task whose
  loss couples the items of a micro-batch (``batch_coupled_loss``: retrieval's in-batch negatives).
- After every epoch, the task's metric on the validation split goes to metrics.jsonl; a better one exports the model
  to ``OUT/best`` (written aside and renamed: a kill never leaves a half-written best), recorded in the epoch's
  checkpoint so a resumed run keeps the right best.
- Under torchrun: DDP, or FSDP2 (``--parallel fsdp``, the default on GPU); validation and the best export then run on
  a full copy gathered on every rank (`unsharded_copy`), so every task's evaluation code runs unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..checkpoint import check_model_path, load_model
from ..checkpoint.export import share_files
from ..config import ConfigError, to_dict
from ..model import resolve_attn_backend
from ..training.checkpoint import hold_run_dir
from ..training.distributed import DistInfo, all_reduce_sum
from ..training.loop import Evaluation, TrainLoop
from ..training.parts import MetricsWriter, autocast, fmt_time
from ..training.schedule import lr_at
from .config import FinetuneConfig
from .task import FinetuneTask

_SALT_ORDER = 0xF17E


@dataclass
class FinetuneResult:
    step: int
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (epoch, metrics)
    best_epoch: int | None = None
    best: float | None = None
    interrupted: bool = False


def item_length(feature: dict[str, Any]) -> int:
    """A training item's size for length grouping: the tokens in its list-valued fields (every task's items hold
    their token ids as lists)."""
    return sum(len(v) for v in feature.values() if isinstance(v, (list, tuple, np.ndarray)))


class FineTuner(TrainLoop):
    """Fine-tuning: the one loop (`biglm.training.loop`) with a task's items as the batch source, its loss as the
    step and its validation metric (keeping the best epoch) as the evaluator. ``after_step(tuner, step)`` is a
    test hook. The settings are checked once, where they enter (`LoopConfig.validate`). A resume keeps the schedule
    its checkpoints were taken under (``fixed_on_resume``, as pre-training's: `TrainLoop.check_resume`)."""

    config_file = "finetune_config.json"
    fixed_on_resume = ("epochs", "schedule", "warmup_ratio", "lr", "min_lr", "global_batch", "betas", "weight_decay")

    def __init__(self, task: FinetuneTask, cfg: FinetuneConfig, *, info: DistInfo,
                 echo: Callable[[str], None] | None = None,
                 after_step: Callable[["FineTuner", int], None] | None = None) -> None:
        cfg.validate(world_size=info.world_size)  # a no-op where `run_finetune` checked these settings already
        super().__init__(cfg, info=info, out=cfg.output_dir(task.name), echo=echo, after_step=after_step)
        self.task = task
        self._build()

    def _build(self) -> None:
        cfg, dev = self.cfg, self.info.device
        base, self.tokenizer = load_model(cfg.model)
        if len(self.tokenizer) > base.config.vocab_size:
            raise ConfigError(f"{cfg.model}: its tokenizer has {len(self.tokenizer)} tokens but the model's vocabulary "
                              f"only {base.config.vocab_size}: the checkpoint and tokenizer do not belong together")
        self.task.prepare(self.tokenizer)  # data and templates checked before any model work
        torch.manual_seed(cfg.seed)  # new heads
        model = self.task.build_model(base, self.tokenizer)
        dropout = float(getattr(model.config, "attention_dropout", 0.0) or 0.0)
        model.config.attn_backend = resolve_attn_backend(cfg.attn_backend, device_type=dev.type, attention_dropout=dropout)
        # FSDP2 shards the weights in place: validation and export run on a gathered copy
        self.setup(model.to(dev).train(), gather_for_evaluation=True)
        self.features = self.task.train_features()
        n = len(self.features)
        if n < cfg.global_batch:
            raise ConfigError(f"the training set has {n} items, fewer than --global_batch {cfg.global_batch}: "
                              "lower --global_batch (and --micro_batch)")
        # a loss that couples the items of a micro-batch (in-batch negatives) must keep the drawn batches
        self._group = cfg.group_by_length and not getattr(self.task, "batch_coupled_loss", False)
        self._lengths = np.array([item_length(f) for f in self.features], dtype=np.int64)
        self.steps_per_epoch = n // cfg.global_batch
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.warmup_steps = int(round(cfg.warmup_ratio * self.total_steps))
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.evaluations = [Evaluation("validation", lambda step, last: self._epoch_end(step), self._record_epoch)]

    # ------------------------------------------------------------------ state
    def write_run_files(self) -> None:
        if not self.info.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "finetune_config.json").write_text(json.dumps(to_dict(self.cfg), indent=2))
        (self.out / "task.json").write_text(json.dumps(self.task.describe(), indent=2))

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]

    # ------------------------------------------------------------------ batches and the step
    def order(self, epoch: int) -> np.ndarray:
        """The visiting order of epoch ``epoch`` (0-based): a pure function of (seed, epoch)."""
        return np.random.default_rng([self.cfg.seed, _SALT_ORDER, epoch]).permutation(len(self.features))

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        return lr_at(step, schedule=cfg.schedule, lr=cfg.lr, min_lr=cfg.min_lr, total_steps=self.total_steps,
                     warmup_steps=self.warmup_steps)

    def step_batches(self) -> tuple[list[tuple[dict[str, Any]]], torch.Tensor]:
        """This rank's micro-batches of the step's items and the number of items in the global batch (one integer
        all-reduced, before any forward is queued)."""
        cfg, dev, W, r = self.cfg, self.info.device, self.info.world_size, self.info.rank
        epoch, pos = divmod(self.step, self.steps_per_epoch)
        items = self.order(epoch)[pos * cfg.global_batch:(pos + 1) * cfg.global_batch]
        if self._group:  # stable sort: ties keep the shuffled order; ranks then take every W-th item
            items = items[np.argsort(self._lengths[items], kind="stable")]
        items = items[r::W]
        micro = [(self.task.collate([self.features[i] for i in items[k:k + cfg.micro_batch]], device=dev),)
                 for k in range(0, len(items), cfg.micro_batch)]
        count = all_reduce_sum(torch.tensor(float(sum(b["num_items"] for b, in micro)), device=dev)).clamp(min=1)
        return micro, count

    def forward_backward(self, batch: dict[str, Any], count: torch.Tensor, *, sync: bool) -> torch.Tensor:
        """One micro-batch: the task's summed loss / the global item count, backward."""
        return self.backward(lambda model: self.task.loss(model, batch) / count, sync=sync)

    # ------------------------------------------------------------------ the evaluator: validation, best epoch
    def evaluate(self, model: torch.nn.Module | None = None) -> dict[str, float]:
        model = self.raw_model if model is None else model
        model.eval()
        with autocast(self.info.device, self.autocast_dtype):
            metrics = self.task.evaluate(model, batch_size=self.cfg.eval_batch_size, device=self.info.device)
        model.train()
        return metrics

    def _epoch_end(self, step: int) -> bool:
        return step % self.steps_per_epoch == 0

    def _better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value > self.best if self.task.higher_is_better else value < self.best

    def _export_best(self, model: torch.nn.Module) -> None:
        tmp, final = self.out / ".tmp-best", self.out / "best"
        shutil.rmtree(tmp, ignore_errors=True)
        self.task.export(model, self.tokenizer, tmp)
        share_files(tmp)
        old = self.out / ".old-best"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)

    def _record_epoch(self, result: FinetuneResult, metrics: MetricsWriter) -> None:
        epoch = self.step // self.steps_per_epoch
        eval_model = self.evaluation_model()
        scores = self.evaluate(eval_model)
        value = scores[self.task.metric]
        result.evals.append((epoch, scores))
        split = getattr(self.task, "eval_split_name", "validation")
        metrics.write({"step": self.step, "epoch": epoch, "split": split, **scores}, kind="eval")
        improved = self._better(value)
        if improved:
            self.best, self.best_epoch = value, epoch
            if self.info.is_main:
                self._export_best(eval_model)
        del eval_model
        self.echo(f"epoch {epoch} | {split}: {', '.join(f'{k} {v:.4g}' for k, v in scores.items())}"
                  f"{' | best so far -> ' + str(self.out / 'best') if improved else ''}")

    # ------------------------------------------------------------------ the loop's log
    def describe(self) -> str:
        cfg = self.cfg
        return (f"[biglm] fine-tuning {self.task.name}: {len(self.features)} items, {cfg.epochs} epochs x "
                f"{self.steps_per_epoch} steps of {cfg.global_batch}, lr {cfg.lr:g} {cfg.schedule}, device "
                f"{self.info.device}; best epoch by {self.task.metric}")

    def new_result(self) -> FinetuneResult:
        return FinetuneResult(step=self.step, best_epoch=self.best_epoch, best=self.best)

    def record_step(self, result: FinetuneResult, metrics: MetricsWriter, loss: torch.Tensor,
                    grad_norm: torch.Tensor, *, last: bool) -> None:
        if not (self.step % self.cfg.log_every == 0 or self._epoch_end(self.step) or last):
            return
        value = float(loss)
        result.losses.append((self.step, value))
        epoch = self.step / self.steps_per_epoch
        metrics.write({"step": self.step, "loss": value, "lr": self.optimizer.param_groups[0]["lr"],
                       "grad_norm": float(grad_norm), "epoch": epoch}, kind="train")
        self.echo(f"step {self.step:>6}/{self.total_steps} | epoch {epoch:.2f} | loss {value:.4f} | "
                  f"eta {fmt_time(self.eta())}")

    def save_due(self, last: bool) -> bool:
        return self._epoch_end(self.step)

    def finish(self, result: FinetuneResult) -> FinetuneResult:
        result.best_epoch, result.best = self.best_epoch, self.best
        if self.info.is_main and not result.interrupted and self.best is not None:
            self.echo(f"[biglm] best epoch {self.best_epoch}: {self.task.metric} {self.best:.4g}; model in "
                      f"{self.out / 'best'}")
        return result


def run_finetune(task: FinetuneTask, cfg: FinetuneConfig, *, echo: Callable[[str], None] | None = None) -> FinetuneResult:
    """Fine-tune ``task`` with ``cfg`` from Python, as ``biglm finetune`` does: in this process, or as one rank when
    started by torchrun (the process group is started here and torn down at the end, also on error).

        from biglm.finetune import FinetuneConfig, Seq2SeqSettings, Seq2SeqTask, run_finetune
        task = Seq2SeqTask(Seq2SeqSettings(train="pairs.jsonl", validation="val.jsonl"), name="squad-qg")
        result = run_finetune(task, FinetuneConfig(model="runs/default", out_dir="runs/qg", epochs=4, lr=5e-4))
        result.best_epoch, result.best          # the best epoch's metric; its model is in runs/qg/best

    SIGINT/SIGTERM stop it after the step in progress with that step's checkpoint, then raise
    `biglm.training.TrainingInterrupted` (``biglm finetune`` exits 130 / 143); the same call resumes there.
    """
    from ..training.distributed import destroy_distributed, init_distributed

    cfg.validate()  # before any process group starts
    info = init_distributed(cfg.device)
    try:
        cfg.validate(world_size=info.world_size)  # again only under torchrun: the ranks are news
        check_model_path(cfg.model)  # a --model that is no model leaves no locked, empty output folder behind
        # the lock before any model or data work, so a second run is refused at once (the loop re-enters it)
        with hold_run_dir(cfg.output_dir(task.name), echo=echo):
            return FineTuner(task, cfg, info=info, echo=echo).train()
    finally:
        destroy_distributed()


__all__ = ["FineTuner", "FinetuneResult", "run_finetune"]
