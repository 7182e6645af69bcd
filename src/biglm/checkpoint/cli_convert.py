"""`biglm convert SRC OUT`: turn a transformers checkpoint of the Llama family (Llama, SmolLM, Mistral without a
sliding window, Qwen2) into a BiGLM Hugging Face directory (weights mapped by name, RoPE θ, GQA, RMSNorm eps, max
positions; a mask token added to the tokenizer when it has none, its embedding initialised from the mean
embedding). What BiGLM cannot represent (a sliding window, attention biases outside Qwen2, MLP biases, rope
scaling, an activation other than SiLU) is refused in one line naming it. Continue with
`biglm pretrain ... --init_from OUT`."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass
class ConvertArgs:
    src: str
    """a transformers checkpoint directory (config.json, weights, tokenizer) of model_type llama, mistral or qwen2"""
    out: str
    """where to write the BiGLM Hugging Face directory"""


def main(argv: list[str]) -> int:
    from ..config import parse_cli
    from .convert import ConvertError, convert_checkpoint

    args = parse_cli(ConvertArgs, argv, prog="biglm convert", doc=__doc__, positionals=("src", "out"))
    try:
        convert_checkpoint(args.src, args.out)
    except (ConvertError, OSError) as e:
        print(f"[biglm] error: cannot convert {args.src}: {e}", file=sys.stderr)
        return 2
    return 0
