"""Tokenise text sources into binary token shards, resumably, with every core: what `biglm data prepare` runs.

It reads documents through `biglm.data.sources` and writes shards with `biglm.data.shards`; pre-training reads the
folder it writes (`biglm.data.mixture`).

Notable features
- Output: ``train-00000.bin``, ``train-00001.bin``, ... (and ``val-00000.bin``... when
  ``val_docs > 0``) in the format of ``biglm.data.shards``, plus ``manifest.json``.
- Deterministic: shard contents depend only on the sources, tokenizer, ``shard_tokens`` and
  ``val_docs``, never on the number of workers (results are consumed in document order).
- Resumable: a shard is recorded in the manifest only after its atomic write, together with
  the position (source, document) where the next shard of its split starts. Re-running the
  same command skips recorded shards and re-reads, without tokenising, the documents they
  hold. An interrupted run and an uninterrupted one give byte-identical shards.
- Shards hold whole documents: a shard is closed before the document that would take it
  past ``shard_tokens`` (a longer document gets a shard of its own).
- Validation: the first ``val_docs`` documents *of each source* go to the ``val`` split, so
  every source is represented in the held-out set. Each shard records its documents and tokens per source
  (``per_source``), and a warning names a source that went to ``val`` whole, or a ``val`` split that holds more
  than `VAL_SHARE_WARN` of the tokens, with its largest document: one huge document (a file read as one) would
  otherwise be most of the held-out set and none of the training data.
- What a source drops (rows without text, bytes that are not UTF-8) is said in one warning line per source
  (`biglm.data.sources`), printed above the progress bar, never glued to it.
- Literal special-token strings in the text ("</s>", "<mask>") are tokenised as text: only
  the separator that ``write_shard`` adds is a real ``</s>``.

Parallelism: a process pool of ``workers``, rather than the fast tokenizer's own threads, because it takes
``workers`` literally and keeps the Python-side id conversion off the main process, which is what limits the
threaded path on many-core machines (both measured in docs/LOG.md).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from biglm.data.shards import dtype_for_vocab, write_shard

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SPLITS = ("train", "val")
VAL_SHARE_WARN = 0.25  # a val split above this share of the tokens is warned about
_FORMAT = 1

# ---- worker side: only `tokenizers` and numpy ------------------------------------------------
_WORKER_TOK: Any = None
_WORKER_DTYPE: Any = None


def _worker_init(tokenizer_json: str, dtype: str) -> None:
    global _WORKER_TOK, _WORKER_DTYPE
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the pool is the parallelism
    from tokenizers import Tokenizer

    _WORKER_TOK = Tokenizer.from_str(tokenizer_json)
    _WORKER_TOK.encode_special_tokens = True  # "</s>" in a document is text, not a separator
    _WORKER_DTYPE = np.dtype(dtype)


def _encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Encode a batch; returns (flat ids in the shard dtype, per-document lengths): cheap to pickle."""
    encs = _WORKER_TOK.encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
    flat = np.fromiter((i for e in encs for i in e.ids), dtype=_WORKER_DTYPE, count=int(lengths.sum()))
    return flat, lengths


# ---- main side --------------------------------------------------------------------------------


class PrepareError(RuntimeError):
    """``prepare`` cannot run: the output folder holds shards of another configuration, or no input."""


@dataclasses.dataclass
class _SplitState:
    """Progress of one split: what the manifest records after each shard."""

    next_shard: int = 0
    resume: tuple[int, int] = (0, 0)  # (source, document) where the next shard starts
    docs: int = 0
    bytes: int = 0
    tokens: int = 0


@dataclasses.dataclass
class _Buffer:
    docs: list[np.ndarray] = dataclasses.field(default_factory=list)
    tokens: int = 0  # including one eos per document
    bytes: int = 0
    per_source: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # source index -> [docs, tokens]
    largest: list[int] = dataclasses.field(default_factory=lambda: [0, 0, 0])  # [source, document, tokens]


def _write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``manifest.json`` of a prepared folder."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise PrepareError(f"{path}: no manifest; run `biglm data prepare SOURCE... --out {out_dir}` first")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def prepare(
    *,
    sources: list[str],
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    shard_tokens: int = 2**26,
    workers: int | None = None,
    val_docs: int = 0,
    text_field: str = "text",
    txt_mode: str = "paragraph",
    batch_docs: int = 64,
    progress: bool = True,
    on_shard_written: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Tokenise ``sources`` (specs as in ``biglm.data.sources``) into shards in ``out_dir``.

    ``tokenizer`` is a path/hub name (loaded with ``load_tokenizer``) or a loaded fast
    tokenizer. ``shard_tokens`` bounds the tokens per shard (2**26 = 128 MiB of uint16).
    ``workers`` tokenising processes (default: all cores; 1 tokenises in this process).
    ``on_shard_written(entry)`` is called after each shard is recorded (progress reporting,
    and tests simulate an interruption by raising from it). Returns the manifest.
    """
    from biglm.data.sources import iter_documents, local_files
    from biglm.data.tokenizer import document_end_id, load_tokenizer, tokenizer_fingerprint, tokenizer_vocab_size

    if not sources:
        raise PrepareError("no sources given; pass at least one file, folder, 'builtin' or hf:OWNER/NAME")
    if shard_tokens < 1 or val_docs < 0 or batch_docs < 1:
        raise ValueError("shard_tokens and batch_docs must be positive and val_docs non-negative")
    for spec in sources:  # a missing path is reported before anything is written
        if spec != "builtin" and not spec.startswith("hf:"):
            local_files(spec)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {out} is a file: give a folder (a new one, or one this command wrote, to resume "
                           "it); the file is left as it is")
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    vocab_size = tokenizer_vocab_size(tok)
    eos_id = document_end_id(tok)
    fingerprint = tokenizer_fingerprint(tok)
    dtype = dtype_for_vocab(vocab_size)
    workers = max(1, int(workers if workers is not None else (os.cpu_count() or 1)))
    out.mkdir(parents=True, exist_ok=True)
    for stale in glob.glob(str(out / ".*.tmp-*")):  # leftovers of a write that was interrupted
        os.unlink(stale)

    config = {
        "format": _FORMAT,
        "sources": list(sources),
        "tokenizer_fingerprint": fingerprint,
        "vocab_size": vocab_size,
        "eos_id": eos_id,
        "dtype": dtype.name,
        "shard_tokens": shard_tokens,
        "val_docs": val_docs,
        "text_field": text_field,
        "txt_mode": txt_mode,
    }
    manifest: dict[str, Any] = {
        "tokenizer": str(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tok.name_or_path,
        "config": config,
        "complete": False,
        "shards": [],
        "progress": {s: dataclasses.asdict(_SplitState()) for s in SPLITS},
    }
    if (out / MANIFEST).is_file():
        old = read_manifest(out)
        if old.get("config") != config:
            diff = sorted(k for k in config if old.get("config", {}).get(k) != config[k])
            raise PrepareError(f"{out}: holds shards prepared with a different configuration ({', '.join(diff)} "
                               "differ); use another --out folder, or delete this one to start over")
        manifest = old
        if manifest["complete"]:
            log.info("%s: already complete (%d shards); nothing to do", out, len(manifest["shards"]))
            return manifest
        log.info("%s: resuming after %d completed shards", out, len(manifest["shards"]))
    state = {s: _SplitState(**{**p, "resume": tuple(p["resume"])}) for s, p in manifest["progress"].items()}
    buffers = {s: _Buffer() for s in SPLITS}
    starts: dict[str, tuple[int, int] | None] = {s: None for s in SPLITS}  # position of each buffer's first doc

    def split_of(doc_idx: int) -> str:
        return "val" if doc_idx < val_docs else "train"

    def flush(split: str, end: tuple[int, int]) -> None:
        buf, st = buffers[split], state[split]
        name = f"{split}-{st.next_shard:05d}.bin"
        info = write_shard(out / name, buf.docs, vocab_size=vocab_size, tokenizer_fingerprint=fingerprint,
                           eos_id=eos_id)
        entry = {"file": name, "split": split, **info, "bytes": buf.bytes,
                 "first": list(starts[split] or end), "end": list(end), "per_source": buf.per_source,
                 "largest": buf.largest}
        st.next_shard += 1
        st.resume = end
        st.docs += info["n_docs"]
        st.tokens += info["n_tokens"]
        st.bytes += buf.bytes
        buffers[split] = _Buffer()
        starts[split] = None
        manifest["shards"].append(entry)
        manifest["progress"] = {s: {**dataclasses.asdict(v), "resume": list(v.resume)} for s, v in state.items()}
        _write_json_atomic(out / MANIFEST, manifest)  # only now does the shard count as done
        if on_shard_written is not None:
            on_shard_written(entry)

    def needed(src: int) -> Iterator[tuple[int, int, str, str]]:
        """(source, doc, split, text) of the documents of source ``src`` not yet in a shard."""
        first = []
        for split in SPLITS:
            rs, rd = state[split].resume
            if rs > src:
                continue  # this split already holds all of source `src`
            start = rd if rs == src else 0
            if split == "train":
                first.append(max(start, val_docs))
            elif start < val_docs:
                first.append(start)
        if not first:
            return
        skip = min(first)
        for d, text in enumerate(iter_documents(sources[src], text_field=text_field, txt_mode=txt_mode)):  # type: ignore[arg-type]
            if d < skip:
                continue  # already in a completed shard of every split: read, not tokenised
            split = split_of(d)
            if (src, d) >= state[split].resume:
                yield src, d, split, text

    def batches() -> Iterator[list[tuple[int, int, str, str]]]:
        batch: list[tuple[int, int, str, str]] = []
        for src in range(len(sources)):
            for item in needed(src):
                batch.append(item)
                if len(batch) == batch_docs:
                    yield batch
                    batch = []
        if batch:
            yield batch

    tok_json = tok.backend_tokenizer.to_str()
    bar = _progress_bar(progress, initial=sum(s.tokens for s in state.values()))
    t0, n_new = time.perf_counter(), 0
    pool = None
    lines_above_bar = contextlib.ExitStack()
    if progress:  # a source's warning (logged while the bar runs) gets a line of its own above the bar
        from tqdm.contrib.logging import logging_redirect_tqdm

        lines_above_bar.enter_context(logging_redirect_tqdm())
    try:
        if workers > 1:
            import multiprocessing as mp

            # fork where there is one: a spawned worker re-imports `biglm` (transformers and torch,
            # ~3-8 s each). Forking is safe here because workers set TOKENIZERS_PARALLELISM=false
            # before their first encode, so they never touch the parent's Rust thread pool, and
            # they use neither torch nor CUDA.
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            pool = mp.get_context(method).Pool(workers, initializer=_worker_init, initargs=(tok_json, dtype.name))
            encode: Callable[[list[str]], Any] = lambda texts: pool.apply_async(_encode, (texts,))  # noqa: E731
        else:
            _worker_init(tok_json, dtype.name)
            encode = _Done.wrap(_encode)
        pending: collections.deque[tuple[list[tuple[int, int, str, str]], Any]] = collections.deque()
        batch_iter = batches()

        def consume(meta: list[tuple[int, int, str, str]], result: Any) -> None:
            nonlocal n_new
            flat, lengths = result.get()
            pos = 0
            for (src, d, split, text), n in zip(meta, lengths):
                ids = flat[pos:pos + n]
                pos += n
                buf = buffers[split]
                if buf.docs and buf.tokens + n + 1 > shard_tokens:
                    flush(split, (src, d))
                    buf = buffers[split]
                if starts[split] is None:
                    starts[split] = (src, d)
                buf.docs.append(ids)
                buf.tokens += int(n) + 1
                buf.bytes += len(text.encode("utf-8"))
                counts = buf.per_source.setdefault(str(src), [0, 0])
                counts[0] += 1
                counts[1] += int(n) + 1
                if n + 1 > buf.largest[2]:
                    buf.largest = [src, d, int(n) + 1]
                n_new += int(n) + 1
                bar.update(int(n) + 1)

        # bounded look-ahead: the pool stays busy while the corpus is never read far ahead
        for meta in batch_iter:
            pending.append((meta, encode([m[3] for m in meta])))
            if len(pending) >= 4 * workers:
                consume(*pending.popleft())
        while pending:
            consume(*pending.popleft())
        for split in SPLITS:
            if buffers[split].docs:
                flush(split, (len(sources), 0))
    finally:
        bar.close()
        lines_above_bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()

    if not manifest["shards"]:
        raise PrepareError(f"sources {sources} produced no documents")
    for split in SPLITS:  # the end position means "all sources done" for both splits
        state[split].resume = (len(sources), 0)
    manifest["progress"] = {s: {**dataclasses.asdict(v), "resume": list(v.resume)} for s, v in state.items()}
    manifest["complete"] = True
    _write_json_atomic(out / MANIFEST, manifest)
    dt = time.perf_counter() - t0
    log.info("prepared %d tokens in %.1f s (%.0f tokens/s) into %s", n_new, dt, n_new / max(dt, 1e-9), out)
    for warning in split_warnings(manifest):
        log.warning("%s", warning)
    return manifest


def per_source(manifest: dict[str, Any]) -> list[dict[str, list[int]]]:
    """Per source (in order): ``{"train": [docs, tokens], "val": [docs, tokens]}`` from the shards' records
    (empty for a folder prepared before shards recorded them)."""
    counts: list[dict[str, list[int]]] = [{s: [0, 0] for s in SPLITS} for _ in manifest["config"]["sources"]]
    for shard in manifest["shards"]:
        for src, (docs, tokens) in shard.get("per_source", {}).items():
            counts[int(src)][shard["split"]][0] += docs
            counts[int(src)][shard["split"]][1] += tokens
    return counts if all("per_source" in shard for shard in manifest["shards"]) else []


def split_warnings(manifest: dict[str, Any]) -> list[str]:
    """What makes the val split a poor held-out set: a source held out whole (none of it is trained on), or a
    val split holding more than `VAL_SHARE_WARN` of the tokens (named with its largest document)."""
    sources, val_docs = manifest["config"]["sources"], manifest["config"]["val_docs"]
    counts = per_source(manifest)
    if not val_docs or not counts:
        return []
    out = [f"{spec}: all its {c['val'][0]:,} documents ({c['val'][1]:,} tokens) went to val (--val_docs {val_docs} "
           "per source), none to train; lower --val_docs, or split it into more documents (--txt_mode line for "
           "text files)" for spec, c in zip(sources, counts) if c["val"][0] and not c["train"][0]]
    val = sum(c["val"][1] for c in counts)
    total = val + sum(c["train"][1] for c in counts)
    if total and val > VAL_SHARE_WARN * total:
        src, doc, tokens = max((shard["largest"] for shard in manifest["shards"] if shard["split"] == "val"),
                               key=lambda largest: largest[2])
        out.append(f"val holds {val:,} of {total:,} tokens ({100 * val / total:.0f}%, more than "
                   f"{100 * VAL_SHARE_WARN:.0f}%); its largest document, number {doc + 1} of {sources[src]}, has "
                   f"{tokens:,} tokens; lower --val_docs, or split long documents (--txt_mode line for text files)")
    return out


class _Done:
    """An already-computed result with the ``.get()`` of a multiprocessing AsyncResult."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value

    @staticmethod
    def wrap(fn: Callable[[list[str]], Any]) -> Callable[[list[str]], _Done]:
        return lambda texts: _Done(fn(texts))


def _progress_bar(enabled: bool, *, initial: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=None, initial=initial, unit="tok", unit_scale=True, desc="tokenising",
                disable=not enabled, dynamic_ncols=True)
