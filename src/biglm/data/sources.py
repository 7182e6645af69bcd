"""Text sources: iterate documents (strings) from local files, folders, the hub or the built-in corpus.

A source spec is one of
- ``builtin``: the built-in corpus (``biglm.data.builtin``), no download;
- ``hf:OWNER/NAME[:CONFIG][@SPLIT]``: a Hugging Face hub dataset, streamed
  (``datasets.load_dataset(NAME, CONFIG, split=SPLIT or "train", streaming=True)``);
- a path to a ``.txt`` (or ``.raw``, WikiText's plain-text files), ``.jsonl``/``.json`` or ``.parquet``
  file, or a folder searched recursively for them (files in sorted path order, hidden files skipped).

Local ``.jsonl``/``.parquet`` files go through the same ``datasets`` streaming loaders as the hub
(``json``, ``parquet``), so local tests exercise the hub code path. ``.txt``/``.raw`` files are read here
(`_text_documents`), split exactly as the ``datasets`` text loader splits them (universal newlines), because
real corpora hold bytes that are not UTF-8 and that loader stops at the first with a traceback. Document rules:
- ``.txt``/``.raw``, ``txt_mode="paragraph"`` (default): a document is a block of text between blank
  lines, which is one story in TinyStories and one paragraph in books or WikiText;
  ``"document"``: one document per file; ``"line"``: one per line.
- ``.jsonl``/``.parquet``/hub: one document per row, from ``text_field`` (default "text").
Leading and trailing whitespace is stripped and empty documents are skipped.

Bytes that are not UTF-8 (a Latin-1 line in a crawl, a truncated character) are skipped and counted, never
fatal: each becomes U+FFFD, the rest of its line is kept, and one warning per source says how many lines and
bytes, and the first FILE:LINE, so the user can clean the file or accept the loss. `biglm data prepare` and
`biglm tokenizer train` both read through here, so they see the same text.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

TxtMode = Literal["paragraph", "document", "line"]

log = logging.getLogger(__name__)

# file suffix -> datasets packaged loader
_LOADERS: dict[str, str] = {".txt": "text", ".raw": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class SourceError(ValueError):
    """A source spec that names nothing readable, or a source that holds no documents."""


@dataclasses.dataclass(frozen=True)
class HubSpec:
    """A parsed ``hf:OWNER/NAME[:CONFIG][@SPLIT]`` spec."""

    name: str
    config: str | None = None
    split: str = "train"


def parse_hub_spec(spec: str) -> HubSpec:
    """Parse ``hf:OWNER/NAME[:CONFIG][@SPLIT]``, e.g. ``hf:HuggingFaceFW/fineweb-edu:sample-10BT@train``."""
    if not spec.startswith("hf:"):
        raise SourceError(f"{spec!r} is not a hub spec (expected hf:OWNER/NAME[:CONFIG][@SPLIT])")
    rest = spec[3:]
    rest, _, split = rest.partition("@")
    name, _, config = rest.partition(":")
    if not name:
        raise SourceError(f"{spec!r}: missing dataset name (expected hf:OWNER/NAME[:CONFIG][@SPLIT])")
    return HubSpec(name=name, config=config or None, split=split or "train")


def local_files(path: str | os.PathLike[str]) -> list[Path]:
    """The readable files a local path stands for: itself, or a folder's files recursively, sorted."""
    p = Path(path)
    if not p.exists():
        raise SourceError(f"{p}: no such file or folder; pass an existing .txt/.jsonl/.parquet file, "
                          "a folder of them, 'builtin', or hf:OWNER/NAME for a hub dataset")
    if p.is_file():
        if p.suffix.lower() not in _LOADERS:
            raise SourceError(f"{p}: unsupported file type {p.suffix!r}; supported: {', '.join(sorted(_LOADERS))}")
        return [p]
    files = sorted(
        f for f in p.rglob("*")
        if f.is_file() and f.suffix.lower() in _LOADERS
        and not any(part.startswith(".") for part in f.relative_to(p).parts)
    )
    if not files:
        raise SourceError(f"{p}: the folder holds no .txt/.jsonl/.json/.parquet files; point at the "
                          "folder that contains the text files")
    return files


@dataclasses.dataclass
class Undecodable:
    """What a source held that is not UTF-8: lines, bytes (each replaced by U+FFFD) and the first FILE:LINE."""

    lines: int = 0
    bytes: int = 0
    first: str = ""

    def warn(self, spec: str) -> None:
        if self.lines:
            log.warning("%s: %d line(s) hold bytes that are not UTF-8: %d byte(s) replaced by U+FFFD, the rest of "
                        "each line kept (first at %s); to keep them, re-encode the file as UTF-8 (say, iconv -f "
                        "LATIN1 -t UTF-8)", spec, self.lines, self.bytes, self.first)


_CHUNK = 1 << 22  # bytes read at a time (then to the end of the line: a chunk never splits a line or a character)
_ESCAPED = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as the "surrogateescape" decoding keeps it


def _decode(chunk: bytes, *, path: Path, line0: int, bad: Undecodable) -> str:
    """``chunk`` (whole lines of ``path``, the first one number ``line0 + 1``) as text with universal newlines;
    each byte that is not UTF-8 becomes U+FFFD and is counted in ``bad``."""
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError:  # the rare chunk: line by line, to count and locate
        lines = []
        for i, line in enumerate(chunk.split(b"\n")):
            kept, n = _ESCAPED.subn("\ufffd", line.decode("utf-8", errors="surrogateescape"))
            if n:
                bad.lines += 1
                bad.bytes += n
                bad.first = bad.first or f"{path}:{line0 + i + 1}"
            lines.append(kept)
        text = "\n".join(lines)
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as a file opened in text mode reads


def _text_documents(path: Path, *, txt_mode: TxtMode, bad: Undecodable) -> Iterator[str]:
    """The documents of one .txt/.raw file, split as the ``datasets`` text loader splits them: at blank lines
    (``"\\n\\n"``), per line, or the whole file; bytes that are not UTF-8 replaced and counted (`_decode`)."""
    rest, line0, whole = "", 0, []
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK) + f.readline():
            text = _decode(chunk, path=path, line0=line0, bad=bad)
            line0 += chunk.count(b"\n")
            if txt_mode == "document":
                whole.append(text)
                continue
            parts = (rest + text).split("\n\n" if txt_mode == "paragraph" else "\n")
            rest = parts.pop()  # the start of a document the next chunk ends
            yield from parts
    if whole or rest:
        yield "".join(whole) or rest


def _rows(loader: str, data_files: list[str], *, text_field: str) -> Iterator[str]:
    import datasets  # deferred: importing datasets costs ~1 s and not every caller needs it

    import pyarrow as pa

    try:
        for row in datasets.load_dataset(loader, data_files=data_files, split="train", streaming=True):
            if text_field not in row:
                raise SourceError(f"{data_files[0]}: rows have no field {text_field!r} (fields: {sorted(row)}); "
                                  "pass text_field= / --text_field with the right one")
            text = row[text_field]
            if isinstance(text, str):
                yield text
    except UnicodeDecodeError:  # JSON is UTF-8 by definition: a file with other bytes is refused, located
        where = _first_undecodable(data_files) or f"one of {', '.join(data_files)}"
        raise SourceError(f"{where}: not UTF-8, which JSON must be; re-encode the file as UTF-8 (say, iconv -f "
                          "LATIN1 -t UTF-8), or convert it to .txt, whose bad bytes are replaced and counted") from None
    except pa.ArrowException as e:  # malformed JSON, a damaged Parquet file: one line, not Arrow's traceback
        where = data_files[0] if len(data_files) == 1 else f"one of {len(data_files)} files ({data_files[0]} ...)"
        raise SourceError(f"{where}: cannot be read as {loader} ({str(e).splitlines()[0]})") from None


def _first_undecodable(files: list[str]) -> str | None:
    """FILE:LINE of the first line that is not UTF-8 among ``files`` (read only once a reader has failed)."""
    for f in files:
        with open(f, "rb") as fh:
            for i, line in enumerate(fh, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    return f"{f}:{i}"
    return None


def _iter_hub(spec: str, *, text_field: str) -> Iterator[str]:
    import datasets

    hub = parse_hub_spec(spec)
    ds = datasets.load_dataset(hub.name, hub.config, split=hub.split, streaming=True)
    for row in ds:
        if text_field not in row:
            raise SourceError(f"{spec}: rows have no field {text_field!r} (fields: {sorted(row)}); "
                              "pass text_field= / --text_field with the right one")
        yield row[text_field]


def _iter_local(spec: str, *, text_field: str, txt_mode: TxtMode) -> Iterator[str]:
    files = local_files(spec)
    bad = Undecodable()
    # consecutive files of one type share a loader call (a folder of 500 .jsonl files is one
    # streaming dataset, not 500), which datasets reads in the order given; text files are read here
    run: list[str] = []
    run_loader = ""
    try:
        for f in files:
            loader = _LOADERS[f.suffix.lower()]
            if run and loader != run_loader:
                yield from _rows(run_loader, run, text_field=text_field)
                run = []
            if loader == "text":
                yield from _text_documents(f, txt_mode=txt_mode, bad=bad)
                continue
            run_loader = loader
            run.append(str(f))
        if run:
            yield from _rows(run_loader, run, text_field=text_field)
    finally:  # also when the reader stops early (`biglm tokenizer train --limit_bytes`): what was read so far
        bad.warn(spec)


def iter_documents(
    spec: str,
    *,
    text_field: str = "text",
    txt_mode: TxtMode = "paragraph",
) -> Iterator[str]:
    """Yield the documents of one source spec (see the module docstring), stripped and non-empty.

    Raises ``SourceError`` for a missing path, an unsupported file, or a source that turns
    out to hold no documents at all.
    """
    if txt_mode not in ("paragraph", "document", "line"):
        raise ValueError(f"txt_mode must be 'paragraph', 'document' or 'line', got {txt_mode!r}")
    if spec == "builtin":
        from biglm.data.builtin import builtin_corpus

        raw: Iterator[str] = iter(builtin_corpus())
    elif spec.startswith("hf:"):
        parse_hub_spec(spec)  # a malformed spec fails here, at the call
        raw = _iter_hub(spec, text_field=text_field)
    else:
        local_files(spec)  # a missing path fails here, at the call, not at the first next()
        raw = _iter_local(spec, text_field=text_field, txt_mode=txt_mode)
    return _stripped(spec, raw)


def _stripped(spec: str, raw: Iterator[str]) -> Iterator[str]:
    n = 0
    for text in raw:
        text = text.strip()
        if text:
            n += 1
            yield text
    if n == 0:
        raise SourceError(f"{spec}: holds no text documents (all files empty or whitespace); "
                          "check the path, or --text_field for .jsonl/.parquet files")


def iter_sources(specs: list[str], **kwargs: object) -> Iterator[str]:
    """The documents of several specs one after the other (``kwargs`` as for ``iter_documents``).

    Every spec is checked at the call, before any is read: a missing path or an unsupported file in the
    last spec fails at once, also when a reader stops early (``biglm tokenizer train --limit_bytes``)."""
    return itertools.chain.from_iterable([iter_documents(spec, **kwargs) for spec in specs])  # type: ignore[arg-type]
