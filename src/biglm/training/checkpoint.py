"""Writing checkpoints during training (the layout is `biglm.checkpoint.layout`'s).

`Checkpointer` saves and restores model + optimizer + per-rank state with torch.distributed.checkpoint,
with the barriers a multi-process run needs. A checkpoint is written into ``checkpoints/.tmp-step_XXXXXXX``
and renamed into place only when every rank has finished, so a kill during saving leaves the previous
checkpoint intact. Only the last K complete checkpoints are kept; the newest is never removed before its
successor is complete.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..checkpoint.layout import CheckpointError, checkpoint_dirs, latest_checkpoint

warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


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
            _barrier()
            if rank == 0:
                meta = {"step": step, "world_size": dist.get_world_size() if dist.is_initialized() else 1}
                with open(tmp / "meta.json", "w") as f:
                    json.dump(meta, f)
                    f.flush()
                    os.fsync(f.fileno())
                old = None
                if final.exists():  # a re-save of the same step: move the old one aside, never delete first
                    old = self.root / f".old-step_{step:07d}"
                    shutil.rmtree(old, ignore_errors=True)
                    os.replace(final, old)
                os.replace(tmp, final)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
                _fsync_dir(self.root)
                self._prune()
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
        """Clean half-written checkpoints, then restore the newest complete one in place: ``(path, extra)``,
        or None when the run has none yet."""
        self.clean_partial()
        ckpt = latest_checkpoint(self.run_dir) if self.root.is_dir() else None
        if ckpt is None:
            return None
        return ckpt, self.load(ckpt, model=model, optimizer=optimizer)

    def _prune(self) -> None:
        for old in checkpoint_dirs(self.run_dir)[: -self.keep_last]:
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


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
