"""Writing checkpoints during training (the layout is `biglm.checkpoint.layout`'s).

`Checkpointer` saves and restores model + optimizer + per-rank state with torch.distributed.checkpoint,
with the barriers a multi-process run needs. A checkpoint is written into ``checkpoints/.tmp-step_XXXXXXX``
and renamed into place only when every rank has finished, so a kill during saving leaves the previous
checkpoint intact. Only the last K complete checkpoints are kept; the newest is never removed before its
successor is complete, and the one just written is never pruned.

Verification: after every rank has written its files, rank 0 records the size and sha256 of each in meta.json
(written atomically, last, so a half-written checkpoint has none). A resume verifies the newest checkpoint
against it, and on damage (a truncated shard, a bad copy) warns, moves it to ``checkpoints/corrupt-step_N``
and tries the next older one; with none intact it refuses in one line. Rank 0 decides and broadcasts the
choice, so every rank resumes from the same checkpoint.

`hold_run_dir` holds the run directory's lock (`biglm.checkpoint.RunLock`) for a training loop: under torchrun
only rank 0 takes the flock and broadcasts the outcome, so a refused run ends on every rank with the same
one-line error instead of leaving the other ranks waiting in a collective.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..checkpoint.layout import (META, CheckpointError, checkpoint_dirs, checkpoint_manifest,
                                 newest_intact_checkpoint)
from ..checkpoint.lock import RunLock

warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object; no-op in one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def hold_run_dir(run_dir: Path, *, echo: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``run_dir``'s `RunLock` for the body (re-entrant in one process). Under torchrun only rank 0 takes the
    flock: it is the one writing run files and pruning checkpoints, and one lock per run (not per rank) is what
    keeps a second run out. Every rank learns rank 0's outcome by a broadcast and raises the same
    `RunDirLockedError` when refused, so no rank is left waiting in a collective."""
    lock, refused = None, None
    if _rank() == 0:
        lock = RunLock(run_dir, echo=echo)
        try:
            lock.acquire()
        except CheckpointError as e:
            lock, refused = None, e
    message = _from_rank0(None if refused is None else str(refused))
    if message is not None:
        from ..checkpoint.lock import RunDirLockedError

        raise refused if refused is not None else RunDirLockedError(message)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


class Checkpointer:
    """Saves and restores (model, optimizer, per-rank extra state) for a run directory."""

    def __init__(self, run_dir: Path, *, keep_last: int = 3) -> None:
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "checkpoints"
        self.keep_last = max(1, keep_last)

    def clean_partial(self) -> None:
        """Remove half-written checkpoints left by a kill during saving."""
        if _rank() == 0 and self.root.is_dir():
            for d in self.root.glob(".tmp-step_*"):
                shutil.rmtree(d, ignore_errors=True)
        _barrier()

    def save(self, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             extra: dict[str, Any]) -> Path:
        """Write checkpoint ``step`` atomically. On failure (e.g. disk full) the partial files are
        removed, earlier checkpoints are untouched, and a `CheckpointError` explains what happened."""
        final = self.root / f"step_{step:07d}"
        tmp = self.root / f".tmp-step_{step:07d}"
        rank = _rank()
        try:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            _barrier()
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
            torch.save(extra, tmp / f"rank{rank:05d}.pt")
            _fsync_file(tmp / f"rank{rank:05d}.pt")
            _barrier()
            if rank == 0:
                # the manifest covers every file every rank wrote (the folder is shared; DCP needs that anyway)
                meta = {"step": step, "world_size": dist.get_world_size() if dist.is_initialized() else 1,
                        "files": checkpoint_manifest(tmp)}
                with open(tmp / (META + ".tmp"), "w") as f:
                    json.dump(meta, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp / (META + ".tmp"), tmp / META)
                old = None
                if final.exists():  # a re-save of the same step: move the old one aside, never delete first
                    old = self.root / f".old-step_{step:07d}"
                    shutil.rmtree(old, ignore_errors=True)
                    os.replace(final, old)
                os.replace(tmp, final)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
                _fsync_dir(self.root)
                self._prune(keep=final)
            _barrier()
        except (OSError, CheckpointException) as e:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            previous = checkpoint_dirs(self.run_dir)
            kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
            full = getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in str(e)
            reason = "no space left on device" if full else str(e).splitlines()[0]
            raise CheckpointError(
                f"could not save checkpoint step {step} to {final}: {reason}; {kept}. Free disk space "
                f"(or point --out_dir elsewhere) and resume with the same command."
            ) from e
        return final

    def resume(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Path, dict[str, Any]] | None:
        """Clean half-written checkpoints, then restore the newest intact one in place: ``(path, extra)``, or None
        when the run has none yet. Damaged newer ones are skipped with a warning and moved aside; a `CheckpointError`
        (one line) when there are checkpoints but none is intact."""
        self.clean_partial()
        choice: str | None = None
        refusal: str | None = None
        if _rank() == 0:
            ckpt, skipped = newest_intact_checkpoint(self.run_dir)
            if ckpt is None and skipped:
                damage = "; ".join(f"{p.name}: {why}" for p, why in skipped)
                refusal = (f"no intact checkpoint in {self.root} ({damage}): move the damaged ones out of "
                           f"{self.root} to start this run afresh, or use another output directory")
            else:
                for path, why in skipped:
                    moved = _move_aside(path)
                    print(f"[biglm] warning: checkpoint {path} is damaged ({why}): skipped and moved to {moved}; "
                          f"resuming from {ckpt.name if ckpt else 'the start'}", file=sys.stderr, flush=True)
                choice = None if ckpt is None else ckpt.name
        choice, refusal = _from_rank0((choice, refusal))
        if refusal is not None:
            raise CheckpointError(refusal)
        if choice is None:
            return None
        ckpt = self.root / choice
        return ckpt, self.load(ckpt, model=model, optimizer=optimizer)

    def _prune(self, *, keep: Path) -> None:
        # by step number, the last K; the checkpoint just written is kept whatever its number (it is the one
        # known intact: older-numbered than damaged ones that were never moved aside, it must not go)
        for old in checkpoint_dirs(self.run_dir)[: -self.keep_last]:
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Restore model and optimizer in place from checkpoint ``path``; return this rank's extra state."""
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        try:
            dcp.load(state, checkpoint_id=str(path))
        except Exception as e:  # DCP reports shape mismatches deep inside the planner
            raise CheckpointError(
                f"cannot load {path} into this model: {e}\nThe checkpoint was written with a different model "
                f"shape or optimizer. Resume with the run's original settings (see {self.run_dir / 'train_config.json'}), "
                f"or start a new run with a different --out_dir."
            ) from e
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rank_file = Path(path) / f"rank{_rank():05d}.pt"
        if not rank_file.exists():
            raise CheckpointError(
                f"{path} has no state for rank {_rank()}: it was written by a run with a different number of "
                "processes. Resume with the same number of ranks."
            )
        return torch.load(rank_file, weights_only=False)


def _move_aside(ckpt: Path) -> Path:
    """Rename a damaged checkpoint to ``corrupt-step_N`` (``-2``, ``-3``... when taken) beside it: out of
    `checkpoint_dirs`, so neither resume, pruning nor export sees it, and kept for inspection."""
    target = ckpt.with_name(f"corrupt-{ckpt.name}")
    n = 1
    while target.exists():
        n += 1
        target = ckpt.with_name(f"corrupt-{ckpt.name}-{n}")
    os.replace(ckpt, target)
    return target


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
