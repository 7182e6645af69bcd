"""`biglm generate CHECKPOINT --prompt TEXT ...`: write answers by iterative unmasking.

Prints one block per prompt: a ``### prompt i: ...`` header line, then the answer. With
``--show-steps`` every model call is printed first, with masked slots shown as ``_``, so one
can watch the answer unmask (Mask-Predict prints the re-masked input and the new prediction).
Exit codes: 0 ok, 2 bad arguments or missing checkpoint.

The options are the checkpoint, ``--prompt``, ``--device``/``--dtype``/``--show-steps`` and one
flag per `DecodingConfig` field (help = the field's docstring; booleans as ``--early-stop`` /
``--no-early-stop``). `_decoding_config` is the one place the flags become a `DecodingConfig`,
validated before the model is loaded. The default is the published Mask-Predict (T model calls);
``--early-stop`` opts in to ending a row once an iteration changes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Literal, get_args, get_origin

import torch

from ..config import field_docs
from .config import FIELDS, DecodingConfig
from .decoding import StepInfo

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _add_decoding_options(p: argparse.ArgumentParser) -> None:
    """One flag per `DecodingConfig` field, typed by the field and documented by its docstring."""
    group = p.add_argument_group("decoding options (DecodingConfig)")
    hints = typing.get_type_hints(DecodingConfig)
    docs = field_docs(DecodingConfig)
    for f in dataclasses.fields(DecodingConfig):
        tp = hints[f.name]
        if get_origin(tp) in (typing.Union, types.UnionType):  # `X | None`: the flag takes an X
            tp = next(a for a in get_args(tp) if a is not type(None))
        flags = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        default = f.default if f.default is not dataclasses.MISSING else None  # list fields: None -> []
        help_text = docs.get(f.name, "").replace("%", "%%")
        if default is not None and not isinstance(default, bool):
            help_text += " (default: %(default)s)"
        if tp is bool:
            group.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                               help=f"{help_text} (default: {'on' if default else 'off'})")
        elif get_origin(tp) is Literal:
            group.add_argument(*flags, dest=f.name, choices=get_args(tp), default=default, help=help_text)
        elif get_origin(tp) is list:
            group.add_argument(*flags, dest=f.name, action="append", default=None, metavar="TEXT",
                               help=f"{help_text}; repeatable")
        else:
            group.add_argument(*flags, dest=f.name, type=tp, default=default, metavar=tp.__name__.upper(),
                               help=help_text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="biglm generate",
        description="Generate text with a BiGLM by iterative unmasking (Mask-Predict, confidence-ordered "
                    "commit or the threshold rule), using the exact prefix cache.",
    )
    p.add_argument("checkpoint", help="exported Hugging Face directory or training checkpoint directory")
    p.add_argument("--prompt", action="append", required=True, help="text to continue; repeat for a batch")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="default: the checkpoint's dtype")
    p.add_argument("--show-steps", action="store_true", help="print the answer after every model call")
    _add_decoding_options(p)
    return p


def _decoding_config(args: argparse.Namespace) -> DecodingConfig:
    """The one place where parsed flags become the decoding options (validated here, once)."""
    return DecodingConfig(**{name: getattr(args, name) for name in FIELDS})


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
    try:
        config = _decoding_config(args)
    except ValueError as e:
        print(f"biglm generate: {e}", file=sys.stderr)
        return 2
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
        answers = generate(model, tokenizer, args.prompt, config=config, on_step=on_step)
    except (ValueError, TypeError) as e:
        print(f"biglm generate: {e}", file=sys.stderr)
        return 2
    for i, (prompt, answer) in enumerate(zip(args.prompt, answers), start=1):
        print(f"### prompt {i}: {prompt}")
        print(answer)
    return 0
