"""The server engine's cost per step in-process (no HTTP), for an A/B of engine changes on the same machine and run:
``clients`` requests of ~30-token prompts admitted at once, greedy, 128 tokens each (ignore_eos), the steady state
timed over ``--steps-timed`` engine steps after ``--warm`` steps. Run it with another checkout's sources first on
PYTHONPATH to compare commits (docs/LOG.md 2026-11-27):

    PYTHONPATH=/tmp/old/src python docs/experiments/engine_step.py --model runs/smol-b1-bf16 --clients 32 --steps 128
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from biglm.checkpoint.loading import load_model
from biglm.generation import DecodeEngine, DecodingConfig

PROMPT = ("Once upon a time, in a small village by the sea, there lived an old fisherman who loved to tell stories "
          "to the children of the village every evening")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--steps", type=int, default=128, help="decoding steps per 128-token answer")
    p.add_argument("--warm", type=int, default=10)
    p.add_argument("--steps-timed", type=int, default=40)
    p.add_argument("--block_length", type=int, default=None, help="1: one position per token (the append cache)")
    p.add_argument("--batch_invariant", action="store_true", help="load_model(..., batch_invariant=True)")
    args = p.parse_args()
    if not Path(args.model).exists():
        p.error(f"no model at {args.model}: pass a directory written by `biglm export` or `biglm pretrain`")
    if args.warm + args.steps_timed > args.steps:
        p.error(f"--warm + --steps-timed ({args.warm + args.steps_timed}) must not exceed --steps ({args.steps}): "
                "the requests would finish inside the timed steps")
    torch.set_num_threads(1)
    model, tok = load_model(args.model, pack=True, batch_invariant=args.batch_invariant)
    base = tok(PROMPT, add_special_tokens=False)["input_ids"]
    engine = DecodeEngine(model, max_batch_rows=64, tokenizer=tok)
    cfg = DecodingConfig(max_new_tokens=128, steps=args.steps, strategy="confidence", ignore_eos=True,
                         block_length=args.block_length, block_cache="append" if args.block_length else "exact")
    for i in range(args.clients):
        engine.submit(str(i), base[: 24 + i % 8], cfg)
    with torch.inference_mode():
        for _ in range(args.warm):
            engine.step()
        p0, t0 = engine.positions, time.perf_counter()
        for _ in range(args.steps_timed):
            engine.step()
        dt = time.perf_counter() - t0
    per_step = dt / args.steps_timed
    tokens = args.clients * 128 / args.steps  # written per step
    print(f"clients={args.clients} steps={args.steps} batch_invariant={args.batch_invariant}: {per_step * 1e3:.1f} ms/step, "
          f"{(engine.positions - p0) / args.steps_timed:.1f} positions/step, {tokens / per_step:.1f} tok/s")


if __name__ == "__main__":
    main()
