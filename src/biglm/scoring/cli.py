"""`biglm eval`: zero-shot evaluation of a BiGLM through lm-evaluation-harness's own CLI.

    biglm eval --model_args pretrained=DIR,scorer=chain --tasks piqa --limit 100 --output_path out/
    biglm eval --suite paper --data-dir ../shared/data/eval --model_args pretrained=DIR --limit 200

Notable features
- lm-eval has no plugin discovery: this launcher imports the adapter (which registers ``biglm``),
  inserts ``--model biglm`` and hands every other flag to lm-eval 0.4.13's CLI unchanged.
- ``--suite paper`` runs the paper's zero-shot suite (DESIGN §8) plus MMLU and LAMBADA with
  lm-eval's *built-in* task YAMLs (same prompts and metrics); only the data source is replaced. For
  each task a small override YAML ``include``s the built-in one by absolute path and points
  ``dataset_path: json`` at ``<data-dir>/<owner>__<name>[/<config>]/<split>.jsonl`` (the hub schema);
  splits that are not shipped become ``null`` (lm-eval 0.4.13 builds its few-shot sampler from
  ``training_split`` even at zero-shot). Missing data files are reported by path and the task is
  skipped. At the end the paper's table is printed: acc_norm for PIQA, ARC-C, LogiQA and HellaSwag,
  acc elsewhere, and the average over the paper's eleven tasks that ran.
- `run_suite` is the same path as a Python function (it builds the lm-eval argv and runs the CLI),
  returning lm-eval's results dict.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SUITES = ("paper",)


@dataclass(frozen=True)
class SuiteTask:
    """One column of the paper's table: a built-in lm-eval task and where its data lies locally.

    ``splits`` are the split files to use (the first one is evaluated); ``null_splits`` are the split
    keys of the built-in YAML to set to null because their data is not shipped.
    """

    column: str
    task: str  # built-in lm-eval task name
    yaml: str  # built-in YAML, relative to lm_eval/tasks
    hub: str  # "<owner>__<name>" folder under the data dir
    config: str | None  # hub config folder, None when the hub dataset has none
    splits: tuple[str, ...]
    null_splits: tuple[str, ...]
    metric: str  # acc or acc_norm, as in the paper's table
    in_average: bool = True


PAPER_SUITE: tuple[SuiteTask, ...] = (
    SuiteTask("ARC-E", "arc_easy", "arc/arc_easy.yaml", "allenai__ai2_arc", "ARC-Easy", ("test",),
              ("training_split", "validation_split"), "acc"),
    SuiteTask("ARC-C", "arc_challenge", "arc/arc_challenge.yaml", "allenai__ai2_arc", "ARC-Challenge", ("test",),
              ("training_split", "validation_split"), "acc_norm"),
    SuiteTask("PIQA", "piqa", "piqa/piqa.yaml", "baber__piqa", None, ("validation",), ("training_split",), "acc_norm"),
    SuiteTask("SciQ", "sciq", "sciq/sciq.yaml", "allenai__sciq", None, ("test",),
              ("training_split", "validation_split"), "acc"),
    SuiteTask("WinoG", "winogrande", "winogrande/default.yaml", "allenai__winogrande", "winogrande_xl",
              ("validation",), ("training_split",), "acc"),
    SuiteTask("LogiQA", "logiqa", "logiqa/logiqa.yaml", "EleutherAI__logiqa", "logiqa", ("test", "validation"),
              ("training_split",), "acc_norm"),
    SuiteTask("RACE", "race", "race/race.yaml", "EleutherAI__race", "high", ("test",), (), "acc"),
    SuiteTask("SIQA", "social_iqa", "siqa/siqa.yaml", "lighteval__siqa", None, ("validation",),
              ("training_split",), "acc"),
    SuiteTask("BoolQ", "boolq", "super_glue/boolq/default.yaml", "aps__super_glue", "boolq", ("validation",),
              ("training_split",), "acc"),
    SuiteTask("HellaS", "hellaswag", "hellaswag/hellaswag.yaml", "Rowan__hellaswag", None, ("validation",),
              ("training_split",), "acc_norm"),
    SuiteTask("TruthQA", "truthfulqa_mc2", "truthfulqa/truthfulqa_mc2.yaml", "truthfulqa__truthful_qa",
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


def _tasks_root() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).resolve().parent


def _split_files(data_dir: Path, t: SuiteTask, config: str | None) -> dict[str, Path]:
    base = data_dir / t.hub / config if config else data_dir / t.hub
    return {s: base / f"{s}.jsonl" for s in t.splits}


def _override(include: Path, task: str, alias: str, files: dict[str, Path], nulls: tuple[str, ...],
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"include": str(include), "task": task, "task_alias": alias, "dataset_path": "json",
                           "dataset_name": None, "dataset_kwargs": {"data_files": {k: str(v) for k, v in files.items()}}}
    doc.update({k: None for k in nulls})
    doc.update(extra or {})
    return doc


def select_tasks(columns: str | list[str] | None) -> tuple[SuiteTask, ...]:
    """The suite's tasks restricted to ``columns`` (table names like "PIQA" or task names like "piqa")."""
    if not columns:
        return PAPER_SUITE
    wanted = [c.strip() for c in columns.split(",")] if isinstance(columns, str) else list(columns)
    known = {t.column.lower(): t for t in PAPER_SUITE} | {t.task.lower(): t for t in PAPER_SUITE}
    bad = [c for c in wanted if c.lower() not in known]
    if bad:
        raise ValueError(f"unknown suite task(s) {', '.join(bad)}; choose from {', '.join(t.column for t in PAPER_SUITE)}.")
    chosen = {known[c.lower()].task for c in wanted}
    return tuple(t for t in PAPER_SUITE if t.task in chosen)


def write_suite_yamls(*, data_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                      suite: str = "paper", only: str | list[str] | None = None,
                      ) -> tuple[list[SuiteTask], dict[str, str]]:
    """Write one override YAML per available task of ``suite`` (or of its ``only`` columns) into ``out_dir``.

    Returns ``(tasks_written, missing)`` where ``missing`` maps a skipped column to the file it looked
    for. Raises FileNotFoundError when no chosen task has data.
    """
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; available: {', '.join(SUITES)}")
    data_dir, out_dir = Path(data_dir).resolve(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    root = _tasks_root()
    written: list[SuiteTask] = []
    missing: dict[str, str] = {}
    for t in select_tasks(only):
        if t.task == "mmlu":
            subjects = _write_mmlu(data_dir, out_dir, root, t)
            if subjects:
                written.append(t)
            else:
                missing[t.column] = str(data_dir / t.hub / "<subject>" / "test.jsonl")
            continue
        files = _split_files(data_dir, t, t.config)
        eval_split = t.splits[0]
        if not files[eval_split].is_file():
            missing[t.column] = str(files[eval_split])
            continue
        nulls = list(t.null_splits)
        for s in t.splits[1:]:  # optional extra splits (LogiQA's validation): null when absent
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
    """57 subject overrides (test + dev from the data dir) and a group averaging them by size, like
    lm-eval's own ``mmlu`` group."""
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


def suite_table(results: dict[str, Any], *, tasks: list[SuiteTask] | tuple[SuiteTask, ...] = PAPER_SUITE) -> tuple[list[str], list[str]]:
    """The paper's table from an lm-eval results dict: (header, row), percentages, "—" where missing.
    The average is over the paper's Table 1 tasks that ran."""
    res = results.get("results", {})

    def value(t: SuiteTask) -> float | None:
        v = res.get(t.task + LOCAL_SUFFIX, res.get(t.task, {})).get(f"{t.metric},none")
        return v if isinstance(v, (int, float)) and not math.isnan(v) else None

    cell = lambda v: "—" if v is None else f"{100 * v:.1f}"  # noqa: E731
    paper = [t for t in tasks if t.in_average]
    extra = [t for t in tasks if not t.in_average]
    ran = [v for v in map(value, paper) if v is not None]
    header = [t.column for t in paper] + ["Avg"] + [t.column for t in extra]
    row = [cell(value(t)) for t in paper] + [cell(sum(ran) / len(ran) if ran else None)] + [cell(value(t)) for t in extra]
    return header, row


def format_table(header: list[str], row: list[str]) -> str:
    widths = [max(len(h), len(r)) for h, r in zip(header, row)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", line(row)])


# ---- running lm-eval ------------------------------------------------------------------------------------

def _run_lm_eval(argv: list[str]) -> None:
    """lm-eval 0.4.13's own CLI (``lm_eval.__main__.cli_evaluate``) on ``argv`` with ``--model biglm``."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    from . import lm_eval_adapter  # noqa: F401  registers "biglm"

    saved = sys.argv
    # HarnessCLI reads sys.argv (it inserts "run" for the legacy flag-only form itself)
    sys.argv = ["lm-eval", "run", "--model", "biglm", *argv]
    try:
        setup_logging()
        parser = HarnessCLI()
        parser.execute(parser.parse_args())
    finally:
        sys.argv = saved


def _model_args(argv: list[str]) -> dict[str, str]:
    """The key=value pairs of ``--model_args`` / ``-a`` in ``argv`` (both accepted spellings)."""
    out: dict[str, str] = {}
    for i, a in enumerate(argv):
        values: list[str] = []
        if a in ("--model_args", "-a"):
            for b in argv[i + 1:]:
                if b.startswith("-"):
                    break
                values.append(b)
        elif a.startswith("--model_args="):
            values = [a.split("=", 1)[1]]
        for v in values:
            for kv in v.split(","):
                if "=" in kv:
                    k, val = kv.split("=", 1)
                    out[k.strip()] = val.strip()
    return out


def _flag_value(argv: list[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def _check_pretrained(argv: list[str]) -> str | None:
    """A clear message when the checkpoint is missing, before lm-eval spends time building tasks."""
    pretrained = _model_args(argv).get("pretrained")
    if pretrained is None:
        return "missing pretrained: pass --model_args pretrained=DIR (a directory written by `biglm export`)."
    if not Path(pretrained).exists():
        return (f"no model at {pretrained}: pass --model_args pretrained=DIR with a directory written by "
                "`biglm export` or `save_pretrained` (config.json + model.safetensors + tokenizer).")
    return None


def _newest_results(output_path: Path, since: float) -> Path:
    found = [p for p in output_path.rglob("results_*.json") if p.stat().st_mtime >= since - 1]
    if not found:
        raise RuntimeError(f"lm-eval wrote no results_*.json under {output_path}")
    return max(found, key=lambda p: p.stat().st_mtime)


def _run_suite_argv(argv: list[str], *, data_dir: Path, suite: str = "paper", only: str | None = None) -> dict[str, Any]:
    """Write the overrides, run lm-eval with them, print the paper table, return the results dict."""
    if _flag_value(argv, "--tasks", "-t") is not None or _flag_value(argv, "--include_path") is not None:
        raise ValueError("--suite chooses the tasks and the include path: drop --tasks/--include_path.")
    output = _flag_value(argv, "--output_path", "-o")
    with tempfile.TemporaryDirectory(prefix="biglm-eval-") as tmp:
        yaml_dir = Path(tmp) / "tasks"
        tasks, missing = write_suite_yamls(data_dir=data_dir, out_dir=yaml_dir, suite=suite, only=only)
        for column, path in missing.items():
            print(f"biglm eval: skipping {column}: data file not found: {path}", file=sys.stderr)
        out_path = Path(output) if output else Path(tmp) / "results"
        extra = [] if output else ["--output_path", str(out_path)]
        names = [t.task + LOCAL_SUFFIX for t in tasks]
        start = time.time()
        _run_lm_eval([*argv, *extra, "--tasks", ",".join(names), "--include_path", str(yaml_dir)])
        path = out_path if out_path.suffix == ".json" and out_path.is_file() else _newest_results(
            out_path.parent if out_path.suffix == ".json" else out_path, start)
        results = json.loads(path.read_text(encoding="utf-8"))
    header, row = suite_table(results, tasks=select_tasks(only))
    print(f"\nBiGLM zero-shot, suite {suite!r} (acc_norm: PIQA, ARC-C, LogiQA, HellaS; acc elsewhere; "
          "Avg over Table 1 tasks that ran)")
    print(format_table(header, row))
    results["biglm_suite"] = {"header": header, "row": row, "missing": missing}
    return results


def run_suite(
    pretrained: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    scorer: str | None = None,
    limit: float | None = None,
    batch_size: int | None = None,
    device: str | None = None,
    output_path: str | os.PathLike[str] | None = None,
    model_args: dict[str, Any] | None = None,
    suite: str = "paper",
    only: str | list[str] | None = None,
) -> dict[str, Any]:
    """Run the paper's zero-shot suite on a BiGLM through lm-eval's CLI and return lm-eval's results dict
    (plus ``results["biglm_suite"]``: the printed table's header, row and skipped tasks).

    ``model_args`` adds further adapter options (e.g. ``{"mc_samples": 16}``); ``scorer`` None keeps the
    adapter's default; ``only`` restricts the suite to some columns (e.g. ``["PIQA", "ARC-E"]``).
    """
    if not Path(pretrained).exists():
        raise FileNotFoundError(f"no model at {pretrained}: pass a directory written by `biglm export` or save_pretrained.")
    args = {"pretrained": str(pretrained), **({"scorer": scorer} if scorer else {}), **(model_args or {})}
    argv = ["--model_args", ",".join(f"{k}={v}" for k, v in args.items())]
    if limit is not None:
        argv += ["--limit", str(limit)]
    if batch_size is not None:
        argv += ["--batch_size", str(batch_size)]
    if device is not None:
        argv += ["--device", str(device)]
    if output_path is not None:
        argv += ["--output_path", str(output_path)]
    return _run_suite_argv(argv, data_dir=Path(data_dir) if data_dir is not None else default_data_dir(), suite=suite,
                           only=",".join(only) if isinstance(only, list) else only)


def main(argv: list[str]) -> int:
    """`biglm eval [--suite paper [--data-dir DIR]] LM_EVAL_FLAGS...` (``--model biglm`` is implied)."""
    parser = argparse.ArgumentParser(
        prog="biglm eval", add_help=False,
        description="Zero-shot evaluation of a BiGLM with lm-evaluation-harness. Every flag not listed here "
                    "goes to `lm-eval run` unchanged (see `lm-eval run --help`); --model biglm is implied.",
        epilog="examples:\n  biglm eval --model_args pretrained=DIR,scorer=chain --tasks piqa --limit 100\n"
               "  biglm eval --suite paper --data-dir ../shared/data/eval --model_args pretrained=DIR --limit 200",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--suite", choices=SUITES, help="run a whole evaluation suite on local data")
    parser.add_argument("--suite-tasks", default=None, metavar="COLS",
                        help="run only these suite columns, comma-separated (e.g. PIQA,ARC-E,LAMBADA)")
    parser.add_argument("--data-dir", default=None,
                        help="eval data in hub layout <owner>__<name>/<config>/<split>.jsonl "
                             "(default: $BIGLM_EVAL_DATA or ./data/eval)")
    ours, rest = parser.parse_known_args(argv)
    if ours.help:
        parser.print_help()
        return 0
    if "--model" in rest or "-M" in rest:
        print("biglm eval: --model is always biglm; drop it.", file=sys.stderr)
        return 2
    problem = _check_pretrained(rest)
    if problem:
        print(f"biglm eval: {problem}", file=sys.stderr)
        return 2
    if ours.suite:
        data_dir = Path(ours.data_dir) if ours.data_dir else default_data_dir()
        try:
            _run_suite_argv(rest, data_dir=data_dir, suite=ours.suite, only=ours.suite_tasks)
        except (FileNotFoundError, ValueError) as e:
            print(f"biglm eval: {e}", file=sys.stderr)
            return 2
        return 0
    if ours.data_dir or ours.suite_tasks:
        print("biglm eval: --data-dir and --suite-tasks only apply with --suite.", file=sys.stderr)
        return 2
    _run_lm_eval(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
