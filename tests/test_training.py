"""The trainer: exact resume after a crash, atomic checkpoints, signals, non-finite loss, torchrun, recipes."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_config, train_losses
import yaml

from biglm.config import ConfigError
from biglm.training.config import ModelArgs
from biglm.training import (
    RECIPES,
    NonFiniteLossError,
    Trainer,
    TrainConfig,
    get_recipe,
    lr_at,
)
from biglm.checkpoint import CheckpointError, checkpoint_dirs, export_checkpoint
from biglm.training.distributed import DistInfo
from biglm.training.loop import TrainingInterrupted

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A 512-token tokenizer and train/val shards of the first 200 kB of the built-in corpus (the Python
    installation's own docs: present wherever the tests run, no shared data needed)."""
    from biglm.data import prepare, train_tokenizer

    root = tmp_path_factory.mktemp("data")
    text = _corpus()[:200_000]
    (root / "corpus.txt").write_text(text)
    tok_dir = root / "tokenizer"
    train_tokenizer(texts=text.split("\n\n"), vocab_size=512, out_dir=str(tok_dir))
    prepare(sources=[str(root / "corpus.txt")], tokenizer=str(tok_dir), out_dir=root / "shards", val_docs=40,
            workers=1, progress=False)
    return root / "shards", tok_dir


def _corpus() -> str:
    from biglm.data import builtin_corpus

    return "\n\n".join(builtin_corpus())


def _cfg(prepared, out: Path, **kw) -> TrainConfig:
    shards, tok = prepared
    return tiny_train_config(out, **{"data": {str(shards): 1.0}, "tokenizer": str(tok), **kw})


_losses = train_losses


def _run_cli(args: list[str], env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "biglm", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


def test_loss_decreases_and_checkpoints(prepared, tmp_path):
    result = Trainer(_cfg(prepared, tmp_path, steps=12, lr=1e-2), info=SINGLE, echo=lambda s: None).train()
    losses = [l for _, l in result.losses]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    assert [s for s, _ in result.val_losses] == [3, 6, 9, 12]
    assert [d.name for d in checkpoint_dirs(tmp_path)] == ["step_0000006", "step_0000009", "step_0000012"]
    assert (tmp_path / "config.json").exists() and (tmp_path / "tokenizer" / "tokenizer.json").exists()


def test_killed_and_resumed_run_matches_uninterrupted(prepared, tmp_path):
    full = tmp_path / "full"
    Trainer(_cfg(prepared, full), info=SINGLE, echo=lambda s: None).train()
    crashed = tmp_path / "crashed"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_cfg(prepared, crashed).to_dict()))
    # a hard kill after step 4: the checkpoint of step 3 is the last one
    proc = _run_cli(["pretrain", str(recipe)], env_extra={"BIGLM_FAULT_AFTER_STEP": "4"})
    assert proc.returncode == 17, proc.stderr
    assert [d.name for d in checkpoint_dirs(crashed)] == ["step_0000003"]
    proc = _run_cli(["pretrain", str(recipe)])
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout
    a, b = _losses(full), _losses(crashed)
    for step in range(1, 7):
        assert a[step] == b[step], (step, a[step], b[step])  # exact, step for step


def test_interrupted_save_keeps_previous_checkpoint(prepared, tmp_path, monkeypatch):
    trainer = Trainer(_cfg(prepared, tmp_path, steps=3), info=SINGLE, echo=lambda s: None)
    trainer.train()
    before = checkpoint_dirs(tmp_path)
    assert [d.name for d in before] == ["step_0000003"]
    files_before = sorted(p.name for p in before[0].iterdir())

    import biglm.training.checkpoint as ck

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.torch, "save", full_disk)
    trainer.step = 4
    with pytest.raises(CheckpointError, match=r"no space left on device.*step_0000003 is intact"):
        trainer.save()
    assert checkpoint_dirs(tmp_path) == before
    assert sorted(p.name for p in before[0].iterdir()) == files_before
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))  # partial files removed
    monkeypatch.undo()
    # a kill half-way through a save leaves a .tmp directory: the next start removes it, the old one loads
    partial = tmp_path / "checkpoints" / ".tmp-step_0000005"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half")
    t2 = Trainer(_cfg(prepared, tmp_path, steps=3), info=SINGLE, echo=lambda s: None)
    assert t2.maybe_resume() and t2.step == 3
    assert not partial.exists()


def _truncate_shard(ckpt: Path) -> Path:
    shard = next(ckpt.glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # as a disk that filled up or a copy cut short leaves it
    return shard


def test_damaged_newest_checkpoint_is_skipped_and_resume_is_exact(prepared, tmp_path, capsys):
    full = Trainer(_cfg(prepared, tmp_path / "full"), info=SINGLE, echo=lambda s: None).train()
    run = tmp_path / "run"
    Trainer(_cfg(prepared, run), info=SINGLE, echo=lambda s: None).train()
    assert [d.name for d in checkpoint_dirs(run)] == ["step_0000003", "step_0000006"]
    meta = json.loads((run / "checkpoints" / "step_0000006" / "meta.json").read_text())
    assert {"bytes", "sha256"} <= set(meta["files"]["rank00000.pt"])  # the manifest written at save time
    _truncate_shard(run / "checkpoints" / "step_0000006")
    capsys.readouterr()
    resumed = Trainer(_cfg(prepared, run), info=SINGLE, echo=lambda s: None)
    result = resumed.train()
    err = capsys.readouterr().err
    assert "warning: checkpoint" in err and "step_0000006 is damaged" in err and "resuming from step_0000003" in err
    assert [s for s, _ in result.losses] == [4, 5, 6]
    assert result.losses == [(s, l) for s, l in full.losses if s > 3]  # exact, step for step
    assert result.val_losses[-1] == full.val_losses[-1]
    # the damaged one is kept aside for inspection, out of resume/pruning/export; a fresh step 6 replaced it
    assert (run / "checkpoints" / "corrupt-step_0000006").is_dir()
    assert [d.name for d in checkpoint_dirs(run)] == ["step_0000003", "step_0000006"]
    # a flipped byte of the same size is caught by the checksum
    from biglm.checkpoint import verify_checkpoint

    shard = next((run / "checkpoints" / "step_0000006").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "does not match the sha256" in verify_checkpoint(shard.parent)
    assert verify_checkpoint(shard.parent, checksums=False) is None


def test_no_intact_checkpoint_is_refused_in_one_line(prepared, tmp_path):
    Trainer(_cfg(prepared, tmp_path), info=SINGLE, echo=lambda s: None).train()
    for ckpt in checkpoint_dirs(tmp_path):
        _truncate_shard(ckpt)
    with pytest.raises(CheckpointError) as e:
        Trainer(_cfg(prepared, tmp_path), info=SINGLE, echo=lambda s: None).train()
    message = str(e.value)
    assert "no intact checkpoint" in message and "\n" not in message
    assert "step_0000006: __0_0.distcp has" in message and "step_0000003: " in message
    assert [d.name for d in checkpoint_dirs(tmp_path)] == ["step_0000003", "step_0000006"]  # nothing moved


def test_pruning_keeps_the_checkpoint_just_written(prepared, tmp_path):
    """Damaged checkpoints of higher step numbers (never resumed past) do not push the new one out."""
    Trainer(_cfg(prepared, tmp_path, steps=3, keep_last=1), info=SINGLE, echo=lambda s: None).train()
    root = tmp_path / "checkpoints"
    for step in (7, 8):  # numbered after any the next run writes
        shutil.copytree(root / "step_0000003", root / f"step_{step:07d}")
        _truncate_shard(root / f"step_{step:07d}")
    trainer = Trainer(_cfg(prepared, tmp_path, steps=3, keep_last=1), info=SINGLE, echo=lambda s: None)
    trainer.step = 4
    trainer.save()
    assert (root / "step_0000004").is_dir()


def _hold_lock_in_subprocess(run_dir: Path) -> subprocess.Popen:
    """Another process that holds ``run_dir``'s lock the way a running `biglm pretrain` does."""
    code = ("import sys, time; from biglm.checkpoint import RunLock; "
            "RunLock(sys.argv[1], command='biglm pretrain other').acquire(); print('locked', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_run_in_the_same_directory_is_refused(prepared, tmp_path, capsys):
    import socket

    from biglm.checkpoint import RunDirLockedError
    from biglm.training.cli import main as pretrain_main

    run = tmp_path / "run"
    holder = _hold_lock_in_subprocess(run)
    try:
        with pytest.raises(RunDirLockedError) as e:
            Trainer(_cfg(prepared, run), info=SINGLE, echo=lambda s: None).train()
        message = str(e.value)
        assert f"pid {holder.pid} on {socket.gethostname()}, started " in message and "biglm pretrain other" in message
        assert "\n" not in message
        assert not (run / "checkpoints").exists()  # it trained nothing
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(yaml.safe_dump(_cfg(prepared, run).to_dict()))
        assert pretrain_main([str(recipe)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"pid {holder.pid}" in err and "in use by another run" in err
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_of_a_dead_process_is_taken_over(prepared, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "run.lock").write_text(json.dumps({"pid": dead.pid, "host": "node7", "started": "2026-01-01 00:00:00 UTC",
                                                   "command": "biglm pretrain crashed"}))
    said: list[str] = []
    result = Trainer(_cfg(prepared, tmp_path, steps=1), info=SINGLE, echo=said.append).train()
    assert result.step == 1
    assert any("taking over the lock" in s and f"pid {dead.pid} on node7" in s for s in said), said
    assert (tmp_path / "run.lock").read_text() == ""  # released cleanly: the next run takes nothing over
    said.clear()
    Trainer(_cfg(prepared, tmp_path, steps=1), info=SINGLE, echo=said.append).train()
    assert not any("taking over" in s for s in said)


def test_sigterm_saves_and_stops(prepared, tmp_path):
    def hook(trainer, step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(TrainingInterrupted) as stop:
        Trainer(_cfg(prepared, tmp_path, save_every=100), info=SINGLE, after_step=hook, echo=lambda s: None).train()
    result = stop.value.result
    assert result.interrupted and result.step == 2 and stop.value.exit_code == 143
    assert [d.name for d in checkpoint_dirs(tmp_path)] == ["step_0000002"]


def test_non_finite_loss_stops_without_touching_checkpoints(prepared, tmp_path):
    def stop_at_3(loop, step):  # an 8-step run stopped after step 3 (as SIGTERM does): a resume keeps its schedule
        if step == 3:
            loop.request_stop(signal.SIGTERM)

    with pytest.raises(TrainingInterrupted):
        Trainer(_cfg(prepared, tmp_path, steps=8), info=SINGLE, echo=lambda s: None, after_step=stop_at_3).train()
    ckpt = checkpoint_dirs(tmp_path)[0]
    assert ckpt.name == "step_0000003"
    stamp = {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()}

    trainer = Trainer(_cfg(prepared, tmp_path, steps=8, save_every=1), info=SINGLE, echo=lambda s: None)

    def nan_output(module, args, output):  # the 5th optimizer step (trainer.step == 4) produces NaN activations
        return output * float("nan") if trainer.step == 4 else output

    trainer.raw_model.model.layers[0].mlp.register_forward_hook(nan_output)
    with pytest.raises(NonFiniteLossError, match="at step 4.*untouched"):
        trainer.train()
    assert [d.name for d in checkpoint_dirs(tmp_path)][-1] == "step_0000004"  # nothing saved after the failure
    assert all(torch.isfinite(p).all() for p in trainer.raw_model.parameters())  # no update was applied
    assert all(torch.isfinite(v).all() for k, v in _load_weights(checkpoint_dirs(tmp_path)[-1]).items())
    assert {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()} == stamp


def _load_weights(ckpt: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = ckpt.parent.parent / "weights.pt"
    dcp_to_torch_save(str(ckpt), str(out))
    return {k: v for k, v in torch.load(out, weights_only=False)["model"].items()}


def test_resume_with_changed_shape_is_refused(prepared, tmp_path):
    Trainer(_cfg(prepared, tmp_path, steps=3), info=SINGLE, echo=lambda s: None).train()
    bigger = _cfg(prepared, tmp_path, steps=3, model=ModelArgs(max_position_embeddings=64, hidden_size=128))
    with pytest.raises(CheckpointError, match="different model shape.*hidden_size: checkpoint 64 vs now 128"):
        Trainer(bigger, info=SINGLE, echo=lambda s: None).train()


def test_export_loads_with_auto_class(prepared, tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    trainer = Trainer(_cfg(prepared, tmp_path / "run", steps=3), info=SINGLE, echo=lambda s: None)
    trainer.train()
    out = export_checkpoint(tmp_path / "run", tmp_path / "hf")
    model = AutoModelForMaskedLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.mask_token_id == model.config.mask_token_id
    ids = torch.randint(5, len(tok), (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, prefix_len=8).logits, trainer.raw_model.eval()(ids, prefix_len=8).logits)


def test_export_in_bfloat16_is_what_loading_gives_by_default(prepared, tmp_path):
    """`biglm export --dtype bfloat16`: the floating weights are written in bf16 and config.json says so, so
    `load_model` (generate, serve) loads bf16 without being told; the weights are the fp32 ones rounded."""
    import json

    from biglm.checkpoint import load_model

    trainer = Trainer(_cfg(prepared, tmp_path / "run", steps=3), info=SINGLE, echo=lambda s: None)
    trainer.train()
    fp32 = export_checkpoint(tmp_path / "run", tmp_path / "fp32")
    bf16 = export_checkpoint(tmp_path / "run", tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((bf16 / "config.json").read_text())["dtype"] == "bfloat16"
    assert (bf16 / "model.safetensors").stat().st_size < 0.6 * (fp32 / "model.safetensors").stat().st_size
    full, _ = load_model(fp32)
    half, _ = load_model(bf16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    for (name, a), (_, b) in zip(full.state_dict().items(), half.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16), b), name
    with pytest.raises(ValueError, match="float64.*choose one of float32, bfloat16, float16"):
        export_checkpoint(tmp_path / "run", tmp_path / "bad", dtype="float64")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(global_batch=10), "global_batch=10 is not divisible by micro_batch=4"),
        (dict(seq_len=128), "seq_len=128 is longer than the model's max_position_embeddings=64"),
        (dict(data={"/nonexistent/shards": 1.0}), "biglm data prepare"),
    ],
)
def test_bad_settings(prepared, tmp_path, kw, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        Trainer(_cfg(prepared, tmp_path, **kw), info=SINGLE, echo=lambda s: None)


def test_shard_from_another_tokenizer_is_refused(prepared, tmp_path):
    from biglm.data import ShardError, train_tokenizer

    other = tmp_path / "other_tok"
    train_tokenizer(texts=["completely different text corpus here"] * 50, vocab_size=300, out_dir=str(other))
    with pytest.raises(ShardError, match="tokenizer"):
        Trainer(_cfg(prepared, tmp_path / "run", tokenizer=str(other)), info=SINGLE, echo=lambda s: None)
    # same vocabulary size, different merges: refused by the fingerprint, not just the size
    same_size = tmp_path / "same_size_tok"
    text = _corpus()[200_000:400_000]
    train_tokenizer(texts=text.split("\n\n"), vocab_size=512, out_dir=str(same_size))
    with pytest.raises(ShardError, match="different tokenizer"):
        Trainer(_cfg(prepared, tmp_path / "run2", tokenizer=str(same_size)), info=SINGLE, echo=lambda s: None)


@pytest.mark.parametrize("parallel, port", [("ddp", 29517), ("fsdp", 29518)])
def test_torchrun_two_processes_match_one(prepared, tmp_path, parallel, port):
    one = tmp_path / "one"
    Trainer(_cfg(prepared, one, steps=4, eval_every=0, save_every=4), info=SINGLE, echo=lambda s: None).train()
    two = tmp_path / "two"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(_cfg(prepared, two, steps=4, eval_every=0, save_every=4, parallel=parallel).to_dict()))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", "biglm", "pretrain", str(recipe)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    a, b = _losses(one), _losses(two)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for s in a:
        assert b[s] == pytest.approx(a[s], rel=1e-4, abs=1e-5), (s, a[s], b[s])
    assert [d.name for d in checkpoint_dirs(two)] == ["step_0000004"]
    assert (checkpoint_dirs(two)[0] / "rank00001.pt").exists()


def test_schedules():
    kw = dict(lr=1.0, min_lr=0.1, total_steps=100, warmup_steps=10)
    assert lr_at(0, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(9, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(55, schedule="cosine", **kw) == pytest.approx(0.55)
    assert lr_at(100, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(50, schedule="wsd", anneal_steps=20, **kw) == 1.0
    assert lr_at(79, schedule="wsd", anneal_steps=20, **kw) == 1.0
    assert lr_at(89, schedule="wsd", anneal_steps=20, **kw) == pytest.approx(0.55)
    assert lr_at(99, schedule="wsd", anneal_steps=20, **kw) == pytest.approx(0.1)
    assert lr_at(99, schedule="wsd", anneal_steps=0, **kw) == 1.0


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_builds(name):
    """Each recipe parses, validates, and builds its model (on the meta device), objective and schedule."""
    from biglm import BiGLMConfig, BiGLMForMaskedLM
    cfg = get_recipe(name)
    if name == "default":  # the built-in CPU demo, not a paper recipe
        assert cfg.data == {"builtin": 1.0} and cfg.preset == "tiny"
        return
    if cfg.requires_init:  # continued pre-training (tests/test_init_from.py): the shape comes from --init_from
        with pytest.raises(ConfigError, match="--init_from"):
            cfg.validate()
        dataclasses.replace(cfg, init_from="runs/source").validate()
        dataclasses.replace(get_recipe(name, local=True), init_from="runs/source").validate()
        return
    if name.startswith("table1-micro-"):  # Table 1 at CPU scale: the three differ in the objective only
        base = get_recipe("table1-micro-biglm")
        assert cfg.objective.name == {"biglm": "biglm", "no-attn": "biglm-no-attn", "mlm": "mlm", "blocks": "biglm-blocks"}[name[13:]]
        assert dataclasses.replace(cfg, name=base.name, objective=base.objective) == base
        cfg.validate()
        return
    cfg.validate(world_size=8)
    assert cfg.seq_len == 2048 and cfg.global_batch == 1024
    config = BiGLMConfig.from_preset(cfg.preset, **cfg.model.overrides())
    with torch.device("meta"):
        model = BiGLMForMaskedLM(config)
    assert sum(p.numel() for p in model.parameters()) > 50e6
    assert 0 < lr_at(cfg.steps - 1, schedule=cfg.schedule, lr=cfg.lr, min_lr=cfg.min_lr, total_steps=cfg.steps,
                     warmup_steps=cfg.warmup_steps, anneal_steps=cfg.anneal_steps) <= cfg.lr
    local = get_recipe(name, local=True)
    assert local.steps < cfg.steps and local.global_batch < cfg.global_batch


def test_paper_recipe_values():
    t8 = get_recipe("table8-betax-0.3-0.5")
    assert t8.objective.prefix_ratio_range == pytest.approx((0.3, 0.5))
    final = get_recipe("biglm-360m")
    assert (final.steps, final.anneal_steps, final.lr, final.min_lr) == (300_000, 60_000, 6e-4, 6e-5)
    assert get_recipe("table2-wsd-rawdata").anneal_steps == 5000
    assert get_recipe("table2-wsd-rawdata-plus").anneal_steps == 10_000
    assert get_recipe("table1-mlm").objective.name == "mlm" and not get_recipe("table1-mlm").objective.decompose
    assert get_recipe("table2-wsd-syndata").anneal_data == {"data/cosmopedia-v2": 1.0}


def test_tensorboard_and_jsonl_metrics(prepared, tmp_path):
    pytest.importorskip("tensorboard")
    Trainer(_cfg(prepared, tmp_path, steps=2, tensorboard=True, eval_every=2), info=SINGLE, echo=lambda s: None).train()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in rows}
    assert kinds == {"train", "log", "val"}
    log = [r for r in rows if r["kind"] == "log"][-1]
    assert log["tokens"] == 2 * 8 * 32 and log["tokens_per_s"] > 0 and "eta_s" in log


def test_generate_and_load_from_a_run_directory(prepared, tmp_path, capsys):
    from biglm.generation.cli import main as generate_main
    from biglm.checkpoint import load_model

    trainer = Trainer(_cfg(prepared, tmp_path, steps=2), info=SINGLE, echo=lambda s: None)
    trainer.train()
    model, tok = load_model(tmp_path)
    ids = torch.randint(5, len(tok), (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, prefix_len=4).logits, trainer.raw_model.eval()(ids, prefix_len=4).logits)
    capsys.readouterr()
    assert generate_main([str(tmp_path), "--prompt", "KING HENRY:", "--max-new-tokens", "6", "--steps", "2"]) == 0
    assert "### prompt 1" in capsys.readouterr().out


def test_forward_backward_makes_no_host_sync(synthetic_data, tmp_path):
    """Hot path (issue 7): after the step's masks are drawn (where syncs stall nothing), a micro-batch's forward,
    loss and backward select masked positions by index: no boolean indexing, nonzero or .item()."""
    from torch.utils._python_dispatch import TorchDispatchMode

    syncing = {"aten.nonzero.default", "aten._local_scalar_dense.default", "aten.masked_select.default"}

    class SyncLog(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bad = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            bool_index = name == "aten.index.Tensor" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) if i is not None)
            if name in syncing or bool_index:
                self.bad.append(name)
            return func(*args, **(kwargs or {}))

    cfg = TrainConfig(name="t", out_dir=str(tmp_path), preset="tiny", model=ModelArgs(max_position_embeddings=64),
                      data={str(synthetic_data / "shards"): 1.0}, tokenizer=str(synthetic_data / "tok"), seq_len=32,
                      micro_batch=4, global_batch=8, steps=3, warmup_steps=1, eval_windows=8)
    trainer = Trainer(cfg, info=SINGLE, echo=lambda s: None)
    trainer.raw_model.model.validate_inputs = False  # the first micro-batch's input check is the one allowed sync
    original = trainer.forward_backward
    logs = []

    def watched(*args, **kwargs):
        with SyncLog() as log:
            out = original(*args, **kwargs)
        logs.append(log.bad)
        return out

    trainer.forward_backward = watched
    trainer.train_step()
    assert len(logs) == 2 and logs == [[], []], logs


def test_preset_on_the_command_line_is_the_shape(prepared, tmp_path):
    """`biglm pretrain --preset P` trains P's shape: the recipe's own shape fields (the default's 4 x 192) give way,
    its dropouts stay, and --model.FIELD on the same command line still changes the preset."""
    from biglm.model.config import PRESETS, BiGLMConfig, count_parameters
    from biglm.training.cli import resolve_config

    shards, tok = prepared
    cfg = resolve_config(["--preset", "tiny", "--data", str(shards), "--tokenizer", str(tok), "--out_dir",
                          str(tmp_path), "--seq_len", "32", "--global_batch", "4", "--micro_batch", "4",
                          "--eval_windows", "4", "--steps", "1", "--warmup_steps", "0"])
    trainer = Trainer(cfg, info=SINGLE, echo=lambda s: None)
    shape = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    assert {k: getattr(trainer.model_config, k) for k in shape} == {k: PRESETS["tiny"][k] for k in shape}
    assert trainer.n_params == count_parameters(BiGLMConfig.from_preset(
        "tiny", vocab_size=trainer.model_config.vocab_size, max_position_embeddings=256))

    big = resolve_config(["--preset", "biglm-124m"])
    built = BiGLMConfig.from_preset(big.preset, vocab_size=49152, **big.model.overrides())
    assert count_parameters(built)["total"] == count_parameters(BiGLMConfig.from_preset("biglm-124m",
                                                                                          vocab_size=49152))["total"]
    six = resolve_config(["--preset", "biglm-124m", "--model.num_hidden_layers", "6"])
    assert (six.model.num_hidden_layers, six.model.hidden_size) == (6, None)  # 6 layers of the preset's 768
    kept = resolve_config(["table1-biglm", "--preset", "biglm-136m"])
    assert (kept.model.hidden_dropout, kept.model.attention_dropout) == (0.1, 0.1)


@pytest.mark.parametrize("case", ["tokenizer-missing", "tokenizer-empty", "data-missing", "device"])
def test_refused_pretrain_leaves_no_run_directory(prepared, tmp_path, capsys, monkeypatch, case):
    """Bad input to `biglm pretrain` is refused before the run directory is made and locked: no empty OUT holding
    run.lock stays behind, and the refusal is one line (the missing data's message adds the command to build it)."""
    from biglm.cli import main

    shards, _ = prepared
    (tmp_path / "empty").mkdir()
    out = tmp_path / "run"
    args = {"tokenizer-missing": ["--tokenizer", "/nonexistent/tok"],
            "tokenizer-empty": ["--data", str(shards), "--tokenizer", str(tmp_path / "empty")],
            "data-missing": ["--data", str(tmp_path / "nodata")],
            "device": ["--device", "cuda"]}[case]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["pretrain", *args, "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    want = {"tokenizer-missing": "--tokenizer /nonexistent/tok: no such folder",
            "tokenizer-empty": f"--tokenizer {tmp_path / 'empty'}: the folder holds no tokenizer",
            "data-missing": f"training data '{tmp_path / 'nodata'}' not found",
            "device": "--device cuda: no CUDA GPU is visible on this machine; use --device cpu"}[case]
    assert want in err
    if case != "data-missing":
        assert len(err.strip().splitlines()) == 1


def test_the_first_step_is_logged_whatever_log_every_and_validation_shows_progress(prepared, tmp_path, capsys):
    lines: list[str] = []
    cfg = _cfg(prepared, tmp_path / "a", steps=3, log_every=100, eval_every=0, save_every=0)
    Trainer(cfg, info=SINGLE, echo=lines.append).train()
    logged = [int(line.split()[1].split("/")[0]) for line in lines if line.startswith("step") and "| loss" in line]
    assert logged == [1, 3]  # the first step, then the last: not silent until step 100
    err = capsys.readouterr().err
    assert "step 3 validation" in err and "/8 [" in err, err  # a bar over the 8 held-out windows
    assert lines[-2].startswith("step      3 | val loss")  # the bar is gone before the line that reports
    trainer = Trainer(_cfg(prepared, tmp_path / "b", steps=3, log_every=100, eval_every=0, save_every=0),
                      info=SINGLE, echo=lines.append)
    trainer.LOG_INTERVAL_S = 0.0  # slow steps: a line whenever the interval has passed since the last one
    lines.clear()
    trainer.train()
    assert [int(line.split()[1].split("/")[0]) for line in lines if "| loss" in line] == [1, 2, 3]


# --- issue 37 items 9, 10: a resume keeps its schedule, a finished run says so, a refused run leaves no folder ------
def test_a_resume_with_another_schedule_is_refused_naming_the_fields(prepared, tmp_path, capsys):
    """Resuming with another --steps moved the lr from 6.95e-05 at step 6 to 2.07e-04 at step 7 in silence."""
    from biglm.cli import main

    Trainer(_cfg(prepared, tmp_path, steps=3), info=SINGLE, echo=lambda s: None).train()
    saved = (tmp_path / "train_config.json").read_text()
    ckpts = [d.name for d in checkpoint_dirs(tmp_path)]
    with pytest.raises(CheckpointError, match=r"other settings than these \(steps 3 -> 6; lr 0.003 -> 0.001\)"):
        Trainer(_cfg(prepared, tmp_path, steps=6, lr=1e-3), info=SINGLE, echo=lambda s: None).train()
    assert (tmp_path / "train_config.json").read_text() == saved and [d.name for d in checkpoint_dirs(tmp_path)] == ckpts
    shards, tok = prepared
    capsys.readouterr()
    assert main(["pretrain", "--preset", "tiny", "--model.max_position_embeddings", "64", "--data", str(shards),
                 "--tokenizer", str(tok), "--out_dir", str(tmp_path), "--seq_len", "32", "--micro_batch", "4",
                 "--global_batch", "8", "--steps", "6", "--lr", "3e-3", "--min_lr", "3e-4", "--warmup_steps", "1",
                 "--eval_windows", "8", "--name", "t"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "steps 3 -> 6" in err and f"--init_from {tmp_path}" in err, err
    # changes that leave the schedule alone still resume
    result = Trainer(_cfg(prepared, tmp_path, steps=3, log_every=2, eval_every=0, keep_last=2), info=SINGLE,
                     echo=lambda s: None).train()
    assert result.step == 3


def test_rerunning_a_finished_run_says_already_finished_and_trains_nothing(prepared, tmp_path):
    Trainer(_cfg(prepared, tmp_path, steps=3), info=SINGLE, echo=lambda s: None).train()
    metrics = (tmp_path / "metrics.jsonl").read_text()
    newest = checkpoint_dirs(tmp_path)[-1]
    stamp = (newest / "meta.json").stat().st_mtime_ns
    said: list[str] = []
    result = Trainer(_cfg(prepared, tmp_path, steps=3), info=SINGLE, echo=said.append).train()
    assert result.step == 3 and result.losses == [] and result.val_losses == []
    finished = [s for s in said if "already finished" in s]
    assert len(finished) == 1 and "step 3 of 3" in finished[0] and not any("resumed from" in s for s in said), said
    assert (tmp_path / "metrics.jsonl").read_text() == metrics  # nothing trained, evaluated or logged again
    assert [d.name for d in checkpoint_dirs(tmp_path)] == [newest.name] or checkpoint_dirs(tmp_path)[-1] == newest
    assert (newest / "meta.json").stat().st_mtime_ns == stamp  # no checkpoint written again


def test_a_run_refused_after_taking_its_lock_leaves_no_folder(prepared, tmp_path, capsys):
    """Data in another tokenizer's ids is found only once the run holds its folder's lock: the refusal left
    OUT/run.lock behind (README: a refused run leaves no folder)."""
    from biglm.cli import main
    from biglm.data import train_tokenizer

    shards, _ = prepared
    other = tmp_path / "other_tok"
    train_tokenizer(texts=["completely different text corpus here"] * 50, vocab_size=300, out_dir=str(other))
    out = tmp_path / "runs" / "x"
    capsys.readouterr()
    assert main(["pretrain", "--preset", "tiny", "--data", str(shards), "--tokenizer", str(other), "--out_dir",
                 str(out), "--seq_len", "32", "--global_batch", "8", "--micro_batch", "4", "--steps", "2",
                 "--warmup_steps", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tokenizer" in err, err
    assert not out.exists() and not (tmp_path / "runs").exists()
