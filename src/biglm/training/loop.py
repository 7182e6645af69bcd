"""The one training loop. Pre-training (`biglm.training.trainer.Trainer`) and fine-tuning
(`biglm.finetune.loop.FineTuner`) are this loop with three parts injected by a program (a subclass):

- the **batch source**, `step_batches()`: this rank's micro-batches of the current step and the global
  normaliser of the loss (known before any forward, so no micro-batch waits on another);
- the **step function**, `forward_backward(*micro, normalizer, sync=...)`: one micro-batch's loss, divided by
  the normaliser, through `backward` (which owns mixed precision, gradient sync and the rank scaling);
- the **evaluators**, `Evaluation`s: each says when it is due and writes what it measured.

Everything else exists once, here: the run directory's lock, the model's wrapping (torch.compile, DDP or FSDP2),
AdamW with the settings of `LoopConfig`, the learning-rate schedule, the clipped and checked optimiser step,
checkpoints with an exact resume (model, optimiser, step, RNG state and the program's own state), SIGINT/SIGTERM,
metrics.jsonl and the experiment trackers of --report_to (`trackers`), the ``after_step`` test hook and the
``BIGLM_FAULT_AFTER_STEP`` crash injection. A new training mode is a program, never a flag in this file.

A stop signal never interrupts a step: the handler records it (and says so on the console), and the loop reads it
once per step, right after the optimiser step (a signal that lands later belongs to the next step); under torchrun
the ranks agree on it by a host-side collective. The stopping step is logged and checkpointed (or the console says
why it could not be), then `train` raises `TrainingInterrupted` (exit status 130 for SIGINT, 143 for SIGTERM), so
``biglm pretrain ... && biglm export ...`` does not go on.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoint import CheckpointError, checkpoint_dirs
from ..config import to_dict
from .checkpoint import Checkpointer, hold_run_dir
from .config import LoopConfig
from .distributed import (DistInfo, agree_max, all_reduce_sum, host_group, parallelize, set_gradient_sync,
                          shape_template, unsharded_copy)
from .parts import (FiniteWatch, MetricsWriter, autocast, autocast_dtype, build_optimizer, clip_and_step,
                    install_stop_signals, restore_rng, restore_signals, rng_state, set_lr)


class TrainingInterrupted(KeyboardInterrupt):
    """A stop signal ended training: raised by `TrainLoop.train` after the stopping step's checkpoint was written
    (``checkpoint``; None when it could not be, which the console said). A KeyboardInterrupt, as Ctrl-C is in
    Python: no ``except Exception`` swallows it, and a script does not go on as if the run had finished.
    ``exit_code`` is the shell's 128 + signal number (130 SIGINT, 143 SIGTERM), what the `biglm` command exits
    with; ``result`` is what `train` would have returned (its ``interrupted`` set)."""

    def __init__(self, signum: int, *, step: int, checkpoint: Path | None, result: Any) -> None:
        self.signal, self.step, self.checkpoint, self.result = signum, step, checkpoint, result
        where = f"checkpoint {checkpoint}" if checkpoint is not None else "its checkpoint could not be written"
        super().__init__(f"{_signal_name(signum)}: training stopped at step {step} ({where})")

    @property
    def exit_code(self) -> int:
        return 128 + self.signal


@dataclass
class Evaluation:
    """An evaluator of the loop: ``due(step, last)`` says when, ``run(result, metrics)`` measures and records."""

    name: str
    due: Callable[[int, bool], bool]
    run: Callable[[Any, MetricsWriter], None]


class TrainLoop:
    """The loop's machinery; a program sets ``total_steps``, calls `setup` with its model and fills ``evaluations``.

    ``after_step(loop, step)`` is called after every optimiser step (tests, fault injection)."""

    total_steps: int
    config_file: str | None = None
    """the run's saved configuration (in the output directory), which `check_resume` compares against"""
    fixed_on_resume: tuple[str, ...] = ()
    """the configuration's fields a resume may not change: the schedule the saved steps were taken under"""

    def __init__(self, cfg: LoopConfig, *, info: DistInfo, out: Path, echo: Callable[[str], None] | None = None,
                 after_step: Callable[[Any, int], None] | None = None) -> None:
        self.cfg, self.info, self.out = cfg, info, Path(out)
        self.echo = echo or (print if info.is_main else (lambda s: None))
        self.after_step = after_step
        self.evaluations: list[Evaluation] = []
        self.step = 0
        self._stop_signal: int | None = None  # the first stop signal received
        self._stop_at: int | None = None  # the step it stops after
        self._deciding = 1  # the step whose stop decision comes next
        self._saved_step: int | None = None
        self._stop_group = None  # under torchrun: the host-side group the ranks agree on a stop over
        self._checking_inputs = True
        self.finite_watch: FiniteWatch | None = None  # a program sets one for the sync-free non-finite check

    # ------------------------------------------------------------------ set-up
    def setup(self, model: torch.nn.Module, *, activation_checkpointing: bool = False,
              gather_for_evaluation: bool = False) -> None:
        """Wrap ``model`` (on its device) for training and build the optimiser and checkpointer.

        ``gather_for_evaluation``: under FSDP2 keep a weightless skeleton, so `evaluation_model` can gather a full
        copy on every rank (evaluation code that calls any submodule cannot run on sharded weights)."""
        cfg, dev = self.cfg, self.info.device
        self.raw_model = model
        self.autocast_dtype = autocast_dtype(cfg.dtype, dev)
        mode = cfg.parallel if cfg.parallel != "auto" else ("fsdp" if dev.type == "cuda" else "ddp")
        self.fsdp = self.info.distributed and mode == "fsdp"
        self._template = shape_template(model) if self.fsdp and gather_for_evaluation else None
        use_compile = cfg.compile == "yes" or (cfg.compile == "auto" and dev.type == "cuda")
        self.model = parallelize(model, info=self.info, mode=mode, compile=use_compile,
                                 activation_checkpointing=activation_checkpointing, param_dtype=self.autocast_dtype)
        self.optimizer = build_optimizer(model, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.checkpointer = Checkpointer(self.out, keep_last=cfg.keep_last)
        self._stop_group = host_group()

    def evaluation_model(self) -> torch.nn.Module:
        """The model an evaluator sees: the training model itself, or under FSDP2 (with ``gather_for_evaluation``)
        a full copy gathered on every rank (a collective)."""
        if self._template is None:
            return self.raw_model
        return unsharded_copy(self.model, template=self._template, device=self.info.device)

    # ------------------------------------------------------------------ the program's parts
    def lr_at(self, step: int) -> float:
        raise NotImplementedError

    def step_batches(self) -> tuple[list[tuple[Any, ...]], torch.Tensor]:
        """This rank's micro-batches of the current step (each a tuple of `forward_backward`'s arguments) and the
        global normaliser of the step's loss."""
        raise NotImplementedError

    def forward_backward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The program's part of a checkpoint, beside the step and the RNG state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def write_run_files(self) -> None:
        """Write what the run directory records of this run (config, tokenizer...) before the first step."""

    def after_optimizer_step(self) -> None:
        """Bookkeeping after the weights changed (e.g. tokens seen)."""

    def record_step(self, result: Any, metrics: MetricsWriter, loss: torch.Tensor, grad_norm: torch.Tensor, *,
                    last: bool) -> None:
        """Log the step (the program decides what a log line holds and when). ``last``: the run ends after this
        step (its last step, the time budget or a stop signal): whatever the program holds back is logged now."""

    def save_due(self, last: bool) -> bool:
        """Whether a checkpoint is due after this step (besides --save_every and a stop signal)."""
        return last

    # ------------------------------------------------------------------ one step
    def backward(self, compute_loss: Callable[[torch.nn.Module], torch.Tensor], *, sync: bool) -> torch.Tensor:
        """One micro-batch: ``compute_loss(model)`` (its loss already divided by the global normaliser) under
        autocast, backward, gradients reduced over ranks only when ``sync``. Returns the detached loss."""
        W = self.info.world_size
        with set_gradient_sync(self.model, sync):
            with autocast(self.info.device, self.autocast_dtype):
                # DDP/FSDP average gradients over ranks; the normaliser is already global, so undo that
                loss = compute_loss(self.model) * W
            loss.backward()
        if self._checking_inputs:
            # inputs come from vocabulary-checked data and tokenizers: after the first checked micro-batch the
            # encoder's per-call range checks (a host sync each) are off
            from ..model import BiGLMModel

            for module in self.raw_model.modules():
                if isinstance(module, BiGLMModel):
                    module.validate_inputs = False
            self._checking_inputs = False
        return loss.detach() / W

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimiser step over the global batch; returns (loss, gradient norm) as device tensors."""
        set_lr(self.optimizer, self.lr_at(self.step))
        micro, normalizer = self.step_batches()
        total = torch.zeros((), device=self.info.device)
        for i, parts in enumerate(micro):
            total += self.forward_backward(*parts, normalizer, sync=i == len(micro) - 1)
        grad_norm = clip_and_step(self.raw_model, self.optimizer, grad_clip=self.cfg.grad_clip, step=self.step,
                                  loss=total, run_dir=self.out, watch=self.finite_watch)
        self.step += 1
        self.after_optimizer_step()
        return all_reduce_sum(total), grad_norm

    def check_finite(self) -> None:
        """Raise `NonFiniteLossError` if a step's gradient was not finite (with ``finite_watch``: one host sync)."""
        if self.finite_watch is not None:
            self.finite_watch.check(self.out)

    # ------------------------------------------------------------------ state
    def save(self) -> Path:
        extra = {"step": self.step, **self.state_dict(), **rng_state(self.info.device)}
        path = self.checkpointer.save(self.step, model=self.model, optimizer=self.optimizer, extra=extra)
        self._saved_step = self.step
        self.echo(f"[biglm] saved checkpoint {path}")
        return path

    # ------------------------------------------------------------------ stop signals
    def request_stop(self, signum: int) -> None:
        """What SIGINT/SIGTERM do (a test may call it too): stop after the step whose stop decision comes next, with
        its checkpoint. Only records and announces: the step in progress, its log line and its save go on."""
        name = _signal_name(signum)
        if self._stop_signal is not None:
            self._announce(f"\n[biglm] received {name} again: already stopping after step "
                           f"{min(self._stop_at or self.step, self.total_steps)}")
            return
        self._stop_signal, self._stop_at = signum, self._deciding
        self._announce(f"\n[biglm] received {name}: stopping after step {min(self._stop_at, self.total_steps)} with "
                       "a checkpoint")

    def _announce(self, text: str) -> None:
        """A line from the signal handler, which may run in the middle of another print (Python's buffered streams
        refuse that reentrant call): then straight to stderr's file descriptor."""
        try:
            self.echo(text)
        except RuntimeError:
            if self.info.is_main:
                os.write(2, (text + "\n").encode())

    def _stop_decision(self) -> int:
        """Whether to stop after this step (the signal number, or 0): read once per step, before anything else of
        the step; a signal later in the step stops after the next one. The ranks agree under torchrun."""
        self._deciding = self.step + 1  # first: a signal from here on announces (and gets) the next step
        local = self._stop_signal if self._stop_at is not None and self._stop_at <= self.step else 0
        return agree_max(local or 0, group=self._stop_group)

    def _save_announced(self, signum: int) -> Path | None:
        """The checkpoint a stop signal announced; when it cannot be written, the console says so and why."""
        try:
            return self.save()
        except (CheckpointError, OSError) as e:
            previous = checkpoint_dirs(self.out)
            resume = f"a resume starts from {previous[-1].name}" if previous else "no checkpoint to resume from"
            self.echo(f"[biglm] {_signal_name(signum)}: could not write the checkpoint of step {self.step} "
                      f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); {resume}")
            return None

    def check_resume(self) -> None:
        """Refuse (`CheckpointError`, one line naming each field with its saved and new value) a resume whose
        ``fixed_on_resume`` fields differ from the run's saved configuration: the steps already taken followed the
        saved schedule, and continuing under another one silently changes it (lr 6.95e-05 at step 6 became 2.07e-04
        at step 7 with another --steps). Checked before any run file is rewritten."""
        saved_path = self.out / self.config_file if self.config_file else None
        if not self.fixed_on_resume or saved_path is None or not saved_path.is_file() or not checkpoint_dirs(self.out):
            return
        try:
            saved = json.loads(saved_path.read_text())
        except (OSError, ValueError):
            return
        now = to_dict(self.cfg)
        changed = [f"{k} {_said(saved[k])} -> {_said(now.get(k))}" for k in self.fixed_on_resume
                   if k in saved and saved[k] != now.get(k)]
        if changed:
            raise CheckpointError(
                f"{self.out} was trained with other settings than these ({'; '.join(changed)}): a resume keeps the "
                f"schedule its checkpoints were taken under. Run it again with the saved values ({saved_path}), or "
                f"start a new run from it: --init_from {self.out} --out_dir NEW_DIR")

    def maybe_resume(self) -> bool:
        """Resume from the newest complete checkpoint in the output directory, if any."""
        self.check_resume()
        self.write_run_files()
        resumed = self.checkpointer.resume(model=self.model, optimizer=self.optimizer)
        if resumed is None:
            return False
        ckpt, extra = resumed
        self.step = self._saved_step = extra["step"]
        self.load_state_dict(extra)
        restore_rng(extra, self.info.device)
        if self.step >= self.total_steps:
            self.echo(f"[biglm] {self.out} already finished: step {self.step} of {self.total_steps} ({ckpt}); "
                      f"nothing to train. To train on, start a new run from it: --init_from {self.out} --out_dir "
                      "NEW_DIR --steps N")
        else:
            self.echo(f"[biglm] resumed from {ckpt} (step {self.step})")
        return True

    # ------------------------------------------------------------------ the loop
    def describe(self) -> str:
        """The run's first log line."""
        return ""

    def new_result(self) -> Any:
        raise NotImplementedError

    def finish(self, result: Any) -> Any:
        return result

    def train(self) -> Any:
        """Resume if there is a checkpoint, then train to the last step, holding the output directory's lock (a
        second run there is refused, naming this one). A stop signal raises `TrainingInterrupted` once its step's
        checkpoint is written (the lock released first)."""
        with hold_run_dir(self.out, echo=self.echo):
            result = self._train()
        if result.interrupted:
            raise TrainingInterrupted(self._stop_signal or signal.SIGINT, step=self.step, checkpoint=self._stopped_with,
                                      result=result)
        return result

    def _train(self) -> Any:
        cfg = self.cfg
        self.maybe_resume()
        result = self.new_result()
        # from the step resumed at: what an earlier attempt logged after it is logged again by this one
        metrics = MetricsWriter(self.out, enabled=self.info.is_main, trackers=cfg.trackers(), config=to_dict(cfg),
                                project=cfg.project, start_step=self.step, echo=self.echo)

        self._deciding = self.step + 1
        self._stopped_with: Path | None = None
        old_handlers = install_stop_signals(self.request_stop)
        self.model.train()
        fault_step = int(os.environ.get("BIGLM_FAULT_AFTER_STEP", "0"))  # tests: simulate a crash (os._exit)
        self.echo(self.describe())
        self.t_start, self.step_start = time.perf_counter(), self.step
        budget = None if getattr(cfg, "max_minutes", None) is None else cfg.max_minutes * 60.0
        self._over_budget = False
        stopped = 0
        try:
            while self.step < self.total_steps:
                loss, grad_norm = self.train_step()
                if self.after_step is not None:
                    self.after_step(self, self.step)
                if fault_step and self.step == fault_step:
                    os._exit(17)
                stopped = self._stop_decision()  # before this step's log line, evaluations and checkpoint
                over = budget is not None and time.perf_counter() - self.t_start >= budget
                last = self.step == self.total_steps or over
                if over and self.step < self.total_steps and not stopped:
                    self.echo(f"[biglm] time budget of {cfg.max_minutes:g} min reached after step {self.step} of "
                              f"{self.total_steps}: stopping here")
                    self._over_budget = True
                save = bool(cfg.save_every and self.step % cfg.save_every == 0) or self.save_due(last)
                due = [e for e in self.evaluations if e.due(self.step, last)]
                if last or stopped or save or due or self.step % cfg.log_every == 0:
                    self.check_finite()  # a skipped (non-finite) step is never logged, evaluated or saved
                self.record_step(result, metrics, loss, grad_norm, last=last or bool(stopped))
                for evaluation in due:
                    evaluation.run(result, metrics)
                if save and not stopped:
                    self.save()
                if stopped or last:
                    break
            # a signal after the last step's decision: the run's end is where it stops
            stopped = stopped or agree_max(self._stop_signal or 0, group=self._stop_group)
            if stopped:
                self._stop_signal = stopped  # under torchrun: the signal another rank received
                self._stopped_with = (self.checkpointer.root / f"step_{self.step:07d}"
                                      if self._saved_step == self.step else self._save_announced(stopped))
                result.interrupted = True
                where = (f"checkpoint {self._stopped_with}" if self._stopped_with is not None
                         else "without its checkpoint")
                then = ("run the same command to resume." if self.step < self.total_steps
                        else "that was the run's last step.")
                self.echo(f"[biglm] {_signal_name(stopped)}: stopped at step {self.step} ({where}); {then}")
        except BaseException:
            if self._stop_signal is not None and self._saved_step != self.step:
                self.echo(f"[biglm] the checkpoint {_signal_name(self._stop_signal)} announced was not written: the "
                          f"run ended on an error at step {self.step}")
            raise
        finally:
            restore_signals(old_handlers)
            metrics.close()
        result.step = self.step
        return self.finish(result)

    def eta(self) -> float:
        """Seconds to the last step at this run's pace so far."""
        done = max(self.step - self.step_start, 1)
        return (time.perf_counter() - self.t_start) / done * (self.total_steps - self.step)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _said(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, (list, dict)) else str(value)


__all__ = ["Evaluation", "TrainLoop", "TrainingInterrupted"]
