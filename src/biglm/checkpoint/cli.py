"""`biglm export RUN_OR_CHECKPOINT OUT_DIR`: write a Hugging Face directory (config.json,
model.safetensors, tokenizer) that `AutoModelForMaskedLM.from_pretrained` loads (after `import biglm`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass
class ExportArgs:
    checkpoint: str
    """a run directory (its newest checkpoint is used) or one checkpoint directory"""
    out_dir: str
    """where to write the Hugging Face model directory"""


def main(argv: list[str]) -> int:
    from ..config import parse_cli
    from .export import export_checkpoint

    args = parse_cli(ExportArgs, argv, prog="biglm export", doc=__doc__, positionals=("checkpoint", "out_dir"))
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir)
    except FileNotFoundError as e:
        print(f"[biglm] error: {e}", file=sys.stderr)
        return 2
    print(f"[biglm] exported {args.checkpoint} -> {out}")
    return 0
