"""`bash benchmarks/run_gpu.sh --dry-run`: issue 40's one GPU command (benchmarks/gpu_all.sh) end to end on a CPU at
tiny sizes, the same commands as on the GPU, so that run cannot fail on a typo: a tiny GGUF split into two halves and
joined (sha256), converted, adapted 2 steps, evaluated (held-out, zero-shot subset, tokens per call), and the
pre-training bench's new and previous paths."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_run_gpu_dry_run_end_to_end(shared_data, tmp_path):
    env = {**os.environ, "GPU_DRY_DIR": str(tmp_path / "dry"), "SHARED_DATA": str(shared_data), "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    proc = subprocess.run(["bash", "benchmarks/run_gpu.sh", "--dry-run"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "dry" / "results"
    rows = json.loads((results / "pretrain-levers-dry.json").read_text())["rows"]
    assert [(r["preset"], r["path"]) for r in rows] == [("tiny", "new"), ("tiny", "previous")]
    for r in rows:
        assert r["device"].startswith("CPU") and r["tokens_per_second"] > 0 and r["mfu"] is None  # no CPU peak
    assert rows[0]["levers"] == {"loss_chunk": 1024, "host_masks": True, "deferred_finite_check": True}
    assert rows[1]["levers"] == {"loss_chunk": 0, "host_masks": False, "deferred_finite_check": False}
    summary = json.loads((results / "adapt-smol-dry.json").read_text())
    assert summary["steps"] == 2 and summary["tokens"] == 2 * 4 * 64
    assert summary["heldout"]["heldout"]["masked_loss,none"] > 0
    assert set(summary["zero_shot"]) == {"arc_easy_local", "piqa_local", "sciq_local", "winogrande_local"}
    assert summary["same_text_as_one_per_call"] == "3/3" and summary["tokens_per_call"] >= 1
    assert not list((REPO / "benchmarks" / "results").glob("*-dry.*"))  # the dry run writes beside itself only


def test_gguf_halves_join_checks_sha256(shared_data, tmp_path):
    import sys

    def carry(*args):
        return subprocess.run([sys.executable, "benchmarks/gpu_carry.py", *map(str, args)], cwd=REPO,
                              capture_output=True, text=True)

    src = tmp_path / "m.gguf"
    src.write_bytes(bytes(range(256)) * 1001)  # an odd length: the halves differ by one byte
    assert carry("pack", src, shared_data, tmp_path / "c", "--no-wheels").returncode == 0
    parts = [tmp_path / "c" / "a" / "model.gguf.part1", tmp_path / "c" / "b" / "model.gguf.part2"]
    assert [p.stat().st_size for p in parts] == [128128, 128128]
    assert carry("join", tmp_path / "c", tmp_path / "out.gguf").returncode == 0
    assert (tmp_path / "out.gguf").read_bytes() == src.read_bytes()
    assert (tmp_path / "c" / "data" / "eval" / "baber__piqa").is_dir()  # both halves' data in one folder
    damaged = bytearray(parts[1].read_bytes())
    damaged[7] ^= 1
    parts[1].write_bytes(bytes(damaged))
    proc = carry("join", tmp_path / "c", tmp_path / "again.gguf")
    assert proc.returncode == 1 and not (tmp_path / "again.gguf").exists()
    assert proc.stderr.strip().splitlines() == [f"gpu_carry.py: {parts[1]} does not match its sha256 (cut short in "
                                                "transit?): carry it again"]
    parts[0].unlink()
    proc = carry("join", tmp_path / "c", tmp_path / "again.gguf")
    assert proc.returncode == 1 and "model.gguf.part1 is missing: carry" in proc.stderr
