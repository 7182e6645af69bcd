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
the next token (the head keeps its alignment; Dream's and DiffuLLaMA's choice, and the better one measured,
docs/LOG.md); --shift false: from its own position, as a BiGLM trained from scratch. The model records it, so
decoding, scoring and serving follow it.

--causal (the default, with --shift): the text is read as the source read it, so the converted model writes the
source's greedy text one token per call and `biglm eval` gives the source's scores, before any training; adaptation
(`biglm pretrain blocks-adapt --init_from OUT`) then trains the mask slots to draft several tokens a call. --causal
false: the paper's bidirectional prefix, which the source's weights never saw (continued pre-training makes it a
BiGLM)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .convert import CAUSAL_DEFAULT, SHIFT_DEFAULT


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
    causal: bool | None = None
    """read the text (prompt and answer) causally, as the source read it: one token per call writes the source's
    greedy text and `biglm eval` gives its scores from step 0, and adaptation trains the mask slots to draft for it;
    false: the paper's bidirectional prefix (a BiGLM only after continued pre-training). Needs --shift; unset: on
    with --shift (the default), off with --shift false"""


def main(argv: list[str]) -> int:
    from ..config import parse_cli
    from .convert import ConvertError, convert_checkpoint

    args = parse_cli(ConvertArgs, argv, prog="biglm convert", doc=__doc__, positionals=("src", "out"))
    causal = args.shift and CAUSAL_DEFAULT if args.causal is None else args.causal
    if causal and not args.shift:
        print("[biglm] error: --causal reads the text as the source did and needs --shift (the next token predicted "
              "from the last text position): drop --shift false, or --causal", file=sys.stderr)
        return 2
    try:
        convert_checkpoint(args.src, args.out, shift=args.shift, causal=causal, overwrite=args.overwrite)
    except (ConvertError, OSError) as e:
        print(f"[biglm] error: cannot convert {args.src}: {e}", file=sys.stderr)
        return 2
    return 0
