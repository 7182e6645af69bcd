"""Where a converted model came from, said the way a model card may say it: a hub id, or a file's (directory's) name
with the sha256 of its weights — never a local path, which means nothing on another machine and can leak a user name.

`resolve_source` reads what `biglm convert SRC` was given: a GGUF file (llama.cpp / Ollama), a transformers
directory, or a hub id. `biglm convert` records the answer in ``OUT/biglm_source.json`` (`SOURCE_FILE`); `biglm
export` copies the root of a model's lineage (convert → `pretrain --init_from` → `finetune` → export) into what it
writes, so a card names the pretrained model a BiGLM descends from even after the run folders are gone.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .layout import file_sha256

SOURCE_FILE = "biglm_source.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


@dataclass(frozen=True)
class SourceRef:
    """A pretrained model named portably: ``kind`` "hub" (``name`` a hub id), "gguf" (a file name) or "transformers"
    (a directory's name); ``sha256`` of the weights for the local kinds (several weight files: the sha256 of their
    names and digests, in name order)."""

    kind: str
    name: str
    sha256: str | None = None

    @property
    def hub_id(self) -> str | None:
        """The id a model card's ``base_model`` may carry (the hub's field takes hub ids only)."""
        return self.name if self.kind == "hub" else None

    def describe(self) -> str:
        """One phrase for a card or a log: ``HuggingFaceTB/SmolLM2-135M`` or ``model.gguf (sha256 ab12…)``."""
        what = {"hub": "", "gguf": "GGUF file ", "transformers": "transformers checkpoint "}.get(self.kind, "")
        return f"{what}`{self.name}`" + (f" (sha256 `{self.sha256}`)" if self.sha256 else "")


@dataclass(frozen=True)
class ResolvedSource:
    """What to load (``location``, with ``gguf_file`` inside it for a GGUF) and how to name it (``ref``)."""

    location: str
    gguf_file: str | None
    ref: SourceRef

    def load_kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def _dir_sha256(folder: Path) -> str | None:
    files = sorted({p for pattern in _WEIGHTS for p in folder.glob(pattern) if p.is_file()})
    if not files:
        return None
    if len(files) == 1:
        return file_sha256(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}:{file_sha256(f)}\n".encode())
    return h.hexdigest()


def resolve_source(src: str) -> ResolvedSource:
    """Read ``src`` as a GGUF file, a transformers directory (config.json; or a folder holding exactly one
    ``.gguf``), or a hub id (``ORG/NAME``, fetched by transformers). `ValueError` in one line when it is none."""
    path = Path(src)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{src} is a file but not a GGUF file (*.gguf): pass a .gguf file, a transformers "
                             "checkpoint directory or a hub id (ORG/NAME)")
        return ResolvedSource(str(path.parent), path.name, SourceRef("gguf", path.name, file_sha256(path)))
    if path.is_dir():
        if (path / "config.json").is_file():
            return ResolvedSource(str(path), None, SourceRef("transformers", path.resolve().name, _dir_sha256(path)))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return resolve_source(str(ggufs[0]))
        raise ValueError(f"{src} is neither a transformers checkpoint directory (no config.json there) nor a folder "
                         f"with one GGUF file ({len(ggufs)} .gguf files): pass the .gguf file itself, a directory "
                         "from `huggingface-cli download ORG/NAME --local-dir DIR`, or the hub id ORG/NAME")
    if _HUB_ID.match(src) and not src.startswith((".", "/")):
        return ResolvedSource(src, None, SourceRef("hub", src))
    raise ValueError(f"{src}: no such file or directory, and not a hub id (ORG/NAME): pass a .gguf file, a "
                     "transformers checkpoint directory or a hub id")


def write_source(out: Path, ref: SourceRef, **extra: Any) -> None:
    (out / SOURCE_FILE).write_text(json.dumps({**asdict(ref), **extra}, indent=2) + "\n")


def read_source(folder: Path) -> SourceRef | None:
    try:
        data = json.loads((folder / SOURCE_FILE).read_text())
        return SourceRef(str(data["kind"]), str(data["name"]), data.get("sha256"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lineage_root(path: str | Path | None, *, _depth: int = 0) -> SourceRef | None:
    """The pretrained model ``path`` descends from: its own `SOURCE_FILE`, else that of the model its run started
    from (a pretrain run's ``init_from``, a fine-tuning run's ``model``), followed back. None when the chain ends in a
    model biglm trained from scratch or in a folder that is gone (a name is never guessed to be a hub id)."""
    if path is None or _depth > 8:
        return None
    folder = Path(path)
    if not folder.exists():
        return None
    if (ref := read_source(folder)) is not None:
        return ref
    for name, key in (("train_config.json", "init_from"), ("finetune_config.json", "model")):
        try:
            parent = json.loads((folder / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if parent:
            return lineage_root(parent, _depth=_depth + 1)
    if folder.name.startswith("step_") or folder.name == "best":  # a checkpoint inside a run
        return lineage_root(folder.parent.parent if folder.parent.name == "checkpoints" else folder.parent,
                            _depth=_depth + 1)
    return None


def base_of(run: Path | None, explicit: str | None = None) -> SourceRef | None:
    """The pretrained model a run's model descends from: ``explicit`` (export's ``--base_model``) when it is a hub id,
    else the root of its lineage (a local folder given there followed back, then the run's own start)."""
    if explicit and not Path(explicit).exists() and _HUB_ID.match(explicit):
        return SourceRef("hub", explicit)
    return (lineage_root(explicit) if explicit else None) or (lineage_root(run) if run is not None else None)


def keep_lineage(out: Path, run: Path, *, base_model: str | None = None) -> None:
    """Copy `base_of` the run into an export ``out`` (`SOURCE_FILE`), so the exported model still names the
    pretrained model it descends from once the run folders are gone; nothing when it was trained from scratch."""
    root = base_of(run, base_model)
    if root is not None:
        write_source(out, root)
