"""`biglm convert SRC OUT`: turn a checkpoint of the Llama family (Llama, SmolLM, Mistral without a sliding window,
Qwen2) into a BiGLM Hugging Face directory (weights mapped by name, RoPE θ, GQA, RMSNorm eps, max positions; a mask
and a pad token added to the tokenizer when it has none, their embeddings initialised from the mean embedding).
SRC is a GGUF file (llama.cpp / Ollama; quantized weights are dequantized to float32), a transformers checkpoint
directory, or a hub id (ORG/NAME). OUT gets a model card and biglm_source.json naming the source by hub id, or by
file name and sha256 (never a local path). What BiGLM cannot represent (a sliding window, attention biases outside Qwen2, MLP biases, rope
scaling, an activation other than SiLU) is refused in one line naming it. OUT must be new or empty (--overwrite
replaces a model there, never a training run), checked before any work; it is written beside itself and renamed
into place at the end, so a failed conversion leaves none. Continue with
`biglm pretrain ... --init_from OUT`.

--shift (the default): the BiGLM predicts a masked token at position i from position i-1, as the source predicted
the next token (the head keeps its alignment; Dream's and DiffuLLaMA's choice, and the better one in issue 23's
measurement, docs/LOG.md); --shift false: from its own position, as a BiGLM trained from scratch. The model records
it, so decoding, scoring and serving follow it."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .convert import SHIFT_DEFAULT


@dataclass
class ConvertArgs:
    src: str
    """a GGUF file, a transformers checkpoint directory (config.json, weights, tokenizer) or a hub id ORG/NAME, of
    model_type llama, mistral or qwen2"""
    out: str
    """where to write the BiGLM Hugging Face directory"""
    overwrite: bool = False
    """replace OUT when it already holds a model (swapped in only once the new one is written); a folder of other
    files, or a training run, is never replaced"""
    shift: bool = SHIFT_DEFAULT
    """predict the token at position i from position i-1's hidden state, as the autoregressive source did (measured
    better than predicting from its own position: docs/LOG.md, issue 23); false: from its own position"""


def main(argv: list[str]) -> int:
    from ..config import parse_cli
    from .convert import ConvertError, convert_checkpoint

    args = parse_cli(ConvertArgs, argv, prog="biglm convert", doc=__doc__, positionals=("src", "out"))
    try:
        convert_checkpoint(args.src, args.out, shift=args.shift, overwrite=args.overwrite)
    except (ConvertError, OSError) as e:
        print(f"[biglm] error: cannot convert {args.src}: {e}", file=sys.stderr)
        return 2
    return 0
