"""One run per directory: `RunLock` holds ``OUT/run.lock`` for as long as a command writes into ``OUT``.

The lock is ``fcntl.flock`` on the file, so the operating system releases it when the holder dies, however it
dies (kill -9, out of memory): a lock can only be stale in the sense that the file still names a process that
no longer holds it. The holder writes its pid, host, start time and command into the file for the refusal
message; a later run that gets the lock while the file still names someone (a run that died) says it takes
the lock over. A clean release empties the file but leaves it in place, except where the lock made the file and
nothing else was written beside it (a run refused before its first file): then the file goes, and the folders the
lock made, so a refused run leaves no folder. A run that locks a file someone unlinked meanwhile (it opened the old
inode) sees that the path no longer names its inode and locks again, so two runs never hold two inodes of one name.

Used by `biglm pretrain` and `biglm finetune` (rank 0 only under torchrun: the training loops broadcast its
outcome, see `biglm.training.checkpoint.hold_run_dir`), and meant for any command that writes a run directory,
such as batch generation. Within one process the lock is re-entrant: the CLI takes it before preparing data
and the training loop takes it again without blocking itself. `RunLock.for_file` holds ``FILE.lock`` instead, for a
command that owns one output file rather than a directory (`biglm generate --output`).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Callable

from .layout import CheckpointError

LOCK_NAME = "run.lock"
_HELD: dict[str, "RunLock"] = {}  # this process's locks by resolved directory, for re-entry


class RunDirLockedError(CheckpointError):
    """Another live process holds the run directory's lock; the message names it in one line."""


class RunLock:
    """``with RunLock(out_dir):`` holds ``out_dir/run.lock`` (created with the directory if needed) or raises
    `RunDirLockedError` naming the other process. ``echo`` receives the note when a dead run's lock is taken over
    (default: stderr)."""

    def __init__(self, run_dir: str | Path, *, command: str | None = None,
                 echo: Callable[[str], None] | None = None, name: str = LOCK_NAME, what: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / name
        self.what = what or str(self.run_dir)  # what the refusal names
        self.command = command if command is not None else " ".join(["biglm", *sys.argv[1:]])[:300]
        self.echo = echo or (lambda s: print(s, file=sys.stderr))
        self._fd: int | None = None
        self._depth = 0
        self._key = ""
        self._made: list[Path] = []  # what acquire created (folders, then the lock file): removed if left unused

    @classmethod
    def for_file(cls, path: str | Path, **kwargs) -> "RunLock":
        """The lock of one output file: ``PATH.lock`` beside it (its directory is created if needed)."""
        path = Path(path)
        return cls(path.parent, name=path.name + ".lock", what=str(path), **kwargs)

    def acquire(self) -> "RunLock":
        self._key = str(self.path.resolve())
        held = _HELD.get(self._key)
        if held is not None:  # re-entry in this process (CLI, then the training loop)
            held._depth += 1
            self._fd, self._depth = None, -1  # this handle defers to the outer one
            return self
        while True:
            missing = [d for d in (self.run_dir, *self.run_dir.parents) if not d.exists()]
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                made = True
            except FileExistsError:
                fd, made = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644), False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = _read_info(fd)
                os.close(fd)
                raise RunDirLockedError(
                    f"{self.what} is in use by another run ({describe_holder(other)}): wait for it to finish or stop "
                    f"it, or choose another output {'file' if self.path.name != LOCK_NAME else 'directory'}") from None
            except OSError as e:  # a file system without locks (some network mounts): run, but say the check is off
                os.close(fd)
                self.echo(f"[biglm] warning: cannot lock {self.path} ({e.strerror or e}): running without the "
                          "one-run-per-directory check")
                return self
            try:
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)  # a refused run removed the file between our open and our lock: lock the new one
        self._made = [*missing, self.path] if made else []
        previous = _read_info(fd)
        if previous:
            self.echo(f"[biglm] taking over the lock of {self.what} left by a run that is no longer running "
                      f"({describe_holder(previous)})")
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                "command": self.command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd, self._depth = fd, 1
        _HELD[self._key] = self
        return self

    def release(self) -> None:
        if self._depth == -1:  # a re-entered handle: the outer one releases
            outer = _HELD.get(self._key)
            if outer is not None:
                outer._depth -= 1
            self._depth = 0
            return
        if self._fd is None:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        fd, self._fd = self._fd, None
        _HELD.pop(self._key, None)
        try:
            os.ftruncate(fd, 0)  # a clean end: the next run finds nobody to take over from
            if self._made and self._unused():
                self.path.unlink(missing_ok=True)  # while still locked: a run that opened it re-locks (acquire)
                for folder in self._made[:-1]:  # deepest first; only folders the lock made, and only if empty
                    try:
                        folder.rmdir()
                    except OSError:
                        break
        finally:
            os.close(fd)  # closing the last descriptor releases the flock

    def _unused(self) -> bool:
        """Whether nothing but the lock was written: a run folder holding only the lock file, or a locked output
        file that does not exist."""
        if self.path.name != LOCK_NAME:
            return not self.path.with_name(self.path.name[: -len(".lock")]).exists()
        try:
            return [p.name for p in self.run_dir.iterdir()] == [LOCK_NAME]
        except OSError:
            return False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def describe_holder(info: dict) -> str:
    """``pid 123 on host, started 2026-11-25 11:00:00 UTC: biglm pretrain ...`` from a lock file's contents."""
    if not info:
        return "no details recorded"
    text = f"pid {info.get('pid', '?')} on {info.get('host', '?')}, started {info.get('started', '?')}"
    return f"{text}: {info['command']}" if info.get("command") else text


def _read_info(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        return {}
    try:
        info = json.loads(raw) if raw else {}
    except ValueError:
        info = None
    return info if isinstance(info, dict) else {"pid": "?", "host": "?", "started": "?"}
