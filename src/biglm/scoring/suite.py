"""The paper's zero-shot suite (DESIGN §8) as data: its columns, their local data, and its table.

Notable features
- `PAPER_SUITE` lists Table 1's eleven columns (ARC-E, ARC-C, PIQA, SciQ, WinoG, LogiQA, RACE, SIQA,
  BoolQ, HellaSwag, TruthfulQA MC1) plus MMLU and LAMBADA, each as a *built-in* lm-eval task (same
  prompts and metrics) and the metric the paper reports for it.
- `write_suite_yamls` replaces only the data source: for each task a small override YAML
  ``include``s the built-in one by absolute path and points ``dataset_path: json`` at
  ``<data-dir>/<owner>__<name>[/<config>]/<split>.jsonl`` (the hub schema). Splits that are not
  shipped become ``null``, because lm-eval 0.4.13 builds its few-shot sampler from
  ``training_split`` even at zero-shot. A task whose evaluation file is missing is returned with the
  path it looked for, so any subset of the sets may be present.
- `suite_table` turns an lm-eval results dict into the paper's row: acc_norm for PIQA, ARC-C, LogiQA
  and HellaSwag, acc elsewhere, and the average over the Table 1 columns that ran.

Nothing here runs a model; `biglm.scoring.harness.run_suite` does, through lm-eval's Python API.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SUITES", "SuiteTask", "PAPER_SUITE", "LOCAL_SUFFIX", "default_data_dir", "select_tasks",
           "write_suite_yamls", "suite_value", "suite_table", "format_table"]

SUITES = ("paper",)


@dataclass(frozen=True)
class SuiteTask:
    """One column of the paper's table: a built-in lm-eval task and where its data lies locally."""

    column: str
    """the column's name in the printed table"""
    task: str
    """the built-in lm-eval task"""
    yaml: str
    """its YAML (a folder of YAMLs for MMLU), relative to ``lm_eval/tasks``"""
    hub: str
    """``<owner>__<name>`` folder of the hub dataset under the data dir"""
    config: str | None
    """hub config folder under ``hub``; None when the hub dataset has none"""
    splits: tuple[str, ...]
    """split files to use: the first is evaluated and must exist, the others are used when present"""
    null_splits: tuple[str, ...]
    """split keys of the built-in YAML set to null because their data is never shipped"""
    metric: str
    """acc or acc_norm, as in the paper's table"""
    in_average: bool = True
    """a Table 1 column (averaged); False for the columns shown after the average"""


PAPER_SUITE: tuple[SuiteTask, ...] = (
    SuiteTask("ARC-E", "arc_easy", "arc/arc_easy.yaml", "allenai__ai2_arc", "ARC-Easy", ("test",),
              ("training_split", "validation_split"), "acc"),
    SuiteTask("ARC-C", "arc_challenge", "arc/arc_challenge.yaml", "allenai__ai2_arc", "ARC-Challenge", ("test",),
              ("training_split", "validation_split"), "acc_norm"),
    SuiteTask("PIQA", "piqa", "piqa/piqa.yaml", "baber__piqa", None, ("validation",), ("training_split",), "acc_norm"),
    SuiteTask("SciQ", "sciq", "sciq/sciq.yaml", "allenai__sciq", None, ("test", "validation"),
              ("training_split",), "acc"),
    SuiteTask("WinoG", "winogrande", "winogrande/default.yaml", "allenai__winogrande", "winogrande_xl",
              ("validation",), ("training_split",), "acc"),
    SuiteTask("LogiQA", "logiqa", "logiqa/logiqa.yaml", "EleutherAI__logiqa", "logiqa", ("test", "validation"),
              ("training_split",), "acc_norm"),
    # RACE: one row per article, `problems` a Python-literal string that lm-eval's race utils parse
    SuiteTask("RACE", "race", "race/race.yaml", "EleutherAI__race", "high", ("test",), (), "acc"),
    SuiteTask("SIQA", "social_iqa", "siqa/siqa.yaml", "lighteval__siqa", None, ("validation",),
              ("training_split",), "acc"),
    SuiteTask("BoolQ", "boolq", "super_glue/boolq/default.yaml", "aps__super_glue", "boolq", ("validation",),
              ("training_split",), "acc"),
    SuiteTask("HellaS", "hellaswag", "hellaswag/hellaswag.yaml", "Rowan__hellaswag", None, ("validation",),
              ("training_split",), "acc_norm"),
    # MC1, not MC2: the paper's TruthfulQA values are MC1-sized (DESIGN §8)
    SuiteTask("TruthQA", "truthfulqa_mc1", "truthfulqa/truthfulqa_mc1.yaml", "truthfulqa__truthful_qa",
              "multiple_choice", ("validation",), (), "acc"),
    # beyond Table 1 (reported by the paper elsewhere): shown after the average, not in it
    SuiteTask("MMLU", "mmlu", "mmlu/default", "cais__mmlu", None, ("test", "dev"), (), "acc", in_average=False),
    SuiteTask("LAMBADA", "lambada_openai", "lambada/lambada_openai.yaml", "EleutherAI__lambada_openai", "default",
              ("test",), (), "acc", in_average=False),
)

LOCAL_SUFFIX = "_local"


def default_data_dir() -> Path:
    """``$BIGLM_EVAL_DATA`` or ``./data/eval``."""
    return Path(os.environ.get("BIGLM_EVAL_DATA", "data/eval"))


def tasks_root() -> Path:
    """The installed ``lm_eval/tasks`` folder (the built-in YAMLs the overrides include)."""
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).resolve().parent


def select_tasks(columns: str | list[str] | tuple[str, ...] | None) -> tuple[SuiteTask, ...]:
    """The suite's tasks restricted to ``columns`` (table names like "PIQA" or task names like "piqa"),
    in the table's order; all of them when ``columns`` is empty."""
    if not columns:
        return PAPER_SUITE
    wanted = [c.strip() for c in columns.split(",")] if isinstance(columns, str) else [str(c).strip() for c in columns]
    known = {t.column.lower(): t for t in PAPER_SUITE} | {t.task.lower(): t for t in PAPER_SUITE}
    bad = [c for c in wanted if c.lower() not in known]
    if bad:
        raise ValueError(f"unknown suite task(s) {', '.join(bad)}; choose from {', '.join(t.column for t in PAPER_SUITE)}.")
    chosen = {known[c.lower()].task for c in wanted}
    return tuple(t for t in PAPER_SUITE if t.task in chosen)


def _override(include: Path, task: str, alias: str, files: dict[str, Path], nulls: tuple[str, ...],
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    # absolute data_files: lm-eval resolves relative ones against the working directory (DESIGN §5)
    doc: dict[str, Any] = {"include": str(include), "task": task, "task_alias": alias, "dataset_path": "json",
                           "dataset_name": None, "dataset_kwargs": {"data_files": {k: str(v) for k, v in files.items()}}}
    doc.update({k: None for k in nulls})
    doc.update(extra or {})
    return doc


def write_suite_yamls(*, data_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                      suite: str = "paper", only: str | list[str] | tuple[str, ...] | None = None,
                      ) -> tuple[list[SuiteTask], dict[str, str]]:
    """Write one override YAML per available task of ``suite`` (or of its ``only`` columns) into ``out_dir``.

    Returns ``(tasks_written, missing)`` where ``missing`` maps a skipped column to the file it looked
    for. Raises FileNotFoundError when no chosen task has data.
    """
    if suite == "multitask":  # Table 5 mixes lm-eval tasks and generation: its own module writes its YAMLs
        raise ValueError("the multitask suite's YAMLs are written by biglm.scoring.multitask.write_multitask_yamls.")
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; available: {', '.join(SUITES)}")
    data_dir, out_dir = Path(data_dir).resolve(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = tasks_root()
    written: list[SuiteTask] = []
    missing: dict[str, str] = {}
    for t in select_tasks(only):
        if t.task == "mmlu":
            if _write_mmlu(data_dir, out_dir, root, t):
                written.append(t)
            else:
                missing[t.column] = str(data_dir / t.hub / "<subject>" / "test.jsonl")
            continue
        base = data_dir / t.hub / t.config if t.config else data_dir / t.hub
        files = {s: base / f"{s}.jsonl" for s in t.splits}
        if not files[t.splits[0]].is_file():
            missing[t.column] = str(files[t.splits[0]])
            continue
        nulls = list(t.null_splits)
        for s in t.splits[1:]:  # optional extra splits (SciQ's and LogiQA's validation): null when absent
            if not files[s].is_file():
                del files[s]
                nulls.append(f"{s}_split")
        doc = _override(root / t.yaml, t.task + LOCAL_SUFFIX, t.task, files, tuple(nulls))
        (out_dir / f"{t.task}{LOCAL_SUFFIX}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        written.append(t)
    if not written:
        raise FileNotFoundError(f"no task of suite {suite!r} has data under {data_dir}: looked for "
                                + "; ".join(missing.values()))
    return written, missing


def _write_mmlu(data_dir: Path, out_dir: Path, root: Path, t: SuiteTask) -> list[str]:
    """Subject overrides (test + dev from the data dir) and a group averaging them by size, like
    lm-eval's own ``mmlu`` group. Returns the subjects written."""
    subjects = []
    for builtin in sorted((root / t.yaml).glob("mmlu_*.yaml")):
        subject = builtin.stem[len("mmlu_"):]
        files = {s: data_dir / t.hub / subject / f"{s}.jsonl" for s in t.splits}
        if not files["test"].is_file():
            continue
        nulls = () if files["dev"].is_file() else ("fewshot_split",)
        if not files["dev"].is_file():
            del files["dev"]
        # tag []: the local copies must not join the built-in mmlu_<category>_tasks tags
        doc = _override(builtin, f"mmlu_{subject}{LOCAL_SUFFIX}", subject, files, nulls, {"tag": []})
        (out_dir / f"mmlu_{subject}{LOCAL_SUFFIX}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        subjects.append(subject)
    if subjects:
        group = {"group": "mmlu" + LOCAL_SUFFIX, "group_alias": "mmlu",
                 "task": [f"mmlu_{s}{LOCAL_SUFFIX}" for s in subjects],
                 "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}], "metadata": {"version": 2}}
        (out_dir / f"_mmlu{LOCAL_SUFFIX}.yaml").write_text(yaml.safe_dump(group, sort_keys=False))
    return subjects


def suite_value(results: dict[str, Any], t: SuiteTask) -> float | None:
    """``t``'s paper metric in an lm-eval results dict (local or built-in task name), None if it did not run."""
    res = results.get("results", {})
    v = res.get(t.task + LOCAL_SUFFIX, res.get(t.task, {})).get(f"{t.metric},none")
    return float(v) if isinstance(v, (int, float)) and not math.isnan(v) else None


def suite_table(results: dict[str, Any], *, tasks: list[SuiteTask] | tuple[SuiteTask, ...] = PAPER_SUITE,
                ) -> tuple[list[str], list[str]]:
    """The paper's table from an lm-eval results dict: (header, row) in percent with one decimal, "—"
    where a column did not run. Avg is the mean of the Table 1 columns that ran; the columns outside
    Table 1 (MMLU, LAMBADA) follow it."""
    paper = [t for t in tasks if t.in_average]
    extra = [t for t in tasks if not t.in_average]
    ran = [v for v in (suite_value(results, t) for t in paper) if v is not None]

    def cell(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:.1f}"

    header = [t.column for t in paper] + ["Avg"] + [t.column for t in extra]
    row = ([cell(suite_value(results, t)) for t in paper] + [cell(sum(ran) / len(ran) if ran else None)]
           + [cell(suite_value(results, t)) for t in extra])
    return header, row


def format_table(header: list[str], row: list[str]) -> str:
    """A Markdown table of one row, columns right-aligned."""
    widths = [max(len(h), len(r)) for h, r in zip(header, row)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", line(row)])
