"""`biglm chat RUN_OR_HF_DIR`: a conversation with a BiGLM, one line of standard input per user turn.

Each turn is appended to the conversation, which is rendered with the model's chat template
(`biglm.generation.chat`: the template an instruction-tuned model was saved with, else the plain
``User:``/``Assistant:`` format) and answered by iterative unmasking; the answer joins the
conversation, so the next prompt holds every earlier turn. A line ending in a backslash continues
on the next line (a turn of several lines: the backslash is dropped, the line break kept). On a
terminal the answer is redrawn on one line after every model call (masked slots as ``_``), so one
can watch it unmask; otherwise (a pipe, a file) only the final answer is printed, one block per
turn. ``/reset`` starts a new conversation, ``/exit`` or end of input ends the session.

Options are every `DecodingConfig` field, as in `biglm generate`. A fine-tuned model carries the
decoding settings it was validated with (answer length, steps, length beam); an option not given on
the command line takes the model's value. A model with a length head (CMLM seq2seq) picks each
answer's length with it.

    biglm chat runs/finetune-flan            # a fine-tuning run (its best epoch) or an exported directory
    printf 'What is 2+2?\\nAnd 3+3?\\n' | biglm chat runs/finetune-flan --steps 8
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import torch

from ..config import ConfigError, parse_cli
from .api import generate
from .chat import render_chat
from .cli import _render, cli_decoding, load_for_cli
from .config import DecodingConfig
from .decoding import StepInfo

PROG = "biglm chat"


@dataclass(frozen=True)
class ChatArgs(DecodingConfig):
    """Chat with a BiGLM: one line of standard input per user turn, answers written by iterative unmasking."""

    checkpoint: str = ""
    """fine-tuning run, exported Hugging Face directory, training run or checkpoint directory"""
    system: str = ""
    """a system message that opens the conversation (empty: none)"""
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    """where the model runs"""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """weights' dtype (unset: the checkpoint's)"""
    show_steps: bool | None = None
    """redraw the answer after every model call (unset: when standard output is a terminal)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.checkpoint:
            raise ConfigError("missing RUN_OR_HF_DIR: a fine-tuning run, a `biglm export` directory or a "
                              "`biglm pretrain` run")


def _live_line(tokenizer, mask_id: int, eos_id: int | None, out: TextIO):
    """An ``on_step`` that redraws the first candidate's answer (up to a written EOS) on the current terminal line."""

    def show(info: StepInfo) -> None:
        ids = info.output_ids[0, :int(info.candidate_length[0])].tolist()
        ids = ids[:ids.index(eos_id)] if eos_id in ids else ids
        text = _render(tokenizer, ids, mask_id).replace("\n", " ")
        out.write(f"\r\x1b[2K[{info.step}/{info.total_steps}] {text}")
        out.flush()

    return show


def _read_turn(lines: TextIO) -> str | None:
    """One user turn: a line, joined with the next while it ends in a backslash; None at the end of input."""
    parts: list[str] = []
    while line := lines.readline():
        line = line.rstrip("\r\n")
        if not line.endswith("\\"):
            return "\n".join([*parts, line])
        parts.append(line[:-1])
    return "\n".join(parts) if parts else None


def chat_loop(model, tokenizer, *, config: DecodingConfig, lines: TextIO, out: TextIO, system: str = "",
              show_steps: bool = False, prompt_marker: str = "") -> list[dict[str, str]]:
    """Answer each line of ``lines`` in one conversation, writing answers to ``out``; returns the conversation."""
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    mask_id = model.config.mask_token_id
    on_step = _live_line(tokenizer, mask_id, model.config.eos_token_id, out) if show_steps else None
    while True:
        if prompt_marker:
            out.write(prompt_marker)
            out.flush()
        text = _read_turn(lines)
        if text is None:  # end of input
            break
        if text.strip() in {"/exit", "/quit"}:
            break
        if text.strip() == "/reset":
            messages = messages[:1] if system else []
            continue
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        prompt = render_chat(tokenizer, messages)
        answer = generate(model, tokenizer, [prompt], config=config, on_step=on_step)[0].strip()
        if on_step is not None:
            out.write("\r\x1b[2K")
        out.write(answer + "\n")
        out.flush()
        messages.append({"role": "assistant", "content": answer})
    return messages


def main(argv: list[str]) -> int:
    """Entry point of `biglm chat`; ``argv`` excludes the word "chat"."""
    try:
        args = parse_cli(ChatArgs, argv, prog=PROG, doc=__doc__, positionals=("checkpoint",))
    except SystemExit as e:
        return int(e.code or 0)
    loaded = load_for_cli(Path(args.checkpoint), prog=PROG, device=args.device, dtype=args.dtype)
    if loaded is None:
        return 2
    model, tokenizer = loaded
    show = sys.stdout.isatty() if args.show_steps is None else args.show_steps
    try:
        chat_loop(model, tokenizer, config=cli_decoding(args, argv, model), lines=sys.stdin, out=sys.stdout,
                  system=args.system, show_steps=show and model.config.mask_token_id is not None,
                  prompt_marker="> " if sys.stdin.isatty() else "")
    except (ValueError, TypeError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
    return 0
