"""Tables for tasks and evaluation sets: one split of a local file or a hub dataset as a ``datasets.Dataset``.

Every task reader (fine-tuning's classification, SQuAD and BEIR readers, the multitask suite's generation
sets) goes through `load_table`, and so through ``datasets.load_dataset``: a local file with the packaged
loaders (``json``/``csv``/``parquet``), a hub dataset as ``hf:OWNER/NAME[:CONFIG][@SPLIT]`` (the spec of
``biglm.data.sources``) through the same call, so local tests exercise the hub path.

Input that cannot be used is a `TaskDataError` whose message names the file, the field and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .sources import parse_hub_spec

if TYPE_CHECKING:
    import datasets

__all__ = ["TaskDataError", "load_table", "preview"]

_LOADERS: dict[str, str] = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
_SHOW = 5  # ids listed in an error message


class TaskDataError(ValueError):
    """Task data that cannot be used; the message names the file, the field and the fix."""


def preview(items: Sequence[Any]) -> str:
    """The first few items (reprs) for an error message, with ", ..." when there are more."""
    shown = ", ".join(repr(x) for x in items[:_SHOW])
    return f"{shown}{', ...' if len(items) > _SHOW else ''}"


def load_table(source: str | os.PathLike[str], *, split: str = "train", **loader_kwargs: Any) -> datasets.Dataset:
    """One split of a local data file or a hub dataset (``hf:OWNER/NAME[:CONFIG][@SPLIT]``) as a ``Dataset``.

    A local file has a single split (``datasets`` calls it "train"), so ``split`` applies to hub
    datasets only; an ``@SPLIT`` in the hub spec wins over ``split``.
    """
    import datasets  # deferred: ~1 s to import

    spec = str(source)
    try:
        if spec.startswith("hf:"):
            hub = parse_hub_spec(spec)
            hub_split = hub.split if "@" in spec else split
            return datasets.load_dataset(hub.name, hub.config, split=hub_split, **loader_kwargs)
        path = Path(spec)
        if not path.is_file():
            raise TaskDataError(f"{path}: no such file; pass a .jsonl/.json/.csv/.tsv/.parquet file or "
                                "hf:OWNER/NAME[:CONFIG][@SPLIT] for a hub dataset")
        loader = _LOADERS.get(path.suffix.lower())
        if loader is None:
            raise TaskDataError(f"{path}: unsupported file type {path.suffix!r}; supported: {sorted(_LOADERS)}")
        if path.suffix.lower() == ".tsv":
            loader_kwargs.setdefault("delimiter", "\t")
        return datasets.load_dataset(loader, data_files=str(path), split="train", **loader_kwargs)
    except TaskDataError:
        raise
    except Exception as e:  # datasets wraps parse errors in several types; name the file
        raise TaskDataError(f"{spec}: could not be read as a dataset ({type(e).__name__}: {e})") from e
