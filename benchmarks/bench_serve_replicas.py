"""`biglm serve --replicas` on Ray Serve: 1 vs 2 replicas at 1, 4 and 16 clients, and Ray Data batch generation
against the same prompts sent through the server, in one run.

Protocol
- Each server is ``biglm serve CHECKPOINT --replicas R --replica_cpus 1`` in a process of its own (a local Ray
  instance; each replica one torch thread), with ``--max_batch_rows``/``--max_queue`` as given; it must answer
  /health with every replica RUNNING before the clock starts. R = 1, then R = 2, in the same run; with
  ``--plain`` the single-process server (``--threads`` torch threads) is measured first as the reference.
- Clients: as `bench_serve.level` (``c`` threads with one keep-alive connection each, non-streamed
  ``/v1/completions`` back to back, greedy, the same decoding fields for every request, a warm-up request per
  client, then ``--seconds`` timed); per level: requests/s, completion tokens/s, latency p50 / p99, failures.
- Batch: ``--rows`` prompts (request ``i`` continues prompt ``i mod 8``, as the clients' requests) with the same
  decoding options, (a) written by `generate_file` with the Ray Data backend (`--replicas 2`'s: 2 model holders of
  one thread each, on a local Ray instance started by this script), rows/s over the job (the actors start with
  it) and after its first batch; (b) the same locally in this process (one thread), as reference; (c) sent
  through the 2-replica server by 16 clients, rows/s from the first request to the last answer (server warm).
- The machine is shared: ``load_avg_1m_at_start`` in the results says how busy it was.

Usage
    python benchmarks/bench_serve_replicas.py --checkpoint RUN --random-weights [--seconds 30] [--rows 256]

Results go to ``benchmarks/results/<out>.json`` (with the machine and git commit) and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import PROMPTS, _free_port, add_load_arguments, level, random_copy  # noqa: E402
from common import machine, write_report  # noqa: E402


def start(args: argparse.Namespace, port: int, replicas: int | None) -> subprocess.Popen:
    threads = 1 if replicas else args.threads
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "biglm", "serve", args.served, "--port", str(port), "--model_name", "bench",
           "--max_batch_rows", str(args.max_batch_rows), "--max_queue", str(args.max_queue), "--log_level", "warning"]
    if replicas:
        cmd += ["--replicas", str(replicas), "--replica_cpus", "1"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait_ready(httpx, url: str, proc: subprocess.Popen, replicas: int | None, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            r = httpx.get(url + "/health", timeout=5)
            body = r.json()
            if r.status_code == 200 and (not replicas or len(body.get("replicas", [])) == replicas):
                return
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(1.0)
    raise RuntimeError("the server did not become healthy in time")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()  # SIGTERM: the graceful shutdown (Ray: the application deleted, Ray stopped)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def through_server(httpx, url: str, body: dict, rows: int, clients: int) -> dict:
    """``rows`` requests (prompt ``i mod 8``, seed ``i``) sent by ``clients`` threads; rows/s over the whole batch."""
    todo = list(range(rows))
    lock = threading.Lock()
    failures = [0]

    def worker() -> None:
        with httpx.Client(timeout=600) as client:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                r = client.post(url + "/v1/completions", json=dict(body, prompt=PROMPTS[i % len(PROMPTS)], seed=i))
                if r.status_code != 200:
                    with lock:
                        failures[0] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return dict(rows=rows, failures=failures[0], seconds=wall, rows_per_s=rows / wall)


def batch_jobs(args: argparse.Namespace, work: Path) -> dict:
    """The ``--rows`` prompts written by `generate_file` on Ray Data (2 model holders of one thread each, on a local
    Ray instance started here) and, as reference, locally in this process (one thread): rows/s over the job and
    after its first batch (the Ray job's actors start with it)."""
    import ray
    import torch

    from biglm.checkpoint import load_model
    from biglm.generation.batch import generate_file
    from biglm.integrations.ray_data import ray_data_backend

    src = work / "prompts.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": PROMPTS[i % len(PROMPTS)]}) + "\n"
                           for i in range(args.rows)))
    options = dict(max_new_tokens=args.max_tokens, steps=args.steps, strategy=args.strategy, temperature=0.0)
    if args.block_length:
        options["block_length"] = args.block_length
    torch.set_num_threads(1)
    model, tok = load_model(args.served, device="cpu")
    out = {}
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        for name, backend in (("ray_data", ray_data_backend(args.served, replicas=2, cpus=1)), ("local", None)):
            stamps: list[tuple[float, int]] = []
            t0 = time.perf_counter()
            report = generate_file(model, tok, src, work / f"answers-{name}.jsonl", config=options,
                                   batch_size=args.batch_size, progress=False, backend=backend,
                                   on_batch=lambda b, rows: stamps.append((time.perf_counter(), len(rows))))
            wall = time.perf_counter() - t0
            (t_first, _), (t_last, _) = stamps[0], stamps[-1]
            after = sum(n for _, n in stamps[1:])
            out[name] = dict(rows=report.written, seconds=wall, rows_per_s=report.written / wall,
                             first_batch_s=t_first - t0,
                             steady_rows_per_s=after / (t_last - t_first) if t_last > t_first else float("nan"))
    finally:
        ray.shutdown()
    same = (work / "answers-ray_data.jsonl").read_bytes() == (work / "answers-local.jsonl").read_bytes()
    out["same_output"] = same
    return out


def run(args: argparse.Namespace) -> dict:
    import httpx2 as httpx

    work = Path(tempfile.mkdtemp(prefix="bench_replicas_"))
    if args.random_weights:
        args.served = random_copy(args.checkpoint, work / "bench")
    body = dict(model="bench", max_tokens=args.max_tokens, steps=args.steps, strategy=args.strategy, temperature=0.0)
    if args.block_length:
        body["block_length"] = args.block_length
    configs = ([None] if args.plain else []) + [1, 2]
    results, batch = [], {}
    for replicas in configs:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start(args, port, replicas)
        name = "plain (1 process)" if replicas is None else f"{replicas} replica(s)"
        try:
            wait_ready(httpx, url, proc, replicas)
            seed = 0
            for c in args.concurrency:
                row = level(httpx, url, clients=c, seconds=args.seconds, body=body, first=seed)
                seed = row.pop("next_seed")
                health = httpx.get(url + "/health", timeout=30).json()
                row["served"] = [r["served"] for r in health.get("replicas", [])]
                row["setup"] = name
                results.append(row)
                print(f"  {name}, {c:3d} clients: {row['requests']:4d} requests ({row['failures']} failed), "
                      f"{row['requests_per_s']:.2f} req/s, p50 {row['latency_p50_s']:.3f} s, "
                      f"p99 {row['latency_p99_s']:.3f} s, served {row['served']}", flush=True)
            if replicas == 2:
                batch["server"] = through_server(httpx, url, body, args.rows, clients=16)
                print(f"  {args.rows} rows through the 2-replica server: {batch['server']['rows_per_s']:.2f} rows/s",
                      flush=True)
        finally:
            stop(proc)
    batch.update(batch_jobs(args, work))
    for name in ("ray_data", "local"):
        print(f"  {args.rows} rows by generate_file ({name}): {batch[name]['rows_per_s']:.2f} rows/s over the job, "
              f"{batch[name]['steady_rows_per_s']:.2f} after its first batch", flush=True)
    return dict(settings=dict(checkpoint=args.checkpoint, random_weights=args.random_weights, threads=args.threads,
                              max_batch_rows=args.max_batch_rows, max_queue=args.max_queue, seconds=args.seconds,
                              rows=args.rows, batch_size=args.batch_size, request=body),
                results=results, batch=batch)


def to_markdown(report: dict) -> str:
    m, s, b = report["machine"], report["settings"], report["batch"]
    load = m["load_avg_1m_at_start"]
    busy = " — loaded: other jobs were running" if load > 0.5 else ""
    lines = ["# biglm serve --replicas on Ray Serve: 1 vs 2 replicas, and Ray Data batch generation", "",
             f"- command: `{report['command']}`",
             f"- machine: {m['cpu']}, {m['cpu_cores']} cores (one torch thread per replica; load average {load} at "
             f"start{busy}); git {m['git_commit'][:12]}" + (" (dirty)" if m["git_dirty"] else ""),
             f"- model: `{s['checkpoint']}`" + (" (its shape and tokenizer, random weights)" if s["random_weights"]
                                               else "")
             + f", max_batch_rows {s['max_batch_rows']}, max_queue {s['max_queue']}; request: "
             f"`{json.dumps(s['request'])}`; {s['seconds']:g} s per level after a warm-up request per client",
             "", "| setup | clients | requests | failed | req/s | completion tok/s | p50 latency (s) | p99 latency (s) "
             "| served per replica |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["results"]:
        lines.append(f"| {r['setup']} | {r['clients']} | {r['requests']} | {r['failures']} | "
                     f"{r['requests_per_s']:.2f} | {r['completion_tokens_per_s']:.1f} | {r['latency_p50_s']:.3f} | "
                     f"{r['latency_p99_s']:.3f} | {', '.join(map(str, r['served'])) or '-'} |")
    rd, lo, sv = b["ray_data"], b["local"], b["server"]
    lines += ["", f"Batch generation of {s['rows']} prompts with the same settings (batch_size {s['batch_size']}; "
              f"Ray Data's file equal to the local one: {b['same_output']}):", "",
              "| path | rows/s over the job | rows/s after the first batch | seconds | first batch after (s) |",
              "|---|---:|---:|---:|---:|",
              f"| Ray Data, 2 model holders (1 thread each; their start-up inside the job) | {rd['rows_per_s']:.2f} | "
              f"{rd['steady_rows_per_s']:.2f} | {rd['seconds']:.1f} | {rd['first_batch_s']:.1f} |",
              f"| local `generate_file`, 1 thread (reference) | {lo['rows_per_s']:.2f} | {lo['steady_rows_per_s']:.2f} | "
              f"{lo['seconds']:.1f} | {lo['first_batch_s']:.1f} |",
              f"| the 2-replica server, 16 clients (already warm; {sv['failures']} failed) | {sv['rows_per_s']:.2f} | "
              f"- | {sv['seconds']:.1f} | - |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_load_arguments(p, seconds=30.0)
    p.add_argument("--plain", action="store_true", help="measure the single-process server first, as reference")
    p.add_argument("--rows", type=int, default=256, help="prompts of the batch comparison")
    p.add_argument("--batch-size", type=int, default=16, help="biglm generate --batch_size of the Ray Data job")
    p.add_argument("--threads", type=int, default=1, help="the plain server's torch threads")
    p.add_argument("--out", default="serve-replicas-cpu", help="results file stem under benchmarks/results/")
    args = p.parse_args(argv)
    args.served = args.checkpoint
    report = dict(command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), machine=machine())
    report.update(run(args))
    write_report(args.out, report, to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
