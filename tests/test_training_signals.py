"""Stop signals in the one training loop (issue 50 item 1): a SIGINT/SIGTERM that lands in any phase of a step (its
forward, its log line, a tracker's log, an evaluation, a checkpoint being written, the last step) stops the run at
the step it announces, with that step's checkpoint, or says why it could not; the run then raises
`TrainingInterrupted` and `biglm` exits 130 (SIGINT) / 143 (SIGTERM). Pre-training and fine-tuning share the loop."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from conftest import tiny_train_config, train_losses
from test_finetune_loop import _cfg as finetune_cfg, _task, pretrained  # noqa: F401 - pretrained: a fixture

from biglm.checkpoint import checkpoint_dirs
from biglm.training import Trainer
from biglm.training import loop as loop_module
from biglm.training.distributed import DistInfo
from biglm.training.loop import TrainingInterrupted

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _cfg(data: Path, out: Path, **kw):
    return tiny_train_config(out, **{"data": {str(data / "shards"): 1.0}, "tokenizer": str(data / "tok"), "steps": 6,
                                     "save_every": 100, "eval_every": 3, "eval_windows": 8, **kw})


def _kill(sig: int) -> None:
    os.kill(os.getpid(), sig)  # a real signal: the loop's handler runs at once, in this (the main) thread


def _announced(said: list[str]) -> int:
    lines = [s for s in said if "received SIG" in s]
    assert len(lines) == 1, said
    return int(re.search(r"stopping after step (\d+)", lines[0]).group(1))


def _check_stopped(stop: pytest.ExceptionInfo, out: Path, said: list[str], sig: int) -> int:
    """The run stopped where it announced, with that step's checkpoint as the newest, every step logged once."""
    step = stop.value.step
    assert _announced(said) == step == stop.value.result.step
    assert stop.value.exit_code == 128 + sig and stop.value.signal == sig
    assert stop.value.result.interrupted
    newest = checkpoint_dirs(out)[-1]
    assert newest.name == f"step_{step:07d}" and stop.value.checkpoint == newest, (newest, said)
    assert any(f"stopped at step {step} (checkpoint {newest})" in s for s in said), said
    assert sorted(train_losses(out)) == list(range(1, step + 1))  # the stopping step's loss is logged, once
    return step


# each phase: how to set it up on a built trainer (sending the signal inside it), the step it stops after
def _in_forward(trainer, sig, monkeypatch):  # inside step 3's first forward: stops after step 3
    sent = []

    def hook(module, args, output):
        if trainer.step == 2 and not sent:
            sent.append(sig)
            _kill(sig)
        return output

    trainer.raw_model.model.layers[0].register_forward_hook(hook)
    return 3


def _in_log_line(trainer, sig, monkeypatch):  # while step 3's log line prints (the report): after step 3's decision, so step 4
    echo = trainer.echo

    def printing(text: str) -> None:
        echo(text)
        if text.startswith("step      3/"):
            _kill(sig)

    trainer.echo = printing
    return 4


def _in_tracker(trainer, sig, monkeypatch):  # inside a tracker's log of step 3 (tensorboard: in-process)
    from biglm.training.trackers import TensorBoardTracker

    original = TensorBoardTracker.log

    def log(self, scalars, step):
        original(self, scalars, step)
        if step == 3 and "log/lr" in scalars:
            _kill(sig)

    monkeypatch.setattr(TensorBoardTracker, "log", log)
    return 4


def _in_validation(trainer, sig, monkeypatch):  # during step 3's validation
    validate = trainer.validate

    def validating():
        if trainer.step == 3:
            _kill(sig)
        return validate()

    trainer.validate = validating
    return 4


def _in_checkpoint(trainer, sig, monkeypatch):  # while step 3's checkpoint is written (--save_every 3)
    save = trainer.checkpointer.save

    def saving(step, **kw):
        path = save(step, **kw)
        if step == 3:
            _kill(sig)
        return path

    trainer.checkpointer.save = saving
    return 4


def _after_last_step(trainer, sig, monkeypatch):  # while the last step's checkpoint is written: the run's end is the stop
    save = trainer.checkpointer.save

    def saving(step, **kw):
        path = save(step, **kw)
        if step == 6:
            _kill(sig)
        return path

    trainer.checkpointer.save = saving
    return 6


PHASES = {"forward": (_in_forward, {}), "log line": (_in_log_line, {}),
          "tracker": (_in_tracker, {"report_to": ["tensorboard"]}), "validation": (_in_validation, {}),
          "checkpoint": (_in_checkpoint, {"save_every": 3}), "after the last step": (_after_last_step, {})}


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_stop_signal_in_any_phase_of_a_step_writes_the_checkpoint_it_announces(synthetic_data, tmp_path, phase,
                                                                                 monkeypatch):
    """The report: SIGINT as the `step 6/12` line printed said "saving a checkpoint after this step", then "stopped at
    step 6", and no step-6 checkpoint existed (the save was decided before the log line, the flag read after)."""
    setup, kw = PHASES[phase]
    sig = signal.SIGTERM if phase in ("forward", "validation") else signal.SIGINT
    said: list[str] = []
    trainer = Trainer(_cfg(synthetic_data, tmp_path, **kw), info=SINGLE, echo=said.append)
    expected = setup(trainer, sig, monkeypatch)
    with pytest.raises(TrainingInterrupted) as stop:
        trainer.train()
    assert _check_stopped(stop, tmp_path, said, sig) == expected
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the loop's handlers are gone again

    if phase == "log line":  # the same command resumes after the stopping step and finishes the run
        result = Trainer(_cfg(synthetic_data, tmp_path, **kw), info=SINGLE, echo=lambda s: None).train()
        assert result.step == 6 and sorted(train_losses(tmp_path)) == [1, 2, 3, 4, 5, 6]


def test_a_checkpoint_that_cannot_be_written_is_said_and_the_run_still_stops(synthetic_data, tmp_path):
    said: list[str] = []
    trainer = Trainer(_cfg(synthetic_data, tmp_path, save_every=2), info=SINGLE, echo=said.append,
                      after_step=lambda loop, step: step == 3 and loop.request_stop(signal.SIGINT))
    save = trainer.checkpointer.save

    def full_disk(step, **kw):
        if step == 3:
            raise OSError(28, "No space left on device")
        return save(step, **kw)

    trainer.checkpointer.save = full_disk
    with pytest.raises(TrainingInterrupted) as stop:
        trainer.train()
    assert stop.value.step == 3 and stop.value.checkpoint is None and stop.value.exit_code == 130
    assert [d.name for d in checkpoint_dirs(tmp_path)] == ["step_0000002"]
    line = next(s for s in said if "could not write the checkpoint of step 3" in s)
    assert "No space left on device" in line and "a resume starts from step_0000002" in line
    assert any("stopped at step 3 (without its checkpoint)" in s for s in said), said


def test_the_announcement_never_breaks_a_print_it_interrupts(synthetic_data, tmp_path, capfd):
    """A signal that lands inside a print makes a print in the handler a reentrant call (Python's buffered streams
    raise RuntimeError there): the announcement goes to stderr's descriptor and the step goes on."""
    said: list[str] = []

    def echo(text: str) -> None:
        if "received SIG" in text:
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stdout>'>")
        said.append(text)

    trainer = Trainer(_cfg(synthetic_data, tmp_path), info=SINGLE, echo=echo,
                      after_step=lambda loop, step: step == 2 and _kill(signal.SIGINT))
    with pytest.raises(TrainingInterrupted) as stop:
        trainer.train()
    assert stop.value.step == 2 and checkpoint_dirs(tmp_path)[-1].name == "step_0000002"
    assert "[biglm] received SIGINT: stopping after step 2 with a checkpoint" in capfd.readouterr().err


def test_ranks_stop_together_when_only_another_rank_got_the_signal(synthetic_data, tmp_path, monkeypatch):
    """Under torchrun the stop is agreed over ranks (a host-side all-reduce): a rank that saw no signal stops at the
    same step and joins the collective save. The other rank's SIGTERM is simulated in the agreement."""
    said: list[str] = []
    trainer = Trainer(_cfg(synthetic_data, tmp_path), info=SINGLE, echo=said.append)
    monkeypatch.setattr(loop_module, "agree_max",
                        lambda value, group: max(value, signal.SIGTERM if trainer.step >= 4 else 0))
    with pytest.raises(TrainingInterrupted) as stop:
        trainer.train()
    assert stop.value.step == 4 and stop.value.exit_code == 143
    assert checkpoint_dirs(tmp_path)[-1].name == "step_0000004"


def test_agree_max_over_two_real_processes(tmp_path):
    """`host_group` + `agree_max` on a real 2-process gloo group: both ranks get the larger value. (The children
    load distributed.py alone: it imports only torch, and a whole biglm import would double the test's time.)"""
    import subprocess
    import sys

    source = Path(loop_module.__file__).with_name("distributed.py")
    code = (f"import importlib.util, json, sys; import torch.distributed as dist\n"
            f"spec = importlib.util.spec_from_file_location('d', {str(source)!r}); d = importlib.util.module_from_spec(spec)\n"
            f"sys.modules['d'] = d; spec.loader.exec_module(d); rank = int(sys.argv[1])\n"
            f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=rank, world_size=2)\n"
            f"group = d.host_group()\n"
            f"print(json.dumps([d.agree_max(15 if rank == 1 else 0, group=group), d.agree_max(0, group=group)]))\n"
            f"dist.destroy_process_group()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [json.loads(o.strip().splitlines()[-1]) for o in outs] == [[15, 0], [15, 0]]


# ------------------------------------------------------------------ the command: exit status 130 / 143
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_pretrain_command_exits_128_plus_the_signal_so_a_chain_stops(synthetic_data, tmp_path, monkeypatch,
                                                                        capsys, sig):
    """`biglm pretrain ... && biglm export ...` went on after Ctrl-C: the interrupted pretrain exited 0."""
    from biglm.cli import main

    record_step = Trainer.record_step

    def record(self, *args, **kw):
        record_step(self, *args, **kw)
        if self.step == 2:
            _kill(sig)

    monkeypatch.setattr(Trainer, "record_step", record)
    out = tmp_path / "run"
    code = main(["pretrain", "--data", str(synthetic_data / "shards"), "--tokenizer", str(synthetic_data / "tok"),
                 "--preset", "tiny", "--model.max_position_embeddings", "64", "--seq_len", "32", "--micro_batch", "4",
                 "--global_batch", "8", "--steps", "6", "--warmup_steps", "1", "--log_every", "1", "--eval_every", "0",
                 "--eval_windows", "8", "--save_every", "100", "--device", "cpu", "--compile", "no",
                 "--out_dir", str(out)])
    assert code == 128 + sig
    assert checkpoint_dirs(out)[-1].name == "step_0000003"
    assert "stopped at step 3" in capsys.readouterr().out


# ------------------------------------------------------------------ fine-tuning: the same loop
def test_finetune_stops_where_it_announces_with_its_checkpoint(pretrained, tmp_path):
    """A SIGTERM while fine-tuning's step-2 line prints (epochs of 6 steps: no checkpoint due before step 6)."""
    from biglm.finetune.loop import FineTuner

    said: list[str] = []

    def echo(text: str) -> None:
        said.append(text)
        if text.startswith("step      2/"):
            _kill(signal.SIGTERM)

    tuner = FineTuner(_task(pretrained), finetune_cfg(pretrained, tmp_path, epochs=1), info=SINGLE, echo=echo)
    with pytest.raises(TrainingInterrupted) as stop:
        tuner.train()
    assert _announced(said) == stop.value.step == 3 and stop.value.exit_code == 143
    assert checkpoint_dirs(tmp_path)[-1].name == "step_0000003"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3]
    assert not any(s.startswith("[biglm] best epoch") for s in said)  # finish() knows the run was cut short
