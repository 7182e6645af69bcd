"""Checkpoint save time at a real shape: main's manifest (rank 0 re-reads and hashes every file after the save)
against this tree's (each rank hashes its bytes as it writes them), in one script run (issue 31, item 4).

    git worktree add /tmp/base 548e84d          # the code to compare against
    python benchmarks/bench_checkpoint_save.py --base-src /tmp/base/src --preset biglm-360m

Each variant runs in a worker process of its own (one model + AdamW state in memory at a time), alternating
base / this ``--rounds`` times, ``--saves`` timed saves each, with `Checkpointer.save` exactly as training calls
it (model + optimizer through torch.distributed.checkpoint, the rank's extra state, meta.json, pruning to the last
one). For reference, the worker of this tree also times the same files written with no hashing at all (plain
`dcp.save` + `torch.save`) and a resume's verification of its last checkpoint (every byte read and hashed). The
checkpoints are written under ``--work`` and deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, machine, markdown_header, positive_int

HERE = Path(__file__).resolve().parent


def worker(args: argparse.Namespace) -> None:
    """Build the model and its AdamW state, time ``args.saves`` saves, print one JSON line."""
    if args.src:
        sys.path.insert(0, args.src)
    import torch

    import biglm
    from biglm.model import BiGLMConfig, BiGLMForMaskedLM
    from biglm.training.checkpoint import Checkpointer
    from biglm.training.parts import build_optimizer

    torch.manual_seed(0)
    model = BiGLMForMaskedLM(BiGLMConfig.from_preset(args.preset))
    optimizer = build_optimizer(model, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    for p in model.parameters():  # one step with small gradients: AdamW's two moments exist, as in a real run
        p.grad = torch.full_like(p, 1e-3)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in model.parameters())
    run = Path(args.work) / args.label
    shutil.rmtree(run, ignore_errors=True)
    checkpointer = Checkpointer(run, keep_last=1)
    extra = {"step": 0, "cpu_rng": torch.get_rng_state()}
    times = []
    for i in range(args.saves):
        t = time.perf_counter()
        path = checkpointer.save(i + 1, model=model, optimizer=optimizer, extra={**extra, "step": i + 1})
        times.append(time.perf_counter() - t)
    size = sum(f.stat().st_size for f in path.iterdir())
    out = {"label": args.label, "src": str(Path(biglm.__file__).parents[1]), "params": params, "bytes": size,
           "save_s": times}
    if args.reference:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from biglm.checkpoint.layout import verify_checkpoint

        t = time.perf_counter()
        assert verify_checkpoint(path) is None
        out["verify_s"] = time.perf_counter() - t
        plain = []
        for i in range(args.saves):
            folder = Path(args.work) / f"plain-{i}"
            shutil.rmtree(folder, ignore_errors=True)
            t = time.perf_counter()
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
            torch.save(extra, folder / "rank00000.pt")
            plain.append(time.perf_counter() - t)
            shutil.rmtree(folder, ignore_errors=True)
        out["plain_save_s"] = plain
    shutil.rmtree(run, ignore_errors=True)
    print("RESULT " + json.dumps(out), flush=True)


def run_worker(args: argparse.Namespace, *, label: str, src: str | None, reference: bool) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--label", label, "--preset", args.preset,
           "--saves", str(args.saves), "--work", args.work] + (["--src", src] if src else []) + (
           ["--reference"] if reference else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"worker {label} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    print(f"{label}: save {', '.join(f'{s:.2f}' for s in result['save_s'])} s", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-src", help="the src/ folder of the code to compare against (a worktree of main)")
    ap.add_argument("--preset", default="biglm-360m")
    ap.add_argument("--rounds", type=positive_int, default=2, help="base/this worker pairs, alternating")
    ap.add_argument("--saves", type=positive_int, default=2, help="timed saves per worker")
    ap.add_argument("--work", default="/tmp/bench-checkpoint-save", help="where checkpoints are written (deleted)")
    ap.add_argument("--out", default="checkpoint-save-360m", help="results file stem under benchmarks/results/")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="this", help=argparse.SUPPRESS)
    ap.add_argument("--src", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not args.base_src or not (Path(args.base_src) / "biglm").is_dir():
        ap.error("--base-src must be the src/ folder of a checkout of the base commit "
                 "(git worktree add /tmp/base 548e84d; --base-src /tmp/base/src)")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "command": "bench_checkpoint_save.py " + " ".join(sys.argv[1:])}
    results: dict[str, list[dict]] = {"base": [], "this": []}
    try:
        for _ in range(args.rounds):
            results["base"].append(run_worker(args, label="base", src=args.base_src, reference=False))
            results["this"].append(run_worker(args, label="this", src=str(HERE.parent / "src"), reference=True))
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    base = [s for r in results["base"] for s in r["save_s"]]
    this = [s for r in results["this"] for s in r["save_s"]]
    ref = results["this"][0]
    plain = [s for r in results["this"] for s in r["plain_save_s"]]
    verify = [r["verify_s"] for r in results["this"]]
    gib = ref["bytes"] / 2**30
    lines = markdown_header(f"Checkpoint save time, {args.preset} with AdamW state, one process", report,
                            load_note="; a shared machine: other jobs ran meanwhile")
    lines += [f"- shape: {args.preset}, {ref['params'] / 1e6:.1f}M parameters; checkpoint {gib:.2f} GiB "
              f"(fp32 weights + AdamW's two moments); {args.rounds} worker(s) per variant, alternating, "
              f"{args.saves} saves each", "",
              "| variant | saves | median (s) | min (s) | max (s) |", "|---|---:|---:|---:|---:|"]

    def row(name: str, xs: list[float]) -> str:
        return f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |"

    base_commit = subprocess.run(["git", "-C", args.base_src, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() or "unknown commit"
    lines += [row(f"main ({base_commit}, {Path(args.base_src).parent}): save, then re-read and hash every file", base),
              row("this tree: hash the bytes as they are written", this),
              row("reference: the same files, no hashing at all", plain),
              row("reference: a resume's verification (read and hash every byte)", verify), ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
