"""Writing checkpoints during training (the layout is `biglm.checkpoint.layout`'s).

`Checkpointer` saves and restores model + optimizer + per-rank state with torch.distributed.checkpoint,
with the barriers a multi-process run needs. A checkpoint is written into ``checkpoints/.tmp-step_XXXXXXX``
and renamed into place only when every rank has finished, so a kill during saving leaves the previous
checkpoint intact. Only the last K complete checkpoints are kept; the newest is never removed before its
successor is complete, and the one just written is never pruned.

Verification: every rank hashes the bytes of its files as it writes them (`_HashingWriter` under
torch.distributed.checkpoint, the same for its own ``rankNNNNN.pt``), and rank 0 gathers the sizes and sha256 into
meta.json (written atomically, last, so a half-written checkpoint has none): no file is read back, and no rank waits
while another re-reads what every rank wrote. A resume verifies the newest checkpoint against it, each rank hashing
its share of the files, and on damage (a truncated shard, a bad copy) warns, moves it to
``checkpoints/corrupt-step_N`` and tries the next older one; with none intact it refuses in one line. Every rank
sees every rank's verdict, so all resume from the same checkpoint.

`hold_run_dir` holds the run directory's lock (`biglm.checkpoint.RunLock`) for a training loop: under torchrun
only rank 0 takes the flock and broadcasts the outcome, so a refused run ends on every rank with the same
one-line error instead of leaving the other ranks waiting in a collective.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..checkpoint.layout import META, CheckpointError, checkpoint_dirs, file_sha256, verify_checkpoint
from ..checkpoint.lock import RunLock

warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _from_every_rank(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank (picklable objects; ``[value]`` in one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


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
            writer = _HashingWriter(tmp)
            dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer)
            written = {**writer.fs.written, **_save_hashed(extra, tmp / f"rank{rank:05d}.pt")}
            # the gather is also the barrier: every rank has written (and fsynced) its files when it answers
            gathered = _from_every_rank(written)
            if rank == 0:
                meta = {"step": step, "world_size": _world_size(), "files": _manifest(tmp, gathered)}
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
        rank, world = _rank(), _world_size()
        # newest first, as rank 0 lists them; each rank hashes its share of a candidate's files and every rank
        # sees every verdict, so all agree on the choice without a further broadcast
        names = _from_rank0([d.name for d in reversed(checkpoint_dirs(self.run_dir))] if rank == 0 else None)
        choice: str | None = None
        skipped: list[tuple[Path, str]] = []
        for name in names:
            verdicts = _from_every_rank(verify_checkpoint(self.root / name, share=(rank, world)))
            problem = next((v for v in verdicts if v is not None), None)
            if problem is None:
                choice = name
                break
            skipped.append((self.root / name, problem))
        if choice is None and skipped:
            damage = "; ".join(f"{p.name}: {why}" for p, why in skipped)
            raise CheckpointError(f"no intact checkpoint in {self.root} ({damage}): move the damaged ones out of "
                                  f"{self.root} to start this run afresh, or use another output directory")
        if rank == 0:
            for path, why in skipped:
                moved = _move_aside(path)
                print(f"[biglm] warning: checkpoint {path} is damaged ({why}): skipped and moved to {moved}; "
                      f"resuming from {choice or 'the start'}", file=sys.stderr, flush=True)
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


_OVERLAP_BYTES = 1 << 20  # smaller writes (headers, pickles) are hashed in line: a thread hop costs more
_HASHER: ThreadPoolExecutor | None = None


def _hash_thread() -> ThreadPoolExecutor:
    """The one thread that hashes large writes (started on first use; a forked child starts its own)."""
    global _HASHER
    if _HASHER is None:
        _HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="biglm-hash")
    return _HASHER


def _forget_hash_thread() -> None:
    global _HASHER
    _HASHER = None  # the parent's thread does not exist in a forked child


os.register_at_fork(after_in_child=_forget_hash_thread)


class _HashingStream(io.RawIOBase):
    """A file being written, hashed on the way out: sha256 and byte count of everything written through it. A write
    of ``_OVERLAP_BYTES`` or more (a tensor's bytes) is hashed on a second thread while this one writes it, so the
    hashing hides behind the I/O. A seek (none of DCP's writers seeks today) or a short write makes the digest
    unknown, and the file is then hashed from disk."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self.raw, self.sha, self.count, self.sequential = raw, hashlib.sha256(), 0, True

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if len(view) < _OVERLAP_BYTES:
            n = self.raw.write(view)
            n = len(view) if n is None else n
            self.sha.update(view[:n])
        else:  # a tensor's bytes: hashed on another thread while this one writes them (both release the GIL)
            hashed = _hash_thread().submit(self.sha.update, view)
            try:
                n = self.raw.write(view)
            finally:
                hashed.result()  # ``view`` may point into memory that is not ours once we return
            n = len(view) if n is None else n
            if n != len(view):  # a short write: the digest holds bytes the file does not
                self.sequential = False
        self.count += n
        return n

    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.sequential = False
        return self.raw.seek(offset, whence)

    def fileno(self) -> int:
        return self.raw.fileno()

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()  # flushes through `flush` while the file is still open
            finally:
                self.raw.close()


class _HashingFileSystem(FileSystem):
    """DCP's local file system, recording ``{name: {"bytes", "sha256"}}`` of each file written (``written``),
    under its final name (DCP writes ``.metadata`` through a temporary name and renames it)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, dict[str, int | str]] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _HashingStream(raw)
            yield stream
            if stream.sequential:
                self.written[Path(path).name] = {"bytes": stream.count, "sha256": stream.sha.hexdigest()}

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        if (digest := self.written.pop(Path(path).name, None)) is not None:
            self.written[Path(new_path).name] = digest


class _HashingWriter(FileSystemWriter):
    """torch.distributed.checkpoint's `FileSystemWriter` (same files, same defaults) over `_HashingFileSystem`:
    ``writer.fs.written`` holds this rank's files' digests once `dcp.save` returns."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.fs = _HashingFileSystem()


def _save_hashed(obj: Any, path: Path) -> dict[str, dict[str, int | str]]:
    """`torch.save` ``obj`` to ``path`` (fsynced) and return its ``{name: {"bytes", "sha256"}}``."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getbuffer()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {path.name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}


def _manifest(folder: Path, gathered: list[dict[str, dict[str, int | str]]]) -> dict[str, dict[str, int | str]]:
    """meta.json's manifest from every rank's digests of what it wrote. A file of the folder that no rank hashed,
    or whose size is not the one hashed, is hashed from disk here (never expected: a safety net, not a path)."""
    written = {name: digest for digests in gathered for name, digest in digests.items()}
    manifest = {}
    for f in sorted(Path(folder).iterdir()):
        if not f.is_file() or f.name == META:
            continue
        size = f.stat().st_size
        digest = written.get(f.name)
        if digest is None or digest["bytes"] != size:
            digest = {"bytes": size, "sha256": file_sha256(f)}
        manifest[f.name] = digest
    return manifest


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


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
