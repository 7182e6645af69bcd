"""Decoding settings at a real model's shape, judged by the autoregressive source: quality, calls and speed.

A BiGLM converted from an AR checkpoint (`biglm convert`, then adapted) writes continuations of held-out prompts under
each decoding setting; the source AR model (the GGUF made a transformers directory, as vLLM and lm-eval load it)
scores them: its mean negative log-likelihood per token of the continuation given the prompt (lower: more what the
source would write; repetitive text also scores low, so the share of distinct bigrams is reported beside it). The
source's own greedy continuation is the reference row. Per setting: model calls per answer, tokens per call, positions
per token, tokens/s in-process (batch 1, one prompt at a time, after a warm-up), and the NLL.

    python benchmarks/bench_decode_quality.py --biglm runs/smol-adapt-b1 \\
        --source ../shared/models/SmolLM2-135M-Instruct.Q4_1.gguf --val-shard runs/data-smol-mix/val-00000.bin \\
        --settings "blocks:8,T=N/2" "blocks:32,T=N/2" "blocks:1" "spec:2" "spec:4" --dtype float32 bfloat16

A setting is ``blocks:B,T=N/2`` (confidence decoding, blocks of B with the model's cache, N/2 calls), ``blocks:1``
(one token per call), ``spec:M`` (speculative decoding, M drafts; greedy, it writes what ``blocks:1`` writes),
``threshold:TAU[,B]`` (Fast-dLLM's threshold rule in blocks of B, default 8: every prediction above TAU is kept, at
least one per call), ``default`` (the model's own default decoding: for a drafting model n-gram drafts checked
exactly, `generation.config.drafting_default`).
EOS is suppressed so every answer is N tokens long. Results: benchmarks/results/<out>.json and .md with machine and
commit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from biglm.checkpoint import load_model
from biglm.generation import generate_ids
from biglm.generation.config import drafting_default

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speculative import held_out_prompts  # noqa: E402
from common import hf_directory, machine, markdown_header, positive_int, write_report  # noqa: E402


def decoding(setting: str, n: int) -> dict:
    """`DecodingConfig` fields of a setting name (module docstring)."""
    kind, _, rest = setting.partition(":")
    if setting == "default":
        return {}  # the model's own default decoding (`drafting_default`), read once the model is loaded
    if kind == "spec":
        return dict(strategy="confidence", draft_length=int(rest))
    if kind == "threshold":
        tau, _, b = rest.partition(",")
        return dict(strategy="threshold", threshold=float(tau), block_length=int(b or 8))
    if kind == "blocks":
        b, _, t = rest.partition(",")
        fields = dict(strategy="confidence", block_length=int(b))
        if t == "T=N/2":
            fields["steps"] = n // 2
        elif t:
            raise SystemExit(f"bench_decode_quality.py: setting {setting!r}: only T=N/2 may follow the block length")
        return fields
    raise SystemExit(f"bench_decode_quality.py: unknown setting {setting!r} (blocks:B[,T=N/2], spec:M, "
                     "threshold:TAU[,B] or default)")


@torch.inference_mode()
def judge_nll(judge: torch.nn.Module, pairs: list[tuple[list[int], list[int]]]) -> float:
    """Mean NLL per continuation token under the AR judge."""
    total, count = 0.0, 0
    device = next(judge.parameters()).device
    for prompt, cont in pairs:
        ids = torch.tensor([prompt + cont], device=device)
        logp = judge(ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
        total -= float(logp.gather(1, torch.tensor(cont, device=device)[:, None]).sum())
        count += len(cont)
    return total / count


def distinct2(conts: list[list[int]]) -> float:
    grams = [tuple(c[i:i + 2]) for c in conts for i in range(len(c) - 1)]
    return len(set(grams)) / max(1, len(grams))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--biglm", required=True, help="a biglm run or export converted from --source")
    p.add_argument("--source", required=True, help="the AR source: a .gguf file or a transformers directory")
    p.add_argument("--val-shard", required=True, help="held-out prompts (a biglm data shard made with its tokenizer)")
    p.add_argument("--prompts", type=positive_int, default=8)
    p.add_argument("--prompt-len", type=positive_int, default=32)
    p.add_argument("--new-tokens", type=positive_int, default=64)
    p.add_argument("--settings", nargs="+", default=["blocks:8,T=N/2", "blocks:32,T=N/2", "blocks:1", "spec:2"])
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--work", default="runs/bench-decode-quality", help="where the source's transformers dir is made")
    p.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    n = args.new_tokens
    configs = {s: decoding(s, n) for s in args.settings}  # bad settings fail before anything loads
    from transformers import AutoModelForCausalLM

    judge = AutoModelForCausalLM.from_pretrained(hf_directory(Path(args.source), Path(args.work)),
                                                 dtype=torch.float32).eval()
    prompts = held_out_prompts(argparse.Namespace(val_shard=args.val_shard, checkpoint=args.biglm, prompts=args.prompts,
                                                  prompt_len=args.prompt_len)).tolist()
    rows = []
    with torch.inference_mode():
        ref = [judge.generate(torch.tensor([pr]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(pr):]
               .tolist() for pr in prompts]
    rows.append(dict(setting="source AR, greedy (reference)", dtype="float32", nll=judge_nll(judge, list(zip(prompts, ref))),
                     distinct2=distinct2(ref)))
    print(rows[-1], flush=True)
    for dtype in args.dtype:
        model, tok = load_model(args.biglm, dtype=getattr(torch, dtype))
        eos = [model.config.eos_token_id] if model.config.eos_token_id is not None else []
        for setting, fields in configs.items():
            kw = dict(max_new_tokens=n, suppress_ids=eos, **(drafting_default(model.config) if setting == "default"
                                                             else fields))
            generate_ids(model, torch.tensor([prompts[0]]), None, **kw)  # warm-up
            conts, seconds, calls, positions = [], 0.0, 0, 0
            for pr in prompts:
                start = time.perf_counter()
                out = generate_ids(model, torch.tensor([pr]), None, **kw)
                seconds += time.perf_counter() - start
                conts.append(out.token_lists()[0])
                calls += out.steps
                positions += out.positions - len(pr)
            tokens = sum(len(c) for c in conts)
            rows.append(dict(setting=setting, dtype=dtype, nll=judge_nll(judge, list(zip(prompts, conts))),
                             distinct2=distinct2(conts), calls_per_answer=calls / len(prompts),
                             tokens_per_call=tokens / calls, positions_per_token=positions / tokens,
                             tokens_per_s=tokens / seconds,
                             sample=tok.decode(conts[0][:40])))
            print({k: v for k, v in rows[-1].items() if k != "sample"}, flush=True)
    meta = dict(command="python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                machine=machine(), prompts=args.prompts, prompt_len=args.prompt_len, new_tokens=n)
    lines = markdown_header("Decoding settings judged by the AR source", meta)
    lines.append("")
    lines += [f"- {args.prompts} held-out prompts of {args.prompt_len} tokens, N = {n}, batch 1, EOS suppressed; "
              "NLL: the source's mean negative log-likelihood per continuation token (lower = closer to what the "
              "source writes; repetition also lowers it: distinct-2 beside it)", "",
              "| setting | dtype | judge NLL | distinct-2 | calls / answer | tokens / call | positions / token | tok/s |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "calls_per_answer" in r:
            lines.append(f"| {r['setting']} | {r['dtype']} | {r['nll']:.2f} | {r['distinct2']:.2f} | "
                         f"{r['calls_per_answer']:.1f} | {r['tokens_per_call']:.2f} | {r['positions_per_token']:.2f} | "
                         f"{r['tokens_per_s']:.1f} |")
        else:
            lines.append(f"| {r['setting']} | {r['dtype']} | {r['nll']:.2f} | {r['distinct2']:.2f} | - | - | - | - |")
    lines += ["", "First sample of each setting (40 tokens):", ""]
    lines += [f"- {r['setting']} ({r['dtype']}): {r['sample']!r}" for r in rows if "sample" in r]
    print("\n".join(lines))
    if args.out:
        write_report(args.out, dict(**meta, rows=rows), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
