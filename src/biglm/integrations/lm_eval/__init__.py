"""lm-evaluation-harness: the ``biglm`` lm-eval model and everything that drives lm-eval.

- ``adapter``: `BiGLMLM`, registered with lm-eval as ``biglm`` when imported (lm-eval has no plugin discovery).
- ``yamls``: override YAMLs that point lm-eval's built-in tasks at local data (the paper suite, Table 5's
  MMLU and SuperGLUE).
- ``harness``: `evaluate` and `run_suite` through lm-eval's Python API; `build_lm` for several runs on one load.
- ``multitask``: `run_multitask`, Table 5's suite (lm-eval's MMLU and SuperGLUE, biglm's Genset).
- ``task_eval``: `TaskEvaluator`, the in-training zero-shot evaluator the training entry point injects.

biglm's own side of evaluation (estimators, the suite's columns and table, metrics, Genset) lives in
`biglm.scoring`; only this package imports ``lm_eval``. Importing it does not import lm-eval: each runner
imports it when it runs.
"""

from __future__ import annotations

from .harness import build_lm, evaluate, model_args_string, results_tables, run_suite, setup_logging
from .multitask import run_multitask
from .task_eval import TaskEvaluator, preserved_rng, zero_shot_evaluator
from .yamls import MultitaskPlan, tasks_root, write_multitask_yamls, write_suite_yamls

__all__ = ["MultitaskPlan", "TaskEvaluator", "build_lm", "evaluate", "model_args_string", "preserved_rng",
           "results_tables", "run_multitask", "run_suite", "setup_logging", "tasks_root", "write_multitask_yamls",
           "write_suite_yamls", "zero_shot_evaluator"]
