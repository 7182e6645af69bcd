"""FLAN instruction-tuning data (DESIGN §10): the hub's Flan-collection schema, and FLAN-style mixtures.

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
- Evaluation sets stay out (``exclude_eval``): a task whose source is an excluded file, lies in
  an excluded folder, has the same bytes as one of their files (sha256, size first), or whose
  name / hub dataset is excluded, is refused, naming the set. The default is what ``--suite
  multitask`` reads: the shared eval folder (``../shared/data/eval``, hub layout ``OWNER__NAME``)
  and the default Genset file (WikiAuto's ``valid.jsonl``).
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from biglm.data.sources import parse_hub_spec
from biglm.finetune.data import TaskDataError, load_table
from biglm.finetune.templates import ANSWER_SLOT, OPTIONS_SLOT, PromptTemplate, TemplateError, _default_flan_file

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

__all__ = [
    "FLAN_COLUMNS", "FlanData", "MixtureTask", "default_eval_sets", "load_flan_patterns", "read_flan_collection",
    "render_mixture",
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
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError as e:
        raise TemplateError(f"{file}: FLAN template file not found; pass templates_file=") from e
    except json.JSONDecodeError as e:
        raise TemplateError(f"{file}: not valid JSON ({e})") from e
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


def default_eval_sets() -> list[Path]:
    """What ``--suite multitask`` reads by default, where present: the shared evaluation folder
    (``../shared/data/eval``) and the default Genset files (WikiAuto, ``../shared/data/finetune/wikiauto``)."""
    from ..scoring.multitask import default_gensets

    shared = _default_flan_file().parents[2] / "eval"
    return [shared] + [Path(g.path) for g in default_gensets(shared)] if shared.is_dir() else []


@dataclasses.dataclass
class _EvalIndex:
    """Excluded evaluation sets: resolved files (with the set each belongs to), names, hub datasets."""

    files: dict[Path, str] = dataclasses.field(default_factory=dict)
    names: set[str] = dataclasses.field(default_factory=set)
    hub: dict[str, str] = dataclasses.field(default_factory=dict)
    _hashes: dict[Path, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, entries: Sequence[str | os.PathLike[str]]) -> _EvalIndex:
        idx = cls()
        for entry in entries:
            s = str(entry)
            if s.startswith("hf:"):
                idx.hub[parse_hub_spec(s).name.lower()] = s
                continue
            p = Path(s)
            if p.is_file():
                idx.files[p.resolve()] = s
            elif p.is_dir():
                for f in p.rglob("*"):
                    if f.is_file():  # the set is the file's folder (e.g. aps__super_glue/boolq), or the file
                        idx.files[f.resolve()] = str(f.parent if f.parent != p else f)
                for sub in p.iterdir():  # hub layout OWNER__NAME names a hub dataset
                    if sub.is_dir() and "__" in sub.name:
                        idx.hub[sub.name.replace("__", "/", 1).lower()] = str(sub)
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

    def check(self, task: MixtureTask) -> None:
        def refuse(what: str, eval_set: str) -> None:
            raise TaskDataError(f"mixture task {task.name!r} ({task.source}): {what} the evaluation set {eval_set}; "
                                "evaluation data must stay out of the training mixture: use a training split")

        for n in (task.name, task.family):
            if n is not None and n in self.names:
                refuse("is named as", repr(n))
        if task.source.startswith("hf:"):
            hub = parse_hub_spec(task.source).name.lower()
            if hub in self.hub:
                refuse("reads", self.hub[hub])
            return
        src = Path(task.source).resolve()
        if src in self.files:
            refuse("is", self.files[src])
        if not src.is_file():
            return  # load_table names the missing file
        size = src.stat().st_size
        for f, eval_set in self.files.items():
            if f.stat().st_size == size and self._sha(f) == self._sha(src):
                refuse(f"has the same content as {f} of", eval_set)


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
    files, folders, task names or hub specs (default ``default_eval_sets()``); a task reading one is
    refused before any rendering.
    """
    import datasets  # deferred: ~1 s to import

    if not tasks:
        raise TaskDataError("render_mixture: no tasks given")
    if options_style not in ("flan2021", "flan_v2"):
        raise TemplateError(f"options_style must be 'flan2021' or 'flan_v2', not {options_style!r}")
    if per_task is not None and per_task < 1:
        raise TaskDataError(f"per_task must be at least 1 (or None for all), got {per_task}")
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TaskDataError(f"mixture tasks {dupes} are given more than once")
    pats = load_flan_patterns(templates_file)
    evals = _EvalIndex.build(default_eval_sets() if exclude_eval is None else exclude_eval)
    for task in tasks:  # every leak is refused before any data is read
        evals.check(task)
    plans = [(task, *_plan(task, pats)) for task in tasks]

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
