"""Experiment trackers (``--report_to``): a tiny pre-training run logs to W&B (offline) and trackio (local), both read
back (W&B's offline ``.wandb`` record file parsed with wandb's own protobuf records; trackio's database through its
storage API) and equal to metrics.jsonl; a resume continues the same tracker runs; a missing package or a failing
tracker is one line and the run finishes."""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from conftest import tiny_train_config, train_losses
from test_finetune_loop import _cfg as finetune_cfg, _task, pretrained  # noqa: F401 - pretrained: a fixture

# trackio reads TRACKIO_DIR once, at import: point it at a temporary folder before anything imports it
if "trackio" not in sys.modules:
    os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="biglm-trackio-")

from biglm.training import Trainer  # noqa: E402
from biglm.training.distributed import DistInfo  # noqa: E402
from biglm.training.loop import TrainingInterrupted  # noqa: E402

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture
def offline(monkeypatch):
    """No network for either tracker: W&B offline, the hub offline."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)


def _cfg(data: Path, out: Path, **kw):
    return tiny_train_config(out, **{"data": {str(data / "shards"): 1.0}, "tokenizer": str(data / "tok"), "steps": 4,
                                     "eval_every": 2, "save_every": 2, **kw})


def wandb_records(path: Path) -> list:
    """The records of a W&B ``.wandb`` file (wandb's LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks
    with a 7-byte header each: CRC32, length, type FULL/FIRST/MIDDLE/LAST), as wandb's own protobuf ``Record``s."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, pos, pending, block = [], 7, b"", 32768
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # the block's trailer
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_runs(out: Path) -> list[dict]:
    """Each offline W&B run under ``out/wandb``, oldest first: its id, name, config and {key: {step: value}}."""
    runs = []
    for path in sorted((out / "wandb").glob("offline-run-*/run-*.wandb")):
        run = {"id": None, "name": None, "config": {}, "history": {}}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"], run["name"] = record.run.run_id, record.run.display_name
                run["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
            elif kind == "config":
                run["config"].update({u.key: json.loads(u.value_json) for u in record.config.update})
            elif kind == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                for key, value in row.items():
                    if not key.startswith("_"):
                        run["history"].setdefault(key, {})[row["_step"]] = value
        runs.append(run)
    return runs


def trackio_logs(project: str, run: str) -> list[dict]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run)


def _stop_at(step: int):
    def hook(loop, now: int) -> None:
        if now == step:
            loop.request_stop(signal.SIGINT)  # what SIGINT does: a checkpoint after this step, then stop
    return hook


def test_pretrain_reports_to_wandb_and_trackio_and_a_resume_continues_their_runs(synthetic_data, tmp_path, offline):
    project = f"biglm-test-{tmp_path.name}"
    out = tmp_path / "tiny-run"
    said: list[str] = []
    cfg = _cfg(synthetic_data, out, report_to=["wandb", "trackio"], project=project)
    with pytest.raises(TrainingInterrupted) as stop:
        Trainer(cfg, info=SINGLE, echo=said.append, after_step=_stop_at(2)).train()
    first = stop.value.result
    assert first.interrupted and first.step == 2
    state = json.loads((out / "trackers.json").read_text())
    second = Trainer(_cfg(synthetic_data, out, report_to=["wandb", "trackio"], project=project), info=SINGLE,
                     echo=said.append).train()
    assert second.step == 4 and not any("training goes on without" in s for s in said), said
    assert json.loads((out / "trackers.json").read_text()) == state  # the same tracker runs, resumed

    losses = train_losses(out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val_loss"] for r in rows if r["kind"] == "val"}
    assert sorted(losses) == [1, 2, 3, 4] and sorted(val) == [2, 4]

    # W&B: two offline segments of one run (the same id), named after the run directory, with the run's config
    runs = wandb_runs(out)
    assert len(runs) == 2 and {r["id"] for r in runs} == {state["wandb"]["id"]}
    assert {r["name"] for r in runs} == {"tiny-run"}
    assert runs[0]["config"]["steps"] == 4 and runs[0]["config"]["report_to"] == ["wandb", "trackio"]
    assert runs[0]["config"]["objective"]["name"] == cfg.objective.name
    logged: dict[str, dict[int, float]] = {}
    for run in runs:
        for key, by_step in run["history"].items():
            logged.setdefault(key, {}).update(by_step)
    assert logged["train/loss"] == losses
    assert logged["val/val_loss"] == val
    assert sorted(runs[0]["history"]["train/loss"]) == [1, 2] and sorted(runs[1]["history"]["train/loss"]) == [3, 4]

    # trackio: one run of that name in the project, resumed, holding the same scalars at the same steps
    assert {k: state["trackio"][k] for k in ("project", "name")} == {"project": project, "name": "tiny-run"}
    from trackio.sqlite_storage import SQLiteStorage

    assert SQLiteStorage.get_runs(project) == ["tiny-run"]
    logs = trackio_logs(project, "tiny-run")
    assert {r["step"]: r["train/loss"] for r in logs if "train/loss" in r} == losses
    assert {r["step"]: r["val/val_loss"] for r in logs if "val/val_loss" in r} == val
    assert SQLiteStorage.get_run_config(project, "tiny-run")["steps"] == 4


def test_a_resume_never_sends_a_tracker_a_step_twice(synthetic_data, tmp_path, offline):
    """Issue 50: trackio showed steps 5-6 twice after a resume from step 4. A run that crashed after logging step 3
    (its checkpoint: step 2) resumes at step 2 and takes step 3 again: TensorBoard purges it, and W&B and trackio,
    which cannot, are not sent it again (their runs hold it already, with the same value: an exact resume)."""
    project = f"biglm-test-{tmp_path.name}"
    out = tmp_path / "crashed-run"

    def crash(loop, step: int) -> None:
        if step == 4:
            raise RuntimeError("killed")

    cfg = dict(report_to=["wandb", "trackio", "tensorboard"], project=project, steps=6)
    with pytest.raises(RuntimeError, match="killed"):
        Trainer(_cfg(synthetic_data, out, **cfg), info=SINGLE, echo=lambda s: None, after_step=crash).train()
    assert sorted(train_losses(out)) == [1, 2, 3]
    Trainer(_cfg(synthetic_data, out, **cfg), info=SINGLE, echo=lambda s: None).train()
    losses = train_losses(out)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]

    logs = trackio_logs(project, "crashed-run")
    for key in ("train/loss", "log/loss", "log/lr"):
        steps = [r["step"] for r in logs if key in r]
        assert sorted(steps) == [1, 2, 3, 4, 5, 6], (key, steps)  # each step once
    assert {r["step"]: r["train/loss"] for r in logs if "train/loss" in r} == losses

    first, second = wandb_runs(out)
    for key in ("train/loss", "log/loss"):
        assert not set(first["history"][key]) & set(second["history"][key]), key
        assert sorted({**first["history"][key], **second["history"][key]}) == [1, 2, 3, 4, 5, 6]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(out / "tensorboard"))
    board.Reload()
    assert [e.step for e in board.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]


def test_a_missing_tracker_package_is_one_line_and_the_run_finishes(synthetic_data, tmp_path, offline, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    said: list[str] = []
    result = Trainer(_cfg(synthetic_data, tmp_path, report_to=["wandb", "tensorboard"]), info=SINGLE,
                     echo=said.append).train()
    assert result.step == 4 and sorted(train_losses(tmp_path)) == [1, 2, 3, 4]
    lines = [s for s in said if "--report_to" in s]
    assert lines == ["[biglm] --report_to wandb: the wandb package is not installed (pip install 'biglm[trackers]'); "
                     "training goes on without it"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))  # the other tracker still logged
    assert not (tmp_path / "wandb").exists()


def test_a_tracker_error_is_one_line_and_the_run_finishes(synthetic_data, tmp_path, offline, monkeypatch):
    from biglm.training import trackers

    def broken(self, scalars, step):
        if step == 2:
            raise ConnectionError("the server went away\nsecond line")
        self.writer.add_scalars("x", {}, step)

    monkeypatch.setattr(trackers.TensorBoardTracker, "log", broken)
    said: list[str] = []
    result = Trainer(_cfg(synthetic_data, tmp_path, report_to=["tensorboard"]), info=SINGLE, echo=said.append).train()
    assert result.step == 4 and sorted(train_losses(tmp_path)) == [1, 2, 3, 4]
    assert [s for s in said if "--report_to" in s] == [
        "[biglm] --report_to tensorboard: logging failed at step 2 (ConnectionError: the server went away); training "
        "goes on without it"]


def test_report_to_is_parsed_and_checked_where_it_enters(capsys):
    from biglm.config import ConfigError, parse_cli
    from biglm.training import TrainConfig
    from biglm.training.trackers import TRACKERS, resolve_report_to

    cfg = parse_cli(TrainConfig, ["--report_to", "wandb,trackio", "--data", "x"], prog="biglm pretrain")
    assert cfg.report_to == ["wandb", "trackio"] and cfg.trackers() == ["wandb", "trackio"]
    cfg = parse_cli(TrainConfig, ["--report_to", "wandb", "--tensorboard", "--data", "x"], prog="biglm pretrain")
    assert cfg.trackers() == ["wandb", "tensorboard"]
    assert resolve_report_to(["none"]) == [] and resolve_report_to([]) == []
    assert set(resolve_report_to(["all"])) <= set(TRACKERS) and "wandb" in resolve_report_to(["all"])
    with pytest.raises(ConfigError, match="'none' stands alone"):
        parse_cli(TrainConfig, ["--report_to", "wandb,none", "--data", "x"], prog="biglm pretrain").validate()
    with pytest.raises(SystemExit) as e:
        parse_cli(TrainConfig, ["--report_to", "wandbb", "--data", "x"], prog="biglm pretrain")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'wandb'" in err[0], err



def test_finetune_reports_to_wandb_the_same_scalars(pretrained, tmp_path, offline):
    from biglm.finetune.loop import FineTuner

    out = tmp_path / "ft-run"
    result = FineTuner(_task(pretrained), finetune_cfg(pretrained, out, epochs=1, report_to=["wandb"]), info=SINGLE,
                       echo=lambda s: None).train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (run,) = wandb_runs(out)
    assert run["name"] == "ft-run" and run["config"]["epochs"] == 1
    assert run["config"]["model"] == str(pretrained / "model")
    train = {r["step"]: r for r in rows if r["kind"] == "train"}
    assert len(train) == result.step and run["history"]["train/loss"] == {s: r["loss"] for s, r in train.items()}
    assert run["history"]["train/lr"] == {s: r["lr"] for s, r in train.items()}
    (evaluation,) = [r for r in rows if r["kind"] == "eval"]
    assert run["history"]["eval/accuracy"] == {evaluation["step"]: evaluation["accuracy"]}
