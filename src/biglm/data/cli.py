"""`biglm data prepare` (tokenise sources into shards) and `biglm data info` (inspect shards)."""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

from ..config import parse_subcommand


@dataclass
class PrepareArgs:
    """Tokenise text sources into train-*.bin / val-*.bin shards and a manifest.json. Re-running the same
    command after an interruption continues where it stopped."""

    sources: list[str] = field(default_factory=list)
    """text sources: .txt/.jsonl/.parquet files, folders of them, 'builtin' or hf:OWNER/NAME[:CONFIG][@SPLIT]"""
    tokenizer: str = ""
    """Hugging Face tokenizer folder or hub name (required)"""
    out: str = ""
    """output folder for shards and manifest.json (required)"""
    workers: int = os.cpu_count() or 1
    """tokenising processes (default: all cores; 1 = in this process)"""
    shard_tokens: int = 2**26
    """maximum tokens per shard"""
    val_docs: int = 0
    """hold out the first N documents of each source as the val split"""
    text_field: str = "text"
    """field holding the text in .jsonl/.parquet/hub rows"""
    txt_mode: Literal["paragraph", "document", "line"] = "paragraph"
    """how .txt files split into documents: at blank lines, per file, per line"""
    progress: bool = True
    """show a progress bar"""

    def __post_init__(self) -> None:
        for name in ("sources", "tokenizer", "out"):
            if not getattr(self, name):
                raise ValueError(f"missing --{name}" if name != "sources" else "missing SOURCES: give at least one source")
        if self.workers < 1 or self.shard_tokens < 1 or self.val_docs < 0:
            raise ValueError("--workers and --shard_tokens must be >= 1 and --val_docs >= 0")


@dataclass
class InfoArgs:
    """Print each shard's header and verify its checksum."""

    paths: list[str] = field(default_factory=list)
    """shard files or prepared folders"""

    def __post_init__(self) -> None:
        if not self.paths:
            raise ValueError("missing PATHS: give shard files or prepared folders")


def _prepare(args: PrepareArgs) -> int:
    from biglm.data.prepare import per_source, prepare
    from biglm.data.tokenizer import check_tokenizer_source

    check_tokenizer_source(args.tokenizer, what="--tokenizer")  # named as the user wrote it, before any output
    t0 = time.perf_counter()
    manifest = prepare(sources=args.sources, tokenizer=args.tokenizer, out_dir=args.out,
                       shard_tokens=args.shard_tokens, workers=args.workers, val_docs=args.val_docs,
                       text_field=args.text_field, txt_mode=args.txt_mode, progress=args.progress)
    dt = time.perf_counter() - t0
    for split, p in manifest["progress"].items():
        if p["tokens"]:
            n = sum(1 for s in manifest["shards"] if s["split"] == split)
            print(f"{split}: {p['tokens']:,} tokens, {p['docs']:,} documents, {p['bytes']:,} bytes in {n} shards")
    if len(args.sources) > 1:  # what each source gave each split
        for spec, c in zip(args.sources, per_source(manifest)):
            print(f"  {spec}: " + ", ".join(f"{split} {c[split][1]:,} tokens ({c[split][0]:,} documents)"
                                            for split in ("train", "val") if c[split][0]))
    total = sum(p["tokens"] for p in manifest["progress"].values())
    print(f"wrote {args.out} in {dt:.1f} s ({total / max(dt, 1e-9):,.0f} tokens/s including start-up)")
    return 0


def _info(args: InfoArgs) -> int:
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
    command, args = parse_subcommand(argv, {"prepare": (PrepareArgs, PrepareArgs.__doc__, ("sources",)),
                                            "info": (InfoArgs, InfoArgs.__doc__, ("paths",))}, prog="biglm data")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from biglm.data.prepare import PrepareError
    from biglm.data.shards import ShardError
    from biglm.data.sources import SourceError
    from biglm.data.tokenizer import TokenizerError

    try:
        return _prepare(args) if command == "prepare" else _info(args)
    except (PrepareError, ShardError, SourceError, TokenizerError) as e:
        print(f"biglm data: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
