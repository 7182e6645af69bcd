"""A drafting model's mask adapters at batch 1: their low-rank products as `F.linear` (what `pack_linears` leaves them)
against prepacked for oneDNN (what it did before), on the same loaded model, prompt by prompt.

    python benchmarks/bench_adapter_packing.py --model runs/smol-causal-a80g --threads 1 \\
        --out adapter-packing-smol-causal-a80g

The model loads as `biglm generate` loads it (prepacked linears, its adapters' `F.linear`); the other arm swaps each
`BiGLMMaskAdapter`'s ``down``/``up`` for a `PackedLinear` of the same weights. Each held-out prompt
(`bench_exact_drafts.prompt_rows`, chats rendered with the model's template) is decoded both ways, in alternating
order, with the model's default decoding at batch 1 (its fill calls carry mask tokens: every layer's adapters run),
``--max-new-tokens`` greedy tokens, end of text ignored: milliseconds a model call (median, and the paired median of
the differences) and whether the text is the same.

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
from common import load_packed, machine, markdown_header, positive_int, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a drafting model (mask adapters): an export or run folder")
    ap.add_argument("--max-new-tokens", type=positive_int, default=64)
    ap.add_argument("--prompts", type=positive_int, default=4, help="prompts of each kind (3 kinds)")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--out", default="adapter-packing")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from biglm.generation import generate_ids
    from biglm.generation.config import model_decoding
    from biglm.model.modeling import BiGLMMaskAdapter
    from biglm.model.packed import PackedLinear

    model, tok = load_packed(args.model, Path(__file__).name)
    adapters = [m for m in model.modules() if isinstance(m, BiGLMMaskAdapter)]
    if not adapters:
        raise SystemExit(f"{args.model} has no mask adapters (mask_adapter_rank 0): pass a `blocks-adapt` model of a "
                         "causal conversion")
    ways = {"F.linear": [(m.down, m.up) for m in adapters],
            "prepacked": [(PackedLinear(m.down), PackedLinear(m.up)) for m in adapters]}

    def use(way: str) -> None:
        for m, (down, up) in zip(adapters, ways[way]):
            m.down, m.up = down, up

    rows = prompt_rows(Path(args.data), args.prompts)
    prompts = [torch.tensor([tok(prompt_text(tok, r), add_special_tokens=False)["input_ids"]]) for r in rows]
    config = model_decoding(model.config, {"max_new_tokens": args.max_new_tokens, "ignore_eos": True})
    use("F.linear")
    generate_ids(model, prompts[0], config=config)  # (warm-up)
    per_call: dict[str, list[float]] = {w: [] for w in ways}
    texts: dict[str, list] = {w: [] for w in ways}
    calls: dict[str, int] = dict.fromkeys(ways, 0)
    for i, ids in enumerate(prompts):
        for way in (list(ways) if i % 2 else list(ways)[::-1]):
            use(way)
            t0 = time.perf_counter()
            out = generate_ids(model, ids, config=config)
            n = sum(out.calls_per_row())
            per_call[way].append((time.perf_counter() - t0) / n)
            texts[way].append(out.token_lists())
            calls[way] += n
    use("F.linear")
    diffs = [a - b for a, b in zip(per_call["F.linear"], per_call["prepacked"])]
    report = {"command": "python " + " ".join(sys.argv), "machine": machine(), "model": args.model,
              "adapters": len(adapters), "rank": model.config.mask_adapter_rank, "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens,
              "decoding": {k: getattr(config, k) for k in ("strategy", "draft_length", "draft_ngram", "draft_model",
                                                            "draft_fill")},
              "ms_per_call": {w: 1e3 * statistics.median(v) for w, v in per_call.items()},
              "paired_difference_ms": 1e3 * statistics.median(diffs), "calls": calls,
              "same_text": texts["F.linear"] == texts["prepacked"]}
    md = markdown_header("A drafting model's mask adapters: F.linear against prepacked, batch 1", report)
    md += ["", f"{len(prompts)} held-out prompts, {args.max_new_tokens} greedy tokens each, the model's default "
               f"decoding; {len(adapters)} adapters of rank {report['rank']}; each prompt both ways, alternating", "",
           "| the adapters' products | ms a model call (median) | model calls | the same text |",
           "|---|---:|---:|---|"]
    md += [f"| {w} | {report['ms_per_call'][w]:.1f} | {calls[w]} | {report['same_text']} |" for w in ways]
    md += ["", f"Paired difference (F.linear - prepacked), median over the prompts: "
               f"{report['paired_difference_ms']:+.1f} ms a call.", ""]
    write_report(args.out, report, "\n".join(md))


if __name__ == "__main__":
    main()
