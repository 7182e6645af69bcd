"""In-training zero-shot evaluation: it logs what `biglm eval` reports for the same checkpoint, it does not
change the training run (losses equal a run without it), and a killed and resumed run stays exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from biglm.checkpoint import checkpoint_dirs
from biglm.config import ConfigError
from biglm.integrations.lm_eval import zero_shot_evaluator
from biglm.training import Trainer, TrainConfig
from biglm.training.config import ModelArgs
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
REPO = Path(__file__).resolve().parents[1]
LIMIT = 6
TASKS = ["ARC-E", "PIQA"]  # ARC-Challenge (the default's other half) is one of the sets held out of ../shared/data


def _cfg(data: Path, out: Path, eval_dir: Path, **kw) -> TrainConfig:
    base = dict(name="t", out_dir=str(out), preset="tiny", model=ModelArgs(max_position_embeddings=128, hidden_dropout=0.1),
                data={str(data / "shards"): 1.0}, tokenizer=str(data / "tok"), seq_len=32, micro_batch=4, global_batch=8,
                steps=4, lr=3e-3, min_lr=3e-4, warmup_steps=1, log_every=1, eval_every=2, eval_windows=8, save_every=2,
                keep_last=5, eval_tasks_every=2, eval_tasks=TASKS, eval_tasks_limit=LIMIT, eval_tasks_data=str(eval_dir))
    base.update(kw)
    return TrainConfig(**base)


def _trainer(cfg: TrainConfig) -> Trainer:
    """A trainer with the zero-shot evaluator injected, as `biglm pretrain` builds it."""
    return Trainer(cfg, info=SINGLE, echo=lambda s: None, task_evaluator=zero_shot_evaluator(cfg, info=SINGLE))


def _records(out: Path, kind: str) -> dict[int, dict]:
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r["kind"] == kind}


def test_logged_scores_equal_biglm_eval_on_the_checkpoint(synthetic_data, shared_data, tmp_path):
    from biglm.integrations.lm_eval import run_suite
    from biglm.scoring.suite import select_tasks, suite_value

    out = tmp_path / "run"
    result = _trainer(_cfg(synthetic_data, out, shared_data / "eval")).train()
    logged = _records(out, "tasks")
    assert sorted(logged) == [2, 4] and [s for s, _ in result.task_scores] == [2, 4]
    assert logged[4]["tokens"] == 4 * 8 * 32
    for ckpt in checkpoint_dirs(out):
        step = int(ckpt.name.split("_")[1])
        results = run_suite(ckpt, data_dir=shared_data / "eval", only=TASKS, limit=LIMIT)
        values = {t.column: suite_value(results, t) for t in select_tasks(TASKS)}
        for column, value in values.items():
            assert logged[step][column] == value, (step, column)  # exact: same questions, scorer and weights
        assert logged[step]["avg"] == pytest.approx(sum(values.values()) / 2, abs=1e-12)
        se = results["results"]["arc_easy_local"]["acc_stderr,none"]
        assert logged[step]["ARC-E_stderr"] == se and 0 <= se < 1
    # the evaluation is real: its scores change as the weights do (random init vs trained differ somewhere)
    assert logged[2] != logged[4]


def test_training_is_unchanged_and_resume_exact(synthetic_data, shared_data, tmp_path):
    eval_dir = shared_data / "eval"
    plain = tmp_path / "plain"
    _trainer(_cfg(synthetic_data, plain, eval_dir, eval_tasks_every=0, steps=6, save_every=3)).train()
    full = tmp_path / "full"
    _trainer(_cfg(synthetic_data, full, eval_dir, steps=6, save_every=3)).train()
    a, b = _records(plain, "train"), _records(full, "train")
    assert all(a[s]["loss"] == b[s]["loss"] for s in range(1, 7))  # dropout RNG not disturbed by lm-eval's seeding
    assert {s: r["val_loss"] for s, r in _records(plain, "val").items()} == \
           {s: r["val_loss"] for s, r in _records(full, "val").items()}

    crashed = tmp_path / "crashed"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_cfg(synthetic_data, crashed, eval_dir, steps=6, save_every=3).to_dict()))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "biglm", "pretrain", str(recipe)]
    proc = subprocess.run(run, capture_output=True, text=True, env={**env, "BIGLM_FAULT_AFTER_STEP": "5"}, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 17, proc.stderr[-2000:]
    proc = subprocess.run(run, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resumed from" in proc.stdout and "zero-shot avg" in proc.stdout
    c = _records(crashed, "train")
    assert all(b[s]["loss"] == c[s]["loss"] for s in range(1, 7))
    full_tasks, crashed_tasks = _records(full, "tasks"), _records(crashed, "tasks")
    assert sorted(crashed_tasks) == [2, 4, 6] and crashed_tasks[6] == full_tasks[6]


def test_bad_settings_are_refused_before_training(synthetic_data, tmp_path):
    with pytest.raises(ConfigError, match="unknown suite task"):
        _cfg(synthetic_data, tmp_path, tmp_path, eval_tasks=["ARC-X"]).validate()
    with pytest.raises(ConfigError, match="eval_tasks_limit"):
        _cfg(synthetic_data, tmp_path, tmp_path, eval_tasks_limit=0).validate()
    with pytest.raises(ConfigError, match="eval_tasks_data"):  # no eval data there: named before step 1
        _trainer(_cfg(synthetic_data, tmp_path / "r", tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="needs the zero-shot evaluator"):  # asked for, not given: refused, not ignored
        Trainer(_cfg(synthetic_data, tmp_path / "r2", tmp_path / "nowhere"), info=SINGLE, echo=lambda s: None)
