"""`biglm tokenizer train`: train a byte-level BPE tokenizer on text files or folders."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator


def _limited(texts: Iterator[str], limit_bytes: int | None) -> Iterator[str]:
    """Stop after ``limit_bytes`` UTF-8 bytes of text (the document that crosses it is kept)."""
    seen = 0
    for text in texts:
        yield text
        seen += len(text.encode("utf-8"))
        if limit_bytes is not None and seen >= limit_bytes:
            return


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="biglm tokenizer", description="Train and inspect BiGLM tokenizers.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a byte-level BPE tokenizer with <pad> <s> </s> <unk> <mask> as ids 0..4",
                       description="Train a byte-level BPE tokenizer and save it as a Hugging Face tokenizer folder.")
    t.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="text sources: .txt/.jsonl/.parquet files, folders of them, 'builtin' or hf:OWNER/NAME")
    t.add_argument("--vocab-size", type=int, default=49152, help="vocabulary size incl. special tokens (default 49152)")
    t.add_argument("--out", required=True, metavar="DIR", help="output folder (tokenizer.json + tokenizer_config.json)")
    t.add_argument("--limit-bytes", type=int, default=None, metavar="N",
                   help="train on the first N bytes of text only (default: all of it)")
    t.add_argument("--min-frequency", type=int, default=2, help="minimum pair count for a merge (default 2)")
    t.add_argument("--text-field", default="text", help="field holding the text in .jsonl/.parquet/hub rows")
    t.add_argument("--txt-mode", choices=["paragraph", "document", "line"], default="paragraph",
                   help="how .txt files split into documents: at blank lines (default), per file, per line")
    return p


def main(argv: list[str]) -> int:
    """Entry point for ``biglm tokenizer ...``; ``argv`` excludes the word "tokenizer"."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from biglm.data.sources import SourceError, iter_sources
    from biglm.data.tokenizer import train_tokenizer

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
