"""Table 5's multitask suite (paper §4.3): MMLU zero/few-shot, the SuperGLUE average, Genset; biglm's own parts.

Table 5 mixes two kinds of evaluation. MMLU and SuperGLUE are likelihood tasks run by lm-eval (built-in
task YAMLs, data replaced by local files, as for Table 1); Genset is free generation by biglm's own
decoding, scored by BLEU-2 and Distinct-2. This module holds what is biglm's own: the SuperGLUE task table
and its discovery, the Genset sets, their instances, generation and scores, and the table. The lm-eval side
(the YAMLs, the runs, the summary) is `biglm.integrations.lm_eval.run_multitask`:

    summary = run_multitask("runs/flan-hf", data_dir="../shared/data/eval", limit=50)
    print(summary["table"])          # Table 5's row: MMLU ZS / FS | SuperGLUE AVG ACC. | Genset B-2 / D-2

Notable features
- MMLU: lm-eval's ``mmlu`` group over the local subjects, run twice on one loaded model: zero-shot and
  ``mmlu_fewshot``-shot (default 5, examples from ``dev``).
- SuperGLUE: every folder under ``<data_dir>/aps__super_glue/`` (hub layout ``<config>/validation.jsonl``)
  is discovered, not listed: each known config name maps to its built-in lm-eval task
  (`SUPERGLUE_TASKS`); ``wsc`` is the unfixed copy of ``wsc.fixed`` (lm-eval's ``wsc`` reads the
  fixed one) and is used only when ``wsc.fixed`` is absent; the diagnostics ``axb``/``axg`` and
  unknown names are skipped with a line naming why. The average is the unweighted mean of the
  tasks that ran (accuracy; ReCoRD's exact match, which is its accuracy at choosing the entity),
  and the table names the tasks it covers and the ones absent.
- Genset: `GensetSpec` gives a set by path, source and target (a field: source text, target string or list
  of references; or a template over the row's fields, ``"{personality}\\n{history}"``, list fields joined by
  newlines, ``{candidates[-1]}`` one item) and an instruction prompt, so WikiAuto, QQP or PersonaChat plug in
  alike; a field a template names that the set lacks is refused before any row is read.
  `select_instances` draws ``n`` (100) row indices with a seeded ``random.Random`` (the same rows
  for a seed, whatever the run); each prompt goes through the model's chat template when it has one
  (`biglm.generation.chat.render_chat`), the answer is written by `biglm.generation.generate` with
  one `DecodingConfig`, the model's own (`genset_decoding`: its saved decoding settings, as `biglm generate` uses
  them, under the ``--genset_decoding`` options given), and the outputs are scored with sacrebleu's BLEU-2
  (multi-reference) and Distinct-2 (`biglm.scoring.metrics`), per set and over the pooled Genset (the paper's column).
- Scales as in the paper's Table 5: accuracies and BLEU-2 in percent, Distinct-2 as a fraction.
- Bad input fails before the model loads: a genset file or field that does not exist, an empty
  source or target, a prompt without ``{source}``, two sets with one name, no part with data.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PARTS", "SUPERGLUE_TASKS", "SuperGlueTask", "GensetSpec", "GensetSample", "DEFAULT_GENSET_PROMPTS",
           "discover_superglue", "parse_genset", "default_gensets", "select_instances", "render_field_template",
           "load_genset", "genset_prompt", "genset_scores", "genset_decoding", "run_genset", "multitask_table"]

PARTS = ("MMLU", "SuperGLUE", "Genset")
SUPERGLUE_HUB = "aps__super_glue"


@dataclass(frozen=True)
class SuperGlueTask:
    """A SuperGLUE config of the hub dataset ``aps/super_glue`` and the built-in lm-eval task that reads it."""

    config: str
    """the hub config, i.e. the folder name under ``aps__super_glue``"""
    task: str
    """the built-in lm-eval task"""
    yaml: str
    """its YAML, relative to ``lm_eval/tasks``"""
    metric: str
    """the accuracy the average takes"""
    label: str
    """the name printed in the table"""


SUPERGLUE_TASKS: tuple[SuperGlueTask, ...] = (
    SuperGlueTask("boolq", "boolq", "super_glue/boolq/default.yaml", "acc", "BoolQ"),
    SuperGlueTask("cb", "cb", "super_glue/cb/default.yaml", "acc", "CB"),
    SuperGlueTask("copa", "copa", "super_glue/copa/default.yaml", "acc", "COPA"),
    SuperGlueTask("multirc", "multirc", "super_glue/multirc/default.yaml", "acc", "MultiRC"),
    # ReCoRD picks one entity among the passage's: exact match is its accuracy
    SuperGlueTask("record", "record", "super_glue/record/default.yaml", "em", "ReCoRD"),
    SuperGlueTask("rte", "sglue_rte", "super_glue/rte/default.yaml", "acc", "RTE"),
    SuperGlueTask("wic", "wic", "super_glue/wic/default.yaml", "acc", "WiC"),
    SuperGlueTask("wsc.fixed", "wsc", "super_glue/wsc/default.yaml", "acc", "WSC"),
)
_BY_CONFIG = {t.config: t for t in SUPERGLUE_TASKS}
_DIAGNOSTICS = ("axb", "axg")  # hub configs that are test-only diagnostics, outside the SuperGLUE score


def discover_superglue(data_dir: str | os.PathLike[str]) -> tuple[list[tuple[SuperGlueTask, Path]], dict[str, str]]:
    """The SuperGLUE tasks whose data lies under ``<data_dir>/aps__super_glue/<config>/validation.jsonl``.

    Returns ``(found, skipped)``: ``found`` pairs each task with its folder, in `SUPERGLUE_TASKS` order;
    ``skipped`` maps a folder name that is not used to the reason.
    """
    root = Path(data_dir) / SUPERGLUE_HUB
    folders = {p.name: p for p in sorted(root.iterdir()) if p.is_dir()} if root.is_dir() else {}
    found: dict[str, tuple[SuperGlueTask, Path]] = {}
    skipped: dict[str, str] = {}
    for name, folder in folders.items():
        if name in _DIAGNOSTICS:
            skipped[name] = "a diagnostic set (test only), not part of the SuperGLUE score"
            continue
        if name == "wsc":  # the unfixed WSC spans: lm-eval's wsc task reads wsc.fixed
            if "wsc.fixed" in folders:
                skipped[name] = "lm-eval's wsc task reads wsc.fixed, which is present (not scored twice)"
                continue
            task = _BY_CONFIG["wsc.fixed"]
        elif name in _BY_CONFIG:
            task = _BY_CONFIG[name]
        else:
            skipped[name] = (f"unknown SuperGLUE config; known: {', '.join(t.config for t in SUPERGLUE_TASKS)} "
                             "(a new one needs an entry in biglm.scoring.multitask.SUPERGLUE_TASKS)")
            continue
        if not (folder / "validation.jsonl").is_file():
            skipped[name] = f"no {folder / 'validation.jsonl'}"
            continue
        found[task.config] = (task, folder)
    ordered = [found[t.config] for t in SUPERGLUE_TASKS if t.config in found]
    return ordered, skipped


# ------------------------------------------------------------------------------------------------- Genset
DEFAULT_GENSET_PROMPTS = {
    # FLAN has no template for these held-out sets; plain instructions in FLAN's style
    "wikiauto": "Simplify the following sentence:\n\n{source}",
    "qqp": "Paraphrase the following question:\n\n{source}",
    "personachat": "Continue the conversation:\n\n{source}",
}


_INDEXED = re.compile(r"^(.+?)\[(-?\d+)\]$")


def _template_parts(text: str, *, what: str) -> list[str | tuple[str, int | None]]:
    """A Genset template cut into literal text and ``(field, index)`` placeholders, as ``str.format`` reads
    braces: ``{field}`` or ``{field[i]}`` a field, ``{{`` and ``}}`` literal braces. A text without braces is a
    plain field name: ``[(text, None)]``."""
    if "{" not in text and "}" not in text:
        return [(text, None)]
    parts: list[str | tuple[str, int | None]] = []
    literal, i = [], 0
    while i < len(text):
        c = text[i]
        if c in "{}" and text[i:i + 2] == c * 2:
            literal.append(c)
            i += 2
            continue
        if c == "}":
            raise ValueError(f"{what} template {text!r} has a '}}' without '{{': write {{{{ and }}}} for literal "
                             "braces")
        if c == "{":
            end = text.find("}", i)
            if end < 0 or "{" in text[i + 1:end]:
                raise ValueError(f"{what} template {text!r} has a '{{' without '}}': write {{field}} for a field, "
                                 "{{ and }} for literal braces")
            name, index = text[i + 1:end].strip(), None
            indexed = _INDEXED.match(name)
            if indexed:
                name, index = indexed.group(1), int(indexed.group(2))
            if not name:
                raise ValueError(f"{what} template {text!r} has an empty {{}}: name a field, e.g. {{history}}")
            parts += ["".join(literal), (name, index)]
            literal, i = [], end + 1
            continue
        literal.append(c)
        i += 1
    parts.append("".join(literal))
    if not any(isinstance(p, tuple) for p in parts):
        raise ValueError(f"{what} template {text!r} names no field: write {{field}} where a field's text goes")
    return [p for p in parts if p != ""]


def _text(value: Any) -> str | None:
    """A field's text: a string as is, a list of strings joined by newlines (dialogue turns, persona lines)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def render_field_template(template: str, row: dict[str, Any]) -> str:
    """Fill a Genset source/target template from one row: ``{field}`` is the field's text (a list of strings
    joined by newlines), ``{field[i]}`` one item of a list field (``[-1]`` the last); a plain field name
    (no braces) stands for ``{name}``. Raises ``ValueError`` naming what the row lacks."""
    out = []
    for part in _template_parts(template, what="genset"):
        if isinstance(part, str):
            out.append(part)
            continue
        name, index = part
        shown = name if index is None else f"{name}[{index}]"
        if name not in row:
            raise ValueError(f"{{{shown}}}: the row has no field {name!r}")
        value = row[name]
        if index is not None:
            if not isinstance(value, (list, tuple)) or not -len(value) <= index < len(value):
                raise ValueError(f"{{{shown}}}: {name!r} is not a list with an item {index}")
            value = value[index]
        text = _text(value)
        if text is None:
            raise ValueError(f"{{{shown}}}: {name!r} is {type(value).__name__}, not text or a list of texts")
        out.append(text)
    return "".join(out)


@dataclass(frozen=True)
class GensetSpec:
    """One generation set of Genset: a data file, its source and target (fields or templates over the row's
    fields), and the instruction."""

    name: str
    """the set's name (wikiauto, qqp, personachat, ...)"""
    path: str
    """a .jsonl/.json/.csv/.tsv/.parquet file (or hf:OWNER/NAME[:CONFIG][@SPLIT])"""
    source: str
    """the input: a field name, or a template over the row's fields such as "{personality}\\n{history}" (a list
    field's items joined by newlines; {field[i]} one item, [-1] the last)"""
    target: str
    """the reference: a field name (a string, or a list of strings: several references) or a template (one
    reference, rendered as the source is, e.g. "{candidates[-1]}")"""
    prompt: str = ""
    """the instruction, with {source} where the input goes (default: the set's built-in prompt, else {source})"""

    def __post_init__(self) -> None:
        for key in ("name", "path", "source", "target"):
            if not getattr(self, key):
                raise ValueError(f"genset {self.name or '?'}: {key} is empty")
        for key in ("source", "target"):
            _template_parts(getattr(self, key), what=f"genset {self.name}: {key}")  # malformed braces fail here
        if not self.prompt:
            object.__setattr__(self, "prompt", DEFAULT_GENSET_PROMPTS.get(self.name.lower(), "{source}"))
        if "{source}" not in self.prompt:
            raise ValueError(f"genset {self.name}: prompt {self.prompt!r} has no {{source}}: write where the input "
                             "goes, e.g. 'Simplify: {source}'")

    def fields(self) -> dict[str, list[str]]:
        """The row fields the source and the target read."""
        return {key: list(dict.fromkeys(p[0] for p in _template_parts(getattr(self, key), what=key)
                                        if isinstance(p, tuple))) for key in ("source", "target")}


_ESCAPES = {"n": "\n", "t": "\t", ":": ":", "\\": "\\"}


def _split_colon_form(spec: str) -> list[str]:
    """``spec`` cut at the colons not escaped by a backslash, each piece's escapes kept as written."""
    pieces, cur, i = [], [], 0
    while i < len(spec):
        c = spec[i]
        if c == "\\" and i + 1 < len(spec):
            cur.append(spec[i:i + 2])
            i += 2
            continue
        if c == ":":
            pieces.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    return pieces + ["".join(cur)]


def _unescape(text: str, *, spec: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            nxt = text[i + 1:i + 2]
            if nxt not in _ESCAPES:
                raise ValueError(f"genset {spec!r}: unknown escape \\{nxt} in a SOURCE/TARGET template; the colon "
                                 "form knows \\n (newline), \\t (tab), \\: (a colon) and \\\\ (a backslash)")
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_genset(spec: str) -> list[GensetSpec]:
    """``NAME:PATH:SOURCE:TARGET`` (the built-in prompt of NAME), or a YAML/JSON file holding a list of
    ``{name, path, source, target, prompt}`` mappings.

    SOURCE and TARGET are field names or templates over the row's fields (`GensetSpec`). In the colon form they
    are the last two colon-separated pieces (PATH may hold colons, as ``hf:glue:qqp@validation`` does), and a
    backslash escapes: ``\\:`` a colon inside a template, ``\\n`` a newline, ``\\t`` a tab, ``\\\\`` a
    backslash, e.g. ``personachat:pc.jsonl:{personality}\\n{history}:{candidates[-1]}``. In YAML write the
    template as YAML text (``source: "{personality}\\n{history}"``, double quotes for the newline)."""
    from ..config import ConfigError, from_dict, load_yaml

    if spec.lower().endswith((".yaml", ".yml", ".json")) and Path(spec).is_file():
        data = load_yaml(spec)
        items = data if isinstance(data, list) else [data]
        try:
            return [from_dict(GensetSpec, dict(item) if isinstance(item, dict) else item) for item in items]
        except ConfigError as e:
            raise ValueError(f"genset file {spec}: {e}") from None
    pieces = _split_colon_form(spec)
    if len(pieces) < 4 or not all(pieces[:1] + pieces[-2:]) or not ":".join(pieces[1:-2]):
        raise ValueError(f"genset {spec!r}: write NAME:PATH:SOURCE:TARGET, SOURCE/TARGET a field or a template "
                         "(e.g. wikiauto:data/wikiauto/valid.jsonl:source:references, or "
                         "personachat:pc.jsonl:{personality}\\n{history}:{candidates[-1]} with \\: for a colon "
                         "and \\n for a newline), or a YAML file of {name, path, source, target, prompt} mappings")
    return [GensetSpec(name=pieces[0], path=":".join(pieces[1:-2]), source=_unescape(pieces[-2], spec=spec),
                       target=_unescape(pieces[-1], spec=spec))]


def default_gensets(data_dir: str | os.PathLike[str]) -> list[GensetSpec]:
    """WikiAuto at ``<data_dir>/../finetune/wikiauto/valid.jsonl`` (the shared data layout) when present."""
    path = Path(data_dir).parent / "finetune" / "wikiauto" / "valid.jsonl"
    return [GensetSpec(name="wikiauto", path=str(path), source="source", target="references")] if path.is_file() else []


def select_instances(total: int, *, n: int, seed: int) -> list[int]:
    """``min(n, total)`` distinct row indices in [0, total), drawn by ``random.Random(seed)``, sorted."""
    if total < 1:
        raise ValueError("the set has no rows")
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    return sorted(random.Random(seed).sample(range(total), min(n, total)))


@dataclass
class GensetSample:
    """The instances drawn from one set: row indices, inputs and references."""

    spec: GensetSpec
    rows: int
    """rows in the whole set"""
    indices: list[int]
    sources: list[str]
    references: list[list[str]]


def load_genset(spec: GensetSpec, *, n: int, seed: int) -> GensetSample:
    """Read ``spec``'s set through ``datasets``, check its fields, and draw ``n`` instances (`select_instances`).

    The source (and a target template) is rendered from each drawn row (`render_field_template`); a field a
    template names that the set lacks is refused before any row is read, naming it and the set's fields."""
    from ..data.tables import load_table

    table = load_table(spec.path)
    for key, names in spec.fields().items():
        text = getattr(spec, key)
        for column in names:
            if column not in table.column_names:
                what = f"its {key}" if text == column else f"named by its {key} template {text!r}"
                raise ValueError(f"genset {spec.name}: {spec.path} has no field {column!r} ({what}); fields: "
                                 f"{', '.join(table.column_names)}")
    indices = select_instances(len(table), n=n, seed=seed)
    picked = table.select(indices)
    plain_target = "{" not in spec.target and "}" not in spec.target
    sources, references = [], []
    for i, row in zip(indices, picked):
        try:
            src = render_field_template(spec.source, row)
        except ValueError as e:
            raise ValueError(f"genset {spec.name}: row {i} of {spec.path}: source {spec.source!r}: {e}") from None
        if not src.strip():
            raise ValueError(f"genset {spec.name}: row {i} of {spec.path} has an empty or non-text {spec.source!r}")
        if plain_target:  # a field: a string or a list of references
            tgt = row[spec.target]
            refs = [tgt] if isinstance(tgt, str) else list(tgt or [])
        else:
            try:
                refs = [render_field_template(spec.target, row)]
            except ValueError as e:
                raise ValueError(f"genset {spec.name}: row {i} of {spec.path}: target {spec.target!r}: {e}") from None
        if not refs or not all(isinstance(r, str) and r.strip() for r in refs):
            raise ValueError(f"genset {spec.name}: row {i} of {spec.path} has an empty {spec.target!r} "
                             "(a string or a non-empty list of non-empty strings is needed)")
        sources.append(src)
        references.append(refs)
    return GensetSample(spec, len(table), indices, sources, references)


def genset_prompt(tokenizer, spec: GensetSpec, source: str) -> str:
    """The instruction with ``source`` in it, rendered as a user turn when the model has a chat template."""
    from ..generation.chat import render_chat

    text = spec.prompt.replace("{source}", source)
    if getattr(tokenizer, "chat_template", None):
        return render_chat(tokenizer, [{"role": "user", "content": text}])
    return text


def genset_scores(outputs: list[str], references: list[list[str]]) -> dict[str, float | None]:
    from .metrics import bleu2, distinct_n

    try:
        d2: float | None = distinct_n(outputs=outputs, n=2) / 100.0
    except ValueError:  # no output has two tokens: Distinct-2 is undefined, not 0
        d2 = None
    return {"bleu2": bleu2(predictions=outputs, references=references), "distinct2": d2}


def genset_decoding(model_config: Any, given: Mapping[str, Any] | None = None):
    """Genset's `DecodingConfig` for a model: its saved decoding settings (a FLAN model trained at 192 EOS-padded
    slots writes 192) under the options ``given`` explicitly (``--genset_decoding.FIELD``), through
    `model_decoding`, as `biglm generate`, `chat` and `serve` decode it; a refused value the model saved names how
    to clear it here."""
    from ..generation.config import model_decoding

    return model_decoding(model_config, given, clear="--genset_decoding.{name} {value}")


def run_genset(model, tokenizer, sample: GensetSample, *, config=None, batch_size: int = 16) -> dict[str, Any]:
    """Generate an answer for each instance of ``sample`` and score them: BLEU-2 (percent), Distinct-2 (fraction).
    ``config``: the `DecodingConfig` (unset: `genset_decoding`, the model's own); the result records it."""
    from ..generation import generate

    config = config if config is not None else genset_decoding(model.config)
    prompts = [genset_prompt(tokenizer, sample.spec, s) for s in sample.sources]
    outputs: list[str] = []
    for start in range(0, len(prompts), batch_size):
        outputs += [a.strip() for a in generate(model, tokenizer, prompts[start:start + batch_size], config=config)]
    return {"name": sample.spec.name, "path": sample.spec.path, "rows": sample.rows, "n": len(outputs),
            "indices": sample.indices, "decoding": dataclasses.asdict(config),
            **genset_scores(outputs, sample.references),
            "instances": [{"index": i, "prompt": p, "output": o, "references": r}
                          for i, p, o, r in zip(sample.indices, prompts, outputs, sample.references)]}


# ------------------------------------------------------------------------------------------------- table
def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.2f}"


def multitask_table(summary: dict[str, Any]) -> str:
    """Table 5's row (MMLU ZS / FS, SuperGLUE AVG ACC., Genset B-2 / D-2) in Markdown, then what each
    column covers and a per-task breakdown."""
    from .suite import format_table

    mm, sg, gs = summary["mmlu"], summary["superglue"], summary["genset"]
    b2 = "—" if gs["bleu2"] is None else f"{gs['bleu2']:.2f}"
    d2 = "—" if gs["distinct2"] is None else f"{gs['distinct2']:.2f}"
    header = ["Model", "MMLU ZS / FS", "SuperGLUE AVG ACC.", "Genset B-2 / D-2"]
    row = [summary["model"], f"{_pct(mm['zero_shot'])} / {_pct(mm['few_shot'])}", _pct(sg["average"]), f"{b2} / {d2}"]
    labels = {t.config: t.label for t in SUPERGLUE_TASKS}
    covered = [labels[c] for c in sg["covered"]]
    absent = [t.label for t in SUPERGLUE_TASKS if t.config not in sg["covered"]]
    ran = summary.get("parts", PARTS)
    lines = [format_table(header, row), ""]
    if "MMLU" in ran:
        lines.append(f"- MMLU: {len(mm['subjects'])} subjects, zero-shot / {mm['fewshot']}-shot (examples from dev), "
                     "accuracy weighted by subject size.")
    if "SuperGLUE" in ran:
        lines.append(f"- SuperGLUE average over {len(covered)} of {len(SUPERGLUE_TASKS)} tasks: "
                     f"{', '.join(covered) or 'none'}" + (f" (absent: {', '.join(absent)})" if absent else "") + ".")
    if "Genset" in ran:
        sets = ", ".join(f"{s['name']} ({s['n']})" for s in gs["sets"]) or "none"
        lines.append(f"- Genset: {sets}, seed {gs['seed']}; B-2 = sacrebleu BLEU-2 (%), D-2 = Distinct-2 (fraction).")
        if gs["sets"] and gs.get("decoding"):
            d = gs["decoding"]
            lines.append(f"- Genset decoding: {d['strategy']}, {d['max_new_tokens']} answer slots, steps "
                         f"{d['steps'] if d['steps'] is not None else 'the strategy default'} (the model's saved "
                         "settings under the --genset_decoding options given).")
    not_run = [p for p in PARTS if p not in ran]
    if not_run:
        lines.append(f"- not run (not among the selected columns): {', '.join(not_run)}.")
    if gs["sets"] and gs["distinct2"] is None:
        lines.append("- D-2 —: no output has two tokens, so Distinct-2 is undefined.")
    if summary.get("limit") is not None:
        limit = summary["limit"]
        shown = int(limit) if float(limit).is_integer() and limit >= 1 else limit
        lines.append(f"- limit={shown} documents per lm-eval task: a quick check, not a reportable number.")
    detail_h = [labels[c] for c in sg["covered"]] + [f"{s['name']} B-2 / D-2" for s in gs["sets"]]
    detail_r = [_pct(sg["tasks"][c]) for c in sg["covered"]]
    detail_r += [f"{s['bleu2']:.2f} / " + ("—" if s["distinct2"] is None else f"{s['distinct2']:.2f}")
                 for s in gs["sets"]]
    if detail_h:
        lines += ["", format_table(detail_h, detail_r)]
    return "\n".join(lines)
