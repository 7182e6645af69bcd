"""The server engine's step under load, in-process: one of the engine's choices against the way before it, step by
step on the same engine.

    python benchmarks/bench_engine_step.py --model runs/smol-causal-a80g-bf16 --requests 32 --threads 1 \\
        [--compare room|grouped|bf16-kernel|layer-kernel] --out engine-step-smol-causal-a80g-bf16

``--compare room`` (default): a call that writes its keys/values into the pooled rows' room (`PrefixCache.room`, the
engine's way) against one that concatenates each layer's cache with them. ``--compare grouped``: float32 attention of
the pooled call through `attention.grouped_attention` (the sdpa backend's choice from
`GROUPED_MIN_QUERY_ROWS_FLOAT32` query rows) against PyTorch's flash kernel. ``--compare bf16-kernel``: a bfloat16
export's linear layers and norms through biglm's CPU kernels (`cpu_kernels`, what `load_model` packs them for on a
CPU without bfloat16 matrix kernels) against oneDNN's prepacked float32 of the same values and PyTorch's `rms_norm`
(`kernel_switch`). ``--compare layer-kernel``: each decoder layer in one C call (`packed.KernelLayer`) against
PyTorch's ops around the same kernel products.

``--requests`` greedy requests of the held-out prompts (`bench_exact_drafts.prompt_rows`, chats rendered with the
model's template) with the model's default decoding, ``--max-new-tokens`` each, end of text ignored, are submitted at
once into a `DecodeEngine` (the model loaded as `biglm serve` loads it: prepacked, a bfloat16 export in float32 on a
CPU without bfloat16 kernels). Once every prompt is encoded (the requests decode one token per call in the pool, as
a server under load does), ``--steps`` pairs of steps are timed, each pair one step of each way in alternating order,
so the machine's drift and the caches' growth hit both alike: the median of each way and of the paired differences.
A step's time includes everything `DecodeEngine.step` does (the model call, drawing, bookkeeping). The answers are
the same either way (tested: tests/test_prefix_cache.py, tests/test_generation_engine.py, tests/test_model.py).

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
from bench_exact_drafts import prompt_rows, prompt_text  # noqa: E402
from common import kernel_switch, load_packed, machine, markdown_header, positive_int, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="an export or run folder")
    ap.add_argument("--requests", type=positive_int, default=32)
    ap.add_argument("--max-new-tokens", type=positive_int, default=128)
    ap.add_argument("--steps", type=positive_int, default=40, help="timed pairs of steps")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--compare", choices=("room", "grouped", "bf16-kernel", "layer-kernel"), default="room",
                    help="room: the call's keys/values into the rows' room vs concatenated; grouped: float32 pooled "
                         "attention through grouped_attention vs the flash kernel; bf16-kernel: a bfloat16 export's "
                         "linear layers through biglm's bfloat16 kernel vs oneDNN's prepacked float32; layer-kernel: "
                         "each decoder layer in one C call vs PyTorch's ops around the same kernel products")
    ap.add_argument("--out", default="engine-step")
    args = ap.parse_args()
    if args.max_new_tokens < 2 * args.steps + 8:
        raise SystemExit(f"--max-new-tokens {args.max_new_tokens} is too few for {args.steps} pairs of steps after "
                         "the prompts: give at least 2 * steps + 8")
    torch.set_num_threads(args.threads)
    from biglm.generation.config import model_decoding
    from biglm.generation.engine import DecodeEngine

    model, tok = load_packed(args.model, Path(__file__).name)
    rows = prompt_rows(Path(args.data), 4)
    prompts = [tok(prompt_text(tok, r), add_special_tokens=False)["input_ids"] for r in rows]
    config = model_decoding(model.config, {"max_new_tokens": args.max_new_tokens, "ignore_eos": True})
    engine = DecodeEngine(model, tokenizer=tok)
    for i in range(args.requests):
        engine.submit(f"r{i}", prompts[i % len(prompts)], config)
    pool, batch = engine._pool, engine._pool.batch
    way = {"room": True}  # (True: the engine's way)
    from biglm.model import attention

    grouped_from = attention.GROUPED_MIN_QUERY_ROWS_FLOAT32
    switch = kernel_switch(model) if args.compare in ("bf16-kernel", "layer-kernel") else None
    use_kernel = None if switch is None else (switch if args.compare == "bf16-kernel"
                                              else lambda engine_way: switch(True, engine_way))

    def batch_as(reqs, call, **kw):  # the pool's batch, without its room for the concatenating way
        cache = batch(reqs, call, **kw)
        if cache is not None and not way["room"] and args.compare == "room":
            cache.room = None
        attention.GROUPED_MIN_QUERY_ROWS_FLOAT32 = (grouped_from if way["room"] or args.compare != "grouped"
                                                    else float("inf"))
        if use_kernel is not None:
            use_kernel(way["room"])
        return cache

    pool.batch = batch_as
    while engine.num_prefilling or engine.num_waiting:
        engine.step()
    for _ in range(2):
        engine.step()
    rows_decoded = sum(r.rows for r in engine._running.values())
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.steps):
        for room in ((True, False) if i % 2 else (False, True)):
            way["room"] = room
            if use_kernel is not None:
                use_kernel(room)
            t0 = time.perf_counter()
            engine.step()
            times[room].append(time.perf_counter() - t0)
    diffs = [a - b for a, b in zip(times[True], times[False])]
    # each way's name in the report, the engine's first ("room"/"concatenate": the keys of the first results)
    names, rows_md, title = {
        "room": (("room", "concatenate"), ("written into the rows' room", "concatenated with the cache in every layer"),
                 "the call writing into the rows' room vs concatenating"),
        "grouped": (("grouped", "flash"), ("`grouped_attention` (two products, float32 softmax)",
                                           "PyTorch's flash kernel (`scaled_dot_product_attention`)"),
                    "float32 pooled attention through grouped_attention vs the flash kernel"),
        "bf16-kernel": (("bf16-kernel", "onednn-float32"), ("biglm's CPU kernels (`cpu_kernels`: products, norms)",
                                                            "oneDNN prepacked float32 of the same values, torch's "
                                                            "rms_norm"),
                        "a bfloat16 export through biglm's CPU kernels vs oneDNN float32"),
        "layer-kernel": (("layer-kernel", "products-kernel"), ("each decoder layer in one C call (`KernelLayer`)",
                                                               "PyTorch's ops around the same kernel products"),
                         "each decoder layer in one C call vs PyTorch's ops around the kernel products"),
    }[args.compare]
    res = {w: {"median_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t)} for w, t in
           ((names[0], times[True]), (names[1], times[False]))}
    res["paired_difference_median_ms"] = 1e3 * statistics.median(diffs)
    report = {"command": "python " + " ".join(sys.argv), "machine": machine(), "model": args.model,
              "compare": args.compare, "requests": args.requests, "rows": rows_decoded,
              "max_new_tokens": args.max_new_tokens, "steps": args.steps,
              "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "results": res,
              **{f"tokens_per_s_{w}": rows_decoded / (res[w]["median_ms"] / 1e3) for w in names}}
    md = markdown_header(f"The engine's step under load: {title}", report)
    md += ["", f"{args.requests} requests ({rows_decoded} rows decoding, one token per call in the pool), "
               f"{args.max_new_tokens} tokens each, {args.steps} pairs of steps in alternating order, "
               f"{report['dtype']} compute", "",
           "| way | step median ms | step min ms | tokens/s (median) |", "|---|---:|---:|---:|"]
    md += [f"| {label} | {res[w]['median_ms']:.1f} | {res[w]['min_ms']:.1f} | {report[f'tokens_per_s_{w}']:.1f} |"
           for w, label in zip(names, rows_md)]
    md += ["", f"Paired difference ({names[0]} - {names[1]}), median over the pairs: "
               f"{res['paired_difference_median_ms']:+.1f} ms a step.", ""]
    write_report(args.out, report, "\n".join(md))


if __name__ == "__main__":
    main()
