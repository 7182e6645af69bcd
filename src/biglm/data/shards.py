"""Headered binary token shards: write atomically, memory-map, refuse anything off.

`biglm.data.prepare` writes them and `biglm.data.mixture` reads them; ``biglm data info`` prints their headers.

File layout (all integers little-endian)::

    0    header, 128 bytes (struct ``_HEADER``, zero-padded):
           magic b"BIGLMTOK" | version u32 | dtype code u32 (1 = uint16, 2 = uint32)
           | header size u32 | checksum u32 | vocab_size u64 | eos_id i64 | n_tokens u64
           | n_docs u64 | tokenizer fingerprint 32 ascii bytes
    128  tokens: n_tokens ids of the dtype, then zero padding to a multiple of 8 bytes
    ...  document index: n_docs int64 offsets (in tokens) of each document's first token

Every document is followed by ``eos_id`` when written, so the token array reads as
``doc0 </s> doc1 </s> ...`` and a window cut anywhere shows the model where documents end;
document i spans ``tokens[doc_offsets[i]:doc_offsets[i+1]]`` (its ``</s>`` included).
The dtype is uint16 iff ``vocab_size <= 65536`` (halving disk and page-cache use for
BiGLM's 49,152-token vocabulary), else uint32.

The checksum is ``zlib.crc32`` over the token bytes (with padding), then the index bytes,
then the header with its checksum field zeroed: cheap enough to verify every shard when it is opened, and it
catches the torn writes and bit rot it is there for.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

MAGIC = b"BIGLMTOK"
VERSION = 1
HEADER_SIZE = 128
_HEADER = struct.Struct("<8sIIIIQqQQ32s")  # 88 bytes; the rest of the 128 is reserved zeros
_DTYPES: dict[int, np.dtype] = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
_CHUNK = 1 << 24  # bytes hashed per crc32 call: bounded memory on huge memory-mapped shards


class ShardError(RuntimeError):
    """A token shard that must not be read: foreign, truncated, corrupt or from another tokenizer."""


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size > 2**32:
        raise ValueError(f"vocab_size={vocab_size} does not fit uint32 token ids")
    return _DTYPES[1] if vocab_size <= 65536 else _DTYPES[2]


def _dtype_code(dtype: np.dtype) -> int:
    return next(code for code, dt in _DTYPES.items() if dt == dtype)


def _pack_header(*, dtype: np.dtype, checksum: int, vocab_size: int, eos_id: int, n_tokens: int,
                 n_docs: int, fingerprint: str) -> bytes:
    raw = _HEADER.pack(MAGIC, VERSION, _dtype_code(dtype), HEADER_SIZE, checksum, vocab_size, eos_id,
                       n_tokens, n_docs, fingerprint.encode("ascii"))
    return raw.ljust(HEADER_SIZE, b"\0")


def _crc(data: memoryview | bytes, crc: int) -> int:
    view = memoryview(data).cast("B")
    for start in range(0, len(view), _CHUNK):
        crc = zlib.crc32(view[start:start + _CHUNK], crc)
    return crc


def _pad8(nbytes: int) -> int:
    return -nbytes % 8


def write_shard(
    path: str | os.PathLike[str],
    docs: Iterable[Sequence[int] | np.ndarray],
    *,
    vocab_size: int,
    tokenizer_fingerprint: str,
    eos_id: int,
) -> dict[str, int]:
    """Write ``docs`` (token-id lists or arrays, without end markers) as one shard at ``path``.

    ``eos_id`` is appended after every document. The write is atomic: the shard goes to a
    temporary file in the same folder, is fsynced, and replaces ``path`` in one rename, so a
    crash leaves either the old file or the complete new one. Returns
    ``{"n_tokens": ..., "n_docs": ..., "checksum": ...}``.
    """
    if len(tokenizer_fingerprint.encode("ascii")) > 32:
        raise ValueError("tokenizer_fingerprint must be at most 32 ASCII characters")
    if not 0 <= eos_id < vocab_size:
        raise ValueError(f"eos_id={eos_id} is outside the vocabulary [0, {vocab_size})")
    dtype = dtype_for_vocab(vocab_size)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    eos = np.array([eos_id], dtype=dtype)
    offsets: list[int] = []
    n_tokens, crc = 0, 0
    try:
        with open(tmp, "wb") as f:
            f.write(b"\0" * HEADER_SIZE)  # placeholder, rewritten once the counts are known
            for doc in docs:
                arr = np.asarray(doc)
                if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
                    raise ValueError(f"{path}: document {len(offsets)} has token ids outside [0, {vocab_size})")
                arr = np.concatenate([arr.astype(dtype, copy=False).ravel(), eos])
                offsets.append(n_tokens)
                n_tokens += arr.size
                data = arr.tobytes()
                crc = _crc(data, crc)
                f.write(data)
            if not offsets:
                raise ValueError(f"{path}: no documents to write; a shard holds at least one")
            pad = b"\0" * _pad8(n_tokens * dtype.itemsize)
            index = np.asarray(offsets, dtype="<i8").tobytes()
            crc = _crc(pad, crc)
            crc = _crc(index, crc)
            f.write(pad)
            f.write(index)
            header = dict(dtype=dtype, vocab_size=vocab_size, eos_id=eos_id, n_tokens=n_tokens,
                          n_docs=len(offsets), fingerprint=tokenizer_fingerprint)
            crc = zlib.crc32(_pack_header(checksum=0, **header), crc)
            f.seek(0)
            f.write(_pack_header(checksum=crc, **header))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # makes the rename itself durable
    return {"n_tokens": n_tokens, "n_docs": len(offsets), "checksum": crc}


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform can open a directory
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ShardReader:
    """A memory-mapped token shard whose header, size and checksum have been checked.

    ``tokens`` is a read-only numpy memmap (uint16 or uint32); ``doc_offsets`` an int64
    array of document starts. Raises ``ShardError`` naming the file for a foreign file (bad
    magic), an unknown format version, a truncated or overlong file, a checksum mismatch
    (only when ``verify``; the other checks always run) or a vocabulary size / tokenizer
    fingerprint different from the expected ones.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        expected_vocab_size: int | None = None,
        expected_fingerprint: str | None = None,
        verify: bool = True,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ShardError(f"{self.path}: no such shard file; run `biglm data prepare` to create it")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(HEADER_SIZE)
        if len(head) < len(MAGIC) or head[: len(MAGIC)] != MAGIC:
            raise ShardError(f"{self.path}: not a biglm token shard (bad magic bytes); "
                             "point at a train-*.bin/val-*.bin written by `biglm data prepare`")
        if len(head) < HEADER_SIZE:
            raise ShardError(f"{self.path}: truncated header ({size} bytes); the file is damaged, "
                             "delete it and re-run `biglm data prepare` to rewrite it")
        (_, version, code, header_size, checksum, vocab_size, eos_id, n_tokens, n_docs,
         fp) = _HEADER.unpack_from(head)
        if version != VERSION or header_size != HEADER_SIZE:
            raise ShardError(f"{self.path}: shard format version {version} is not supported (this biglm "
                             f"reads version {VERSION}); re-run `biglm data prepare` with this biglm")
        if code not in _DTYPES:
            raise ShardError(f"{self.path}: unknown dtype code {code}; the header is corrupt, "
                             "delete the file and re-run `biglm data prepare`")
        self.dtype = _DTYPES[code]
        self.vocab_size = int(vocab_size)
        self.eos_id = int(eos_id)
        self.n_tokens = int(n_tokens)
        self.n_docs = int(n_docs)
        self.fingerprint = fp.rstrip(b"\0").decode("ascii", errors="replace")
        self.checksum = int(checksum)
        tok_bytes = self.n_tokens * self.dtype.itemsize
        self._index_start = HEADER_SIZE + tok_bytes + _pad8(tok_bytes)
        expected_size = self._index_start + 8 * self.n_docs
        if size != expected_size:
            what = "truncated" if size < expected_size else "has trailing bytes"
            raise ShardError(f"{self.path}: file {what} ({size} bytes, header says {expected_size}); "
                             "it was not fully written or was damaged: delete it and re-run "
                             "`biglm data prepare` to rewrite it")
        if expected_vocab_size is not None and expected_vocab_size != self.vocab_size:
            raise ShardError(f"{self.path}: shard built with a different tokenizer (vocab size "
                             f"{self.vocab_size}, expected {expected_vocab_size}): re-run `biglm data "
                             "prepare` with the tokenizer this run uses")
        if expected_fingerprint is not None and expected_fingerprint != self.fingerprint:
            raise ShardError(f"{self.path}: shard built with a different tokenizer (fingerprint "
                             f"{self.fingerprint}, expected {expected_fingerprint}): re-run `biglm data "
                             "prepare` with the tokenizer this run uses")
        if self.n_tokens == 0 or self.n_docs == 0:
            raise ShardError(f"{self.path}: empty shard (no tokens); delete it and re-run `biglm data prepare`")
        self.tokens: np.ndarray = np.memmap(self.path, dtype=self.dtype, mode="r", offset=HEADER_SIZE,
                                            shape=(self.n_tokens,))
        # the index is small (8 bytes per document): read it into memory
        self.doc_offsets: np.ndarray = np.fromfile(self.path, dtype="<i8", count=self.n_docs,
                                                   offset=self._index_start)
        if verify:
            self.verify()

    def verify(self) -> None:
        """Recompute the checksum and check the document index; raise ``ShardError`` if off."""
        tok_bytes = self.n_tokens * self.dtype.itemsize
        crc = _crc(memoryview(self.tokens), 0)
        crc = _crc(b"\0" * _pad8(tok_bytes), crc)
        crc = _crc(self.doc_offsets.tobytes(), crc)
        crc = zlib.crc32(_pack_header(dtype=self.dtype, checksum=0, vocab_size=self.vocab_size,
                                      eos_id=self.eos_id, n_tokens=self.n_tokens, n_docs=self.n_docs,
                                      fingerprint=self.fingerprint), crc)
        if crc != self.checksum:
            raise ShardError(f"{self.path}: checksum mismatch (stored {self.checksum:#010x}, computed "
                             f"{crc:#010x}): the shard is corrupt; delete it and re-run `biglm data prepare`")
        offs = self.doc_offsets
        if offs[0] != 0 or np.any(np.diff(offs) <= 0) or offs[-1] >= self.n_tokens:
            raise ShardError(f"{self.path}: document index is inconsistent; delete it and re-run "
                             "`biglm data prepare`")

    def __len__(self) -> int:
        return self.n_docs

    def doc(self, i: int) -> np.ndarray:
        """Tokens of document ``i``, its trailing ``eos_id`` included (a memmap view)."""
        if not -self.n_docs <= i < self.n_docs:
            raise IndexError(f"document {i} out of range for {self.n_docs} documents in {self.path}")
        i %= self.n_docs
        end = int(self.doc_offsets[i + 1]) if i + 1 < self.n_docs else self.n_tokens
        return self.tokens[int(self.doc_offsets[i]):end]

    def __repr__(self) -> str:
        return (f"ShardReader({str(self.path)!r}, n_tokens={self.n_tokens}, n_docs={self.n_docs}, "
                f"vocab_size={self.vocab_size}, dtype={self.dtype.name})")
