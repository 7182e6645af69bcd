"""A model folder written whole or not at all: `staged_output` for `biglm convert` and `biglm export`.

OUT is checked before any work (`check_output_dir`): a folder that holds a training run (checkpoints, run.lock, a run's
config) is never written into, not even with ``overwrite``: export and convert would rewrite its config.json under
its checkpoints, and the next resume or reader would pair them with other weights. A non-empty OUT is refused unless
``overwrite``, and then only a model folder (config.json) is replaced: ``--overwrite`` on a folder of other files is
more likely a typo than a wish to delete them.

Everything is written into a hidden folder beside OUT (same file system, so the final rename is atomic) and renamed
into place at the end; a replaced OUT is moved aside first and removed only once the new one is in place. A failure
(disk full, a file size limit) removes the temporary folder and raises `OutputError` in one line: OUT is absent, or
the old one intact.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .lock import LOCK_NAME

RUN_MARKERS = ("checkpoints", LOCK_NAME, "train_config.json", "task.json", "finetune_config.json")


class OutputError(OSError):
    """OUT cannot be written (refused before any work, or a write failed and nothing was left); one line."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else super().__str__()


def run_marker(path: Path) -> str | None:
    """The name of what marks ``path`` as a training run's folder (``checkpoints``, ``run.lock``...), or None."""
    return next((name for name in RUN_MARKERS if (Path(path) / name).exists()), None)


def check_output_dir(out: str | Path, *, overwrite: bool = False) -> None:
    """Refuse (`OutputError`, one line) an OUT that a model folder must not be written to; cheap, run first."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is a file, not a folder: choose another output folder")
    if not out.is_dir():
        return
    marker = run_marker(out)
    if marker is not None:
        raise OutputError(f"{out} holds a training run ({marker}): a model folder is never written over a run, "
                          "even with --overwrite; choose another output folder")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    if not overwrite:
        raise OutputError(f"{out} is not empty ({len(entries)} entries: {', '.join(entries[:3])}"
                          f"{', ...' if len(entries) > 3 else ''}): choose another output folder, or pass --overwrite "
                          "to replace the model there")
    if not (out / "config.json").is_file():
        raise OutputError(f"{out} holds files but no model (no config.json): --overwrite replaces only a model "
                          "folder; choose another output folder or empty this one yourself")


def write_failure(e: BaseException) -> str | None:
    """Why a write failed, in words (disk full, a file size limit, the OS's message), or None when ``e`` is no
    write failure (a bug, which keeps its traceback). safetensors reports the OS error inside its own message."""
    code = getattr(e, "errno", None)
    if not isinstance(e, OSError):
        if type(e).__name__ != "SafetensorError" or not (m := re.search(r"(?:code: |os error )(\d+)", str(e))):
            return None
        code = int(m.group(1))
    if code == errno.ENOSPC:
        return "no space left on device"
    if code == errno.EFBIG:
        return "file too large (a file size limit: ulimit -f)"
    if code == errno.EDQUOT:
        return "disk quota exceeded"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _umask() -> int:
    current = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(current)
    return current


@contextlib.contextmanager
def staged_output(out: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """``with staged_output(OUT) as tmp:`` write the model into ``tmp``; on leaving, ``tmp`` becomes OUT (a model
    OUT replaced only with ``overwrite``). On failure ``tmp`` is removed and OUT left as it was; a write failure
    becomes `OutputError` (one line), anything else is re-raised."""
    out = Path(out)
    check_output_dir(out, overwrite=overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o777 & ~_umask())  # the folder a plain mkdir gives, not mkdtemp's private 0700
    try:
        yield tmp
        check_output_dir(out, overwrite=overwrite)  # again: a run may have started there meanwhile
        old = None
        if out.is_dir():
            if any(out.iterdir()):
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
                os.replace(out, old)  # over the empty placeholder mkdtemp made
            else:
                out.rmdir()
        try:
            os.replace(tmp, out)
        except OSError:
            if old is not None:
                os.replace(old, out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = write_failure(e) if isinstance(e, Exception) and not isinstance(e, OutputError) else None
        if reason is None:
            raise
        state = f"{out} is unchanged" if out.exists() else f"nothing was left at {out}"
        raise OutputError(f"could not write {out}: {reason}; {state}. Free space (or lift the limit) and run the "
                          "command again") from e


__all__ = ["OutputError", "RUN_MARKERS", "check_output_dir", "run_marker", "staged_output", "write_failure"]
