"""What one decoding call costs at batch 1, and where the time goes: BiGLM block decoding against transformers'
autoregressive `generate`, same shape, same run (issue 21: why T = N/2 calls stay under 2x the AR model on a CPU).

Three measurements, each the minimum over ``--repeats`` rounds after a warm-up, one thread by default:
- ``rows``: one vocabulary-sized matrix product (hidden x vocab, as the LM head) for 1, 2, 4, 8, 16 rows, cycling over
  four such matrices so that, as in a forward pass, the weights do not stay in cache: the cost of a call is mostly
  streaming the weights, and it grows little with the rows a call runs.
- ``biglm``: `generate_ids` at batch 1 (append cache: the cost a `biglm-blocks` model pays; confidence, T = N / ``--tokens-per-step``) for each
  ``--block-length``; its time split into the model's forward calls (timed inside `BiGLMForMaskedLM.forward`) and
  the rest (the decoding loop: sampling, ranking, commits, cache bookkeeping), per call.
- ``positions``: one BiGLM forward over a cached 128-token prefix for 1, 4 and 16 suffix positions (logits at all of
  them), its time per call and the part in matrix products (`torch.profiler`, ``aten::mm``).
- ``ar``: a `LlamaForCausalLM` of the same shape (random weights, tied as the BiGLM; `bench_generation.build_models`), greedy `generate` of exactly
  N tokens with its KV cache, split the same way (model forward vs `generate`'s own work), per token.

    python benchmarks/bench_call_cost.py --threads 1 --out call-cost-cpu

Results go to ``benchmarks/results/<out>.json`` and ``.md`` with the machine, torch version and git commit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from transformers import LlamaForCausalLM

from biglm import BiGLMForMaskedLM
from biglm.generation import DecodingConfig, generate_ids

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import build_models  # noqa: E402
from common import machine, markdown_header, positive_int, write_report  # noqa: E402


class ForwardTimer:
    """Accumulates the wall time spent inside ``cls.forward`` (patched for the timer's lifetime)."""

    def __init__(self, cls: type) -> None:
        self.cls, self.original, self.seconds = cls, cls.forward, 0.0

    def __enter__(self) -> "ForwardTimer":
        original = self.original

        def timed(module, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(module, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        self.cls.forward = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self.cls.forward = self.original


def best_split(run, cls: type, repeats: int) -> tuple[float, float]:
    """(total, inside forward) seconds of the fastest of ``repeats`` runs of ``run`` after one warm-up."""
    run()
    best = None
    for _ in range(repeats):
        with ForwardTimer(cls) as timer:
            t0 = time.perf_counter()
            run()
            total = time.perf_counter() - t0
        if best is None or total < best[0]:
            best = (total, timer.seconds)
    return best


def rows_probe(hidden: int, vocab: int, repeats: int) -> list[dict]:
    weights = [torch.randn(vocab, hidden) * 0.02 for _ in range(4)]
    out = []
    for rows in (1, 2, 4, 8, 16):
        x = torch.randn(rows, hidden)
        for _ in range(20):
            for w in weights:
                F.linear(x, w)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(25):
                for w in weights:
                    F.linear(x, w)
            times.append((time.perf_counter() - t0) / 100)
        out.append(dict(rows=rows, matrix_mb=vocab * hidden * 4 / 2**20, us_per_product=min(times) * 1e6))
    return out


def positions_probe(model: BiGLMForMaskedLM, vocab: int, repeats: int) -> list[dict]:
    model.model.validate_inputs = False
    cache = model.encode_prefix(torch.randint(5, vocab, (1, 128)))
    out = []
    for length in (1, 4, 16):
        ids, where = torch.randint(5, vocab, (1, length)), torch.ones(1, length, dtype=torch.bool)
        for _ in range(20):
            model(ids, prefix_cache=cache, logits_positions=where)
        with torch.profiler.profile() as prof:
            t0 = time.perf_counter()
            for _ in range(20 * repeats):
                model(ids, prefix_cache=cache, logits_positions=where)
            seconds = time.perf_counter() - t0
        mm = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == "aten::mm") / (20 * repeats)
        out.append(dict(positions=length, ms_per_call_profiled=seconds / (20 * repeats) * 1e3, mm_ms_per_call=mm / 1e3))
    model.model.validate_inputs = True
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=positive_int, default=128)
    p.add_argument("--tokens-per-step", type=positive_int, default=2)
    p.add_argument("--block-length", type=positive_int, nargs="+", default=[2, 8])
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    # the models of bench_generation.py's speed runs: same shape, same seeds, the Llama built from the BiGLM's config
    shape = argparse.Namespace(checkpoint=None, preset="tiny", layers=args.layers, hidden=args.hidden,
                               intermediate=args.intermediate, heads=args.heads, kv_heads=args.kv_heads,
                               vocab_size=args.vocab_size, prompt_len=args.prompt_len, new_tokens=[args.new_tokens],
                               compile=False)
    _, biglm, llama = build_models(shape, torch.device("cpu"), torch.float32)
    prompt = torch.randint(5, args.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    n = args.new_tokens
    rows = []
    with torch.inference_mode():
        for b in args.block_length:
            cfg = DecodingConfig(max_new_tokens=n, strategy="confidence", steps=max(1, n // args.tokens_per_step),
                                 block_length=b, block_cache="append")
            calls = generate_ids(biglm, prompt, config=cfg).forward_calls
            total, model = best_split(lambda cfg=cfg: generate_ids(biglm, prompt, config=cfg), BiGLMForMaskedLM,
                                      args.repeats)
            rows.append(dict(decoder=f"biglm blocks of {b}, T=N/{args.tokens_per_step}", calls=calls, total_s=total,
                             model_ms_per_call=model / calls * 1e3, rest_ms_per_call=(total - model) / calls * 1e3))
        kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(prompt))
        total, model = best_split(lambda: llama.generate(prompt, **kw), LlamaForCausalLM, args.repeats)
        rows.append(dict(decoder="transformers generate (AR, KV cache)", calls=n, total_s=total,
                         model_ms_per_call=model / n * 1e3, rest_ms_per_call=(total - model) / n * 1e3))
    ar = rows[-1]["total_s"]
    for r in rows:
        r["vs_ar"] = ar / r["total_s"]
    probe = rows_probe(args.hidden, args.vocab_size, args.repeats)
    with torch.inference_mode():
        positions = positions_probe(biglm, args.vocab_size, args.repeats)
    report = dict(command="bench_call_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  machine=machine(), settings=vars(args), decoders=rows, rows_probe=probe,
                  positions_probe=positions)
    lines = [*markdown_header("Cost of one decoding call at batch 1", report),
             f"- shape: {args.layers} layers, hidden {args.hidden}, heads {args.heads}/{args.kv_heads}, MLP "
             f"{args.intermediate}, vocab {args.vocab_size}, float32; prompt {args.prompt_len}, N = {n}; fastest of "
             f"{args.repeats} runs after a warm-up", "",
             "| decoder | calls | total (s) | model per call (ms) | rest per call (ms) | vs AR |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['decoder']} | {r['calls']} | {r['total_s']:.3f} | {r['model_ms_per_call']:.2f} | "
              f"{r['rest_ms_per_call']:.2f} | {r['vs_ar']:.2f}x |" for r in rows]
    lines += ["", f"One {probe[0]['matrix_mb']:.1f} MB matrix product (hidden x vocab), cycling over four such matrices:",
              "", "| rows | us per product |", "|---:|---:|"]
    lines += [f"| {r['rows']} | {r['us_per_product']:.0f} |" for r in probe]
    lines += ["", "One BiGLM forward over a cached 128-token prefix (profiled):", "",
              "| positions | ms per call | of which matrix products (ms) |", "|---:|---:|---:|"]
    lines += [f"| {r['positions']} | {r['ms_per_call_profiled']:.2f} | {r['mm_ms_per_call']:.2f} |" for r in positions]
    md = "\n".join(lines)
    print(md)
    if args.out:
        write_report(args.out, report, md)


if __name__ == "__main__":
    main()
