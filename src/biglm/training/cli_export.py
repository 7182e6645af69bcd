"""`biglm export RUN_OR_CHECKPOINT OUT_DIR`: write a Hugging Face directory (config.json,
model.safetensors, tokenizer) that `AutoModelForMaskedLM.from_pretrained` loads (after `import biglm`)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    from .checkpoint import export_checkpoint

    parser = argparse.ArgumentParser(prog="biglm export", description=__doc__)
    parser.add_argument("checkpoint", help="a run directory (its newest checkpoint is used) or one checkpoint directory")
    parser.add_argument("out_dir", help="where to write the Hugging Face model directory")
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir)
    except FileNotFoundError as e:
        print(f"[biglm] error: {e}", file=sys.stderr)
        return 2
    print(f"[biglm] exported {args.checkpoint} -> {out}")
    return 0
