"""In-training zero-shot evaluation (the paper's Fig. 3 metric): every K steps the current
model is scored on a fixed subset of zero-shot tasks (default ARC-Easy + ARC-Challenge) by exactly what
`biglm eval --suite paper` runs — the suite's override YAMLs on the local data, lm-eval's
``simple_evaluate`` and the ``biglm`` adapter with the same scorer — and the per-task metric and the
average go to metrics.jsonl (``kind: "tasks"``) and TensorBoard.

Why it cannot disturb a run: lm-eval reseeds Python's, NumPy's and torch's RNGs, so every RNG state is
saved before and restored after; the data sampler is not touched; the model goes back to train mode.
Under torchrun the unwrapped model is scored on rank 0 while the others wait (FSDP first gathers a full
copy of the weights onto rank 0: `biglm.training.distributed.full_model_on_rank0`), so the value does not
depend on the number of ranks.

The training entry point builds the evaluator and hands it to the trainer: training itself imports no
lm-eval.
"""

from __future__ import annotations

import contextlib
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...config import ConfigError


class TaskEvaluator:
    """Scores a model in memory on a fixed zero-shot subset. Construct once per run (writes the task
    YAMLs into ``work_dir`` and indexes lm-eval's tasks once); call `evaluate` every K steps."""

    def __init__(self, *, tasks: list[str], data_dir: str | Path, limit: int | None, scorer: str,
                 work_dir: Path) -> None:
        from ...scoring.suite import select_tasks
        from .yamls import write_suite_yamls

        try:
            chosen = select_tasks(tasks)
            written, missing = write_suite_yamls(data_dir=data_dir, out_dir=work_dir, only=tasks)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"--eval_tasks: {e} (--eval_tasks_data names the data folder)") from None
        if missing:  # a fixed subset: every chosen task must run, or the average would change meaning
            raise ConfigError("--eval_tasks: no data for " + "; ".join(f"{c} ({p})" for c, p in missing.items())
                              + ": set --eval_tasks_data to the eval data folder, or drop those tasks")
        self.tasks = [t for t in chosen if t in written]
        self.limit, self.scorer = limit, scorer
        self.work_dir = work_dir
        self._task_manager = None

    @property
    def task_manager(self):
        if self._task_manager is None:
            from lm_eval.tasks import TaskManager

            # the suite YAMLs include lm-eval's own by absolute path: lm-eval's index is not needed (~15-50 s)
            self._task_manager = TaskManager(include_path=str(self.work_dir), include_defaults=False)
        return self._task_manager

    def evaluate(self, *, model: torch.nn.Module, tokenizer: Any) -> dict[str, float]:
        """``{"avg": mean, COLUMN: value, COLUMN_stderr: se, ...}`` (fractions) for ``model`` in memory; every
        RNG state and the model's train/eval mode are as before on return."""
        import lm_eval

        from ...scoring.suite import LOCAL_SUFFIX, suite_value
        from .adapter import BiGLMLM

        was_training = model.training
        model.eval()
        try:
            with preserved_rng(), _quiet_lm_eval():
                lm = BiGLMLM.from_model(model=model, tokenizer=tokenizer, scorer=self.scorer)
                results = lm_eval.simple_evaluate(model=lm, tasks=[t.task + LOCAL_SUFFIX for t in self.tasks],
                                                  task_manager=self.task_manager, limit=self.limit, log_samples=False)
        finally:
            model.train(was_training)
        out: dict[str, float] = {}
        for t in self.tasks:
            value = suite_value(results, t)
            if value is None:
                raise RuntimeError(f"in-training evaluation: {t.task} returned no {t.metric}")
            out[t.column] = value
            se = results["results"][t.task + LOCAL_SUFFIX].get(f"{t.metric}_stderr,none")
            if isinstance(se, (int, float)):
                out[f"{t.column}_stderr"] = float(se)
        out["avg"] = sum(out[t.column] for t in self.tasks) / len(self.tasks)
        return out


@contextlib.contextmanager
def preserved_rng():
    """Python, NumPy, torch CPU and (when present) every CUDA RNG state, restored on exit."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def _quiet_lm_eval():
    """lm-eval logs every task build at INFO; a training log keeps its own one line per evaluation."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def zero_shot_evaluator(cfg: Any, *, info: Any = None) -> TaskEvaluator | None:
    """The in-training zero-shot evaluator a `TrainConfig`'s --eval_tasks_every asks for (lm-eval's, as `biglm eval` scores), built
    where it is injected into the trainer; None when the run has none or on ranks other than 0 (which only gather
    and wait). Bad task names or missing data are refused here, before any model work."""
    if not cfg.eval_tasks_every or (info is not None and not info.is_main):
        return None
    from ...scoring.suite import default_data_dir

    return TaskEvaluator(tasks=cfg.eval_tasks, data_dir=cfg.eval_tasks_data or default_data_dir(),
                         limit=cfg.eval_tasks_limit, scorer=cfg.eval_tasks_scorer, work_dir=cfg.output_dir / "eval_tasks")
