"""Layout of a run directory (written by `biglm pretrain` / `biglm finetune`)::

    OUT/config.json            model config (BiGLMConfig.save_pretrained)
    OUT/train_config.json      the full run configuration
    OUT/tokenizer/             the tokenizer the data was built with
    OUT/checkpoints/step_0001000/   one complete checkpoint:
        .metadata, __*.distcp  model + optimizer, torch.distributed.checkpoint (sharded under FSDP)
        rank00000.pt           per-rank state: data position, RNG
        meta.json              written last: step, world size; its presence marks the checkpoint complete

A checkpoint is written into ``checkpoints/.tmp-step_XXXXXXX`` and renamed into place only when it
is complete, so a kill during saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

from pathlib import Path


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says what to do."""


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [d for d in root.glob("step_*") if (d / "meta.json").exists()]
    return sorted(done, key=lambda d: int(d.name.split("_")[1]))


def latest_checkpoint(path: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or ``path`` itself if it is a checkpoint."""
    path = Path(path)
    if (path / "meta.json").exists():
        return path
    dirs = checkpoint_dirs(path)
    return dirs[-1] if dirs else None


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory holding ``checkpoint`` (``RUN/checkpoints/step_N`` -> ``RUN``)."""
    return Path(checkpoint).parent.parent
