"""Checkpoint verification and run-directory locks below the training loops (the loops' own tests, exact resume
past a damaged checkpoint and a refused second run, are in test_training.py and test_finetune_loop.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from biglm.checkpoint import RunDirLockedError, RunLock

REPO = Path(__file__).resolve().parents[1]

TWO_RANKS = r'''
import json, sys
from pathlib import Path
import torch, torch.distributed as dist
from biglm.checkpoint import CheckpointError
from biglm.training.checkpoint import Checkpointer, hold_run_dir

dist.init_process_group("gloo")
rank, run = dist.get_rank(), Path(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(model.parameters())
ck = Checkpointer(run, keep_last=3)
for step in (1, 2):
    with torch.no_grad():
        model.weight.fill_(float(step))
    ck.save(step, model=model, optimizer=optimizer, extra={"step": step, "rank": rank})
dist.barrier()
if rank == 0:  # only rank 0 sees the damage: the others must still resume from what rank 0 chose
    shard = sorted((run / "checkpoints" / "step_0000002").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:10])
dist.barrier()
_, extra = ck.resume(model=model, optimizer=optimizer)
out = {"step": extra["step"], "rank": extra["rank"], "weight": model.weight[0, 0].item()}
try:
    with hold_run_dir(run):
        out["lock"] = "held"
except CheckpointError as e:
    out["lock"] = str(e)
(run / f"out{rank}.json").write_text(json.dumps(out))
dist.destroy_process_group()
'''


def test_two_ranks_agree_on_the_resume_checkpoint_and_on_a_refused_lock(tmp_path):
    """Under torchrun rank 0 verifies and chooses, every rank loads that checkpoint; rank 0 alone takes the lock and
    a refusal reaches every rank (none waits forever in a collective)."""
    run = tmp_path / "run"
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    with RunLock(run, command="biglm pretrain first"):  # the first run, still going
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29541",
               str(script), str(run)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "step_0000002 is damaged" in proc.stderr and "resuming from step_0000001" in proc.stderr
    outs = [json.loads((run / f"out{r}.json").read_text()) for r in (0, 1)]
    for rank, out in enumerate(outs):
        assert (out["step"], out["rank"], out["weight"]) == (1, rank, 1.0)
        assert f"pid {os.getpid()}" in out["lock"] and "biglm pretrain first" in out["lock"]


def test_run_lock_refuses_a_second_holder_and_is_reentrant_in_one_process(tmp_path):
    import fcntl

    with RunLock(tmp_path, command="biglm finetune x") as lock:
        info = json.loads(lock.path.read_text())
        assert info["pid"] == os.getpid() and info["command"] == "biglm finetune x" and info["host"]
        with RunLock(tmp_path):  # the CLI holds it and the loop takes it again
            pass
        # still held after the inner release: another open file description cannot take it
        fd = os.open(lock.path, os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    assert (tmp_path / "run.lock").read_text() == ""
    # a lock held through another open file description (as another process would) refuses, naming it
    fd = os.open(tmp_path / "run.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, json.dumps({"pid": 4242, "host": "node3", "started": "2026-11-25 10:00:00 UTC"}).encode(), 0)
    try:
        with pytest.raises(RunDirLockedError, match=r"in use by another run \(pid 4242 on node3, started 2026-11-25"):
            RunLock(tmp_path).acquire()
    finally:
        os.close(fd)
    notes: list[str] = []
    with RunLock(tmp_path, echo=notes.append):  # the holder is gone: its record stays, the lock is free
        pass
    assert len(notes) == 1 and "taking over" in notes[0] and "pid 4242 on node3" in notes[0]


def test_a_flex_model_loads_on_a_cpu_with_sdpa_and_the_same_logits(checkpoint, tmp_path):
    """A GPU run's FlexAttention model, loaded on a CPU, runs sdpa (FlexAttention's CPU path is uncompiled and slow):
    same logits under the BiGLM mask."""
    import torch
    from transformers import AutoTokenizer

    from biglm.checkpoint import load_model
    from conftest import save_random_model

    out = save_random_model(tmp_path / "flex", AutoTokenizer.from_pretrained(checkpoint), attn_backend="flex")
    model, tok = load_model(out)
    assert model.config.attn_backend == "sdpa"
    flex, _ = load_model(out)
    flex.config.attn_backend = "flex"
    ids = torch.randint(5, len(tok), (2, 10))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids, prefix_len=4).logits, flex(ids, prefix_len=4).logits, atol=1e-5, rtol=1e-5)
