"""Layout of a run directory (written by `biglm pretrain` / `biglm finetune`)::

    OUT/config.json            model config (BiGLMConfig.save_pretrained)
    OUT/train_config.json      the full run configuration
    OUT/tokenizer/             the tokenizer the data was built with
    OUT/checkpoints/step_0001000/   one complete checkpoint:
        .metadata, __*.distcp  model + optimizer, torch.distributed.checkpoint (sharded under FSDP)
        rank00000.pt           per-rank state: data position, RNG
        meta.json              written last (atomically): step, world size and the manifest, the size and
                               sha256 of every other file (each hashed by the rank that wrote it, as it wrote
                               it); its presence marks the checkpoint complete
    OUT/checkpoints/corrupt-step_0000006/   a damaged checkpoint a resume skipped, kept for inspection
    OUT/run.lock               held (flock) by the run using the directory: pid, host, start (`lock.RunLock`)

A checkpoint is written into ``checkpoints/.tmp-step_XXXXXXX`` and renamed into place only when it
is complete, so a kill during saving leaves the previous checkpoint intact. A file damaged later (a
truncated shard, a bad copy, flipped bytes) is caught by `verify_checkpoint` against the manifest: a resume and
every reader (`checkpoint_to_read`: export, generate, serve, --init_from) skip to the newest intact checkpoint
with a warning, so damaged weights are never trained on, published or served.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Callable

META = "meta.json"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says what to do."""


class DamagedCheckpointError(CheckpointError, ValueError):
    """No intact checkpoint where one was asked for (`checkpoint_to_read`). A ValueError too: the commands that
    report bad input (a FileNotFoundError, OSError or ValueError) in one line report this one the same way."""


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


def verify_checkpoint(path: Path, *, checksums: bool = True, share: tuple[int, int] = (0, 1)) -> str | None:
    """What is wrong with checkpoint ``path`` in words, or None when it is intact.

    Every file named in meta.json's manifest must exist with its size and (``checksums``) its sha256. The sizes
    alone catch a truncated shard at the cost of a ``stat``; the checksums read every byte. ``share=(i, n)`` reads
    only the i-th of every n files (in name order): n processes each reading their share check the checkpoint
    once between them, in 1/n of the time. A meta.json without a manifest is not intact: nothing in it vouches
    for the files beside it.
    """
    path = Path(path)
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as e:
        return f"{META} is unreadable ({type(e).__name__})"
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{META} has no manifest (the size and sha256 of each file), so its files cannot be checked"
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        size = f.stat().st_size
        if size != want.get("bytes"):
            return f"{name} has {size} bytes, {want.get('bytes')} were written"
    if checksums:
        i, n = share
        for name in sorted(files)[i::n]:
            if file_sha256(path / name) != files[name].get("sha256"):
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


def checkpoint_to_read(path: Path, *, warn: Callable[[str], None] | None = None) -> Path | None:
    """The checkpoint a reader of ``path`` (export, generate, serve, --init_from) gets, verified in full (sizes and
    sha256) against its manifest: ``path`` itself when it is one checkpoint, or a run directory's newest intact
    checkpoint, with one warning (``warn``, default stderr) naming each damaged newer one it passed over, as a
    resume does. None when ``path`` holds no checkpoint at all; `DamagedCheckpointError` (one line) when the
    checkpoint asked for, or every checkpoint of the run, is damaged: weights that do not match what was written
    are never read."""
    path = Path(path)
    warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    if (path / META).exists():
        problem = verify_checkpoint(path)
        if problem is not None:
            run = run_dir_of(path)
            other = (f"pass the run directory {run} to read its newest intact checkpoint"
                     if checkpoint_dirs(run) else "pass an intact checkpoint")
            raise DamagedCheckpointError(f"checkpoint {path} is damaged ({problem}): {other}")
        return path
    ckpt, skipped = newest_intact_checkpoint(path)
    if ckpt is None and skipped:
        damage = "; ".join(f"{p.name}: {why}" for p, why in skipped)
        raise DamagedCheckpointError(f"{path} has no intact checkpoint ({damage}): every checkpoint differs from "
                                     "what was written; resume the run to write a fresh one, or restore the files")
    for bad, why in skipped:
        warn(f"[biglm] warning: checkpoint {bad} is damaged ({why}): skipped; reading {ckpt.name}")
    return ckpt
