"""Throughput and latency of `biglm serve` on loopback under 1, 4 and 16 concurrent clients.

Protocol
- The server is ``biglm serve CHECKPOINT`` in a process of its own (``OMP_NUM_THREADS`` = ``--threads``,
  so it does not fight the clients for cores), on a free loopback port, with ``--max_batch_rows`` and
  ``--max_queue`` as given; it must answer /health before the clock starts.
- Clients: ``c`` threads, one keep-alive connection each (httpx2, the HTTP client the `openai` package
  uses), send non-streamed ``/v1/completions`` back to back; request ``i`` continues prompt
  ``i mod len(PROMPTS)`` with the same decoding fields (``max_tokens``, ``steps``, ``strategy``,
  ``block_length``, greedy, seed ``i``). Each level first sends ``c`` untimed requests (warm-up),
  then runs for ``--seconds``; requests started before the deadline are waited for and counted.
- ``--random-weights``: serve the checkpoint's shape and tokenizer with freshly initialised weights
  (seed 0). A short-trained model ends most answers at an early EOS, so its requests measure the
  length of its answers more than the server; random weights write all ``max_tokens`` slots.
- Per level: requests, failures (anything but a complete 200), requests/s and completion tokens/s
  over the level's wall time, latency p50 / p99 (nearest rank; with few requests p99 is the
  maximum), and the engine's decoding steps (from /health) — fewer steps than requests x steps
  means requests shared model calls.

Usage
    python benchmarks/bench_serve.py --checkpoint RUN [--concurrency 1 4 16] [--seconds 45] [--threads 1]

Results go to ``benchmarks/results/<out>.json`` (with the machine and git commit) and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_report  # noqa: E402

PROMPTS = ["The following example shows how to", "This module provides", "Return the value of the",
           "If the argument is omitted, the", "A new instance of the class is", "The default encoding is",
           "Changed in version 3.2: the", "Raise an exception when the"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, "-m", "biglm", "serve", args.served, "--port", str(port), "--model_name", "bench",
           "--max_batch_rows", str(args.max_batch_rows), "--max_queue", str(args.max_queue), "--log_level", "warning"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_healthy(httpx, url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy in time")


def level(httpx, url: str, *, clients: int, seconds: float, body: dict, first: int,
          prompts: list[str] = PROMPTS, keep_latencies: bool = False) -> dict:
    """``clients`` threads sending requests back to back for ``seconds``; per-request latency and tokens
    (``keep_latencies``: each request's too, ``latencies_s``, for merging several levels' percentiles)."""
    latencies: list[float] = []
    tokens: list[int] = []
    failures: list[str] = []
    lock = threading.Lock()
    counter = [first]
    deadline = [0.0]

    def one(client, i: int) -> tuple[bool, float, int, str]:
        req = dict(body, prompt=prompts[i % len(prompts)], seed=i)
        t0 = time.perf_counter()
        r = client.post(url + "/v1/completions", json=req)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            return False, dt, 0, f"{r.status_code} {r.text[:200]}"
        out = r.json()
        ok = out["choices"][0]["finish_reason"] in ("stop", "length")
        return ok, dt, int(out["usage"]["completion_tokens"]), "" if ok else f"incomplete {out}"

    def worker(warm: bool) -> None:
        with httpx.Client(timeout=600) as client:
            if warm:
                with lock:
                    i = counter[0]
                    counter[0] += 1
                one(client, i)
                return
            while time.perf_counter() < deadline[0]:
                with lock:
                    i = counter[0]
                    counter[0] += 1
                ok, dt, n, err = one(client, i)
                with lock:
                    if ok:
                        latencies.append(dt)
                        tokens.append(n)
                    else:
                        failures.append(err)

    for warm in (True, False):
        if not warm:
            deadline[0] = time.perf_counter() + seconds
            t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(warm,)) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - t0
    return dict(clients=clients, requests=len(latencies), failures=len(failures), failure_examples=failures[:3],
                wall_s=wall, requests_per_s=len(latencies) / wall, completion_tokens_per_s=sum(tokens) / wall,
                latency_p50_s=_percentile(latencies, 50) if latencies else None,
                latency_p99_s=_percentile(latencies, 99) if latencies else None,
                latency_mean_s=statistics.mean(latencies) if latencies else None,
                latency_p95_s=_percentile(latencies, 95) if latencies else None, next_seed=counter[0],
                **({"latencies_s": latencies} if keep_latencies else {}))


def random_copy(checkpoint: str, out: Path) -> str:
    """``checkpoint``'s config and tokenizer with freshly initialised weights, saved to ``out``."""
    import torch

    from biglm import BiGLMForMaskedLM
    from biglm.checkpoint import load_model

    model, tokenizer = load_model(checkpoint)
    torch.manual_seed(0)
    BiGLMForMaskedLM(model.config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def run(args: argparse.Namespace) -> dict:
    import tempfile

    import httpx2 as httpx

    if args.random_weights:
        args.served = random_copy(args.checkpoint, Path(tempfile.mkdtemp(prefix="bench_serve_")) / "bench")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(args, port)
    body = dict(model="bench", max_tokens=args.max_tokens, steps=args.steps, strategy=args.strategy, temperature=0.0)
    if args.block_length:
        body["block_length"] = args.block_length
    rows = []
    try:
        wait_healthy(httpx, url, proc)
        seed = 0
        for c in args.concurrency:
            before = httpx.get(url + "/health").json()["stats"].get("steps", 0)
            row = level(httpx, url, clients=c, seconds=args.seconds, body=body, first=seed)
            seed = row.pop("next_seed")
            health = httpx.get(url + "/health").json()
            row["engine_steps"] = health["stats"].get("steps", 0) - before  # warm-up included
            row["healthy_after"] = health["status"] == "ok"
            rows.append(row)
            print(f"  {c:3d} clients: {row['requests']:4d} requests ({row['failures']} failed) in {row['wall_s']:.1f} s, "
                  f"{row['requests_per_s']:.2f} req/s, {row['completion_tokens_per_s']:.1f} tok/s, "
                  f"p50 {row['latency_p50_s']:.3f} s, p99 {row['latency_p99_s']:.3f} s", flush=True)
    finally:
        proc.terminate()  # SIGTERM: the server's graceful shutdown
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return dict(settings=dict(checkpoint=args.checkpoint, random_weights=args.random_weights, threads=args.threads,
                              max_batch_rows=args.max_batch_rows,
                              max_queue=args.max_queue, seconds=args.seconds, request=body), results=rows)


def to_markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    lines = ["# biglm serve: throughput and latency on loopback", "", f"- command: `{report['command']}`",
             f"- machine: {m['cpu']}, {m['cpu_cores']} cores (server threads {s['threads']}, load average "
             f"{m['load_avg_1m_at_start']} at start); git {m['git_commit'][:12]}" + (" (dirty)" if m["git_dirty"] else ""),
             f"- server: `{s['checkpoint']}`" + (" (its shape and tokenizer, random weights)" if s["random_weights"] else "")
             + f", max_batch_rows {s['max_batch_rows']}, max_queue {s['max_queue']}; "
             f"request: `{json.dumps(s['request'])}`; {s['seconds']:g} s per level after a warm-up request per client",
             "", "| clients | requests | failed | req/s | completion tok/s | p50 latency (s) | p99 latency (s) | "
             "engine steps | healthy after |", "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["results"]:
        lines.append(f"| {r['clients']} | {r['requests']} | {r['failures']} | {r['requests_per_s']:.2f} | "
                     f"{r['completion_tokens_per_s']:.1f} | {r['latency_p50_s']:.3f} | {r['latency_p99_s']:.3f} | "
                     f"{r['engine_steps']} | {r['healthy_after']} |")
    return "\n".join(lines) + "\n"


def add_load_arguments(p: argparse.ArgumentParser, *, seconds: float) -> None:
    """The server, request and load options every serving benchmark takes."""
    p.add_argument("--checkpoint", required=True, help="a trained run or export (the server needs its tokenizer)")
    p.add_argument("--random-weights", action="store_true", help="serve the checkpoint's shape with fresh weights")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--seconds", type=float, default=seconds, help="timed seconds per concurrency level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--strategy", default="confidence")
    p.add_argument("--block-length", type=int, default=16)
    p.add_argument("--max-batch-rows", type=int, default=16)
    p.add_argument("--max-queue", type=int, default=64)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_load_arguments(p, seconds=45.0)
    p.add_argument("--threads", type=int, default=1, help="the server's torch/OpenMP threads")
    p.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    args = p.parse_args(argv)
    args.served = args.checkpoint
    report = dict(command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), machine=machine())
    report.update(run(args))
    stem = args.out or "bench_serve_cpu"
    write_report(stem, report, to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
