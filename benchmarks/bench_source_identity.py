"""A BiGLM made from an AR model against its source: the same greedy text, token for token (issue 49's done-when).

The source (a GGUF file or a transformers folder) writes ``--max-new-tokens`` tokens with transformers' own greedy
``generate`` (float32, the end-of-text token suppressed); the BiGLM writes the same prompts with the real
`biglm generate MODEL --input rows.jsonl --output out.jsonl --ignore_eos` command, one token per call
(``--strategy confidence --block_length 1 --steps N --draft_length 0``) and with its default decoding (no decoding
flag: drafts from n-gram lookup and, on an adapted model, its own mask slots), one prompt at a time (``--batch-size``
1: a batch above `speculative.DRAFT_ROWS` rows carries no mask drafts, so larger batches measure n-gram drafts only). Each row: whether its text equals the
source's, the characters they share before they part, and tokens per model call. The prompts are
`bench_exact_drafts.prompt_rows`'s: held-out texts to continue, chat turns, rewrites.

    python benchmarks/bench_source_identity.py --source ../shared/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --model runs/smol-causal --out source-identity-smol-causal-fp32

Results go to ``benchmarks/results/<out>.json`` and ``.md`` with the machine and commit; the rows and the outputs
beside them in ``benchmarks/results/<out>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exact_drafts import KINDS, prompt_rows, prompt_text, run_generate  # noqa: E402
from common import RESULTS, machine, markdown_header, positive_int, write_report  # noqa: E402


def source_texts(source: str, model: str, rows: list[dict], n: int, threads: int) -> dict[str, str]:
    """The source's greedy answers (transformers ``generate``, float32, EOS suppressed), prompts rendered and
    tokenized as `biglm generate` does (the BiGLM's tokenizer: the source's plus the added mask token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer


    torch.set_num_threads(threads)
    kw = {"gguf_file": Path(source).name} if source.endswith(".gguf") else {}
    where = str(Path(source).parent) if kw else source
    lm = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).eval()
    from biglm.checkpoint import model_source

    where_model = model_source(model)  # an export or a run folder (its tokenizer/ and config.json)
    tok = AutoTokenizer.from_pretrained(where_model.tokenizer_dir)
    eos = json.loads((Path(where_model.config_dir) / "config.json").read_text())["eos_token_id"]
    out = {}
    for row in rows:
        text = prompt_text(tok, row)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            gen = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, suppress_tokens=[eos], eos_token_id=None, pad_token_id=eos)
        out[row["id"]] = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
    return out


def shared_chars(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def training_summary(run: Path) -> dict:
    """What an adapted model's run trained on: steps, window tokens, data folders (its train_config.json and the last
    metrics line), so a table can say how long the adaptation behind a row was."""
    cfg = json.loads((run / "train_config.json").read_text())
    tokens = None
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        logged = [json.loads(line) for line in metrics.read_text().splitlines() if '"log"' in line]
        tokens = logged[-1].get("tokens") if logged else None
    return {"recipe": cfg.get("name"), "steps": cfg.get("steps"), "tokens": tokens, "data": sorted(cfg.get("data", {})),
            "seq_len": cfg.get("seq_len"), "global_batch": cfg.get("global_batch")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, help="the AR model the BiGLM was converted from (.gguf or folder)")
    ap.add_argument("--model", required=True, help="the BiGLM (a `biglm convert` or `biglm pretrain` output)")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    ap.add_argument("--prompts", type=positive_int, default=4, help="prompts of each kind")
    ap.add_argument("--max-new-tokens", type=positive_int, default=96)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--batch-size", type=positive_int, default=1,
                    help="prompts `biglm generate` decodes together (default 1: one request, as a server at batch 1; "
                         "above `speculative.DRAFT_ROWS` rows a call carries no mask drafts, by design)")
    ap.add_argument("--skip-default", action="store_true", help="one token per call only")
    ap.add_argument("--setting", action="append", default=[], metavar="NAME=FLAGS",
                    help="another decoding to compare, e.g. 'model-drafts=--draft_length 4 --draft_ngram 0 "
                         "--draft_model true' (repeatable)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        ap.error(f"--model {args.model}: no such directory (a `biglm convert` or `biglm pretrain` output)")
    if not Path(args.source).exists() and args.source.endswith(".gguf"):
        ap.error(f"--source {args.source}: no such file")

    where = RESULTS / args.out
    where.mkdir(parents=True, exist_ok=True)
    rows = prompt_rows(Path(args.data), args.prompts)
    rows_path = where / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    n = args.max_new_tokens
    ref = source_texts(args.source, args.model, rows, n, args.threads)
    (where / "source.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in ref.items()))
    common = ["--dtype", args.dtype, "--ignore_eos", "--batch_size", str(args.batch_size)]
    settings = {"one_per_call": ["--strategy", "confidence", "--block_length", "1", "--steps", str(n),
                                 "--draft_length", "0"]}
    if not args.skip_default:
        settings["default"] = []
    for item in args.setting:
        name, sep, flags = item.partition("=")
        if not sep or not name:
            ap.error(f"--setting {item!r}: give NAME=FLAGS")
        settings[name] = flags.split()
    read = lambda p: {r["id"]: r for r in map(json.loads, p.read_text().splitlines())}  # noqa: E731
    adapted = (Path(args.model) / "train_config.json").is_file()  # a training run's folder, not a conversion
    report = {"command": "python " + " ".join(sys.argv), "source": os.path.basename(args.source), "model": args.model,
              "adapted": adapted, "training": training_summary(Path(args.model)) if adapted else None,
              "dtype": args.dtype, "max_new_tokens": n, "batch_size": args.batch_size, "machine": machine(),
              "settings": {}}
    lines = markdown_header(f"The BiGLM {args.model} against its source {os.path.basename(args.source)}", report)
    lines += ["", f"Source: transformers' greedy `generate` in float32, EOS suppressed; BiGLM: `biglm generate "
              f"--ignore_eos --dtype {args.dtype} --batch_size {args.batch_size}`, {n} tokens, {args.threads} thread(s).", "",
              "| setting | kind | same text as the source | shared characters (min / median) | tokens per call |",
              "|---|---|---|---|---|"]
    for name, flags in settings.items():
        seconds = run_generate(args.model, rows_path, where / f"{name}.jsonl", n, common + flags, args.threads)
        got = read(where / f"{name}.jsonl")
        per_row = [{"id": r["id"], "kind": r["id"].split("-")[0], "same_text": got[r["id"]]["text"] == ref[r["id"]],
                    "shared_chars": shared_chars(got[r["id"]]["text"], ref[r["id"]]),
                    "tokens": got[r["id"]]["completion_tokens"], "calls": got[r["id"]]["calls"]} for r in rows]
        kinds = {}
        for kind in (*KINDS, "all"):
            sel = [r for r in per_row if kind in (r["kind"], "all")]
            shared = sorted(r["shared_chars"] for r in sel)
            kinds[kind] = {"same_text": f"{sum(r['same_text'] for r in sel)}/{len(sel)}",
                           "shared_chars_min": shared[0], "shared_chars_median": shared[len(shared) // 2],
                           "tokens_per_call": sum(r["tokens"] for r in sel) / max(sum(r["calls"] for r in sel), 1)}
            lines.append(f"| {name} | {kind} | {kinds[kind]['same_text']} | {shared[0]} / {shared[len(shared) // 2]} "
                         f"| {kinds[kind]['tokens_per_call']:.2f} |")
        report["settings"][name] = {"flags": " ".join(flags) or "(none: the model's default)", "seconds": seconds,
                                    "kinds": kinds, "rows": per_row}
    write_report(args.out, report, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
