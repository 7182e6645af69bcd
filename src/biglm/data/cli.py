"""`biglm data prepare` (tokenise sources into shards) and `biglm data info` (inspect shards)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="biglm data", description="Prepare and inspect pre-tokenised data.")
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("prepare", help="tokenise text sources into binary token shards (resumable)",
                        description="Tokenise text sources into train-*.bin / val-*.bin shards and a manifest.json. "
                                    "Re-running the same command after an interruption continues where it stopped.")
    pr.add_argument("sources", nargs="+", metavar="SOURCE",
                    help="text sources: .txt/.jsonl/.parquet files, folders of them, 'builtin' or "
                         "hf:OWNER/NAME[:CONFIG][@SPLIT]")
    pr.add_argument("--tokenizer", required=True, metavar="PATH", help="Hugging Face tokenizer folder or hub name")
    pr.add_argument("--out", required=True, metavar="DIR", help="output folder for shards and manifest.json")
    pr.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="tokenising processes (default: all cores; 1 = in this process)")
    pr.add_argument("--shard-tokens", type=int, default=2**26, help="maximum tokens per shard (default 2**26)")
    pr.add_argument("--val-docs", type=int, default=0,
                    help="hold out the first N documents of each source as the val split (default 0)")
    pr.add_argument("--text-field", default="text", help="field holding the text in .jsonl/.parquet/hub rows")
    pr.add_argument("--txt-mode", choices=["paragraph", "document", "line"], default="paragraph",
                    help="how .txt files split into documents: at blank lines (default), per file, per line")
    pr.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    info = sub.add_parser("info", help="print the header of shards, verifying their checksums",
                          description="Print each shard's header and verify its checksum.")
    info.add_argument("paths", nargs="+", metavar="PATH", help="shard files or prepared folders")
    return p


def _prepare(args: argparse.Namespace) -> int:
    from biglm.data.prepare import prepare

    t0 = time.perf_counter()
    manifest = prepare(sources=args.sources, tokenizer=args.tokenizer, out_dir=args.out,
                       shard_tokens=args.shard_tokens, workers=args.workers, val_docs=args.val_docs,
                       text_field=args.text_field, txt_mode=args.txt_mode, progress=not args.no_progress)
    dt = time.perf_counter() - t0
    for split, p in manifest["progress"].items():
        if p["tokens"]:
            n = sum(1 for s in manifest["shards"] if s["split"] == split)
            print(f"{split}: {p['tokens']:,} tokens, {p['docs']:,} documents, {p['bytes']:,} bytes in {n} shards")
    total = sum(p["tokens"] for p in manifest["progress"].values())
    print(f"wrote {args.out} in {dt:.1f} s ({total / max(dt, 1e-9):,.0f} tokens/s including start-up)")
    return 0


def _info(args: argparse.Namespace) -> int:
    from pathlib import Path

    from biglm.data.shards import ShardReader

    paths: list[Path] = []
    for p in map(Path, args.paths):
        paths += sorted(p.glob("*.bin")) if p.is_dir() else [p]
    for path in paths:
        r = ShardReader(path)
        print(f"{path}: {r.n_tokens:,} tokens, {r.n_docs:,} docs, vocab {r.vocab_size}, {r.dtype.name}, "
              f"eos {r.eos_id}, tokenizer {r.fingerprint}, checksum ok")
    return 0


def main(argv: list[str]) -> int:
    """Entry point for ``biglm data ...``; ``argv`` excludes the word "data"."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from biglm.data.prepare import PrepareError
    from biglm.data.shards import ShardError
    from biglm.data.sources import SourceError

    try:
        return _prepare(args) if args.command == "prepare" else _info(args)
    except (PrepareError, ShardError, SourceError) as e:
        print(f"biglm data: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
