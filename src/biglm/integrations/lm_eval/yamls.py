"""lm-eval task YAMLs for biglm's suites: built-in lm-eval tasks pointed at local data in hub layout.

Notable features
- `write_suite_yamls` replaces only the data source: for each task a small override YAML
  ``include``s the built-in one by absolute path (under `tasks_root`, lm-eval's installed task folder) and
  points ``dataset_path: json`` at ``<data-dir>/<owner>__<name>[/<config>]/<split>.jsonl`` (the hub schema).
  Splits that are not shipped become ``null``, because lm-eval 0.4.13 builds its few-shot sampler from
  ``training_split`` even at zero-shot. A task whose evaluation file is missing is returned with the
  path it looked for, so any subset of the sets may be present. The suite itself (columns, metrics, the
  paper's table) is biglm's own data, in `biglm.scoring.suite`.
- MMLU: one override per local subject and a group averaging them by size, like lm-eval's own ``mmlu``.
- `write_multitask_yamls`: the MMLU subjects and the SuperGLUE tasks found in the data folder
  (`biglm.scoring.multitask.discover_superglue`) for Table 5's suite.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...scoring.multitask import PARTS, SUPERGLUE_HUB, SuperGlueTask, discover_superglue
from ...scoring.suite import LOCAL_SUFFIX, PAPER_SUITE, SUITES, SuiteTask, select_tasks

__all__ = ["MultitaskPlan", "tasks_root", "write_multitask_yamls", "write_suite_yamls"]


def tasks_root() -> Path:
    """The installed ``lm_eval/tasks`` folder (the built-in YAMLs the overrides include)."""
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).resolve().parent


def _override(include: Path, task: str, alias: str, files: dict[str, Path], nulls: tuple[str, ...],
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    # absolute data_files: lm-eval resolves relative ones against the working directory, not the YAML's folder
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
        raise ValueError("the multitask suite's YAMLs are written by biglm.integrations.lm_eval.write_multitask_yamls.")
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


@dataclass
class MultitaskPlan:
    """What `write_multitask_yamls` wrote: the MMLU group (None when absent), the SuperGLUE tasks, the skips."""

    mmlu_task: str | None
    mmlu_subjects: list[str]
    superglue: list[SuperGlueTask]
    skipped: dict[str, str] = field(default_factory=dict)


def write_multitask_yamls(*, data_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                          parts: Sequence[str] = PARTS) -> MultitaskPlan:
    """Override YAMLs for the MMLU subjects (and their group) and the SuperGLUE tasks found in ``data_dir``."""
    data_dir, out_dir = Path(data_dir).resolve(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = tasks_root()
    plan = MultitaskPlan(None, [], [])
    if "MMLU" in parts:
        mmlu = next(t for t in PAPER_SUITE if t.task == "mmlu")
        plan.mmlu_subjects = _write_mmlu(data_dir, out_dir, root, mmlu)
        if plan.mmlu_subjects:
            plan.mmlu_task = "mmlu" + LOCAL_SUFFIX
        else:
            plan.skipped["MMLU"] = f"no {data_dir / mmlu.hub / '<subject>' / 'test.jsonl'}"
    if "SuperGLUE" in parts:
        found, skipped = discover_superglue(data_dir)
        plan.skipped.update({f"SuperGLUE {k}": v for k, v in skipped.items()})
        for task, folder in found:
            files = {"validation": folder / "validation.jsonl"}
            nulls: tuple[str, ...] = ("training_split",)
            if (folder / "train.jsonl").is_file():  # the few-shot sampler's source, when shipped
                files["train"], nulls = folder / "train.jsonl", ()
            # tag []: the local copies must not join the built-in super-glue-lm-eval-v1 tag
            doc = _override(root / task.yaml, task.task + LOCAL_SUFFIX, task.config, files, nulls, {"tag": []})
            (out_dir / f"{task.task}{LOCAL_SUFFIX}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
            plan.superglue.append(task)
        if not found:
            plan.skipped["SuperGLUE"] = f"no known task folder with validation.jsonl under {data_dir / SUPERGLUE_HUB}"
    return plan
