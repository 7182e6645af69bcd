"""A model's default decoding against one token per call, on held-out prompts of three kinds (issue 38's done-when).

The default decoding of a drafting model (`generation.config.drafting_default`: speculative decoding with the model's
drafts and n-gram lookup) must write exactly what one token per call writes, in fewer calls. This runs the real
commands a user runs, `biglm generate MODEL --input rows.jsonl --output out.jsonl --max_new_tokens N` with no decoding
flag, and the same with ``--strategy confidence --block_length 1 --steps N --draft_length 0``, and compares them row
by row: identical text (the quality: identity with one token per call) and tokens per model call (``calls`` of each
output row), per kind and overall.

The prompts (``--prompts`` each kind, read from ``--data``, a folder in ``shared/data``'s layout):
- ``continue``: the opening words of a held-out text (Brown corpus news files, ``pretrain/brown``), raw;
- ``chat``: a question of SQuAD v1.1's dev set (``finetune/squad_v1.1``) as a user turn, through the model's chat
  template;
- ``rewrite``: "Rewrite the following text in simpler words" and a WikiAuto sentence (``finetune/wikiauto``), as a
  user turn through the chat template.

    python benchmarks/bench_exact_drafts.py --model runs/smol-a40 --data ../shared/data --out exact-drafts-smol-a40

Results go to ``benchmarks/results/<out>.json`` and ``.md`` with the machine and commit; the rows and both outputs
beside them in ``benchmarks/results/<out>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, markdown_header, positive_int, write_report  # noqa: E402

KINDS = ("continue", "chat", "rewrite")


def prompt_rows(data: Path, per_kind: int, words: int = 60) -> list[dict]:
    """``per_kind`` rows of each kind (module docstring), ids ``KIND-i``."""
    rows = []
    brown = sorted((data / "pretrain" / "brown").glob("*.txt"))
    if len(brown) < per_kind:
        raise SystemExit(f"bench_exact_drafts.py: {data}/pretrain/brown holds {len(brown)} texts, fewer than "
                         f"--prompts {per_kind}")
    for i, path in enumerate(brown[-per_kind:]):  # the last files: far from any training mix's first ones
        text = " ".join(path.read_text(encoding="utf-8", errors="replace").split()[:words])
        rows.append({"id": f"continue-{i}", "prompt": text})
    squad = json.loads((data / "finetune" / "squad_v1.1" / "dev-v1.1.reconstructed.json").read_text())
    questions = [qa["question"] for article in squad["data"] for para in article["paragraphs"] for qa in para["qas"]]
    step = max(1, len(questions) // per_kind)
    for i in range(per_kind):
        rows.append({"id": f"chat-{i}", "messages": [{"role": "user", "content": questions[i * step]}]})
    wiki = [json.loads(line) for line in (data / "finetune" / "wikiauto" / "valid.jsonl").open(encoding="utf-8")]
    long_enough = [w["source"] for w in wiki if len(w["source"].split()) >= 20]
    step = max(1, len(long_enough) // per_kind)
    for i in range(per_kind):
        text = long_enough[i * step]
        rows.append({"id": f"rewrite-{i}", "messages": [{"role": "user", "content":
                     f"Rewrite the following text in simpler words.\n\n{text}"}]})
    return rows


def prompt_text(tokenizer, row: dict) -> str:
    """A `prompt_rows` row as the text a model reads: a chat turn rendered with the tokenizer's chat template
    (`biglm.generation.chat.render_chat`, as `biglm generate` renders it), else the prompt as it is."""
    from biglm.generation.chat import render_chat

    return render_chat(tokenizer, row["messages"]) if "messages" in row else row["prompt"]


def run_generate(model: str, rows: Path, out: Path, n: int, flags: list[str], threads: int) -> float:
    out.unlink(missing_ok=True)
    Path(str(out) + ".meta.json").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "biglm", "generate", model, "--input", str(rows), "--output", str(out),
           "--max_new_tokens", str(n), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench_exact_drafts.py: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    ap.add_argument("--prompts", type=positive_int, default=4, help="prompts of each kind")
    ap.add_argument("--max-new-tokens", type=positive_int, default=96)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--flags", default="", help="decoding flags of the setting under test (default: none, the "
                                               "model's default decoding)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        ap.error(f"--model {args.model}: no such directory (a `biglm export` or `biglm pretrain` output)")

    where = RESULTS / args.out
    where.mkdir(parents=True, exist_ok=True)
    rows_path = where / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in prompt_rows(Path(args.data), args.prompts)))
    n = args.max_new_tokens
    common = ["--dtype", args.dtype]
    plain_flags = ["--strategy", "confidence", "--block_length", "1", "--steps", str(n), "--draft_length", "0"]
    t_plain = run_generate(args.model, rows_path, where / "one-per-call.jsonl", n, common + plain_flags, args.threads)
    t_default = run_generate(args.model, rows_path, where / "default.jsonl", n, common + args.flags.split(),
                             args.threads)
    read = lambda p: {r["id"]: r for r in map(json.loads, p.read_text().splitlines())}  # noqa: E731
    plain, default = read(where / "one-per-call.jsonl"), read(where / "default.jsonl")
    per_row, by_kind = [], {k: [] for k in KINDS}
    for rid, ref in plain.items():
        got = default[rid]
        kind = rid.split("-")[0]
        row = {"id": rid, "kind": kind, "same_text": got["text"] == ref["text"], "tokens": got["completion_tokens"],
               "calls": got["calls"], "tokens_per_call": got["completion_tokens"] / max(got["calls"], 1),
               "plain_calls": ref["calls"]}
        per_row.append(row)
        by_kind[kind].append(row)
    kinds = {k: {"same_text": f"{sum(r['same_text'] for r in v)}/{len(v)}",
                 "tokens_per_call": sum(r["tokens"] for r in v) / max(sum(r["calls"] for r in v), 1)}
             for k, v in by_kind.items()}
    mean_tpc = statistics.mean(k["tokens_per_call"] for k in kinds.values())
    report = {"command": "python " + " ".join(sys.argv), "model": args.model, "dtype": args.dtype, "max_new_tokens": n, "flags": args.flags or "(none)",
              "machine": machine(), "seconds": {"one_per_call": t_plain, "default": t_default},
              "same_text": f"{sum(r['same_text'] for r in per_row)}/{len(per_row)}", "kinds": kinds,
              "tokens_per_call_mean_of_kinds": mean_tpc, "rows": per_row}
    lines = markdown_header(f"Default decoding vs one token per call: {args.model}", report) + ["",
             f"`biglm generate MODEL --input rows.jsonl --max_new_tokens {n} --dtype {args.dtype} {args.flags}` "
             f"against `{' '.join(plain_flags)}`; wall (incl. loading) {t_default:.1f} s vs {t_plain:.1f} s, "
             f"{args.threads} thread(s).", "",
             "| kind | same text as one token per call | tokens per call |", "|---|---|---|"]
    lines += [f"| {k} | {v['same_text']} | {v['tokens_per_call']:.2f} |" for k, v in kinds.items()]
    lines += [f"| **all** | **{report['same_text']}** | **{mean_tpc:.2f}** (mean of kinds) |"]
    write_report(args.out, report, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
