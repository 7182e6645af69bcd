"""`biglm serve`'s CPU time per written token at C clients, robust to other load on the machine (docs/LOG.md
2026-11-27): the server's process CPU seconds over the timed level divided by the tokens it wrote, beside the wall
tokens/s (which other load moves). For an A/B of serving changes in one sitting; extra arguments go to `biglm serve`:

    python docs/experiments/serve_cpu.py runs/smol-a40-bf16 32 20 --decoding.draft_length 0 --decoding.steps 128
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_serve import _free_port, level, wait_healthy  # noqa: E402
from bench_serve_vs_vllm import PROMPTS  # noqa: E402


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    import httpx2 as httpx
    import psutil

    model, clients, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "biglm", "serve", model, "--model_name", "biglm", "--threads", "1",
           "--decoding.max_new_tokens", "128", "--log_level", "warning", *sys.argv[4:], "--port", str(port)]
    log = open(REPO / "runs" / "serve_cpu.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.stderr = open(log.name)  # wait_healthy reads it when the server dies
    try:
        wait_healthy(httpx, url, proc, timeout=300)
        ps = psutil.Process(proc.pid)
        body = {"max_tokens": 128, "temperature": 0.0, "ignore_eos": True, "model": "biglm"}
        level(httpx, url, clients=clients, seconds=1, body=body, first=0, prompts=PROMPTS)  # warm-up
        cpu0 = sum(ps.cpu_times()[:2])
        row = level(httpx, url, clients=clients, seconds=seconds, body=body, first=100, prompts=PROMPTS)
        cpu = sum(ps.cpu_times()[:2]) - cpu0
        tokens = row["completion_tokens_per_s"] * row["wall_s"]
        print(f"{clients} clients {' '.join(sys.argv[4:])}: {row['completion_tokens_per_s']:.1f} tok/s wall, server "
              f"CPU {1000 * cpu / tokens:.2f} ms per token, load {os.getloadavg()[0]:.2f}")
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


if __name__ == "__main__":
    main()
