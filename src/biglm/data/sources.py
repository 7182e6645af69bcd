"""Text sources: iterate documents (strings) from local files, folders, the hub or the built-in corpus.

A source spec is one of
- ``builtin``: the built-in corpus (``biglm.data.builtin``), no download;
- ``hf:OWNER/NAME[:CONFIG][@SPLIT]``: a Hugging Face hub dataset, streamed
  (``datasets.load_dataset(NAME, CONFIG, split=SPLIT or "train", streaming=True)``);
- a path to a ``.txt`` (or ``.raw``, WikiText's plain-text files), ``.jsonl``/``.json`` or ``.parquet``
  file, or a folder searched recursively for them (files in sorted path order, hidden files skipped).

Local ``.jsonl``/``.parquet`` files go through the same ``datasets`` streaming loaders as the hub
(``json``, ``parquet``), so local tests exercise the hub code path. ``.txt``/``.raw`` files are read here
(`_text_documents`), with universal newlines as the ``datasets`` text loader reads them, because
real corpora hold bytes that are not UTF-8 and that loader stops at the first with a traceback. Document rules:
- ``.txt``/``.raw``, ``txt_mode="paragraph"`` (default): a document is a block of text between blank
  lines (lines of whitespace only count as blank), which is one story in TinyStories and one paragraph in books;
  a file with no blank line at all is read one document per line (its lines are its paragraphs, as in WikiText's
  raw files: one huge document would otherwise go whole to one split), and one line per source says so;
  ``"document"``: one document per file; ``"line"``: one per line. A file that starts with a UTF-16/32
  byte-order mark is decoded as such (a UTF-8 one is dropped).
- ``.jsonl``/``.parquet``/hub: one document per row, from ``text_field`` (default "text"). A row whose field is
  missing, null, a number or empty is dropped, and one warning per source counts them by reason and names the
  first (``FILE:LINE``): a number is not taken as text, since it means the wrong field or a broken export.
Leading and trailing whitespace is stripped and empty documents are skipped.

Bytes that are not UTF-8 (a Latin-1 line in a crawl, a truncated character) are skipped and counted, never
fatal: each becomes U+FFFD, the rest of its line is kept, and one warning per source says how many lines and
bytes, and the first FILE:LINE, so the user can clean the file or accept the loss. `biglm data prepare` and
`biglm tokenizer train` both read through here, so they see the same text.
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import itertools
import logging
import os
import re
from collections.abc import Callable, Iterator
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
    encoding: str = "UTF-8"  # what the first such line's file was read as (UTF-16/32 where its BOM says so)

    def warn(self, spec: str) -> None:
        if self.lines:
            fix = ("to keep them, re-encode the file as UTF-8 (say, iconv -f LATIN1 -t UTF-8)" if self.encoding ==
                   "UTF-8" else f"the {self.encoding} file is damaged there")
            log.warning("%s: %d line(s) hold bytes that are not %s: %d byte(s) replaced by U+FFFD, the rest of "
                        "each line kept (first at %s); %s", spec, self.lines, self.encoding, self.bytes, self.first,
                        fix)


@dataclasses.dataclass
class SourceReport:
    """What reading one source dropped or decided for the user, said in one line each at its end (`warn`)."""

    bad: Undecodable = dataclasses.field(default_factory=Undecodable)
    rows: int = 0  # rows of .jsonl/.parquet/hub tables read
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # reason -> rows
    first_dropped: str = ""
    per_line_files: int = 0  # text files with no blank line, read one document per line
    first_per_line: str = ""
    text_field: str = "text"

    def drop_summary(self) -> str:
        """``3 of 5 rows, whose 'text' is: 2 missing or null, 1 a number (first at FILE:LINE)``, or ""."""
        if not self.dropped:
            return ""
        why = ", ".join(f"{n} {reason}" for reason, n in self.dropped.most_common())
        return (f"{sum(self.dropped.values())} of {self.rows} row(s) dropped, whose {self.text_field!r} is: {why} "
                f"(first at {self.first_dropped})")

    def warn(self, spec: str) -> None:
        self.bad.warn(spec)
        if self.dropped:
            log.warning("%s: %s; only strings are text: check --text_field, or fix those rows", spec,
                        self.drop_summary())
        if self.per_line_files:
            which = "it has" if self.first_per_line == spec else f"{self.per_line_files} text file(s) have"
            first = "" if self.first_per_line == spec else f" (first {self.first_per_line})"
            log.info("%s: %s no blank line%s, so each line is a document; --txt_mode document keeps a file whole",
                     spec, which, first)


_CHUNK = 1 << 22  # bytes read at a time (then to the end of the line: a chunk never splits a line or a character)
# a byte that could not be decoded, as "surrogateescape" (UTF-8) or `_escape_undecodable` (UTF-16/32) keep it
_ESCAPED = re.compile("[\udc00-\udcff]")
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")  # a line of whitespace only ends a paragraph
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"), (codecs.BOM_UTF8, "utf-8-sig"))  # UTF-32 LE starts with UTF-16 LE's


def _escape_undecodable(e: UnicodeError) -> tuple[str, int]:
    """A decoding error handler: each undecodable byte becomes a lone surrogate (found and counted by `_marked`)."""
    assert isinstance(e, UnicodeDecodeError)
    return "".join(chr(0xDC00 + b) for b in e.object[e.start:e.end]), e.end


codecs.register_error("biglm.escape", _escape_undecodable)


def byte_order_mark(path: Path) -> str | None:
    """The encoding a file's byte-order mark names ("utf-16", "utf-32", "utf-8-sig"), or None."""
    with path.open("rb") as f:
        head = f.read(4)
    return next((enc for bom, enc in _BOMS if head.startswith(bom)), None)


def _marked(text: str, *, path: Path, line0: int, bad: Undecodable, encoding: str = "UTF-8") -> str:
    """``text`` (whole lines of ``path``, the first one number ``line0 + 1``) with each escaped byte as U+FFFD,
    counted and located in ``bad``; then universal newlines, as a file opened in text mode reads."""
    if _ESCAPED.search(text):  # the rare chunk: line by line, to count and locate
        lines = []
        for i, line in enumerate(text.split("\n")):
            kept, n = _ESCAPED.subn("\ufffd", line)
            if n:
                bad.lines += 1
                bad.bytes += n
                if not bad.first:
                    bad.first, bad.encoding = f"{path}:{line0 + i + 1}", encoding
            lines.append(kept)
        text = "\n".join(lines)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _text_chunks(path: Path, *, bad: Undecodable) -> Iterator[str]:
    """The text of ``path`` in pieces of whole lines (universal newlines), UTF-8 unless a byte-order mark says
    UTF-16/32; undecodable bytes replaced and counted (`_marked`)."""
    encoding = byte_order_mark(path)
    line0 = 0
    with path.open("rb") as f:
        if encoding in (None, "utf-8-sig"):
            f.read(3 if encoding else 0)  # a UTF-8 BOM is no text
            while chunk := f.read(_CHUNK) + f.readline():
                try:
                    text = chunk.decode("utf-8")
                except UnicodeDecodeError:
                    text = chunk.decode("utf-8", errors="surrogateescape")
                yield _marked(text, path=path, line0=line0, bad=bad)
                line0 += chunk.count(b"\n")
            return
        decoder = codecs.getincrementaldecoder(encoding)(errors="biglm.escape")  # it reads (and drops) the BOM
        rest = ""
        while True:
            chunk = f.read(_CHUNK)
            text = rest + decoder.decode(chunk, final=not chunk)
            cut = len(text) if not chunk else text.rfind("\n") + 1  # whole lines only: "\r\n" is never split
            if cut:
                yield _marked(text[:cut], path=path, line0=line0, bad=bad, encoding=encoding.upper())
                line0 += text.count("\n", 0, cut)
            rest = text[cut:]
            if not chunk:
                return


def _text_documents(path: Path, *, txt_mode: TxtMode, bad: Undecodable,
                    report: SourceReport | None = None) -> Iterator[str]:
    """The documents of one .txt/.raw file: between blank lines (a file with none: per line, counted in
    ``report``), per line, or the whole file (see the module docstring)."""
    rest, whole, blank_seen = "", [], False
    for text in _text_chunks(path, bad=bad):
        if txt_mode == "document":
            whole.append(text)
            continue
        parts = _BLANK_LINE.split(rest + text) if txt_mode == "paragraph" else (rest + text).split("\n")
        blank_seen = blank_seen or len(parts) > 1
        rest = parts.pop()  # the start of a document the next chunk ends
        yield from parts
    if txt_mode == "document":
        yield "".join(whole)
    elif txt_mode == "paragraph" and not blank_seen and "\n" in rest.strip():
        if report is not None:  # the whole file is one block: its lines are its paragraphs
            report.per_line_files += 1
            report.first_per_line = report.first_per_line or str(path)
        yield from rest.split("\n")
    elif rest:
        yield rest


def _row_text(value: object) -> tuple[str | None, str]:
    """A table row's text field as a document, or (None, why it is dropped)."""
    if isinstance(value, str):
        return (value, "") if value.strip() else (None, "empty")
    if value is None:
        return None, "missing or null"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None, "a number"
    return None, f"a {type(value).__name__}"


def _locate_row(files: list[str], k: int) -> str:
    """FILE:LINE (FILE row N for Parquet) of row ``k`` (from 0) of the rows ``files`` hold one after the other;
    JSON Lines rows are the non-blank lines, as the json loader reads them."""
    for f in files:
        if f.lower().endswith(".parquet"):
            import pyarrow.parquet as pq

            n = pq.ParquetFile(f).metadata.num_rows
            if k < n:
                return f"{f} row {k + 1}"
            k -= n
            continue
        with open(f, "rb") as fh:
            for i, line in enumerate(fh, 1):
                if line.strip():
                    if k == 0:
                        return f"{f}:{i}"
                    k -= 1
    return f"row {k + 1} of {files[0]}" if len(files) == 1 else f"one of {len(files)} files ({files[0]} ...)"


def _table_texts(rows: Iterator[dict], *, where: str, text_field: str, report: SourceReport,
                 locate: Callable[[int], str]) -> Iterator[str]:
    """The text of each row of a table source; rows without text counted by reason in ``report``."""
    for k, row in enumerate(rows):
        if text_field not in row:
            raise SourceError(f"{where}: rows have no field {text_field!r} (fields: {sorted(row)}); "
                              "pass text_field= / --text_field with the right one")
        report.rows += 1
        text, why = _row_text(row[text_field])
        if text is None:
            report.dropped[why] += 1
            report.first_dropped = report.first_dropped or locate(k)
            continue
        yield text


def _rows(loader: str, data_files: list[str], *, text_field: str, report: SourceReport) -> Iterator[str]:
    import datasets  # deferred: importing datasets costs ~1 s and not every caller needs it

    import pyarrow as pa

    for f in data_files:  # checked before reading: the json loader would fail on the first NUL with "not UTF-8"
        encoding = byte_order_mark(Path(f)) if loader == "json" else None
        if encoding in ("utf-16", "utf-32"):
            raise SourceError(f"{f}: is {encoding.upper()} (its byte-order mark says so), but JSON must be UTF-8; "
                              f"convert it: iconv -f {encoding.upper()} -t UTF-8 {f} > {Path(f).stem}.utf8.jsonl")
    try:
        ds = datasets.load_dataset(loader, data_files=data_files, split="train", streaming=True)
        yield from _table_texts(iter(ds), where=data_files[0], text_field=text_field, report=report,
                                locate=lambda k: _locate_row(data_files, k))
    except UnicodeDecodeError:  # JSON is UTF-8 by definition: a file with other bytes is refused, located
        where = _first_undecodable(data_files) or f"one of {', '.join(data_files)}"
        raise SourceError(f"{where}: not UTF-8, which JSON must be; re-encode the file as UTF-8 (say, iconv -f "
                          "LATIN1 -t UTF-8), or convert it to .txt, whose bad bytes are replaced and counted") from None
    except SourceError:
        raise
    except (pa.ArrowException, ValueError) as e:  # malformed JSON, a damaged Parquet file: one line, no traceback
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


def _iter_hub(spec: str, *, text_field: str, report: SourceReport) -> Iterator[str]:
    import datasets

    hub = parse_hub_spec(spec)
    ds = datasets.load_dataset(hub.name, hub.config, split=hub.split, streaming=True)
    try:
        yield from _table_texts(iter(ds), where=spec, text_field=text_field, report=report,
                                locate=lambda k: f"row {k + 1}")
    finally:
        report.warn(spec)


def _iter_local(spec: str, *, text_field: str, txt_mode: TxtMode, report: SourceReport) -> Iterator[str]:
    files = local_files(spec)
    # consecutive files of one type share a loader call (a folder of 500 .jsonl files is one
    # streaming dataset, not 500), which datasets reads in the order given; text files are read here
    run: list[str] = []
    run_loader = ""
    try:
        for f in files:
            loader = _LOADERS[f.suffix.lower()]
            if run and loader != run_loader:
                yield from _rows(run_loader, run, text_field=text_field, report=report)
                run = []
            if loader == "text":
                yield from _text_documents(f, txt_mode=txt_mode, bad=report.bad, report=report)
                continue
            run_loader = loader
            run.append(str(f))
        if run:
            yield from _rows(run_loader, run, text_field=text_field, report=report)
    finally:  # also when the reader stops early (`biglm tokenizer train --limit_bytes`): what was read so far
        report.warn(spec)


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
    report = SourceReport(text_field=text_field)
    if spec == "builtin":
        from biglm.data.builtin import builtin_corpus

        raw: Iterator[str] = iter(builtin_corpus())
    elif spec.startswith("hf:"):
        parse_hub_spec(spec)  # a malformed spec fails here, at the call
        raw = _iter_hub(spec, text_field=text_field, report=report)
    else:
        local_files(spec)  # a missing path fails here, at the call, not at the first next()
        raw = _iter_local(spec, text_field=text_field, txt_mode=txt_mode, report=report)
    return _stripped(spec, raw, report)


def _stripped(spec: str, raw: Iterator[str], report: SourceReport) -> Iterator[str]:
    n = 0
    for text in raw:
        text = text.strip()
        if text:
            n += 1
            yield text
    if n == 0:
        if report.dropped:
            raise SourceError(f"{spec}: holds no text documents: {report.drop_summary()}; check --text_field")
        raise SourceError(f"{spec}: holds no text documents (all files empty or whitespace); "
                          "check the path, or --text_field for .jsonl/.parquet files")


def iter_sources(specs: list[str], **kwargs: object) -> Iterator[str]:
    """The documents of several specs one after the other (``kwargs`` as for ``iter_documents``).

    Every spec is checked at the call, before any is read: a missing path or an unsupported file in the
    last spec fails at once, also when a reader stops early (``biglm tokenizer train --limit_bytes``)."""
    return itertools.chain.from_iterable([iter_documents(spec, **kwargs) for spec in specs])  # type: ignore[arg-type]
