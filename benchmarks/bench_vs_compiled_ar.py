"""biglm's default decoding against a compiled autoregressive peer on one device (issue 38 item 7).

On a GPU a 135M model's call is bound by kernel launches, not by reading the weights: the peer that counts there is
the AR source decoded by transformers with a static KV cache compiled with CUDA graphs (`generate(...,
cache_implementation="static")`: transformers compiles the decoding step itself, ``mode="reduce-overhead"``), beside
its eager decoding. biglm runs the path `biglm generate --input` runs (`BatchAnswerer`'s greedy batch:
`generate_ids` over the left-padded prompts) at the model's default decoding and at plain one token per call, eager
and optionally with its layers compiled (``--biglm-compile``).

Every row is greedy, ``--new-tokens`` tokens per answer (EOS ignored on both sides), on held-out prompts of three
kinds (`bench_exact_drafts.prompt_rows`: open continuation, a chat turn, a rewrite), at batch 1 (the first
``--batch1-per-kind`` of each kind, one at a time) and at batch ``--batch`` (every row at once). Each row of the table
carries the quality of what it timed: NLL per token of the answers judged by the source in float32, distinct
bigrams, and for biglm the answers identical to biglm's one token per call in the same dtype. ``--exact-dtype``
(float32) repeats biglm's default against one token per call in that dtype at both batch sizes: the exactness claim.

    python benchmarks/bench_vs_compiled_ar.py --biglm runs/gpu-decode/a40 \\
        --source runs/gpu-decode/model.gguf --data runs/gpu-carry/data --device cuda --out vs-compiled-ar-gpu

Results: ``benchmarks/results/<out>.json`` and ``.md`` (machine, versions, commit), answers in ``<out>-answers.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode_quality import distinct2, judge_nll  # noqa: E402
from bench_exact_drafts import prompt_rows  # noqa: E402
from common import RESULTS, hf_directory, machine, markdown_header, positive_int, sync, write_report  # noqa: E402

from biglm.generation.decoding import left_pad  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def one_per_call(n: int) -> dict:
    """`biglm generate`'s plain one-token-per-call flags (the reference every default is compared with)."""
    return {"strategy": "confidence", "block_length": 1, "steps": n, "draft_length": 0}


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class BiglmSide:
    """A biglm model decoding prepared rows the way `biglm generate --input` does (one `generate_ids` per batch)."""

    def __init__(self, path: str, device: torch.device, dtype: torch.dtype, *, compile: bool = False) -> None:
        from biglm.checkpoint import load_model

        self.model, self.tok = load_model(path, device=device, dtype=dtype, pack=device.type == "cpu",
                                          compile=compile)
        self.device = device
        self.suppress = list(range(len(self.tok), self.model.config.vocab_size))

    def prepare(self, rows: list[dict], options: dict):
        from biglm.generation.batch import BatchRow, prepare_rows

        prepared = [BatchRow(line=i + 1, id=r["id"], prompt=r.get("prompt"), messages=r.get("messages"))
                    for i, r in enumerate(rows)]
        prepare_rows(self.model, self.tok, prepared, where="bench rows", config=options)
        return prepared

    def run(self, prepared, size: int) -> tuple[list[dict], float, int]:
        """Answers, seconds and the query positions the calls computed (`GenerationOutput.positions`)."""
        from biglm.generation.decoding import generate_ids

        cfg = self.model.config
        pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
        out_rows, positions = [], 0
        sync(self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            for group in batches(prepared, size):
                ids, mask = left_pad([r.prompt_ids for r in group], pad_id=pad, device=self.device)
                out = generate_ids(self.model, ids, mask, config=group[0].config, suppress_ids=self.suppress)
                for r, toks, calls in zip(group, out.token_lists(), out.calls_per_row()):
                    out_rows.append({"id": r.id, "prompt_ids": r.prompt_ids, "tokens": toks, "calls": calls})
                positions += out.positions
        sync(self.device)
        return out_rows, time.perf_counter() - start, positions


class ArSide:
    """The AR source through transformers' `generate` (greedy, exactly ``n`` new tokens per row)."""

    def __init__(self, hf_dir: Path, device: torch.device, dtype: torch.dtype, *, static: bool) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).to(device).eval()
        self.device, self.static = device, static
        self.pad = self.model.generation_config.pad_token_id
        if self.pad is None:
            self.pad = self.model.config.eos_token_id if isinstance(self.model.config.eos_token_id, int) else 0

    def run(self, prompts: list[tuple[str, list[int]]], size: int, n: int) -> tuple[list[dict], float]:
        kw = {"cache_implementation": "static"} if self.static else {}
        out_rows = []
        sync(self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            for group in batches(prompts, size):
                ids, mask = left_pad([p for _, p in group], pad_id=self.pad, device=self.device)
                res = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                          do_sample=False, pad_token_id=self.pad, **kw)
                for (rid, p), row in zip(group, res[:, ids.shape[1]:].tolist()):
                    out_rows.append({"id": rid, "prompt_ids": p, "tokens": row, "calls": n})
        sync(self.device)
        return out_rows, time.perf_counter() - start

    @property
    def compiled(self) -> bool:
        """Whether transformers compiled the decoding step (it does so only where it judges the device and cache fit)."""
        return hasattr(self.model, "_compiled_call")


def summarize(label: str, size: int, rows: list[dict], seconds: float, judge, reference: dict | None,
              positions: int | None = None) -> dict:
    tokens = sum(len(r["tokens"]) for r in rows)
    calls = sum(r["calls"] for r in rows)  # each answer's own calls (`biglm generate`'s ``calls``)
    out = {"setting": label, "batch": size, "rows": len(rows), "tokens": tokens, "seconds": round(seconds, 3),
           "tokens_per_s": round(tokens / seconds, 1), "tokens_per_call": round(tokens / max(calls, 1), 2),
           "judged_nll": round(judge_nll(judge, [(r["prompt_ids"], r["tokens"]) for r in rows]), 3),
           "distinct2": round(distinct2([r["tokens"] for r in rows]), 3)}
    if positions is not None:
        out["positions_per_token"] = round(positions / tokens, 2)
    if reference is not None:
        out["same_as_one_per_call"] = f"{sum(r['tokens'] == reference[r['id']] for r in rows)}/{len(rows)}"
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--biglm", required=True, help="the drafting model (a `biglm pretrain` run or export)")
    ap.add_argument("--source", required=True, help="its AR source: a .gguf file or a transformers directory")
    ap.add_argument("--data", required=True, help="a folder in shared/data's layout (the prompts)")
    ap.add_argument("--per-kind", type=positive_int, default=11, help="prompts of each kind (batch level: all of them)")
    ap.add_argument("--batch", type=positive_int, default=32, help="rows per call of the batched level")
    ap.add_argument("--batch1-per-kind", type=positive_int, default=4, help="prompts of each kind at batch 1")
    ap.add_argument("--new-tokens", type=positive_int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--exact-dtype", default="float32", choices=[*sorted(DTYPES), "none"],
                    help="also compare biglm's default with one token per call in this dtype (none: skip)")
    ap.add_argument("--biglm-compile", action="store_true", help="also time biglm's default with compiled layers")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="seconds after which the optional --biglm-compile rows are skipped (a device call's limit)")
    ap.add_argument("--work", default="runs/bench-vs-compiled-ar", help="where the source's transformers copy goes")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not Path(args.biglm).is_dir():
        ap.error(f"--biglm {args.biglm}: no such directory (a `biglm pretrain` run or `biglm export` output)")
    if not Path(args.source).exists():
        ap.error(f"--source {args.source}: no such file or directory")
    device, dtype, n = torch.device(args.device), DTYPES[args.dtype], args.new_tokens

    all_rows = prompt_rows(Path(args.data), args.per_kind)[:args.batch]
    first = {k: [r for r in all_rows if r["id"].startswith(k)][:args.batch1_per_kind]
             for k in ("continue", "chat", "rewrite")}
    rows1 = [r for k in first.values() for r in k]
    hf = hf_directory(Path(args.source), Path(args.work))
    from transformers import AutoModelForCausalLM

    judge = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).to(device).eval()
    report_rows, answers, errors = [], [], []
    t0 = time.perf_counter()
    report = {"command": "python " + " ".join(sys.argv), "biglm": args.biglm, "source": args.source,
              "device": str(device), "dtype": args.dtype, "new_tokens": n, "batch": args.batch,
              "machine": machine(device), "rows": report_rows, "errors": errors}

    def write() -> None:
        write_report(args.out, report, to_markdown(report, batch1=len(rows1), batched=len(all_rows)))
        (RESULTS / f"{args.out}-answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))

    def record(label, size, rows, sec, ref, positions=None):
        report_rows.append(summarize(label, size, rows, sec, judge, ref, positions))
        answers.extend({"setting": label, "batch": size, "id": r["id"], "tokens": r["tokens"]} for r in rows)
        write()

    def failed(label: str, e: Exception) -> None:  # recorded and shown, never hidden
        errors.append({"setting": label, "error": f"{type(e).__name__}: {str(e)[:400]}"})
        print(errors[-1], flush=True)
        write()

    def biglm_levels(side: BiglmSide, tag: str) -> None:
        refs: dict[int, dict] = {}
        for name, flags in (("one token per call", one_per_call(n)), ("default", {})):  # the reference first
            prepared = side.prepare(all_rows, {"max_new_tokens": n, "ignore_eos": True, **flags})
            by_id = {r.id: r for r in prepared}
            for size, subset in ((1, [by_id[r["id"]] for r in rows1]), (args.batch, prepared)):
                side.run(subset[:size], size)  # warm-up: a batch of this size
                got, sec, positions = side.run(subset, size)
                record(f"biglm {name}, {tag}", size, got, sec, refs.get(size), positions)
                if name == "one token per call":
                    refs[size] = {r["id"]: r["tokens"] for r in got}

    side = BiglmSide(args.biglm, device, dtype)
    biglm_ids = {r.id: r.prompt_ids for r in side.prepare(all_rows, {"max_new_tokens": n})}
    biglm_levels(side, args.dtype)
    del side

    from transformers import AutoTokenizer

    from biglm.generation.chat import render_chat

    tok = AutoTokenizer.from_pretrained(hf)

    def ids_of(r):
        text = r["prompt"] if r.get("messages") is None else render_chat(tok, r["messages"])
        return r["id"], list(tok(text, add_special_tokens=False)["input_ids"])

    ar_all, ar_1 = [ids_of(r) for r in all_rows], [ids_of(r) for r in rows1]
    # the same tokenizer on both sides: the AR peer reads the prompt ids biglm's rows were encoded to
    differ = [rid for rid, ids in ar_all if ids != biglm_ids[rid]]
    if differ:
        raise SystemExit(f"bench_vs_compiled_ar.py: the source's tokenizer encodes {differ} otherwise than biglm's: "
                         "--source must be the model --biglm was converted from")
    longest = lambda ps: sorted(ps, key=lambda p: -len(p[1]))  # noqa: E731 - a static cache sized by the first call
    for label, static in ((f"AR source, transformers eager, {args.dtype}", False),
                          (f"AR source, transformers static cache + compile, {args.dtype}", True)):
        try:
            ar = ArSide(hf, device, dtype, static=static)
            for size, prompts in ((1, ar_1), (args.batch, ar_all)):
                ar.run(longest(prompts)[:size], size, n)  # warm-up (compilation, the cache's size)
                ar.run(longest(prompts)[:size], size, n)
                got, sec = ar.run(prompts, size, n)
                record(label + ("" if not static else (" (compiled)" if ar.compiled else " (NOT compiled here)")),
                       size, got, sec, None)
            del ar
        except Exception as e:  # noqa: BLE001
            failed(label, e)

    if args.exact_dtype != "none" and args.exact_dtype != args.dtype:
        side = BiglmSide(args.biglm, device, DTYPES[args.exact_dtype])
        biglm_levels(side, args.exact_dtype)
        del side
    if args.biglm_compile:
        if time.perf_counter() - t0 > args.budget_s:
            failed("biglm, layers compiled", TimeoutError(f"skipped: {args.budget_s} s of --budget-s spent"))
        else:
            try:
                side = BiglmSide(args.biglm, device, dtype, compile=True)
                biglm_levels(side, f"{args.dtype}, layers compiled")
                del side
            except Exception as e:  # noqa: BLE001
                failed("biglm, layers compiled", e)
    print(to_markdown(report, batch1=len(rows1), batched=len(all_rows)))


def to_markdown(report: dict, *, batch1: int, batched: int) -> str:
    rows, n = report["rows"], report["new_tokens"]
    peer = {r["batch"]: r["tokens_per_s"] for r in rows if "compile" in r["setting"] and "AR" in r["setting"]}
    lines = markdown_header("biglm's default decoding vs a compiled AR on one device", report) + [
        "", f"{n} greedy tokens per answer (EOS ignored), held-out prompts of three kinds (continuation, chat, "
        f"rewrite); batch 1: {batch1} prompts one at a time; batch {report['batch']}: {batched} rows at once. "
        "Judged NLL: the source in float32; same text: identical tokens to biglm's one token per call in the same "
        "dtype.", "",
        "| setting | batch | tok/s | x compiled AR | tokens/call | positions/token | judged NLL | distinct-2 | "
        "same as one per call |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        x = f"{r['tokens_per_s'] / peer[r['batch']]:.2f}" if peer.get(r["batch"]) else "-"
        lines.append(f"| {r['setting']} | {r['batch']} | {r['tokens_per_s']} | {x} | {r['tokens_per_call']} | "
                     f"{r.get('positions_per_token', '-')} | {r['judged_nll']} | {r['distinct2']} | "
                     f"{r.get('same_as_one_per_call', '-')} |")
    lines += [f"\nFailed: {e['setting']}: {e['error']}" for e in report["errors"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
