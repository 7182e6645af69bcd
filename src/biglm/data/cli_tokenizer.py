"""`biglm tokenizer train`: train a byte-level BPE tokenizer on text files or folders."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..config import parse_subcommand


def _limited(texts: Iterator[str], limit_bytes: int | None) -> Iterator[str]:
    """Stop after ``limit_bytes`` UTF-8 bytes of text (the document that crosses it is kept)."""
    seen = 0
    for text in texts:
        yield text
        seen += len(text.encode("utf-8"))
        if limit_bytes is not None and seen >= limit_bytes:
            return


@dataclass
class TrainTokenizerArgs:
    """Train a byte-level BPE tokenizer (<pad> <s> </s> <unk> <mask> as ids 0..4) and save it as a Hugging Face
    tokenizer folder."""

    input: list[str] = field(default_factory=list)
    """text sources, comma-separated: .txt/.jsonl/.parquet files, folders of them, 'builtin' or hf:OWNER/NAME (required)"""
    out: str = ""
    """output folder (tokenizer.json + tokenizer_config.json) (required)"""
    vocab_size: int = 49152
    """vocabulary size including the special tokens"""
    limit_bytes: int | None = None
    """train on the first N bytes of text only (default: all of it)"""
    min_frequency: int = 2
    """minimum pair count for a merge"""
    text_field: str = "text"
    """field holding the text in .jsonl/.parquet/hub rows"""
    txt_mode: Literal["paragraph", "document", "line"] = "paragraph"
    """how .txt files split into documents: at blank lines, per file, per line"""

    def __post_init__(self) -> None:
        if not self.input or not self.out:
            raise ValueError(f"missing --{'input' if not self.input else 'out'}")
        if self.vocab_size < 6:
            raise ValueError(f"--vocab_size {self.vocab_size} leaves no room beside the 5 special tokens")


def main(argv: list[str]) -> int:
    """Entry point for ``biglm tokenizer ...``; ``argv`` excludes the word "tokenizer"."""
    _, args = parse_subcommand(argv, {"train": (TrainTokenizerArgs, TrainTokenizerArgs.__doc__, ())},
                               prog="biglm tokenizer")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from biglm.data.sources import SourceError, iter_sources
    from biglm.data.tokenizer import train_tokenizer

    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"biglm tokenizer: --out {args.out} is a file: give a folder (tokenizer.json and tokenizer_config.json "
              "go in it)", file=sys.stderr)
        return 2
    try:
        texts = _limited(iter_sources(args.input, text_field=args.text_field, txt_mode=args.txt_mode),
                         args.limit_bytes)
        t0 = time.perf_counter()
        tok = train_tokenizer(texts=texts, vocab_size=args.vocab_size, out_dir=args.out,
                              min_frequency=args.min_frequency)
    except SourceError as e:
        print(f"biglm tokenizer: {e}", file=sys.stderr)
        return 2
    print(f"trained a {len(tok)}-token byte-level BPE in {time.perf_counter() - t0:.1f} s; saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
