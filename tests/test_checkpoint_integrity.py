"""Checkpoint integrity for everyone who reads a run (issue 31): export, generate and serve verify the sha256 that
meta.json records and pass over a damaged checkpoint as a resume does; metrics.jsonl reads as one run after a
resume; every rank hashes its files as it writes them (nothing is read back to build the manifest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_config

from biglm.checkpoint import checkpoint_dirs
from biglm.training import Trainer
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def run(synthetic_data, tmp_path_factory) -> Path:
    """A finished tiny run with checkpoints at steps 3 and 6 (tests copy it before damaging anything)."""
    out = tmp_path_factory.mktemp("integrity") / "run"
    cfg = tiny_train_config(out, data={str(synthetic_data / "shards"): 1.0}, tokenizer=str(synthetic_data / "tok"))
    Trainer(cfg, info=SINGLE, echo=lambda s: None).train()
    assert [d.name for d in checkpoint_dirs(out)] == ["step_0000003", "step_0000006"]
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / "run"))


def _flip(ckpt: Path, n: int = 4096) -> None:
    """XOR ``n`` bytes in the middle of the checkpoint's shard: same size, different content (as a bad disk does)."""
    shard = next(ckpt.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0x5A for b in data[mid:mid + n])
    shard.write_bytes(bytes(data))


def _export(argv: list[str], capsys) -> tuple[int, str]:
    from biglm.checkpoint.cli import main

    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().err


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_export_passes_over_flipped_bytes_to_the_previous_step_with_one_warning(run, tmp_path, capsys):
    from biglm.checkpoint import load_inference_checkpoint

    run = _copy(run, tmp_path)
    _flip(run / "checkpoints" / "step_0000006")
    rc, err = _export([str(run), str(tmp_path / "out")], capsys)
    assert rc == 0, err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1, err
    assert "step_0000006 is damaged" in warnings[0] and "does not match the sha256" in warnings[0]
    assert "reading step_0000003" in warnings[0]
    exported = _weights(tmp_path / "out")
    step3, _ = load_inference_checkpoint(run / "checkpoints" / "step_0000003")
    want = step3.state_dict()
    assert exported and all(torch.equal(t, want[k]) for k, t in exported.items())
    card = (tmp_path / "out" / "README.md").read_text()
    assert "step_0000003" in card or "step 3" in card  # the card describes what was exported


def test_generate_and_load_model_pass_over_a_meta_json_without_its_manifest(run, tmp_path, capsys):
    from biglm.checkpoint import load_inference_checkpoint, load_model

    run = _copy(run, tmp_path)
    meta_path = run / "checkpoints" / "step_0000006" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["files"]
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    model, _ = load_model(run)
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "step_0000006 is damaged" in err and "has no manifest" in err, err
    step3, _ = load_inference_checkpoint(run / "checkpoints" / "step_0000003")
    for (k, a), b in zip(model.state_dict().items(), step3.state_dict().values()):
        assert torch.equal(a, b), k


def test_every_checkpoint_damaged_is_refused_in_one_line(run, tmp_path, capsys):
    from biglm.generation.cli import main as generate_main

    run = _copy(run, tmp_path)
    for ckpt in checkpoint_dirs(run):
        _flip(ckpt, n=1 << 16)  # a large flip: today's size-only check loads it and ends in a long traceback
    rc, err = _export([str(run), str(tmp_path / "out")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "no intact checkpoint" in err and "step_0000006: __0_0.distcp does not match the sha256" in err
    assert "step_0000003: __0_0.distcp does not match" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "model.safetensors").exists()  # nothing published
    # one damaged checkpoint asked for by name: refused, pointing at its run
    one = run / "checkpoints" / "step_0000006"
    rc, err = _export([str(one), str(tmp_path / "out")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"checkpoint {one} is damaged" in err and f"pass the run directory {run}" in err
    capsys.readouterr()
    assert generate_main([str(one), "--prompt", "the cat"]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is damaged" in err and "Traceback" not in err, err


def test_a_resume_drops_the_rolled_back_steps_from_metrics_jsonl(synthetic_data, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = dict(data={str(synthetic_data / "shards"): 1.0}, tokenizer=str(synthetic_data / "tok"))
    Trainer(tiny_train_config(out, **cfg), info=SINGLE, echo=lambda s: None).train()
    _flip(out / "checkpoints" / "step_0000006")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 7, "lo')  # a line a kill cut short
    Trainer(tiny_train_config(out, **cfg), info=SINGLE, echo=lambda s: None).train()  # falls back to step 3
    assert "resuming from step_0000003" in capsys.readouterr().err
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rows = [row for row in map(_parsed, lines) if row is not None]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if r["kind"] == "val"] == [3, 6]
    assert len(rows) == len(lines)  # the cut line is gone too
    assert not (out / "metrics.jsonl.tmp").exists()


def _parsed(line: str) -> dict | None:
    try:
        return json.loads(line)
    except ValueError:
        return None


def test_each_rank_hashes_its_files_as_it_writes_them(monkeypatch, tmp_path):
    """The manifest comes from the bytes on their way out: no file of the checkpoint is read back to hash it."""
    import biglm.checkpoint.layout as layout
    import biglm.training.checkpoint as training_checkpoint
    from biglm.training.checkpoint import Checkpointer

    read_back: list[str] = []
    real = layout.file_sha256
    monkeypatch.setattr(layout, "file_sha256", lambda p, **k: read_back.append(str(p)) or real(p, **k))
    monkeypatch.setattr(training_checkpoint, "file_sha256", lambda p, **k: read_back.append(str(p)) or real(p, **k),
                        raising=False)
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 512)  # a 2 MiB weight: hashed beside its write; the bias in line
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 1024)).sum().backward()
    optimizer.step()
    ckpt = Checkpointer(tmp_path).save(1, model=model, optimizer=optimizer, extra={"step": 1})
    assert read_back == []
    files = json.loads((ckpt / "meta.json").read_text())["files"]
    assert set(files) == {p.name for p in ckpt.iterdir()} - {"meta.json"}
    assert {".metadata", "__0_0.distcp", "rank00000.pt"} <= set(files)
    for name, want in files.items():
        assert want == {"bytes": (ckpt / name).stat().st_size, "sha256": real(ckpt / name)}, name


# --- issue 37 items 7, 8: an export never lands over a run or a folder it was not asked to replace, and is whole --
def _entries(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("overwrite", [False, True])
def test_export_into_a_run_or_a_folder_of_other_files_is_refused_before_any_work(run, tmp_path, capsys, overwrite):
    """Exporting into a training run rewrote its config.json under its checkpoints (issue 37 item 7): refused in
    one line whatever --overwrite says, and so is a folder of other files; the target is left byte for byte."""
    target = _copy(run, tmp_path)  # a run (checkpoints, run.lock, train_config.json)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    flag = ["--overwrite"] if overwrite else []
    for folder, said in ((target, "holds a training run"),
                         (other, "holds files but no model" if overwrite else "is not empty")):
        before = _entries(folder)
        rc, err = _export([str(run), str(folder), *flag], capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and said in err, err
        assert _entries(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "run"]  # no temporary folder left behind


def test_export_over_an_earlier_export_needs_overwrite_and_replaces_it_whole(run, tmp_path, capsys):
    out = tmp_path / "hf"
    rc, err = _export([str(run / "checkpoints" / "step_0000003"), str(out)], capsys)
    assert rc == 0, err
    (out / "stale.txt").write_text("from the old export")
    old = _entries(out)
    rc, err = _export([str(run), str(out)], capsys)
    assert rc == 2 and "is not empty" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1, err
    assert _entries(out) == old
    rc, err = _export([str(run), str(out), "--overwrite"], capsys)
    assert rc == 0, err
    assert not (out / "stale.txt").exists()  # replaced, not merged
    from biglm.checkpoint import load_inference_checkpoint

    step6, _ = load_inference_checkpoint(run)
    want = step6.state_dict()
    assert all(torch.equal(t, want[k]) for k, t in _weights(out).items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_an_export_cut_by_a_file_size_limit_leaves_nothing_and_one_line(run, tmp_path):
    """`ulimit -f` (a full disk's cousin) during the write of model.safetensors: before, OUT kept a lone config.json
    and the command ended in a traceback; now OUT is absent (or the old one intact) and the error is one line."""
    import resource
    import subprocess
    import sys

    def limit():  # 64 KiB: config.json and the tokenizer fit, the weights do not
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))

    def export(*args):
        return subprocess.run([sys.executable, "-m", "biglm", "export", str(run), *args], capture_output=True,
                              text=True, preexec_fn=limit, timeout=300)

    out = tmp_path / "hf"
    done = export(str(out))
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "[biglm]" in line]  # (transformers' progress bar aside)
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"could not write {out}: file too large" in lines[0] and "nothing was left" in lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # over an earlier export (--overwrite): the old one stays as it was
    from biglm.checkpoint import export_checkpoint

    export_checkpoint(run / "checkpoints" / "step_0000003", out)
    before = _entries(out)
    done = export(str(out), "--overwrite")
    assert done.returncode == 2 and f"{out} is unchanged" in done.stderr, done.stderr
    assert _entries(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
