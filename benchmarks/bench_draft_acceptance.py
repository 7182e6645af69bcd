"""Draft sources and draft lengths on held-out prompts of three kinds: acceptance per slot, tokens per call, positions
per token and in-process speed at batch 1, beside one token per call, every setting exact (the test of identity is
part of the run).

The prompts are `bench_exact_drafts.prompt_rows` (a continuation, a chat turn, a rewrite; chat turns through the
model's chat template). Each setting decodes every prompt alone (batch 1, greedy, EOS suppressed so every answer is
``--max-new-tokens`` long), after one untimed warm-up prompt; a setting's time is the sum over prompts. Per slot k
the acceptance is P(draft k kept | drafts 1..k-1 kept), over the calls that checked m drafts, by the source of
the call's drafts (the model's mask slots, or an n-gram of the text so far).

    python benchmarks/bench_draft_acceptance.py --model runs/smol-a40 --dtype bfloat16 --out draft-acceptance-a40

Results: ``benchmarks/results/<out>.json`` and ``.md`` with the machine and commit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exact_drafts import KINDS, prompt_rows  # noqa: E402
from common import machine, markdown_header, positive_int, write_report  # noqa: E402

from biglm.checkpoint import load_model  # noqa: E402
from biglm.generation import DecodingConfig, generate_ids  # noqa: E402
from biglm.generation.speculative import SOURCES, SpeculativeDecode  # noqa: E402


def settings(lengths: list[int], ngrams: list[int]) -> dict[str, dict]:
    """The settings of a run: one token per call, then each draft length with each source; n-gram sources once per
    ``ngrams`` value (the longest n-gram matched, `DecodingConfig.draft_ngram`; named in the label when not 3)."""
    out = {"one token per call": dict(block_length=1)}
    for m in lengths:
        out[f"m={m} model"] = dict(draft_length=m)
        for n in ngrams:
            tag = "" if n == 3 else f", n<={n}"
            out[f"m={m}{tag} n-gram"] = dict(draft_length=m, draft_ngram=n, draft_model=False, draft_fill=False)
            out[f"m={m}{tag} n-gram+fill"] = dict(draft_length=m, draft_ngram=n, draft_model=False)  # the default
            out[f"m={m}{tag} model+n-gram"] = dict(draft_length=m, draft_ngram=n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    ap.add_argument("--prompts", type=positive_int, default=4, help="prompts of each kind")
    ap.add_argument("--max-new-tokens", type=positive_int, default=96)
    ap.add_argument("--draft-lengths", type=positive_int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--ngram", type=positive_int, nargs="+", default=[3],
                    help="longest n-gram matched by n-gram drafts (draft_ngram); one setting per value")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--sources", nargs="+", default=["model", "n-gram", "n-gram+fill", "model+n-gram"],
                    choices=["model", "n-gram", "n-gram+fill", "model+n-gram"],
                    help="draft sources to run at each draft length (n-gram+fill: n-gram drafts, the model's where none "
                         "matched, `draft_fill`: the default)")
    ap.add_argument("--batch-invariant", action="store_true", help="load_model(batch_invariant=True) (bf16)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), pack=True,
                            batch_invariant=args.batch_invariant)
    texts = []
    for row in prompt_rows(Path(args.data), args.prompts):
        text = row["prompt"] if "prompt" in row else tok.apply_chat_template(row["messages"], tokenize=False,
                                                                               add_generation_prompt=True)
        texts.append((row["id"].split("-")[0], tok(text, add_special_tokens=False)["input_ids"]))
    N = args.max_new_tokens
    base = dict(max_new_tokens=N, strategy="confidence", ignore_eos=True)
    counts: dict[str, torch.Tensor] = {}
    real_init = SpeculativeDecode.__init__

    def spy(self, *a, **kw):  # every decode's kept-draft histogram, summed per setting
        real_init(self, *a, **kw)
        spy.decodes.append(self)

    spy.decodes = []
    SpeculativeDecode.__init__ = spy
    rows, answers = {}, {}
    chosen = {label: extra for label, extra in settings(args.draft_lengths, args.ngram).items()
              if label == "one token per call" or label.rsplit(" ", 1)[1] in args.sources}
    for label, extra in chosen.items():
        cfg = DecodingConfig(**base, **extra)
        generate_ids(model, torch.tensor([texts[0][1]]), config=cfg)  # warm-up
        spy.decodes.clear()
        per_kind = {k: {"tokens": 0, "calls": 0, "positions": 0, "seconds": 0.0} for k in KINDS}
        outs = []
        for kind, ids in texts:
            start = time.perf_counter()
            out = generate_ids(model, torch.tensor([ids]), config=cfg)
            seconds = time.perf_counter() - start
            outs.append(out.token_lists()[0])
            k = per_kind[kind]
            k["tokens"] += N
            k["calls"] += out.steps
            k["positions"] += out.positions - len(ids)
            k["seconds"] += seconds
        answers[label] = outs
        row = {"kinds": {k: {"tokens_per_call": v["tokens"] / v["calls"], "tok_s": v["tokens"] / v["seconds"],
                             "positions_per_token": v["positions"] / v["tokens"]} for k, v in per_kind.items()}}
        tokens = sum(v["tokens"] for v in per_kind.values())
        row["tok_s"] = tokens / sum(v["seconds"] for v in per_kind.values())
        row["tokens_per_call_mean_of_kinds"] = sum(v["tokens_per_call"] for v in row["kinds"].values()) / len(KINDS)
        row["same_as_one_per_call"] = (f"{sum(a == b for a, b in zip(outs, answers['one token per call']))}"
                                       f"/{len(outs)}")
        if spy.decodes:
            hist = sum(d.kept_counts for d in spy.decodes)  # (source, kept)
            acc = {}
            for s, name in enumerate(SOURCES):
                h = hist[s].double()
                if h.sum() == 0:
                    continue
                reach = h.flip(0).cumsum(0).flip(0)  # calls keeping >= k drafts
                acc[name] = {"calls": int(h.sum()),
                             "per_slot": [round(float(reach[k] / reach[k - 1]), 3) if reach[k - 1] else None
                                          for k in range(1, len(h))]}
            row["acceptance"] = acc
        rows[label] = row
        print(label, {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items() if k != "kinds"},
              flush=True)
    SpeculativeDecode.__init__ = real_init
    report = {"command": "python " + " ".join(sys.argv), "machine": machine(), "model": args.model,
              "dtype": args.dtype, "batch_invariant": args.batch_invariant, "max_new_tokens": N, "settings": rows}
    plain = rows["one token per call"]["tok_s"]
    mode = ", batch-invariant" if args.batch_invariant else ""
    lines = markdown_header(f"Draft sources on held-out prompts: {args.model} ({args.dtype}{mode})", report) + [
        "", f"Batch 1, {N} tokens per prompt (EOS suppressed), {len(texts)} prompts ({args.prompts} of each kind: "
        f"{', '.join(KINDS)}), prepacked linears. Tokens per call: the mean of the kinds'.", "",
        "| setting | same text as one per call | tokens/call (continue / chat / rewrite) | positions/token | tok/s "
        "| vs one per call | acceptance per slot (model; n-gram) |", "|---|---|---|---|---|---|---|"]
    for label, row in rows.items():
        k = row["kinds"]
        pos = sum(v["positions_per_token"] for v in k.values()) / len(k)
        acc = "; ".join(f"{n} {v['per_slot']}" for n, v in row.get("acceptance", {}).items())
        per_kind = " / ".join(f"{v['tokens_per_call']:.2f}" for v in k.values())
        lines.append(f"| {label} | {row['same_as_one_per_call']} | {row['tokens_per_call_mean_of_kinds']:.2f} "
                     f"({per_kind}) | {pos:.2f} | "
                     f"{row['tok_s']:.1f} | {row['tok_s'] / plain:.2f}x | {acc} |")
    write_report(args.out, report, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
