"""Layout of a run directory (written by `biglm pretrain` / `biglm finetune`)::

    OUT/config.json            model config (BiGLMConfig.save_pretrained)
    OUT/train_config.json      the full run configuration
    OUT/tokenizer/             the tokenizer the data was built with
    OUT/checkpoints/step_0001000/   one complete checkpoint:
        .metadata, __*.distcp  model + optimizer, torch.distributed.checkpoint (sharded under FSDP)
        rank00000.pt           per-rank state: data position, RNG
        meta.json              written last (atomically): step, world size and the manifest, the size and
                               sha256 of every other file; its presence marks the checkpoint complete
    OUT/checkpoints/corrupt-step_0000006/   a damaged checkpoint a resume skipped, kept for inspection
    OUT/run.lock               held (flock) by the run using the directory: pid, host, start (`lock.RunLock`)

A checkpoint is written into ``checkpoints/.tmp-step_XXXXXXX`` and renamed into place only when it
is complete, so a kill during saving leaves the previous checkpoint intact. A file damaged later (a
truncated shard, a bad copy) is caught by `verify_checkpoint` against the manifest.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

META = "meta.json"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says what to do."""


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [d for d in root.glob("step_*") if (d / META).exists()]
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


def file_sha256(path: Path, *, chunk: int = 1 << 20) -> str:
    """The sha256 of a file, read in 1 MiB chunks (streaming: no memory beyond one chunk)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checkpoint_manifest(folder: Path) -> dict[str, dict[str, int | str]]:
    """``{name: {"bytes": n, "sha256": hex}}`` for every file of a checkpoint folder but meta.json (which holds it)."""
    return {f.name: {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
            for f in sorted(Path(folder).iterdir()) if f.is_file() and f.name != META}


def verify_checkpoint(path: Path, *, checksums: bool = True) -> str | None:
    """What is wrong with checkpoint ``path`` in words, or None when it is intact.

    Every file named in meta.json's manifest must exist with its size and (``checksums``) its sha256. The sizes
    alone catch a truncated shard at the cost of a ``stat``; the checksums read every byte. A checkpoint written
    before manifests existed (no ``files`` in meta.json) cannot be checked and counts as intact.
    """
    path = Path(path)
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as e:
        return f"{META} is unreadable ({type(e).__name__})"
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict):
        return None
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        size = f.stat().st_size
        if size != want.get("bytes"):
            return f"{name} has {size} bytes, {want.get('bytes')} were written"
    if checksums:
        for name, want in files.items():
            if file_sha256(path / name) != want.get("sha256"):
                return f"{name} does not match the sha256 written with it"
    return None


def newest_intact_checkpoint(run_dir: Path, *, checksums: bool = True) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint of a run that `verify_checkpoint` accepts, and the newer damaged ones it passed over
    as ``(path, problem)``, newest first. Only as many checkpoints are read as it takes to find an intact one."""
    skipped: list[tuple[Path, str]] = []
    for ckpt in reversed(checkpoint_dirs(run_dir)):
        problem = verify_checkpoint(ckpt, checksums=checksums)
        if problem is None:
            return ckpt, skipped
        skipped.append((ckpt, problem))
    return None, skipped
