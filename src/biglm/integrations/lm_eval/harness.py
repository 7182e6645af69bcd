"""lm-evaluation-harness on a BiGLM through lm-eval's Python API.

    results = evaluate(model_args={"pretrained": "runs/x-hf", "scorer": "chain"}, tasks=["piqa"], limit=100)
    results = run_suite("runs/x-hf", data_dir="../shared/data/eval", limit=200)   # the paper's suite

Notable features
- Calls ``lm_eval.simple_evaluate`` with ``model="biglm"`` (registered by importing the adapter: lm-eval
  has no plugin discovery) and a ``TaskManager(include_path=...)`` for task YAMLs outside lm-eval. No
  argv is built and ``sys.argv`` is never touched.
- With ``output_path`` the results are written by lm-eval's own ``EvaluationTracker``, exactly as
  ``lm-eval run --output_path`` writes them: ``<output_path>/<pretrained path, "/" as "__">/results_<date>.json``
  (or ``<stem>_<date>.json`` beside a path ending in ``.json``), plus ``samples_<task>_<date>.jsonl``
  per task with ``log_samples``.
- `build_lm` builds the model once for several evaluations (the multitask suite runs MMLU zero- and
  few-shot on one load, then generates Genset with the same weights).
- `run_suite` writes the suite's override YAMLs (`write_suite_yamls`, for the suite `biglm.scoring.suite`
  defines) into a temporary folder, runs them, and adds the paper table to the results dict as
  ``results["biglm_suite"]``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ...scoring.suite import LOCAL_SUFFIX, default_data_dir, select_tasks, suite_table
from .yamls import write_suite_yamls

__all__ = ["evaluate", "run_suite", "model_args_string", "build_lm", "setup_logging", "results_tables"]


def model_args_string(model_args: str | dict[str, Any]) -> str:
    """``key=value,...`` as lm-eval's ``--model_args``: lm-eval then converts "16" to 16 and "true" to
    True itself (a dict would reach the adapter as strings)."""
    if isinstance(model_args, str):
        return model_args
    return ",".join(f"{k}={v}" for k, v in model_args.items() if v is not None)


def build_lm(*, model_args: str | dict[str, Any], batch_size: int | str | None = None, device: str | None = None):
    """The ``biglm`` lm-eval model, built once as ``simple_evaluate`` would build it, so several
    evaluations (and biglm's own generation, through its ``.model``/``.tokenizer``) share one load."""
    from lm_eval.api.registry import get_model

    from . import adapter  # noqa: F401  registers "biglm"

    extra = {k: v for k, v in (("batch_size", batch_size), ("device", device)) if v is not None}
    return get_model("biglm").create_from_arg_string(model_args_string(model_args), extra)


def evaluate(
    *,
    model_args: str | dict[str, Any] | None = None,
    tasks: list[str] | tuple[str, ...],
    lm: Any = None,
    include_path: str | os.PathLike[str] | None = None,
    limit: float | None = None,
    num_fewshot: int | None = None,
    batch_size: int | str | None = None,
    device: str | None = None,
    output_path: str | os.PathLike[str] | None = None,
    log_samples: bool = False,
    include_defaults: bool = True,
) -> dict[str, Any]:
    """Evaluate the ``biglm`` model on lm-eval ``tasks`` and return lm-eval's results dict.

    ``include_defaults=False`` indexes only ``include_path``: right when every task is one of biglm's suite
    YAMLs, which include lm-eval's own by absolute path (indexing lm-eval's thousands of YAMLs takes ~15-50 s).

    ``model_args`` are the adapter's options (``pretrained`` is required); ``batch_size`` None keeps
    the adapter's default. ``lm`` is a model from `build_lm` to reuse instead (then ``model_args``,
    ``batch_size`` and ``device`` are those it was built with and must be left unset). ``log_samples``
    keeps the per-document records in ``results["samples"]`` (and writes them when ``output_path`` is given).
    """
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from . import adapter  # noqa: F401  registers "biglm"

    if (lm is None) == (model_args is None):
        raise ValueError("pass either model_args (lm-eval builds the model) or lm (a model from build_lm).")
    if lm is not None and (batch_size is not None or device is not None):
        raise ValueError("batch_size and device belong to build_lm when lm is given.")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as lm-eval's CLI does
    tracker = EvaluationTracker(output_path=str(output_path)) if output_path is not None else None
    results = lm_eval.simple_evaluate(
        model=lm if lm is not None else "biglm",
        model_args=model_args_string(model_args) if lm is None else None, tasks=list(tasks),
        task_manager=TaskManager(include_path=str(include_path) if include_path is not None else None,
                                 include_defaults=include_defaults),
        num_fewshot=num_fewshot, batch_size=batch_size, device=device, limit=limit,
        log_samples=log_samples, evaluation_tracker=tracker)
    if results is None:  # a non-zero rank under torchrun: rank 0 holds the results
        return {}
    samples = results.pop("samples", None)
    if tracker is not None:
        tracker.save_results_aggregated(results=results, samples=samples)
        for name in results.get("configs", {}) if samples else ():
            tracker.save_results_samples(task_name=name, samples=samples[name])
    if samples is not None:
        results["samples"] = samples
    return results


def run_suite(
    pretrained: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    scorer: str | None = None,
    model_args: dict[str, Any] | None = None,
    suite: str = "paper",
    only: str | list[str] | tuple[str, ...] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run the paper's zero-shot suite on the local data in ``data_dir`` (default `default_data_dir`)
    and return lm-eval's results dict, plus ``results["biglm_suite"]``: the paper table's ``header``
    and ``row`` and the ``missing`` columns (column -> the data file looked for).

    ``model_args`` adds further adapter options (e.g. ``{"mc_samples": 16}``); ``scorer`` None keeps the
    adapter's default; ``only`` restricts the suite to some columns (e.g. ``["PIQA", "ARC-E"]``).
    ``options`` are `evaluate`'s: ``limit``, ``num_fewshot``, ``batch_size``, ``device``, ``output_path``,
    ``log_samples``. Columns without data are skipped with a line on stderr naming the file.
    """
    if not Path(pretrained).exists():
        raise FileNotFoundError(f"no model at {pretrained}: pass a directory written by `biglm export` or save_pretrained.")
    args = {"pretrained": str(pretrained), **({"scorer": scorer} if scorer else {}), **(model_args or {})}
    data = Path(data_dir) if data_dir is not None else default_data_dir()
    with tempfile.TemporaryDirectory(prefix="biglm-suite-") as tmp:
        tasks, missing = write_suite_yamls(data_dir=data, out_dir=tmp, suite=suite, only=only)
        for column, path in missing.items():
            print(f"biglm eval: skipping {column}: data file not found: {path}", file=sys.stderr)
        results = evaluate(model_args=args, tasks=[t.task + LOCAL_SUFFIX for t in tasks], include_path=tmp,
                           include_defaults=False, **options)
    if results:
        header, row = suite_table(results, tasks=select_tasks(only))
        results["biglm_suite"] = {"header": header, "row": row, "missing": missing}
    return results


def setup_logging() -> None:
    """lm-eval's progress lines, as its own CLI shows them."""
    from lm_eval.utils import setup_logging as lm_eval_setup_logging

    lm_eval_setup_logging()


def results_tables(results: dict[str, Any]) -> str:
    """lm-eval's printed tables of a results dict: the tasks, then the groups when there are any."""
    from lm_eval.utils import make_table

    tables = [make_table(results)]
    if "groups" in results:
        tables.append(make_table(results, "groups"))
    return "\n".join(tables)
