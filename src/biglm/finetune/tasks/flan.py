"""FLAN instruction-tuning data (the instruct family): the hub's Flan-collection schema, and FLAN-style mixtures.

Two sources of ``{inputs, targets, task_name}`` rows:

- ``read_flan_collection``: rows already rendered, in the hub Flan-collection schema (local JSONL,
  or ``hf:OWNER/NAME[:CONFIG][@SPLIT]``), read as is through ``load_table``.
- ``render_mixture``: without hub access, a mixture rendered from FLAN's templates
  (``templates_flan_v2.json`` or ``templates_flan2021_v1.json``) and task data held locally,
  one ``MixtureTask`` per task: each example gets a random pattern of its family (seeded).

Notable features
- Checked before any work: a Flan file without ``inputs``/``targets`` (naming the file and the
  field); a template field the task data lacks (naming the field, the pattern and the family);
  a classification family without option strings; an evaluation set in the mixture.
- Evaluation sets stay out (``exclude_eval``), checked at the row level: a task any of whose rows
  carries an evaluation row's text (normalised: case, punctuation, spacing ignored; each input of
  ``MIN_OVERLAP_WORDS`` words or more, or the row's texts together) is refused naming the set and
  the overlap count, so a partial copy under another name is caught; so is a task whose source is
  an excluded file or has its bytes, whose name is excluded, or that reads an excluded hub dataset
  (split-aware: ``hf:ANY_OWNER/super_glue:boolq@validation`` is refused when
  ``aps__super_glue/boolq/validation.jsonl`` is excluded, ``@train`` is not). The default is what
  ``--suite multitask`` reads: ``$BIGLM_EVAL_DATA`` or the shared eval folder
  (``../shared/data/eval``, hub layout ``OWNER__NAME``) and the default Genset file (WikiAuto's
  ``valid.jsonl``); it fails closed: no evaluation data found is a refusal saying how to point
  at it. The evaluation files' fingerprints are computed once per process.
- ``{options_}`` as FLAN renders it: ``options_style="flan2021"`` is FLAN 2021's fixed
  ``OPTIONS:\\n- a\\n- b`` (``PromptTemplate.options_text``); ``"flan_v2"`` draws the header
  from the file's ``OPT_START_STRING_CANDIDATES`` per example as FLAN v2 does, items keeping
  the ``- `` marker (v2's item-name/end-string candidates are not in the extracted file).
- Empty targets are counted and dropped (``FlanData.dropped_empty``), never trained silently.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ...config import ConfigError, convert, from_dict
from ...data.sources import parse_hub_spec
from ...data.tables import TaskDataError, load_table
from ..templates import (ANSWER_SLOT, OPTIONS_SLOT, PromptTemplate, TemplateError, _default_flan_file,
                         read_template_file)

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

__all__ = [
    "EVAL_DATA_ENV", "FLAN_COLUMNS", "MIN_OVERLAP_WORDS", "FlanData", "MixtureOptions", "MixtureTask",
    "default_eval_sets", "load_flan_patterns", "mixture_options", "read_flan_collection", "render_mixture",
]

FLAN_COLUMNS = ("inputs", "targets", "task_name", "template_idx")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# FLAN task names whose template family has another name (its v2 file's aliases are added on load)
FAMILY_ALIASES = {"anli_r1": "anli", "anli_r2": "anli", "anli_r3": "anli", "super_glue_rte": "rte",
                  "boolq": "bool_q", "glue_mnli": "mnli"}


@dataclasses.dataclass(frozen=True)
class FlanData:
    """Rows ``{inputs, targets, task_name, ...}`` ready for instruction tuning, and what was dropped."""

    dataset: datasets.Dataset
    source: str
    dropped_empty: int = 0
    """Rows whose target was empty or null (or input null), dropped and reported."""


# ---------------------------------------------------------------- the hub's Flan-collection schema

def read_flan_collection(source: str | os.PathLike[str], *, split: str = "train") -> FlanData:
    """Read Flan-collection rows (``inputs``, ``targets``, optional ``task_name`` and more) from JSONL or the hub."""
    table = load_table(source, split=split)
    missing = [c for c in ("inputs", "targets") if c not in table.column_names]
    if missing:
        raise TaskDataError(f"{source}: not in the Flan-collection schema: field(s) {missing} missing "
                            f"(columns: {sorted(table.column_names)}); rows need inputs and targets")
    if "task_name" not in table.column_names:
        table = table.add_column("task_name", [Path(str(source)).stem] * len(table))
    n = len(table)
    table = table.filter(lambda r: r["inputs"] is not None and r["targets"] is not None
                         and bool(str(r["targets"]).strip()))
    dropped = n - len(table)
    if dropped:
        log.warning("%s: %d of %d rows have an empty target (or null input) and are dropped", source, dropped, n)
    if len(table) == 0:
        raise TaskDataError(f"{source}: no row with a non-empty target ({n} rows read)")
    return FlanData(dataset=table, source=str(source), dropped_empty=dropped)


# ---------------------------------------------------------------- FLAN templates

@dataclasses.dataclass(frozen=True)
class _Patterns:
    patterns: dict[str, list[tuple[str, str]]]
    aliases: dict[str, str]
    option_headers: tuple[str, ...]
    source: str

    def family(self, name: str) -> tuple[str, list[tuple[str, str]]]:
        key = self.aliases.get(name, FAMILY_ALIASES.get(name, name))
        if key not in self.patterns:
            near = sorted(k for k in self.patterns if name.lower()[:4] in k.lower())[:10]
            raise TemplateError(f"{self.source}: no FLAN template family {name!r}; similar: "
                                f"{near or sorted(self.patterns)[:10]}; set MixtureTask.family")
        return key, self.patterns[key]


def load_flan_patterns(path: str | os.PathLike[str] | None = None) -> _Patterns:
    """FLAN's ``PATTERNS`` (v2 or 2021 file: ``{"patterns": {family: [[input, target], ...]}}``)."""
    file = Path(path) if path is not None else _default_flan_file()
    data = read_template_file(file, json.loads, missing="FLAN template file not found; pass templates_file=",
                              language="JSON", parse_error=json.JSONDecodeError)
    if not isinstance(data, dict) or not isinstance(data.get("patterns"), dict):
        raise TemplateError(f"{file}: no 'patterns' mapping; expected templates_flan_v2.json or "
                            "templates_flan2021_v1.json")
    headers = data.get("other_constants", {}).get("OPT_START_STRING_CANDIDATES") or ["OPTIONS:"]
    patterns = {k: [(str(a), str(b)) for a, b in v] for k, v in data["patterns"].items()}
    return _Patterns(patterns, dict(data.get("aliases", {})), tuple(headers), str(file))


# ---------------------------------------------------------------- mixture rendering

@dataclasses.dataclass(frozen=True)
class MixtureTask:
    """One task of a FLAN-style mixture: local (or hub) data rendered with the patterns of a FLAN family."""

    name: str
    """Task name written to ``task_name``; also the template family unless ``family`` is set (e.g. "mnli")."""
    source: str
    """Data file (.jsonl/.json/.csv/.tsv/.parquet) or ``hf:OWNER/NAME[:CONFIG][@SPLIT]``."""
    field_map: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Template field -> data column, e.g. {"text": "passage"}; unmapped fields read the column of their name."""
    label_words: Sequence[str] | None = None
    """FLAN's option strings, index = label id, e.g. ("yes", "it is not possible to tell", "no")."""
    label_column: str = "label"
    """Column holding the label id (or the option string itself) for classification families."""
    split: str = "train"
    """Split of a hub dataset (a local file has one)."""
    family: str | None = None
    """FLAN template family when it differs from ``name`` (anli_r1 -> anli is known)."""
    template_indices: Sequence[int] | None = None
    """Patterns of the family to draw from; default all."""

    def __post_init__(self) -> None:
        """Every field checked against its type where the task is made, by `biglm.config`'s typed conversion: a
        spec's ``label_words: 3`` is refused here in one line naming the task, the field, the value and the type
        wanted, not by a TypeError deep inside rendering. A value that says the same in another type is converted
        (``template_indices: ["1"]``); YAML's ``yes``/``no`` are booleans, not option strings, and are refused."""
        hints = typing.get_type_hints(MixtureTask)
        shown = f"mixture task {self.name!r}" if isinstance(self.name, str) else "a mixture task"
        for f in dataclasses.fields(self):
            value, tp = getattr(self, f.name), hints[f.name]
            try:
                if isinstance(value, str) and _wants_collection(tp):  # a string is a sequence, but not of these
                    raise ConfigError(value)
                converted = convert(value, tp, name=f.name)
            except ConfigError:
                booleans = isinstance(value, bool) or (isinstance(value, (list, tuple))
                                                       and any(isinstance(v, bool) for v in value))
                hint = ' (YAML reads yes/no/on/off as booleans: quote them, "yes")' if booleans else ""
                raise ConfigError(f"{shown}: {f.name} expects {_yaml_type(tp)}, got {value!r}{hint}") from None
            if isinstance(value, tuple) and isinstance(converted, list):
                converted = tuple(converted)  # a tuple given stays one
            object.__setattr__(self, f.name, converted)


def _arms(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def _wants_collection(tp: Any) -> bool:
    return any(typing.get_origin(a) in (list, tuple, dict, Sequence, Mapping) for a in _arms(tp))


_YAML_NAMES = {str: "string", int: "whole number", float: "number", bool: "boolean", type(None): "null"}


def _yaml_type(tp: Any) -> str:
    """A field's type as a spec file writes it: "a list of strings or null", "a mapping of string to string"."""
    if len(_arms(tp)) > 1:
        return " or ".join(_yaml_type(a) for a in _arms(tp))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple, Sequence):
        return f"a list of {_YAML_NAMES.get(args[0], 'value')}s"
    if origin in (dict, Mapping):
        return f"a mapping of {_YAML_NAMES.get(args[0], 'value')} to {_YAML_NAMES.get(args[1], 'value')}"
    name = _YAML_NAMES.get(tp, getattr(tp, "__name__", str(tp)))
    return name if name == "null" else f"a {name}"


@dataclasses.dataclass(frozen=True)
class MixtureOptions:
    """`render_mixture`'s settings besides the tasks, typed: a mixture spec's values are read into it by
    `biglm.config` (`mixture_options`), so ``per_task: lots`` or ``seed: abc`` is refused in one line naming the key,
    the value and the type wanted before any run starts, not by a TypeError in the middle of one."""

    per_task: int | None = None
    """FLAN's per-task cap (a seeded sample); none: every row"""
    seed: int = 0
    """seed of the sample, the patterns drawn and the shuffle"""
    options_style: Literal["flan2021", "flan_v2"] = "flan2021"
    """how ``{options_}`` renders: FLAN 2021's fixed header, or a header drawn per example as FLAN v2 does"""

    def __post_init__(self) -> None:
        if self.per_task is not None and self.per_task < 1:
            raise ConfigError(f"per_task must be at least 1 (or none for all), got {self.per_task}")


def mixture_options(data: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """The `MixtureOptions` keys of ``data`` (a mixture spec; other keys are left alone) as `render_mixture`
    keywords, each converted to its type; a `ConfigError` naming ``where``, the key, the value and the type."""
    given = {f.name: data[f.name] for f in dataclasses.fields(MixtureOptions) if f.name in data}
    try:
        return dataclasses.asdict(from_dict(MixtureOptions, given))
    except ConfigError as e:
        raise ConfigError(f"{where}: {str(e).removeprefix('--')}") from None


EVAL_DATA_ENV = "BIGLM_EVAL_DATA"
"""The environment variable naming the evaluation data folder (hub layout), as ``biglm eval`` reads it."""
MIN_OVERLAP_WORDS = 8
"""A text value of an evaluation row with at least this many (normalised) words is matched on its own."""
_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
_GENERIC_CONFIGS = {"default", "main", "all", "plain_text"}
_WORD = re.compile(r"\w+")


def _shared_eval_dir() -> Path:
    # the shared data folder sits beside the repository (../shared/data), as the FLAN templates do
    return Path(__file__).resolve().parents[5] / "shared" / "data" / "eval"


def default_eval_sets() -> list[Path]:
    """What ``--suite multitask`` reads by default: the evaluation folder and the default Genset files (WikiAuto,
    ``<eval>/../finetune/wikiauto``).

    The folder is ``$BIGLM_EVAL_DATA`` when set, else those of ``../shared/data/eval`` (beside the repository) and
    ``./data/eval`` that exist. Fails closed: when none is found, raises `TaskDataError` saying how to point at
    them, never an empty exclusion.
    """
    from ...scoring.multitask import default_gensets

    env = os.environ.get(EVAL_DATA_ENV)
    if env:
        roots = [Path(env)]
        if not roots[0].is_dir():
            raise TaskDataError(f"${EVAL_DATA_ENV}={env} is not a folder: point it at the evaluation data (hub layout "
                                "OWNER__NAME/[CONFIG/]SPLIT.jsonl) that must stay out of the FLAN mixture")
    else:
        looked = [_shared_eval_dir(), Path("data/eval")]
        roots = [p for p in looked if p.is_dir()]
        if not roots:
            raise TaskDataError(
                "no evaluation data found to keep out of the FLAN mixture (looked in "
                f"{', '.join(str(p) for p in looked)}): set {EVAL_DATA_ENV}=/path/to/data/eval, or list the sets in "
                "the mixture spec (exclude_eval: [PATH, ...], render_mixture(exclude_eval=...)); "
                "exclude_eval: [] trains without the check")
    return roots + [Path(g.path) for root in roots for g in default_gensets(root)]


def _normalise(text: str) -> str:
    """Case-folded words, punctuation and spacing dropped: two copies of a text that differ in those match."""
    return " ".join(_WORD.findall(text.casefold()))


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=12).digest()


def _row_keys(row: Mapping[str, Any]) -> set[bytes]:
    """A row's text fingerprints: each top-level text value of `MIN_OVERLAP_WORDS` words or more (a passage,
    a question, a premise), and the row's texts taken together (a copied row, however short its texts)."""
    texts = [t for t in (_normalise(v) for v in row.values() if isinstance(v, str)) if t]
    digests = [_digest(t) for t in texts]
    keys = {d for d, t in zip(digests, texts) if t.count(" ") + 1 >= MIN_OVERLAP_WORDS}
    if digests:  # the row: its texts' digests in a fixed order (a copy with renamed columns matches)
        keys.add(hashlib.blake2b(b"".join(sorted(digests)), digest_size=12, person=b"row").digest())
    return keys


def _iter_rows(path: Path) -> Any:
    if path.suffix.lower() == ".jsonl":
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    row = json.loads(line)
                    if isinstance(row, dict):
                        yield row
        return
    yield from load_table(path)


# per process: an evaluation file's fingerprints, by (path, size, mtime)
_FILE_KEYS: dict[tuple[Path, int, int], frozenset[bytes]] = {}


def _file_keys(path: Path) -> frozenset[bytes]:
    st = path.stat()
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _FILE_KEYS:
        keys: set[bytes] = set()
        try:
            for row in _iter_rows(path):
                keys |= _row_keys(row)
        except (ValueError, TaskDataError) as e:  # fail closed: an unreadable evaluation file is no exclusion
            raise TaskDataError(f"evaluation file {path} could not be read to keep it out of the mixture ({e}); fix "
                                "it or leave it out of exclude_eval") from None
        _FILE_KEYS[key] = frozenset(keys)
    return _FILE_KEYS[key]


@dataclasses.dataclass(frozen=True)
class _HubSet:
    name: str
    """the dataset's name without its owner, lower case"""
    config: str | None
    split: str | None
    """None: every split"""
    label: str

    def matches(self, name: str, config: str | None, split: str) -> bool:
        if self.split is not None and split.lower() != self.split.lower():
            return False
        if name == self.name:  # the owner is not compared: a mirror under another owner is the same data
            return config is None or self.config is None or config.lower() == self.config.lower()
        # a benchmark's config published on its own (super_glue:boolq as OWNER/boolq)
        return self.config is not None and self.config.lower() not in _GENERIC_CONFIGS and name == self.config.lower()


def _looks_like_path(entry: str) -> bool:
    return "/" in entry or os.sep in entry or entry.startswith(".") or entry.lower().endswith(_DATA_SUFFIXES)


@dataclasses.dataclass
class _EvalIndex:
    """Excluded evaluation sets: resolved files (with the set each belongs to), names, hub datasets by split."""

    files: dict[Path, str] = dataclasses.field(default_factory=dict)
    names: set[str] = dataclasses.field(default_factory=set)
    hub: list[_HubSet] = dataclasses.field(default_factory=list)
    _hashes: dict[Path, str] = dataclasses.field(default_factory=dict)
    _keys: dict[bytes, str] | None = None

    @classmethod
    def build(cls, entries: Sequence[str | os.PathLike[str]]) -> _EvalIndex:
        idx = cls()
        for entry in entries:
            s = str(entry)
            if s.startswith("hf:"):
                spec = parse_hub_spec(s)
                idx.hub.append(_HubSet(spec.name.rsplit("/", 1)[-1].lower(), spec.config,
                                       spec.split if "@" in s else None, s))
                continue
            p = Path(s)
            if p.is_file():
                idx.files[p.resolve()] = s
            elif p.is_dir():
                found = [f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix.lower() in _DATA_SUFFIXES]
                if not found:
                    raise TaskDataError(f"exclude_eval entry {s} holds no {'/'.join(_DATA_SUFFIXES)} file: point at "
                                        "the evaluation data (hub layout OWNER__NAME/[CONFIG/]SPLIT.jsonl)")
                for f in found:  # the set is the file's folder (e.g. aps__super_glue/boolq), or the file
                    label = str(f.parent if f.parent != p else f)
                    idx.files[f.resolve()] = label
                    # hub layout OWNER__NAME/[CONFIG/]SPLIT.jsonl, under the folder or the folder itself
                    rel = (p.name, *f.relative_to(p).parts) if "__" in p.name else f.relative_to(p).parts
                    if "__" in rel[0] and len(rel) in (2, 3):
                        name = rel[0].split("__", 1)[1].lower()
                        idx.hub.append(_HubSet(name, rel[1] if len(rel) == 3 else None, f.stem, str(f)))
            elif _looks_like_path(s):  # fail closed: a missing folder is no exclusion
                raise TaskDataError(f"exclude_eval entry {s}: no such file or folder; point at the evaluation data "
                                    f"(or set {EVAL_DATA_ENV} and leave exclude_eval out)")
            else:
                idx.names.add(s)  # a task name
        return idx

    def _sha(self, f: Path) -> str:
        if f not in self._hashes:
            h = hashlib.sha256()
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            self._hashes[f] = h.hexdigest()
        return self._hashes[f]

    @staticmethod
    def _refuse(task: MixtureTask, what: str, eval_set: str) -> None:
        raise TaskDataError(f"mixture task {task.name!r} ({task.source}): {what} the evaluation set {eval_set}; "
                            "evaluation data must stay out of the training mixture: use a training split")

    def check(self, task: MixtureTask) -> None:
        """Refuse a task that names, reads or copies a whole evaluation file (before any data is read)."""
        for n in (task.name, task.family):
            if n is not None and n in self.names:
                self._refuse(task, "is named as", repr(n))
        if task.source.startswith("hf:"):
            spec = parse_hub_spec(task.source)
            split = spec.split if "@" in task.source else task.split
            name = spec.name.rsplit("/", 1)[-1].lower()
            shown = spec.name + (f":{spec.config}" if spec.config else "")
            for hub in self.hub:
                if hub.matches(name, spec.config, split):
                    self._refuse(task, f"reads the {split!r} split of {shown}, whatever its owner, which is", hub.label)
            return
        src = Path(task.source).resolve()
        if src in self.files:
            self._refuse(task, "is", self.files[src])
        if not src.is_file():
            return  # load_table names the missing file
        size = src.stat().st_size
        for f, eval_set in self.files.items():
            if f.stat().st_size == size and self._sha(f) == self._sha(src):
                self._refuse(task, f"has the same content as {f} of", eval_set)

    def check_rows(self, task: MixtureTask, table: datasets.Dataset) -> None:
        """Refuse a task any of whose rows has an evaluation row's text (`_row_keys`: a long input, or the row)."""
        if not self.files:
            return
        if self._keys is None:
            self._keys = {}
            for f, eval_set in self.files.items():
                for k in _file_keys(f):
                    self._keys.setdefault(k, eval_set)
        hits: dict[str, int] = {}
        first: dict[str, int] = {}
        i = 0
        for batch in table.iter(batch_size=1000):
            columns = list(batch)
            for values in zip(*(batch[c] for c in columns)):
                sets = {self._keys[k] for k in _row_keys(dict(zip(columns, values))) if k in self._keys}
                for eval_set in sets:
                    hits[eval_set] = hits.get(eval_set, 0) + 1
                    first.setdefault(eval_set, i)
                i += 1
        if hits:
            worst = sorted(hits.items(), key=lambda kv: -kv[1])
            named = "; ".join(f"{n} of its {len(table)} rows overlap the evaluation set {s} (first: row {first[s]})"
                              for s, n in worst)
            raise TaskDataError(f"mixture task {task.name!r} ({task.source}): {named}: the same text (normalised: "
                                "case, punctuation and spacing ignored) as the evaluation rows' inputs; evaluation "
                                "data must stay out of the training mixture: use a training split")


def _fields(text: str) -> list[str]:
    return [m.group(1) for m in _PLACEHOLDER.finditer(text)]


def _fill(text: str, values: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def render_mixture(
    tasks: Sequence[MixtureTask],
    *,
    templates_file: str | os.PathLike[str] | None = None,
    seed: int = 0,
    per_task: int | None = None,
    exclude_eval: Sequence[str | os.PathLike[str]] | None = None,
    options_style: Literal["flan2021", "flan_v2"] = "flan2021",
) -> datasets.Dataset:
    """Render a FLAN-style mixture: rows ``{inputs, targets, task_name, template_idx}``, shuffled by ``seed``.

    Each example of each task gets a pattern drawn at random from its family; at most ``per_task``
    examples per task (a seeded sample; FLAN's per-task cap). ``exclude_eval`` lists evaluation
    files, folders (hub layout ``OWNER__NAME/[CONFIG/]SPLIT.jsonl``), task names or hub specs
    (``hf:OWNER/NAME[:CONFIG][@SPLIT]``, no ``@``: every split); default `default_eval_sets`, which
    refuses when it finds no evaluation data; ``[]`` turns the check off. A task that names, reads
    (a hub dataset: the same name under any owner, config and split) or holds any row of one is
    refused before any rendering, naming the set and how many rows overlap.
    """
    import datasets  # deferred: ~1 s to import

    if not tasks:
        raise TaskDataError("render_mixture: no tasks given")
    opts = mixture_options(dict(per_task=per_task, seed=seed, options_style=options_style), where="render_mixture")
    per_task, seed, options_style = opts["per_task"], opts["seed"], opts["options_style"]
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TaskDataError(f"mixture tasks {dupes} are given more than once")
    pats = load_flan_patterns(templates_file)
    evals = _EvalIndex.build(default_eval_sets() if exclude_eval is None else exclude_eval)
    for task in tasks:  # a task naming, reading or copying an evaluation file is refused before any data is read
        evals.check(task)
    plans = [(task, *_plan(task, pats)) for task in tasks]
    for task, _, _, table in plans:  # then row by row: a partial copy of an evaluation set, before any rendering
        evals.check_rows(task, table)

    rng = random.Random(seed)
    rows: dict[str, list[Any]] = {c: [] for c in FLAN_COLUMNS}
    for task, family, chosen, table in plans:
        order = list(range(len(table)))
        if per_task is not None and per_task < len(order):
            order = sorted(rng.sample(order, per_task))
        dropped = 0
        for i in order:
            row = table[i]
            values, ok = _values(task, row, pats, options_style, rng)
            if not ok:
                dropped += 1
                continue
            k = rng.choice(chosen)
            inp, tgt = pats.patterns[family][k]
            if not set(_fields(inp + tgt)) <= set(values):  # a null field in this row
                dropped += 1
                continue
            target = _fill(tgt, values)
            if not target.strip():
                dropped += 1
                continue
            rows["inputs"].append(_fill(inp, values))
            rows["targets"].append(target)
            rows["task_name"].append(task.name)
            rows["template_idx"].append(k)
        if dropped:
            log.warning("%s (%s): %d rows dropped (label -1/null or empty target)", task.name, task.source, dropped)
    perm = list(range(len(rows["inputs"])))
    rng.shuffle(perm)  # FLAN mixes tasks; a fixed seed gives the same mixture
    return datasets.Dataset.from_dict({c: [v[i] for i in perm] for c, v in rows.items()})


def _plan(task: MixtureTask, pats: _Patterns) -> tuple[str, list[int], datasets.Dataset]:
    """The family, the pattern indices to draw from and the table, all checked before rendering."""
    family, patterns = pats.family(task.family or task.name)
    chosen = list(range(len(patterns))) if task.template_indices is None else [int(i) for i in task.template_indices]
    bad = [i for i in chosen if not 0 <= i < len(patterns)]
    if bad or not chosen:
        raise TemplateError(f"{pats.source}: family {family!r} has patterns 0..{len(patterns) - 1}; "
                            f"template_indices {list(task.template_indices or [])} do not fit")
    table = load_table(task.source, split=task.split)
    columns = set(table.column_names)
    for k in chosen:
        inp, tgt = patterns[k]
        for field in dict.fromkeys(_fields(inp) + _fields(tgt)):
            if field == OPTIONS_SLOT or (field == ANSWER_SLOT and ANSWER_SLOT not in task.field_map):
                if task.label_words is None and "options" not in task.field_map:
                    raise TemplateError(f"{pats.source}: pattern {k} of family {family!r} uses {{{field}}}: task "
                                        f"{task.name!r} needs label_words (FLAN's option strings, index = label "
                                        "id) or field_map['options'] (a column of per-row options)")
                if task.label_column not in columns:
                    raise TemplateError(f"{task.source}: template field {{{field}}} of family {family!r} needs the "
                                        f"label column {task.label_column!r}, which the data lacks "
                                        f"(columns: {sorted(columns)}); set label_column")
                continue
            column = task.field_map.get(field, field)
            if column not in columns:
                raise TemplateError(f"{task.source}: template field {field!r} (pattern {k} of FLAN family "
                                    f"{family!r}, {pats.source}) is missing from the data "
                                    f"(columns: {sorted(columns)}); map it with field_map={{{field!r}: COLUMN}} "
                                    "or restrict template_indices")
    if "options" in task.field_map and task.field_map["options"] not in columns:
        raise TemplateError(f"{task.source}: field_map['options'] names column {task.field_map['options']!r}, "
                            f"which the data lacks (columns: {sorted(columns)})")
    return family, chosen, table


def _values(task: MixtureTask, row: Mapping[str, Any], pats: _Patterns, style: str,
            rng: random.Random) -> tuple[dict[str, str], bool]:
    """The string of every template field for one row; ok=False for an unlabelled row or a null field."""
    values: dict[str, str] = {}
    for field, column in {**{c: c for c in row}, **task.field_map}.items():
        if column in row and row[column] is not None and field != "options":
            values[field] = str(row[column])
    options = task.label_words
    if "options" in task.field_map:
        options = row[task.field_map["options"]]
    if options is not None and task.label_column in row:
        label = row[task.label_column]
        if label is None or (isinstance(label, int) and not 0 <= label < len(options)):
            return values, False  # GLUE's -1 test rows, or a null label
        answer = options[label] if isinstance(label, int) else str(label)
        if answer not in options:
            raise TaskDataError(f"{task.source}: label {label!r} of task {task.name!r} is not a label id nor one "
                                f"of the options {list(options)}")
        values.setdefault(ANSWER_SLOT, answer)
        header = "OPTIONS:" if style == "flan2021" else rng.choice(pats.option_headers)
        values[OPTIONS_SLOT] = _options_text(options, header)
    return values, True


def _options_text(options: Sequence[str], header: str) -> str:
    if len(options) >= 2 and len(set(options)) == len(options):
        return PromptTemplate(template="{answer}", label_words=tuple(options), options_header=header).options_text()
    return "\n- ".join([header, *options])  # per-row options may repeat or be one; render them all the same
