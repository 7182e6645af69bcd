"""Issue 21's quality comparison, evaluation stage: every model of `blocks_quality_train.sh` on the same held-out
data and masks (`biglm eval --suite heldout`'s metrics) and, on the synthetic grammar, the grammatical share of
generated continuations at equal model calls; TinyStories samples for reading.

    python docs/experiments/blocks_quality_eval.py --models EXPORTS_DIR --data DATA_ROOT --out results.json

EXPORTS_DIR holds `grammar-<variant>-s<seed>` and `ts-<variant>-s<seed>` exports; DATA_ROOT the prepared `data`
(grammar) and `ts_data` (TinyStories) folders. One thread, a few minutes per model on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from synthetic_grammar import check  # noqa: E402

from biglm.checkpoint import load_model  # noqa: E402
from biglm.data.shards import ShardReader  # noqa: E402
from biglm.generation import generate_ids  # noqa: E402
from biglm.scoring.heldout import heldout_metrics  # noqa: E402

# equal calls for every model: T = N/2 (2 tokens per call); the model's own default cache (blocks: append)
SETTINGS = {
    "one block, T=N/2": dict(strategy="confidence", steps=32),
    "blocks of 16, T=N/2": dict(strategy="confidence", steps=32, block_length=16),
    "blocks of 8, T=N/2": dict(strategy="confidence", steps=32, block_length=8),
}
# fewer positions per committed token (<= 3 with the append cache), the batch-32 aim: --settings lean
LEAN = {
    "blocks of 4, T=N/2": dict(strategy="confidence", steps=32, block_length=4),
    "threshold 0.9, blocks of 8": dict(strategy="threshold", threshold=0.9, block_length=8),
    "threshold 0.7, blocks of 8": dict(strategy="threshold", threshold=0.7, block_length=8),
}


def prompts(data: Path, *, n: int, prompt_len: int, new: int) -> torch.Tensor:
    shard = ShardReader(sorted((data).glob("val-*.bin"))[0], expected_vocab_size=None)
    rows = [shard.doc(i).astype("int64").tolist() for i in range(len(shard))]
    rows = [r[:prompt_len] for r in rows if len(r) >= prompt_len + new][:n]
    return torch.tensor(rows, dtype=torch.long)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="only models whose name starts with this (e.g. grammar)")
    ap.add_argument("--settings", choices=["default", "lean"], default="default")
    ap.add_argument("--dump", type=Path, default=None,
                    help="only write the TinyStories models' (prompt, continuation) ids for ar_judge.py here")
    args = ap.parse_args()
    if args.dump:
        return dump(args)
    torch.set_num_threads(1)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    settings = SETTINGS if args.settings == "default" else LEAN
    for model_dir in sorted(args.models.iterdir()):
        name = model_dir.name
        if name in results or not name.startswith(args.only):
            continue
        model, tok = load_model(model_dir)
        model.float().eval()
        grammar = name.startswith("grammar")
        data = args.data / ("data" if grammar else "ts_data")
        row = {"prefix_attention": model.config.prefix_attention}
        if args.settings == "default":  # the held-out metrics do not depend on the decoding settings
            row.update(heldout_metrics(model, data=data, windows=256, seq_len=128, docs=200))
        p = prompts(data, n=48, prompt_len=24, new=64)
        for label, kw in settings.items():
            out = generate_ids(model, p, max_new_tokens=64, **kw)
            texts = [tok.decode(a, skip_special_tokens=True) for a in out.token_lists()]
            entry = {"calls": out.steps, "forward_calls": out.forward_calls,
                     "positions_per_token": out.positions / (p.shape[0] * 64)}
            if grammar:
                counts = [check(tok.decode(q.tolist(), skip_special_tokens=True), t) for q, t in zip(p, texts)]
                total = max(1, sum(c["sentences"] for c in counts))
                entry.update(sentences=total, grammatical=sum(c["grammatical"] for c in counts) / total,
                             on_subject=sum(c["on_subject"] for c in counts) / total)
            else:
                entry["samples"] = [tok.decode(p[i].tolist(), skip_special_tokens=True) + " ||| " + texts[i]
                                    for i in range(3)]
            row[label] = entry
        results[name] = row
        args.out.write_text(json.dumps(results, indent=1))
        print(name, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                     if not isinstance(v, dict)}, flush=True)
        for label in settings:
            e = row[label]
            print("  ", label, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in e.items() if k != "samples"},
                  flush=True)


def dump(args: argparse.Namespace) -> None:
    """Every TinyStories model's continuations of the same 48 held-out prompts (ids, cut at EOS), and the gold ones."""
    torch.set_num_threads(1)
    out: dict = {}
    p = prompts(args.data / "ts_data", n=48, prompt_len=24, new=64)
    shard = ShardReader(sorted((args.data / "ts_data").glob("val-*.bin"))[0], expected_vocab_size=None)
    gold = [r[24:88] for r in (shard.doc(i).astype("int64").tolist() for i in range(len(shard))) if len(r) >= 88][:48]
    out["gold"] = {"held-out text": [[q.tolist(), g] for q, g in zip(p, gold)]}
    for model_dir in sorted(args.models.iterdir()):
        if not model_dir.name.startswith("ts"):
            continue
        model, _ = load_model(model_dir)
        model.float().eval()
        out[model_dir.name] = {label: [[q.tolist(), a] for q, a in zip(p, generate_ids(model, p, max_new_tokens=64,
                                                                                        **kw).token_lists())]
                               for label, kw in SETTINGS.items()}
        print(model_dir.name, flush=True)
    args.dump.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
