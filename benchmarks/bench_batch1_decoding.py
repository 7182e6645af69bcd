"""Decoding settings of one model at batch 1, timed in-process: milliseconds a model call, tokens a call, tokens/s.

    python benchmarks/bench_batch1_decoding.py --model runs/smol-causal-a80g --threads 1 \\
        --setting "one-per-call=strategy=confidence,block_length=1,steps=96,draft_length=0" --setting default= \\
        --setting "ngram-only=strategy=confidence,draft_length=4,draft_ngram=3,draft_model=false,draft_fill=false" \\
        --out batch1-decoding-smol-causal-a80g

The model loads as `biglm generate` loads it (`load_model(..., pack=True)`); each ``--setting NAME=FIELD=VALUE,...``
(empty: the model's default decoding) is `model_decoding` of those fields over ``--max-new-tokens`` greedy tokens, end
of text ignored, and decodes each held-out prompt (`bench_exact_drafts.prompt_rows`, chats rendered with the model's
template) alone with `generate_ids`, after one untimed warm-up answer; prompt by prompt every setting runs in turn
(the order rotating), so the machine's drift hits them alike. The time is the decoding's only (no load, no
tokenizing), so the settings compare as a server at batch 1 would run them.

``--compare-bf16-kernel`` (a bfloat16 export on a CPU without bfloat16 matrix kernels, where `load_model` packs its
linear layers and norms for biglm's CPU kernels, `cpu_kernels`): each setting twice, the kernels against oneDNN's
prepacked float32 of the same values and PyTorch's `rms_norm` (`common.kernel_switch`), both in the
rotation. ``--compare-layer-kernel``: each setting with each decoder layer in one C call (`packed.KernelLayer`) and with
PyTorch's ops around the same kernel products (with both flags: the three ways).

Results: benchmarks/results/<out>.json and .md with the machine and commit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exact_drafts import prompt_rows, prompt_text  # noqa: E402
from common import kernel_switch, load_packed, machine, markdown_header, positive_int, write_report  # noqa: E402


def parse_setting(text: str) -> tuple[str, dict]:
    name, _, fields = text.partition("=")
    values = {}
    for item in filter(None, fields.split(",")):
        key, _, raw = item.partition("=")
        low = raw.lower()
        values[key] = (True if low == "true" else False if low == "false" else None if low == "none"
                       else int(raw) if raw.lstrip("-").isdigit() else float(raw) if raw.replace(".", "", 1).isdigit()
                       else raw)
    if not name:
        raise argparse.ArgumentTypeError(f"--setting {text!r}: give NAME=FIELD=VALUE,... (NAME= for the default)")
    return name, values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="an export or run folder")
    ap.add_argument("--setting", type=parse_setting, action="append", required=True)
    ap.add_argument("--max-new-tokens", type=positive_int, default=96)
    ap.add_argument("--prompts", type=positive_int, default=4, help="prompts of each kind (3 kinds)")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--compile", action="store_true",
                    help="load as `biglm generate --compile` does (each decoder layer torch.compiled, dynamic shapes; "
                         "float32), the compilation in the warm-up answers")
    ap.add_argument("--compare-bf16-kernel", action="store_true",
                    help="each setting with biglm's bfloat16 kernel and with oneDNN float32 of the same weights "
                         "(a bfloat16 export on a CPU without bfloat16 matrix kernels)")
    ap.add_argument("--compare-layer-kernel", action="store_true",
                    help="each setting with each decoder layer in one C call (`packed.KernelLayer`) and with "
                         "PyTorch's ops around the same kernel products")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--out", default="batch1-decoding")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if (args.compare_bf16_kernel or args.compare_layer_kernel) and args.compile:
        raise SystemExit("bench_batch1_decoding.py: --compare-bf16-kernel and --compare-layer-kernel compare packed "
                         "kernels; drop --compile")
    from biglm.generation import generate_ids
    from biglm.generation.config import model_decoding

    model, tok = (load_packed(args.model, Path(__file__).name, pack=False, compile=True, dtype=torch.float32)
                  if args.compile else load_packed(args.model, Path(__file__).name))
    ways = [("", lambda: None)]
    if args.compare_bf16_kernel or args.compare_layer_kernel:
        use_kernel = kernel_switch(model)
        ways = [("bf16-kernel", lambda: use_kernel(True))]
        if args.compare_layer_kernel:
            ways = [("layer-kernel", lambda: use_kernel(True, True)),
                    ("products-kernel", lambda: use_kernel(True, False))]
        if args.compare_bf16_kernel:
            ways.append(("onednn-float32", lambda: use_kernel(False)))
    rows = prompt_rows(Path(args.data), args.prompts)
    prompts = [torch.tensor([tok(prompt_text(tok, r), add_special_tokens=False)["input_ids"]]) for r in rows]
    configs = []
    for name, fields in args.setting:  # every setting checked before any is timed
        try:
            configs.append(model_decoding(model.config, {"max_new_tokens": args.max_new_tokens, "ignore_eos": True,
                                                         **fields}))
        except (TypeError, ValueError) as e:
            raise SystemExit(f"bench_batch1_decoding.py: --setting {name}: {e}") from None
    # every (setting, way) runs each prompt in turn, the order rotating prompt by prompt, so that the machine's drift
    # over the run hits them alike
    runs = [(f"{name} ({way})" if way else name, fields, config, use)
            for (name, fields), config in zip(args.setting, configs) for way, use in ways]
    for _, _, config, use in runs:
        use()
        for ids in prompts[:2 if args.compile else 1]:  # (warm-up; compiled: the shapes of a second prompt too)
            generate_ids(model, ids, config=config)
    calls, texts, seconds = [0] * len(runs), [[] for _ in runs], [0.0] * len(runs)
    for i, ids in enumerate(prompts):
        for j in (list(range(len(runs)))[i % len(runs):] + list(range(len(runs)))[:i % len(runs)]):
            use = runs[j][3]
            use()
            t0 = time.perf_counter()
            out = generate_ids(model, ids, config=runs[j][2])
            seconds[j] += time.perf_counter() - t0
            calls[j] += sum(out.calls_per_row())
            texts[j].append(out.token_lists()[0])
    tokens = args.max_new_tokens * len(prompts)
    results = []
    for j, (label, fields, _, _) in enumerate(runs):
        results.append({"setting": label, "fields": fields, "seconds": seconds[j], "calls": calls[j],
                        "ms_per_call": 1e3 * seconds[j] / calls[j], "tokens_per_call": tokens / calls[j],
                        "tokens_per_s": tokens / seconds[j], "texts": texts[j]})
        print(f"{label}: {tokens / seconds[j]:.1f} tok/s, {tokens / calls[j]:.2f} tokens a call, "
              f"{1e3 * seconds[j] / calls[j]:.1f} ms a call", flush=True)
    first = results[0]["texts"]
    for r in results:
        r["same_text_as_first"] = sum(a == b for a, b in zip(r.pop("texts"), first))
    report = {"command": "python " + " ".join(sys.argv), "machine": machine(), "model": args.model,
              "compiled": args.compile, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "results": results}
    md = markdown_header("Decoding settings at batch 1, in-process"
                         + (" (each decoder layer torch.compiled)" if args.compile else ""), report)
    md += ["", f"{len(prompts)} held-out prompts alone, {args.max_new_tokens} greedy tokens each, end of text ignored",
           "", f"| setting | tok/s | tokens a call | ms a call | the same text as {results[0]['setting']} |",
           "|---|---:|---:|---:|---|"]
    md += [f"| {r['setting']} (`{', '.join(f'{k}={v}' for k, v in r['fields'].items()) or 'the default'}`) | "
           f"{r['tokens_per_s']:.1f} | {r['tokens_per_call']:.2f} | {r['ms_per_call']:.1f} | "
           f"{r['same_text_as_first']}/{len(prompts)} |" for r in results]
    write_report(args.out, report, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
