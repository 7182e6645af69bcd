"""Speculative decoding against block decoding and an autoregressive model, speed and quality side by side, on a
trained `biglm-blocks` checkpoint and its held-out prompts (issue 21: batch 1, >= 2x the AR model at the quality of
T = N/2).

A random model never agrees with its own drafts, so this benchmark needs trained weights and real prompts: the first
``--prompt-len`` tokens of the first ``--prompts`` held-out documents that long (``--val-shard``, default
CHECKPOINT/data/val-*.bin); the answers run on past the document.

Settings, each writing exactly N tokens per prompt (EOS suppressed for every BiGLM setting, so no answer stops early
and every setting does the work of N tokens, as the AR model does with ``min_new_tokens = N``):
- ``ar``: a `LlamaForCausalLM` of the checkpoint's shape (random weights: they do not change a forward's cost),
  transformers' greedy ``generate`` with its KV cache (`bench_generation.build_models`);
- ``blocks of B, T=N/2``: confidence decoding, blocks of ``--block-length`` with the append cache, two tokens per
  call (the issue's reference quality);
- ``blocks of 1, T=N``: one token per call (what speculative decoding reproduces exactly);
- ``speculative m=k``: ``draft_length`` k for each of ``--draft-lengths``, with each ``--draft-accept`` (1 = exact).
Timing: one warm-up round, then ``--repeats`` rounds over all prompts (batch 1: one prompt at a time; larger
``--batch``: prompts in groups of that size). Within a round every setting answers a group before the next group
starts, so a shared machine's drifting speed hits every setting alike; a setting's round time sums its groups. The
median round is the headline, and the ratio against the AR model is the median of the rounds' own ratios.
Quality (the timed answers): model calls per answer, tokens per call, positions processed per committed token,
agreement with the blocks-of-1 answer, and with ``--grammar`` the grammatical share of the complete sentences
(`synthetic_grammar.check`).

    python benchmarks/bench_speculative.py --checkpoint RUN --grammar --threads 1 --out speculative-grammar-cpu

Results go to ``benchmarks/results/<out>.json`` and ``.md`` with the machine, torch version and git commit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from biglm.checkpoint import load_model
from biglm.generation import DecodingConfig, generate_ids

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import _DTYPES, _sync, llama_peer  # noqa: E402
from common import machine, markdown_header, positive_int, write_report  # noqa: E402


def settings(args: argparse.Namespace, n: int) -> dict[str, dict]:
    """Label -> `DecodingConfig` fields of every BiGLM setting timed."""
    out = {f"blocks of {args.block_length}, T=N/2": dict(strategy="confidence", steps=n // 2,
                                                         block_length=args.block_length),
           "blocks of 1, T=N": dict(strategy="confidence", block_length=1)}
    for accept in args.draft_accept:
        for m in args.draft_lengths:
            out[f"speculative m={m}" + ("" if accept == 1.0 else f", accept {accept:g}")] = dict(
                strategy="confidence", draft_length=m, draft_accept=accept)
    return out


def held_out_prompts(args: argparse.Namespace) -> torch.Tensor:
    """(prompts, P): the first ``--prompt-len`` tokens of the first ``--prompts`` held-out documents that long (the
    answers continue past the document's end: only the prompt is read)."""
    from biglm.data.shards import ShardReader

    shards = [Path(args.val_shard)] if args.val_shard else sorted((Path(args.checkpoint) / "data").glob("val-*.bin"))
    if not shards or not shards[0].is_file():
        raise SystemExit(f"bench_speculative.py: no held-out shard ({args.val_shard or args.checkpoint + '/data/val-*.bin'}): "
                         "pass --val-shard DATA/val-00000.bin")
    shard = ShardReader(shards[0], expected_vocab_size=None)
    rows = []
    for i in range(len(shard)):
        doc = shard.doc(i)
        if len(doc) >= args.prompt_len:
            rows.append(doc[:args.prompt_len].astype("int64").tolist())
        if len(rows) == args.prompts:
            break
    if len(rows) < args.prompts:
        raise SystemExit(f"bench_speculative.py: only {len(rows)} documents of {shards[0]} hold --prompt-len "
                         f"{args.prompt_len} tokens; ask for fewer --prompts or a shorter --prompt-len")
    return torch.tensor(rows, dtype=torch.long)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a trained biglm-blocks run or export")
    p.add_argument("--val-shard", default=None, help="held-out prompts (default: CHECKPOINT/data/val-*.bin)")
    p.add_argument("--prompt-len", type=positive_int, default=64)
    p.add_argument("--new-tokens", type=positive_int, default=128, help="N, the tokens each answer writes")
    p.add_argument("--prompts", type=positive_int, default=16)
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--block-length", type=positive_int, default=8, help="the reference setting's blocks")
    p.add_argument("--draft-lengths", type=positive_int, nargs="+", default=[1, 2, 3])
    p.add_argument("--draft-accept", type=float, nargs="+", default=[1.0, 0.5])
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--grammar", action="store_true", help="the checkpoint learned benchmarks/synthetic_grammar.py")
    p.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    args = p.parse_args(argv)
    for a in args.draft_accept:
        if not 0.0 < a <= 1.0:
            p.error(f"--draft-accept {a}: must lie in (0, 1]")
    if args.threads:
        torch.set_num_threads(args.threads)
    where = machine(torch.device(args.device))  # the load before this run's own work
    if not Path(args.checkpoint).exists():
        p.error(f"--checkpoint {args.checkpoint}: no such run or export")
    device, dtype = torch.device(args.device), _DTYPES[args.dtype]
    model, tokenizer = load_model(args.checkpoint, device=device, dtype=dtype)  # on a CPU: sdpa attention
    if model.config.prefix_attention != "blocks":
        p.error(f"--checkpoint {args.checkpoint}: a paper (bidirectional) model; speculative decoding is exact for a "
                "biglm-blocks model (biglm pretrain --objective biglm-blocks, or the adaptation recipe)")
    n = args.new_tokens
    if args.prompt_len + n > model.config.max_position_embeddings:
        p.error(f"--prompt-len {args.prompt_len} + --new-tokens {n} exceed the model's max_position_embeddings="
                f"{model.config.max_position_embeddings}: a trained model writes only inside the window it learned")
    llama = llama_peer(model.config, device, dtype)
    prompts = held_out_prompts(args).to(device)
    groups = list(prompts.split(args.batch))
    eos = model.config.eos_token_id
    grid = settings(args, n)

    def run_ar(g: torch.Tensor) -> dict:
        with torch.inference_mode():
            out = llama.generate(g, attention_mask=torch.ones_like(g), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False)
        assert out.shape[1] == g.shape[1] + n
        return dict(calls=n, positions=g.shape[0] * (args.prompt_len + n - 1), answers=[])

    def run_biglm(g: torch.Tensor, fields: dict) -> dict:
        out = generate_ids(model, g, config=DecodingConfig(max_new_tokens=n, **fields), suppress_ids=[eos])
        return dict(calls=out.steps, positions=out.positions, answers=out.token_lists())

    runs = {"ar": run_ar, **{label: (lambda g, f=f: run_biglm(g, f)) for label, f in grid.items()}}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.repeats + 1):  # round 0 warms up
        spent = dict.fromkeys(runs, 0.0)
        made: dict[str, dict] = {label: dict(calls=0, positions=0, answers=[]) for label in runs}
        for g in groups:  # every setting on this group before the next: a drifting machine hits all alike
            for label, fn in runs.items():
                _sync(device)
                t0 = time.perf_counter()
                w = fn(g)
                _sync(device)
                spent[label] += time.perf_counter() - t0
                for key in ("calls", "positions", "answers"):
                    made[label][key] += w[key]
        for label, t in spent.items():
            if r:
                times[label].append(t)
            print(f"  {'warm-up' if not r else f'round {r}/{args.repeats}'} {label:<32} {t:7.2f} s", flush=True)
    ref = made["blocks of 1, T=N"]["answers"]
    rows = []
    for label in runs:
        med = statistics.median(times[label])
        w = made[label]
        calls = w["calls"] / len(groups)  # one call of a group serves each of its answers
        ratios = [a / t for a, t in zip(times["ar"], times[label])]  # each round against its own AR time
        row = dict(setting=label, seconds_median=med, seconds=times[label], speedup_vs_ar=statistics.median(ratios),
                   speedup_vs_ar_rounds=ratios,
                   calls_per_answer=calls, tokens_per_call=n / calls, positions_per_token=w["positions"] / (prompts.shape[0] * n))
        if label != "ar":
            row.update(grid[label])
            row["agreement_with_one_per_call"] = sum(a == b for x, y in zip(w["answers"], ref) for a, b in zip(x, y)) / (
                len(ref) * n)
            if args.grammar:
                from synthetic_grammar import check

                counts = [check(tokenizer.decode(q.tolist(), skip_special_tokens=True),
                                tokenizer.decode(a, skip_special_tokens=True)) for q, a in zip(prompts, w["answers"])]
                row["grammatical"] = sum(c["grammatical"] for c in counts) / max(1, sum(c["sentences"] for c in counts))
        rows.append(row)
    report = dict(mode="speculative", settings=dict(
        checkpoint=args.checkpoint, prompts=prompts.shape[0], prompt_len=args.prompt_len, new_tokens=n,
        batch=args.batch, repeats=args.repeats, block_length=args.block_length, device=str(device), dtype=args.dtype,
        shape=dict(
            layers=model.config.num_hidden_layers, hidden=model.config.hidden_size, vocab=model.config.vocab_size)),
        machine=where, command="python benchmarks/bench_speculative.py " + " ".join(sys.argv[1:] if argv is None else argv),
        results=rows)
    lines = [*markdown_header("Speculative decoding vs block decoding vs AR, trained weights", report), "",
             f"- {prompts.shape[0]} held-out prompts of {args.prompt_len} tokens, N = {n}, batch {args.batch}; "
             f"{model.config.num_hidden_layers} layers x {model.config.hidden_size}, vocab {model.config.vocab_size}, "
             f"{args.dtype} on {device}; "
             f"{args.repeats} rounds after a warm-up, each setting on a group of prompts before the next group; time: "
             "the median round; vs AR: the median of the rounds' own ratios (their range beside it)", "",
             "| setting | calls / answer | tokens / call | positions / token | agreement with 1 per call "
             "| grammatical | time (s) | vs AR | rounds |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        gram = f"{100 * r['grammatical']:.1f}%" if "grammatical" in r else "-"
        agree = f"{100 * r['agreement_with_one_per_call']:.1f}%" if "agreement_with_one_per_call" in r else "-"
        lines.append(f"| {r['setting']} | {r['calls_per_answer']:.1f} | {r['tokens_per_call']:.2f} | "
                     f"{r['positions_per_token']:.2f} | {agree} | {gram} | {r['seconds_median']:.2f} | "
                     f"{r['speedup_vs_ar']:.2f}x | {min(r['speedup_vs_ar_rounds']):.2f}-{max(r['speedup_vs_ar_rounds']):.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_report(args.out, report, text)


if __name__ == "__main__":
    main()
