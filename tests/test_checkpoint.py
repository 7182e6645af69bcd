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
        (tmp_path / "config.json").write_text("{}")  # a run that wrote something: its lock file stays
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


# --- issue 37 items 11, 12: one shared loader refuses a tokenizer that is not the model's, and unreadable weights ---
def _model_dir(checkpoint: Path, tmp_path: Path, name: str = "m") -> Path:
    import shutil

    return Path(shutil.copytree(checkpoint, tmp_path / name))


def _one_line(argv: list[str], capsys) -> str:
    from biglm.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _swap_tokenizer(folder: Path, tok) -> None:
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / f).unlink(missing_ok=True)
    tok.save_pretrained(folder)


def test_a_tokenizer_that_does_not_fit_the_model_is_refused_in_one_line(checkpoint, tmp_path, capsys):
    """A 49,153-row model beside a 1,000-token tokenizer wrote garbage with exit 0 (issue 37 item 11): the loader
    every command shares refuses a tokenizer with more tokens than the embedding, another mask id, a special id past
    the embedding, or (a converted model) a fingerprint other than the one recorded at conversion."""
    import json

    from biglm.checkpoint import load_model
    from biglm.data.tokenizer import TokenizerError, train_tokenizer
    from biglm.model import BiGLMConfig

    texts = ["the quick brown fox jumps over the lazy dog", "pack my box with five dozen liquor jugs"] * 40
    vocab = BiGLMConfig.from_pretrained(checkpoint).vocab_size
    small = train_tokenizer(texts=texts, vocab_size=280)  # mask id 4, as the model's, but another mapping
    # a model whose mask token is its last row (as `biglm convert` adds it) beside a small biglm tokenizer
    bigger = _model_dir(checkpoint, tmp_path, "bigger")
    cfg = json.loads((bigger / "config.json").read_text())
    (bigger / "config.json").write_text(json.dumps({**cfg, "mask_token_id": vocab - 1}))
    with pytest.raises(TokenizerError, match=f"has mask id 4 but the model's is {vocab - 1}"):
        load_model(bigger)
    err = _one_line(["generate", str(bigger), "--prompt", "the cat"], capsys)
    assert "is not the model's tokenizer" in err and str(bigger) in err
    # more tokens than the embedding has rows
    many = _model_dir(checkpoint, tmp_path, "many")
    _swap_tokenizer(many, train_tokenizer(texts=[" ".join(f"w{i}x{j}" for j in range(60)) for i in range(60)],
                                          vocab_size=vocab + 200))
    with pytest.raises(TokenizerError, match=f"but the model's embedding has {vocab:,} rows"):
        load_model(many)
    # a special id past the embedding (a pad added after the model was saved)
    padded = _model_dir(checkpoint, tmp_path, "padded")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(padded)
    tok.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    _swap_tokenizer(padded, tok)
    cfg = json.loads((padded / "config.json").read_text())
    assert len(tok) == vocab + 1
    (padded / "config.json").write_text(json.dumps({**cfg, "vocab_size": vocab}))
    with pytest.raises(TokenizerError):
        load_model(padded)
    # the fingerprint `biglm convert` records: a same-size tokenizer with other ids is refused
    converted = _model_dir(checkpoint, tmp_path, "converted")
    from biglm.data.tokenizer import tokenizer_fingerprint

    (converted / "biglm_source.json").write_text(json.dumps(
        {"kind": "hub", "name": "org/x", "tokenizer_fingerprint": tokenizer_fingerprint(AutoTokenizer.from_pretrained(
            checkpoint))}))
    load_model(converted)  # its own tokenizer fits
    other = train_tokenizer(texts=texts, vocab_size=len(AutoTokenizer.from_pretrained(checkpoint)))
    _swap_tokenizer(converted, other)
    assert len(other) <= vocab and other.mask_token_id == BiGLMConfig.from_pretrained(converted).mask_token_id
    with pytest.raises(TokenizerError, match="maps text to other ids"):
        load_model(converted)


def test_a_model_without_a_tokenizer_says_where_it_looked(checkpoint, tmp_path, capsys):
    bare = _model_dir(checkpoint, tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / f).unlink(missing_ok=True)
    err = _one_line(["generate", str(bare), "--prompt", "the cat"], capsys)
    assert f"the model's tokenizer is missing: looked for tokenizer.json or tokenizer_config.json in {bare}" in err
    assert "sentencepiece" not in err


def test_truncated_weights_are_one_line_for_generate_serve_and_eval(checkpoint, tmp_path, capsys, monkeypatch):
    """A truncated model.safetensors ended generate, serve and eval in safetensors' traceback (issue 37 item 12):
    the shared loader says it in one line, for each command."""
    folder = _model_dir(checkpoint, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    said = f"the weights in {folder} (model.safetensors) cannot be read"
    for argv in (["generate", str(folder), "--prompt", "the cat"], ["serve", str(folder), "--port", "0"]):
        err = _one_line(argv, capsys)
        assert said in err and "truncated or damaged" in err, err
    from biglm.scoring.cli import main as eval_main

    capsys.readouterr()
    assert eval_main(["--model_args", f"pretrained={folder}", "--tasks", "piqa", "--limit", "1"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("biglm eval:")]
    assert len(err) == 1 and said in err[0], err


def test_eval_without_the_hub_says_lm_eval_fetches_the_data_and_how_to_use_local_files(checkpoint, capsys,
                                                                                        monkeypatch):
    """`biglm eval --tasks piqa` with no network ended in datasets' ConnectionError traceback."""
    import datasets

    def unreachable(path, *a, **k):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    from biglm.scoring.cli import main as eval_main

    capsys.readouterr()
    assert eval_main(["--model_args", f"pretrained={checkpoint}", "--tasks", "piqa", "--limit", "1"]) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.startswith("biglm eval:")]
    assert len(err) == 1 and "in dataset_module_factory" not in captured.err, captured.err  # (lm-eval's log aside)
    assert "lm-eval fetches each task's data from the Hugging Face Hub" in err[0]
    assert "Couldn't reach 'baber/piqa'" in err[0]
    assert "--suite paper --suite_tasks PIQA --data_dir DIR" in err[0] and "<data_dir>/baber__piqa/validation.jsonl" in err[0]


def test_a_lock_that_guarded_nothing_leaves_no_file_and_no_folder(tmp_path):
    """A run refused after taking its lock (issue 37 item 10) left OUT/run.lock, and OUT, behind: the lock removes
    the file and the folders it made when nothing else was written; a folder it did not make stays."""
    out = tmp_path / "runs" / "a"
    with RunLock(out):
        assert (out / "run.lock").is_file()
    assert not (tmp_path / "runs").exists()
    (tmp_path / "kept").mkdir()
    with RunLock(tmp_path / "kept"):
        pass
    assert (tmp_path / "kept").is_dir() and list((tmp_path / "kept").iterdir()) == []
    with RunLock(out):
        (out / "config.json").write_text("{}")
    assert (out / "run.lock").read_text() == "" and (out / "config.json").is_file()
    # an output file's lock: gone when the file was never written, kept (empty) beside a written one
    with RunLock.for_file(tmp_path / "gen" / "answers.jsonl"):
        pass
    assert not (tmp_path / "gen").exists()
    with RunLock.for_file(tmp_path / "gen" / "answers.jsonl"):
        (tmp_path / "gen" / "answers.jsonl").write_text("{}\n")
    assert (tmp_path / "gen" / "answers.jsonl.lock").is_file()


def test_a_lock_taken_on_a_file_removed_meanwhile_is_taken_again(tmp_path, monkeypatch):
    """Between a run's open and its flock, a refused run may remove the lock file: the lock must then be the new
    file at that path, or two runs would hold two inodes of one name."""
    import fcntl

    import biglm.checkpoint.lock as lock_module

    real_flock, swapped = fcntl.flock, []

    def flock(fd, op):
        if not swapped:  # the file this run opened is unlinked and a new one made before the flock lands
            swapped.append(os.fstat(fd).st_ino)
            (tmp_path / "run.lock").unlink()
            (tmp_path / "run.lock").write_text("")
        return real_flock(fd, op)

    monkeypatch.setattr(lock_module.fcntl, "flock", flock)
    (tmp_path / "config.json").write_text("{}")
    with RunLock(tmp_path) as held:
        assert os.fstat(held._fd).st_ino == os.stat(tmp_path / "run.lock").st_ino != swapped[0]
