"""Text sources: iterate documents (strings) from local files, folders, the hub or the built-in corpus.

A source spec is one of
- ``builtin``: the built-in corpus (``biglm.data.builtin``), no download;
- ``hf:OWNER/NAME[:CONFIG][@SPLIT]``: a Hugging Face hub dataset, streamed
  (``datasets.load_dataset(NAME, CONFIG, split=SPLIT or "train", streaming=True)``);
- a path to a ``.txt`` (or ``.raw``, WikiText's plain-text files), ``.jsonl``/``.json`` or ``.parquet``
  file, or a folder searched recursively for them (files in sorted path order, hidden files skipped).

Local files go through the same ``datasets`` streaming loaders as the hub (``text``,
``json``, ``parquet``), so local tests exercise the hub code path. Document rules:
- ``.txt``/``.raw``, ``txt_mode="paragraph"`` (default): a document is a block of text between blank
  lines, which is one story in TinyStories and one paragraph in books or WikiText;
  ``"document"``: one document per file; ``"line"``: one per line.
- ``.jsonl``/``.parquet``/hub: one document per row, from ``text_field`` (default "text").
Leading and trailing whitespace is stripped and empty documents are skipped.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

TxtMode = Literal["paragraph", "document", "line"]

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


def _rows(loader: str, data_files: list[str], *, txt_mode: TxtMode, text_field: str) -> Iterator[str]:
    import datasets  # deferred: importing datasets costs ~1 s and not every caller needs it

    kwargs = {"sample_by": txt_mode} if loader == "text" else {}
    ds = datasets.load_dataset(loader, data_files=data_files, split="train", streaming=True, **kwargs)
    field = "text" if loader == "text" else text_field
    for row in ds:
        if field not in row:
            raise SourceError(f"{data_files[0]}: rows have no field {field!r} (fields: {sorted(row)}); "
                              "pass text_field= / --text_field with the right one")
        text = row[field]
        if isinstance(text, str):
            yield text


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
    # consecutive files of one type share a loader call (a folder of 500 .txt files is one
    # streaming dataset, not 500), which datasets reads in the order given
    run: list[str] = []
    run_loader = ""
    for f in files:
        loader = _LOADERS[f.suffix.lower()]
        if run and loader != run_loader:
            yield from _rows(run_loader, run, txt_mode=txt_mode, text_field=text_field)
            run = []
        run_loader = loader
        run.append(str(f))
    if run:
        yield from _rows(run_loader, run, txt_mode=txt_mode, text_field=text_field)


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
