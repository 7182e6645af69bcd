"""The parts every training loop of biglm is built from (pre-training in `trainer`, fine-tuning in
`biglm.finetune.loop`): the optimiser, mixed precision, the clipped and checked optimiser step, stop
signals, and the metrics writer. A new loop composes these; it never re-implements them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import torch

from .distributed import all_reduce_sum


class NonFiniteLossError(RuntimeError):
    """The loss or gradient became NaN/inf; the run stopped before updating the weights."""


def build_optimizer(model: torch.nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float
                    ) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not norms or biases), fused kernels."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=tuple(betas), fused=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of a ``dtype`` setting: bf16 for "bf16" (and "auto" on GPU), None (fp32) otherwise."""
    return torch.bfloat16 if dtype == "bf16" or (dtype == "auto" and device.type == "cuda") else None


def autocast(device: torch.device, dtype: torch.dtype | None):
    """The autocast context for ``dtype`` (a no-op for fp32)."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def _non_finite(step: int, loss_now: float, run_dir: Path) -> NonFiniteLossError:
    return NonFiniteLossError(
        f"non-finite {'loss' if not math.isfinite(loss_now) else 'gradient'} at step {step} "
        f"(loss {loss_now}): the run stopped before the optimizer step, so the weights and every checkpoint "
        f"are untouched. Lower --lr, check the data, or resume from the last checkpoint in {run_dir}/checkpoints."
    )


class FiniteWatch:
    """The non-finite check without a host sync per step: the first step whose gradient norm is NaN/inf is recorded
    on the device, and from it on the fused optimiser skips every update (its ``found_inf``, as AMP's grad scaler
    uses it), so the weights stay those before that step; `check` (one sync) raises the error naming it."""

    def __init__(self, device: torch.device) -> None:
        self.first = torch.full((), -1, dtype=torch.long, device=device)
        self.loss = torch.zeros((), device=device)

    def update(self, grad_norm: torch.Tensor, *, step: int, loss: torch.Tensor) -> torch.Tensor:
        """Record this step's norm; returns the optimiser's ``found_inf`` (1.0: skip)."""
        new = ~torch.isfinite(grad_norm) & (self.first < 0)
        self.first = torch.where(new, step, self.first)
        self.loss = torch.where(new, loss.detach().float(), self.loss)
        return (self.first >= 0).float()

    def check(self, run_dir: Path) -> None:
        first = int(self.first)
        if first >= 0:
            raise _non_finite(first, float(all_reduce_sum(self.loss.clone())), run_dir)


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, grad_clip: float, step: int,
                  loss: torch.Tensor, run_dir: Path, watch: FiniteWatch | None = None) -> torch.Tensor:
    """Clip the global gradient norm, refuse a non-finite one before the weights change (one scalar sync per
    step; with ``watch``, none: the step is skipped on the device and `FiniteWatch.check` raises later), take the
    optimiser step and clear the gradients. Returns the (pre-clip) gradient norm."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    if watch is not None:
        optimizer.found_inf = watch.update(grad_norm, step=step, loss=loss)
    elif not bool(torch.isfinite(grad_norm)):
        raise _non_finite(step, float(all_reduce_sum(loss.detach().clone())), run_dir)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


class StepPrefetcher:
    """Builds the steps ``start, start+1, ... end-1`` with ``build(step)`` in a background thread, ``depth`` ahead,
    so data reading and mask drawing run while the device computes; `get` returns them in order (re-raising an
    error of ``build``). The thread is the only caller of ``build`` until `close`."""

    def __init__(self, build: Callable[[int], Any], *, start: int, end: int, depth: int = 2) -> None:
        import queue
        import threading

        self.next_step = start
        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()

        def run() -> None:
            for step in range(start, end):
                try:
                    item = (build(step), None)
                except BaseException as e:  # noqa: BLE001 - handed to the consumer
                    item = (None, e)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set() or item[1] is not None:
                    return

        self._thread = threading.Thread(target=run, name="biglm-step-prefetch", daemon=True)
        self._thread.start()

    def get(self) -> Any:
        item, error = self._queue.get()
        if error is not None:
            raise error
        self.next_step += 1
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def rng_state(device: torch.device) -> dict[str, Any]:
    """The RNG state a checkpoint keeps (dropout and any sampling replay exactly after a resume)."""
    state = {"rng_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["rng_cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["rng_cpu"])
    if "rng_cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["rng_cuda"], device)


def install_stop_signals(on_stop: Callable[[int], None]) -> dict:
    """Route SIGINT/SIGTERM to ``on_stop(signum)`` (the loop's `TrainLoop.request_stop`: it records the signal and
    the step it stops after; the loop writes that step's checkpoint); returns the previous handlers for
    `restore_signals`."""
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread
            old[sig] = signal.signal(sig, lambda signum, frame: on_stop(signum))
    return old


def restore_signals(old: dict) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)


class MetricsWriter:
    """JSONL metrics (one record per line: train losses, logs, validation) and the experiment trackers of
    ``--report_to`` (`trackers.Trackers`: the same numbers, as ``KIND/FIELD`` scalars at the record's step).

    ``start_step`` is the step the run (re)starts from: what an earlier attempt logged past it (steps a crash or a
    damaged checkpoint rolled back, which the run is about to log again) is dropped before the first new line, so
    the log reads as one run. metrics.jsonl is rewritten atomically; TensorBoard purges the same steps; a resumed
    W&B or trackio run, which cannot take a step back, is not sent those scalars again (`trackers.Trackers`: the
    dropped records say what it was sent)."""

    def __init__(self, out: Path, *, enabled: bool, trackers: Sequence[str] = (), config: dict[str, Any] | None = None,
                 project: str = "biglm", start_step: int = 0, echo: Callable[[str], None] = print) -> None:
        self.enabled = enabled
        self.trackers = None
        if not enabled:
            return
        out.mkdir(parents=True, exist_ok=True)
        dropped = _drop_logged_after(out / "metrics.jsonl", start_step)
        self.file = open(out / "metrics.jsonl", "a")
        if trackers:
            from .trackers import Trackers

            sent = {(key, record["step"]) for record in dropped if isinstance(record.get("step"), int)
                    for key in tracker_scalars(record)}
            self.trackers = Trackers(out, trackers, config=config or {}, project=project, start_step=start_step,
                                     echo=echo, already_sent=sent)

    def write(self, record: dict[str, Any], kind: str = "train") -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps({"kind": kind, **record}) + "\n")
        self.file.flush()
        if self.trackers is not None and isinstance(record.get("step"), int):
            self.trackers.log(tracker_scalars({"kind": kind, **record}), record["step"])

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            if self.trackers is not None:
                self.trackers.close()


def tracker_scalars(record: dict[str, Any]) -> dict[str, float]:
    """What the trackers get of a metrics.jsonl record: its numbers as ``KIND/FIELD`` scalars (at its step)."""
    kind = record.get("kind", "train")
    return {f"{kind}/{k}": v for k, v in record.items()
            if k not in ("step", "kind") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _drop_logged_after(path: Path, step: int) -> list[dict[str, Any]]:
    """Rewrite metrics file ``path`` (atomically: a kill leaves the old file or the new) without the records of
    steps after ``step`` and without a line a kill cut short; records without a step stay. Untouched when there
    is nothing to drop. Returns the dropped records (what an earlier attempt logged past ``step``)."""
    if not path.is_file():
        return []
    kept, dropped = [], []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line) if line.endswith("\n") else None
            except ValueError:
                record = None
            if not isinstance(record, dict) or isinstance(record.get("step"), (int, float)) and record["step"] > step:
                dropped.append(record if isinstance(record, dict) else {})
            else:
                kept.append(line)
    if not dropped:
        return []
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return dropped


def progress_bar(total: int, *, desc: str, unit: str, enabled: bool) -> Any:
    """A progress bar on stderr for an evaluation that takes a while (validation, zero-shot), shown on the main
    rank and erased when done, so the line the evaluation logs follows the last step's line directly."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False, dynamic_ncols=True)


def fmt_time(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
