"""`biglm generate CHECKPOINT --prompt TEXT ...`: write answers by iterative unmasking.

Prints one block per prompt: a ``### prompt i: ...`` header line, then the answer. With
``--show-steps`` every model call is printed first, with masked slots shown as ``_``, so one
can watch the answer unmask (Mask-Predict prints the re-masked input and the new prediction).
Exit codes: 0 ok, 2 bad arguments or missing checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .decoding import STRATEGIES, StepInfo

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="biglm generate",
        description="Generate text with a BiGLM by iterative unmasking (Mask-Predict, confidence-ordered "
                    "commit or the threshold rule), using the exact prefix cache.",
    )
    p.add_argument("checkpoint", help="exported Hugging Face directory or training checkpoint directory")
    p.add_argument("--prompt", action="append", required=True, help="text to continue; repeat for a batch")
    p.add_argument("--max-new-tokens", type=int, default=64, help="answer slots N (answers stop at EOS)")
    p.add_argument("--steps", type=int, default=None,
                   help="model calls T (default: 10 for mask-predict, N for confidence/threshold)")
    p.add_argument("--strategy", choices=STRATEGIES, default="mask-predict")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length-beam", type=int, default=1, help="candidate answer lengths to try (keeps the most likely)")
    p.add_argument("--block-length", type=int, default=None, help="semi-autoregressive blocks (confidence/threshold)")
    p.add_argument("--threshold", type=float, default=0.9, help="τ of the threshold strategy")
    p.add_argument("--stop", action="append", default=None, help="cut the answer at this string; repeatable")
    p.add_argument("--no-cache", action="store_true", help="recompute the prompt every step (for checking)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="default: the checkpoint's dtype")
    p.add_argument("--show-steps", action="store_true", help="print the answer after every model call")
    return p


def _render(tokenizer, ids: list[int], mask_id: int) -> str:
    # decode with the mask token kept, then show each mask as "_"
    text = tokenizer.decode(ids, skip_special_tokens=False)
    mask_text = tokenizer.convert_ids_to_tokens(mask_id)
    return text.replace(mask_text, "_") if mask_text else text


def _step_printer(tokenizer, mask_id: int):
    def show(info: StepInfo) -> None:
        for r in range(info.output_ids.shape[0]):
            n = int(info.candidate_length[r])
            label = f"prompt {int(info.prompt_index[r]) + 1}"
            if info.candidate_length.unique().numel() > 1:
                label += f" (length {n})"
            head = f"[step {info.step}/{info.total_steps}] {label}, {int(info.num_masked[r])} masked"
            after = _render(tokenizer, info.output_ids[r, :n].tolist(), mask_id)
            if info.strategy == "mask-predict":
                before = _render(tokenizer, info.input_ids[r, :n].tolist(), mask_id)
                print(f"{head}: {before}\n{' ' * len(head)}  -> {after}", flush=True)
            else:
                print(f"{head}: {after}", flush=True)
    return show


def main(argv: list[str]) -> int:
    """Entry point of `biglm generate`; ``argv`` excludes the word "generate"."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse exits on --help (0) and bad flags (2); callers want a return code
        return int(e.code or 0)
    path = Path(args.checkpoint)
    if not path.exists():
        print(f"biglm generate: no checkpoint at {path}: pass a directory written by `biglm export` "
              "or `biglm pretrain` (or a Hugging Face model directory).", file=sys.stderr)
        return 2
    from ..checkpoint import load_model
    from .api import generate

    try:
        model, tokenizer = load_model(path, device=args.device, dtype=_DTYPES.get(args.dtype) if args.dtype else None)
    except (FileNotFoundError, OSError, ValueError) as e:
        print(f"biglm generate: cannot load {path}: {e}", file=sys.stderr)
        return 2
    mask_id = model.config.mask_token_id
    on_step = _step_printer(tokenizer, mask_id) if args.show_steps and mask_id is not None else None
    try:
        answers = generate(
            model, tokenizer, args.prompt, max_new_tokens=args.max_new_tokens, steps=args.steps,
            strategy=args.strategy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            seed=args.seed, length_beam=args.length_beam, block_length=args.block_length,
            threshold=args.threshold, stop=args.stop, use_cache=not args.no_cache, on_step=on_step,
        )
    except (ValueError, TypeError) as e:
        print(f"biglm generate: {e}", file=sys.stderr)
        return 2
    for i, (prompt, answer) in enumerate(zip(args.prompt, answers), start=1):
        print(f"### prompt {i}: {prompt}")
        print(answer)
    return 0
