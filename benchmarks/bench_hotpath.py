"""The training step's hot path, BEFORE and AFTER a change: tokens/s and peak memory of the trainer's own
`Trainer.forward_backward` (plus masks, clipping and fused AdamW, as in `Trainer.train_step`), for any number
of source trees, each run in fresh subprocesses with that tree's `src/` first on PYTHONPATH.

    git worktree add /tmp/biglm-before 3d7d7a6
    python benchmarks/bench_hotpath.py --tree before=/tmp/biglm-before --tree after=. --repeats 3 --threads 2
    python benchmarks/bench_hotpath.py --tree after=. --configs default --iters 2 --warmup 1   # quick check

Configs: `default` is the default run's step (4 layers, hidden 192, 6 heads, 2 kv, mlp 512, vocab 4096, L=128,
micro batch 32); `136m` is preset biglm-136m at vocab 49152, L=256, batch 2 (`--layers-136m N` cuts its depth,
default the full 30).

What is measured, per (tree, config, repeat), each in a fresh process:
- time: `--warmup` untimed steps, then `--iters` timed steps; tokens/s = batch·L·iters / seconds. Trees and
  repeats are interleaved (before, after, before, after, ...) so a change in machine load hits both alike;
  the median over repeats is reported.
- memory: on CPU, the process's peak resident set (VmHWM in /proc/self/status) during the timed steps, after
  resetting it (``echo 5 > /proc/self/clear_refs``) at the end of the warm-up, minus the resident set at that
  moment: the step's peak working memory above the weights, gradients and AdamW state. glibc keeps freed
  blocks under its dynamic mmap threshold (up to 32 MiB) in the process, which would hide tensors freed and
  reallocated within a step, so the memory process runs with a fixed ``MALLOC_MMAP_THRESHOLD_`` (large tensors
  are mapped and unmapped, RSS follows the live tensors) — a separate process from the timing one, whose
  allocator is left alone. tracemalloc is no use here: it sees Python's allocations, not torch's. On CUDA:
  ``torch.cuda.max_memory_allocated`` over the timed steps, minus the allocation at their start, in the timing
  process, plus the number of host syncs in one step (``torch.cuda.set_sync_debug_mode``).

Writes ``results/<--out or hotpath-cpu|gpu>.json`` with the machine, this checkout's commit and each tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CONFIGS = {
    "default": dict(preset="tiny", model=dict(num_hidden_layers=4, hidden_size=192, num_attention_heads=6,
                                              num_key_value_heads=2, intermediate_size=512, vocab_size=4096,
                                              max_position_embeddings=256),
                    seq_len=128, batch=32),
    "136m": dict(preset="biglm-136m", model=dict(vocab_size=49152, max_position_embeddings=2048), seq_len=256, batch=2),
}


# ---------------------------------------------------------------------------------------------- worker side
def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(args: argparse.Namespace) -> dict:
    """One measurement in this process, with whatever `biglm` PYTHONPATH gives (the tree under test)."""
    import contextlib
    import resource
    import types
    import warnings

    import torch

    import biglm
    from biglm import BiGLMConfig, BiGLMForMaskedLM
    from biglm.objective import apply_masks, draw_masks, get_objective, make_generator
    from biglm.training.distributed import DistInfo
    from biglm.training.trainer import Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    gpu = dev.type == "cuda"
    spec = CONFIGS[args.config]
    model_args = dict(spec["model"])
    if args.config == "136m" and args.layers_136m:
        model_args["num_hidden_layers"] = args.layers_136m
    B, L = spec["batch"], spec["seq_len"]
    config = BiGLMConfig.from_preset(spec["preset"], **model_args, attn_backend="flex" if gpu else "sdpa")
    torch.manual_seed(0)
    model = BiGLMForMaskedLM(config).to(dev)  # validate_inputs as the model sets it: the trainer decides
    if gpu and args.compile:
        for block in model.model.layers:
            block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01, fused=True)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if gpu else contextlib.nullcontext
    # the trainer's own forward_backward, bound to a stand-in with the attributes it reads
    stub = types.SimpleNamespace(model=model, raw_model=model, fsdp=False, _autocast=autocast, _doc_ids=lambda w: None,
                                 info=DistInfo(rank=0, world_size=1, local_rank=0, device=dev))
    objective = get_objective("biglm")
    windows = torch.randint(5, config.vocab_size, (B, L), generator=torch.Generator().manual_seed(1)).to(dev)

    def step(i: int) -> None:
        gen = make_generator(seed=0, step=i, rank=0, device=dev)
        pattern = draw_masks(B, L, objective, generator=gen, device=dev, vocab_size=config.vocab_size)
        normalizer = pattern.count().float().clamp(min=1)
        batch = apply_masks(windows, pattern, mask_token_id=4)
        if hasattr(batch, "find_positions"):  # as Trainer.train_step does, before the forward is queued
            batch.find_positions()
        Trainer.forward_backward(stub, batch, windows, normalizer, sync=True)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize(dev)

    for i in range(args.warmup):
        step(i)
    sync()
    row: dict = {"tree": args.tree_name, "config": args.config, "measure": args.measure, "biglm_file": biglm.__file__,
                 "B": B, "L": L, "layers": config.num_hidden_layers, "vocab": config.vocab_size,
                 "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}
    if args.measure == "memory":
        base = _status_kib("VmRSS")
        row["peak_reset"] = _reset_peak_rss()
    elif gpu:
        base_alloc = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t = time.perf_counter()
    for i in range(args.iters):
        step(args.warmup + i)
    sync()
    seconds = time.perf_counter() - t
    if args.measure == "memory":
        peak = _status_kib("VmHWM") if row["peak_reset"] else None
        row.update(rss_base_mib=base / 1024 if base else None,
                   step_peak_rss_mib=(peak - base) / 1024 if peak and base else None,
                   process_max_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    else:
        row.update(s_per_step=seconds / args.iters, tokens_per_s=B * L * args.iters / seconds)
        if gpu:
            row.update(step_peak_alloc_mib=(torch.cuda.max_memory_allocated(dev) - base_alloc) / 2**20,
                       alloc_base_mib=base_alloc / 2**20)
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step(args.warmup + args.iters)
                sync()
            torch.cuda.set_sync_debug_mode(0)
            row["host_syncs_per_step"] = sum("synchroniz" in str(w.message) for w in caught)
    return row


# ---------------------------------------------------------------------------------------------- driver side
def _tree_src(path: Path) -> Path:
    path = path.resolve()
    return path / "src" if (path / "src" / "biglm").is_dir() else path


def _git(path: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _run_worker(args: argparse.Namespace, name: str, src: Path, config: str, measure: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if measure == "memory":
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # fixed: freed large tensors leave the RSS at once
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--tree-name", name, "--config", config,
           "--measure", measure, "--device", args.device, "--iters", str(args.iters), "--warmup", str(args.warmup)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.layers_136m:
        cmd += ["--layers-136m", str(args.layers_136m)]
    if args.compile:
        cmd.append("--compile")
    # run from a neutral folder so the current checkout's `src` is not picked up instead of the tree's
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/")
    if proc.returncode != 0:
        raise RuntimeError(f"worker {name}/{config}/{measure} failed:\n{proc.stderr[-4000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    if not row["biglm_file"].startswith(str(src)):
        raise RuntimeError(f"tree {name}: imported biglm from {row['biglm_file']}, not from {src}")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                    help="a source tree to measure (repo root or its src/); repeat for BEFORE and AFTER (default: after=this checkout)")
    ap.add_argument("--configs", default="default,136m", help=f"comma-separated, from {', '.join(CONFIGS)}")
    ap.add_argument("--layers-136m", type=int, default=None, help="cut the 136m config to this many layers (default: all 30)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--compile", action="store_true", help="torch.compile each block, as the trainer does on GPU")
    ap.add_argument("--iters", type=int, default=10, help="timed steps per process")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (AdamW state, allocator, compile)")
    ap.add_argument("--repeats", type=int, default=1, help="fresh processes per (tree, config, measure); median reported")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (pin it on a shared machine)")
    ap.add_argument("--no-memory", action="store_true", help="CPU: skip the separate memory processes")
    ap.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree-name", default="", help=argparse.SUPPRESS)
    ap.add_argument("--config", default="default", help=argparse.SUPPRESS)
    ap.add_argument("--measure", default="time", choices=("time", "memory"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.worker:
        print(json.dumps(worker(args)))
        return

    sys.path.insert(0, str(HERE))
    from common import machine, write_result

    trees = {}
    for item in args.tree or [f"after={HERE.parent}"]:
        name, _, path = item.partition("=")
        if not path:
            ap.error(f"--tree {item!r}: write NAME=PATH")
        src = _tree_src(Path(path))
        if not (src / "biglm").is_dir():
            ap.error(f"--tree {item!r}: no biglm package under {src}")
        root = src.parent
        trees[name] = {"src": str(src), "commit": _git(root, "rev-parse", "HEAD"),
                       "dirty": bool(_git(root, "status", "--porcelain", "--", "src/biglm"))}
    configs = args.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r}; choose from {', '.join(CONFIGS)}")
    measures = ["time"] + ([] if args.device == "cuda" or args.no_memory else ["memory"])
    rows = []
    for config in configs:
        for measure in measures:
            for r in range(args.repeats):
                for name, tree in trees.items():  # interleaved: before, after, before, after, ...
                    row = _run_worker(args, name, Path(tree["src"]), config, measure)
                    row["repeat"] = r
                    rows.append(row)
                    shown = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items() if k != "biglm_file"}
                    print(shown, flush=True)
    summary = {}
    keys = ("tokens_per_s", "s_per_step", "step_peak_rss_mib", "rss_base_mib", "step_peak_alloc_mib", "host_syncs_per_step")
    for config in configs:
        for name in trees:
            mine = [r for r in rows if r["config"] == config and r["tree"] == name]
            summary.setdefault(config, {})[name] = {
                k: statistics.median(vals) for k in keys if (vals := [r[k] for r in mine if r.get(k) is not None])}
    for config, per_tree in summary.items():
        print(f"\n{config}:")
        for name, values in per_tree.items():
            print(f"  {name:<10} " + "  ".join(f"{k} {v:,.1f}" for k, v in values.items()))
    stem = args.out or f"hotpath-{'gpu' if args.device == 'cuda' else 'cpu'}"
    path = write_result("hotpath", {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "tree_name", "config", "measure")},
                                    "trees": trees, "configs": {c: CONFIGS[c] for c in configs}, "summary": summary,
                                    "rows": rows, "machine_at_end": {"load_avg_1m": round(os.getloadavg()[0], 2)}},
                        stem=stem)
    print("wrote", path)


if __name__ == "__main__":
    main()
