"""A model's linear layers through biglm's bfloat16 CPU kernel against oneDNN's prepacked float32 of the same weights:
the matrix products of one decoding call, by the rows the call carries.

    python benchmarks/bench_bf16_kernel.py --model runs/smol-causal-a80g-bf16 --threads 1 --out bf16-kernel-smol

The model (a bfloat16 export) loads as `biglm serve` loads it on a CPU without bfloat16 matrix kernels: float32
compute, its linear layers packed for `biglm.model.cpu_kernels` (`pack_linears(bf16_weights=True)`). For each row
count, every packed product of the model (fused q/k/v, o, fused gate/up, down in each layer, and the head) is applied
once, in the model's order, to random rows of its input width, as one call applies them: the weights stream from
memory as they do in a call. Each round times both ways back to back (which first alternates); the table gives the
median over ``--repeats`` rounds and the largest difference between the two ways' outputs relative to their size.

Results: benchmarks/results/<out>.json and .md with the machine and commit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import kernel_switch, load_packed, machine, markdown_header, positive_int, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a bfloat16 export")
    ap.add_argument("--rows", type=positive_int, nargs="+", default=[1, 2, 4, 6, 8, 12, 16, 32, 64, 160])
    ap.add_argument("--repeats", type=positive_int, default=7)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--out", default="bf16-kernel")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from biglm.model.packed import FusedPackedLinear, PackedLinear

    model, _ = load_packed(args.model, Path(__file__).name)
    use = kernel_switch(model)  # (exits in one line where nothing is packed for the kernel)
    products = [m for m in model.modules() if isinstance(m, (PackedLinear, FusedPackedLinear))
                and m.packed is not None and m.packed.bf16]
    widths = [(m.weight.shape[1] if isinstance(m, PackedLinear) else m._parts[0].weight.shape[1]) for m in products]
    weights = sum(m.packed.weight.numel() for m in products)
    g = torch.Generator().manual_seed(0)
    results = []
    with torch.inference_mode():
        for rows in args.rows:
            xs = [torch.randn(rows, k, generator=g) for k in widths]
            times: dict[bool, list[float]] = {True: [], False: []}
            outs = {}
            for r in range(args.repeats + 1):
                for kernel in ((True, False) if r % 2 else (False, True)):
                    use(kernel)
                    t0 = time.perf_counter()
                    got = [m.packed(x) for m, x in zip(products, xs)]
                    if r:  # (round 0: warm-up)
                        times[kernel].append(time.perf_counter() - t0)
                    outs[kernel] = got
            gap = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                      for a, b in zip(outs[True], outs[False]))
            k_ms, f_ms = (1e3 * statistics.median(times[w]) for w in (True, False))
            results.append({"rows": rows, "kernel_ms": k_ms, "onednn_float32_ms": f_ms, "ratio": k_ms / f_ms,
                            "max_relative_difference": gap})
            print(f"{rows:4d} rows: kernel {k_ms:7.1f} ms, oneDNN float32 {f_ms:7.1f} ms ({k_ms / f_ms:.2f}x)",
                  flush=True)
    use(True)
    report = {"command": "python " + " ".join(sys.argv), "machine": machine(), "model": args.model,
              "products": len(products), "weights": weights, "repeats": args.repeats, "results": results}
    md = markdown_header("A model's linear layers: biglm's bfloat16 kernel vs oneDNN float32", report)
    md += ["", f"{len(products)} products ({weights / 1e6:.1f}M weights: {2 * weights / 1e6:.0f} MB in bfloat16, "
               f"{4 * weights / 1e6:.0f} MB in float32) in the model's order, median of {args.repeats} rounds", "",
           "| rows | kernel ms | oneDNN float32 ms | kernel / oneDNN | max relative difference |",
           "|---:|---:|---:|---:|---:|"]
    md += [f"| {r['rows']} | {r['kernel_ms']:.1f} | {r['onednn_float32_ms']:.1f} | {r['ratio']:.2f}x | "
           f"{r['max_relative_difference']:.1e} |" for r in results]
    write_report(args.out, report, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
