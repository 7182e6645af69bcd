"""A burst of requests into an idle engine, in-process (no HTTP): the first request arrives alone and starts
speculative (drafts pay at one row), the others arrive ``--lead`` steps later and load the engine. Times the whole
wave (every request greedy, the model's default decoding, ``--tokens`` each with ignore_eos) with the first request
moving into the pool at the first loaded step (`DecodeEngine._one_per_call`, HEAD) and without (it keeps a call of its
own beside every pooled call, as before), the arms alternated in one process so the machine's drift falls on both;
checks that both arms write the same answers (docs/LOG.md 2026-11-28):

    python docs/experiments/engine_burst.py --model runs/smol-a40-bf16 --clients 32 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from biglm.checkpoint.loading import load_model
from biglm.generation import DecodeEngine
from biglm.generation.config import model_decoding

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_step import PROMPT  # noqa: E402  (the steady-state experiment's prompt)


def wave(model, tok, *, clients: int, lead: int, tokens: int, move: bool) -> tuple[float, int, dict[str, list[int]]]:
    """Seconds for the whole wave, engine steps, and each request's answer."""
    engine = DecodeEngine(model, max_batch_rows=64, tokenizer=tok)
    if not move:
        engine._moves_to_the_pool = lambda req: False  # the engine before the move: the first request stays apart
    cfg = model_decoding(model.config, {"max_new_tokens": tokens, "ignore_eos": True})
    base = tok(PROMPT, add_special_tokens=False)["input_ids"]
    answers: dict[str, list[int]] = {}
    t0, steps = time.perf_counter(), 0
    engine.submit("0", base[:24], cfg)
    while engine.num_running or engine.num_waiting:
        if steps == lead:
            for i in range(1, clients):
                engine.submit(str(i), base[: 24 + i % 8], cfg)
        for e in engine.step():
            if e.finished:
                answers[e.request_id] = e.token_ids
        steps += 1
    return time.perf_counter() - t0, steps, answers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--lead", type=int, default=3, help="steps the first request runs alone")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if not Path(args.model).exists():
        p.error(f"no model at {args.model}: pass a directory written by `biglm export` or `biglm pretrain`")
    if args.clients < 2 or args.lead < 1:
        p.error("--clients must be >= 2 and --lead >= 1: a first request alone, then the rest")
    torch.set_num_threads(1)
    model, tok = load_model(args.model, pack=True)
    with torch.inference_mode():
        wave(model, tok, clients=4, lead=1, tokens=16, move=True)  # warm-up
        for r in range(args.rounds):
            runs = {}
            for move in ((True, False) if r % 2 == 0 else (False, True)):
                runs[move] = wave(model, tok, clients=args.clients, lead=args.lead, tokens=args.tokens, move=move)
            (t_on, s_on, a_on), (t_off, s_off, a_off) = runs[True], runs[False]
            same = sum(a_on[k] == a_off[k] for k in a_on)
            n = args.clients * args.tokens
            print(f"round {r}: moved {t_on:.2f} s ({n / t_on:.1f} tok/s, {s_on} steps) | apart {t_off:.2f} s "
                  f"({n / t_off:.1f} tok/s, {s_off} steps) | {t_off / t_on:.3f}x | same answers {same}/{len(a_on)}",
                  flush=True)


if __name__ == "__main__":
    main()
