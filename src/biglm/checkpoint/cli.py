"""`biglm export RUN_OR_CHECKPOINT OUT_DIR`: write a Hugging Face directory (config.json,
model.safetensors, tokenizer) that `AutoModelForMaskedLM.from_pretrained` loads (after `import biglm`), with a
model card (README.md: YAML front matter for the Hub, then the architecture, objective, training steps and tokens,
the evaluation results found in the run, and how to load and generate). OUT_DIR must be new or empty (--overwrite
replaces a model there, never a training run); it is written beside itself and renamed into place at the end, so a
failed export leaves none."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal


@dataclass
class ExportArgs:
    checkpoint: str
    """a run directory (its newest checkpoint is used) or one checkpoint directory"""
    out_dir: str
    """where to write the Hugging Face model directory"""
    license: str = "apache-2.0"
    """the model card's license (a Hugging Face license id)"""
    base_model: str | None = None
    """the model card's base_model (default: the run's --init_from, or a fine-tuning run's --model); e.g. a hub id"""
    card: bool = True
    """write the model card README.md"""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """the weights' dtype in OUT_DIR, which generate and serve then load by default (unset: the checkpoint's, float32)"""
    overwrite: bool = False
    """replace OUT_DIR when it already holds a model (swapped in only once the new one is written); a folder of other
    files, or a training run, is never replaced"""


def main(argv: list[str]) -> int:
    from ..config import parse_cli
    from .export import export_checkpoint

    args = parse_cli(ExportArgs, argv, prog="biglm export", doc=__doc__, positionals=("checkpoint", "out_dir"))
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, card=args.card, license=args.license,
                                base_model=args.base_model, dtype=args.dtype,
                                overwrite=args.overwrite)
    except (FileNotFoundError, OSError, ValueError) as e:  # a damaged checkpoint (DamagedCheckpointError) included
        print(f"[biglm] error: {e}", file=sys.stderr)
        return 2
    print(f"[biglm] exported {args.checkpoint} -> {out}")
    return 0
