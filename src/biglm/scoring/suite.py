"""The paper's zero-shot suite as data: its columns, their local data, and its table.

Notable features
- `PAPER_SUITE` lists Table 1's eleven columns (ARC-E, ARC-C, PIQA, SciQ, WinoG, LogiQA, RACE, SIQA,
  BoolQ, HellaSwag, TruthfulQA MC1) plus MMLU and LAMBADA, each as a *built-in* lm-eval task (same
  prompts and metrics) and the metric the paper reports for it.
- The override YAMLs that point lm-eval's built-in tasks at the local data are written by
  `biglm.integrations.lm_eval.write_suite_yamls` (lm-eval's own task folder is read there).
- `suite_table` turns an lm-eval results dict into the paper's row: acc_norm for PIQA, ARC-C, LogiQA
  and HellaSwag, acc elsewhere, and the average over the Table 1 columns that ran.

Nothing here runs a model or imports lm-eval; `biglm.integrations.lm_eval.run_suite` runs the suite through
lm-eval's Python API.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


__all__ = ["SUITES", "SuiteTask", "PAPER_SUITE", "LOCAL_SUFFIX", "default_data_dir", "select_tasks",
           "suite_value", "suite_table", "format_table"]

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
    # MC1, not MC2: the paper's TruthfulQA values are MC1-sized (MC2 would be ~15 points higher)
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
