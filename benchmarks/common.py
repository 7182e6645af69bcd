"""Shared helpers for benchmark scripts: the machine, the code version, timing with warm-up excluded."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        info["commit"] = "unknown"
    return info


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn: Callable[[], object], *, device: torch.device, warmup: int = 2, iters: int = 5) -> float:
    """Mean seconds per call of ``fn`` over ``iters`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t) / iters


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    tag = "gpu" if torch.cuda.is_available() else "cpu"
    path = RESULTS / f"{name}-{tag}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2))
    return path
