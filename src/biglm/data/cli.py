"""`biglm data prepare` (tokenise sources into shards), `biglm data distill` (a teacher model writes the text, then
shards of it) and `biglm data info` (inspect shards)."""

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
class DistillArgs:
    """A teacher model writes the text a model adapts on: prompts cut from text SOURCES (continuations),
    --chat_sources (user turns) and/or --input rows, answered by the teacher (an autoregressive model, e.g. the GGUF
    a model was converted from, or a biglm model one token per call; greedy unless --temperature), then tokenised with the student's
    --tokenizer into train-*.bin / val-*.bin shards and a manifest.json in --out, as `biglm data prepare` writes them.
    A model adapted on it learns in its mask slots the tokens the teacher writes next (draft acceptance; the guide
    "Start from an AR checkpoint", docs/guides/convert.md). Re-running the same command after an interruption
    continues where it stopped."""

    sources: list[str] = field(default_factory=list)
    """text sources for continuation prompts: .txt/.jsonl/.parquet files, folders of them, 'builtin' or hf:OWNER/NAME"""
    teacher: str = ""
    """the model that writes the text (required): an autoregressive model (a .gguf file, a transformers folder, a hub
    id) or a biglm model folder or run"""
    tokenizer: str = ""
    """the student's tokenizer, for the shards (e.g. `biglm convert`'s output; default: a biglm teacher's own)"""
    out: str = ""
    """output folder: prompts.jsonl, answers.jsonl, text.jsonl, the shards and manifest.json (required)"""
    chat_sources: list[str] = field(default_factory=list)
    """sources whose documents become a user's turn through the chat template (e.g. instructions)"""
    chat_field: str = "text"
    """field holding the text in .jsonl/.parquet/hub rows of --chat_sources"""
    chat_docs: int = 256
    """chat prompts taken from --chat_sources (the sources in turn)"""
    input: str = ""
    """more prompts: a JSONL of rows in `biglm generate --input`'s format (a "prompt" or chat "messages")"""
    docs: int = 1024
    """continuation prompts cut from SOURCES (one per document, the sources in turn)"""
    prompt_words: int = 32
    """words of a document kept as its prompt (shorter documents are skipped)"""
    skip_docs: int = 0
    """documents skipped at the start of each source (e.g. the --val_docs of the set you evaluate on)"""
    max_new_tokens: int = 96
    """tokens the teacher writes after each prompt"""
    batch_size: int = 16
    """prompts the teacher answers together"""
    temperature: float = 0.0
    """0: the teacher's greedy text (its next tokens exactly: what draft slots are checked against); above 0: sampled"""
    seed: int = 0
    """the sampler's seed (with --temperature)"""
    no_repeat_ngram: int = 0
    """an autoregressive teacher never repeats an n-gram of this many tokens (0: no limit); a small model's greedy text
    loops, and a model adapted on loops loops more"""
    val_docs: int = 0
    """hold out the first N documents of the teacher's text as the val split"""
    text_field: str = "text"
    """field holding the text in .jsonl/.parquet/hub rows of SOURCES"""
    txt_mode: Literal["paragraph", "document", "line"] = "paragraph"
    """how .txt SOURCES split into documents: at blank lines, per file, per line"""
    progress: bool = True
    """show progress bars"""

    def __post_init__(self) -> None:
        for name in ("teacher", "out"):
            if not getattr(self, name):
                raise ValueError(f"missing --{name}")
        if not self.sources and not self.chat_sources and not self.input:
            raise ValueError("no prompts: give text SOURCES (continuation prompts), --chat_sources and/or --input")


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


def _distill(args: DistillArgs) -> int:
    from biglm.training.distill import distill

    t0 = time.perf_counter()
    manifest = distill(args.teacher, args.out, sources=args.sources, chat_sources=args.chat_sources,
                       input=args.input or None, tokenizer=args.tokenizer or None, docs=args.docs,
                       chat_docs=args.chat_docs, chat_field=args.chat_field,
                       prompt_words=args.prompt_words, skip_docs=args.skip_docs, max_new_tokens=args.max_new_tokens,
                       batch_size=args.batch_size, temperature=args.temperature, seed=args.seed,
                       no_repeat_ngram=args.no_repeat_ngram,
                       val_docs=args.val_docs, text_field=args.text_field,
                       txt_mode=args.txt_mode, progress=args.progress)
    for split, p in manifest["progress"].items():
        if p["tokens"]:
            print(f"{split}: {p['tokens']:,} tokens, {p['docs']:,} documents")
    print(f"wrote {args.out} in {time.perf_counter() - t0:.1f} s; train on it: biglm pretrain blocks-adapt "
          f"--init_from MODEL --data {args.out}")
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
                                            "distill": (DistillArgs, DistillArgs.__doc__, ("sources",)),
                                            "info": (InfoArgs, InfoArgs.__doc__, ("paths",))}, prog="biglm data")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from biglm.data.prepare import PrepareError
    from biglm.data.shards import ShardError
    from biglm.data.sources import SourceError
    from biglm.data.tokenizer import TokenizerError

    try:
        if command == "distill":
            from biglm.generation.batch import BatchInputError
            from biglm.training.distill import DistillError

            try:
                return _distill(args)
            except (DistillError, BatchInputError) as e:
                print(f"biglm data: {e}", file=sys.stderr)
                return 2
        return _prepare(args) if command == "prepare" else _info(args)
    except (PrepareError, ShardError, SourceError, TokenizerError) as e:
        print(f"biglm data: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
