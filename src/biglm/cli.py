"""The `biglm` command line.

Each subcommand lives next to the code it drives and exposes ``main(argv) -> int``; this file
only dispatches, so adding a command never touches the others. What every command shares is here, once:

- ``biglm --version``; an unknown command gets the nearest one (``did you mean 'pretrain'?``);
- exit status: a command's own, 2 for bad usage, 128 + N for a stop signal N: 130 for Ctrl-C (a training run's
  `TrainingInterrupted` after its checkpoint, or a plain KeyboardInterrupt: one line, no traceback) and 143 for
  SIGTERM, so ``biglm pretrain ... && biglm export ...`` stops with the run;
- Python warnings (a library's UserWarning, say) as one line each, ``[biglm] warning: MESSAGE (PACKAGE)``, on
  stderr, never the warning's source file and line.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import warnings
from pathlib import Path

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "presets": ("biglm.cli_presets", "list the architecture presets with their parameter counts"),
    "tokenizer": ("biglm.data.cli_tokenizer", "train a byte-level BPE tokenizer (tokenizer train ...)"),
    "data": ("biglm.data.cli", "tokenise text sources into binary token shards (data prepare ...), or a teacher's text (data distill ...)"),
    "pretrain": ("biglm.training.cli", "pre-train a BiGLM from a recipe (no argument: the built-in default)"),
    "recipes": ("biglm.training.cli_recipes", "list the pre-training recipes of the paper"),
    "finetune": ("biglm.finetune.cli", "fine-tune on a task (classification by prompt, SQuAD, retrieval, CMLM seq2seq, FLAN instruction tuning)"),
    "tasks": ("biglm.finetune.cli_tasks", "list the fine-tuning tasks"),
    "convert": ("biglm.checkpoint.cli_convert", "convert a Llama-family transformers checkpoint (Llama, SmolLM, Mistral, Qwen2) to a BiGLM directory"),
    "export": ("biglm.checkpoint.cli", "export a pre-training run (or a fine-tuning run's best epoch) as a Hugging Face directory"),
    "generate": ("biglm.generation.cli", "generate text by iterative unmasking (Mask-Predict)"),
    "chat": ("biglm.generation.cli_chat", "chat with a model on standard input (its chat template; the answer unmasks live)"),
    "eval": ("biglm.scoring.cli", "zero-shot evaluation through lm-evaluation-harness"),
    "report": ("biglm.report.cli", "figures, tables and one HTML page from runs, eval results and benchmarks (Fig. 3-4, Tables 1/2/8, 6)"),
    "serve": ("biglm.serving.cli", "serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming)"),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: biglm COMMAND [ARGS...]  |  biglm --version", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `biglm COMMAND --help` for a command's options."]
    return "\n".join(lines)


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file=None,
                 line: str | None = None) -> None:
    """`warnings.showwarning` for the command line: one line on stderr, ``[biglm] warning: MESSAGE (PACKAGE)``,
    where Python would print the source file, its line number and the line of code."""
    text = " ".join(str(message).split()) or category.__name__
    kind = "" if category is UserWarning else f"{category.__name__}: "
    origin = _package_of(filename)
    stream = file if file is not None else sys.stderr
    try:
        stream.write(f"[biglm] warning: {kind}{text}{f' ({origin})' if origin else ''}\n")
    except (OSError, ValueError):  # a closed stream: as Python's own, never an error
        pass


def _package_of(filename: str) -> str:
    """The top-level package a source file belongs to (``torch`` for .../site-packages/torch/nn/x.py), or ''."""
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return Path(parts[parts.index(marker) + 1]).stem
    if "biglm" in parts:
        return "biglm"
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if argv[0] in {"--version", "-V"}:
        from . import __version__

        print(f"biglm {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"biglm: unknown command {name!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.showwarning = show_warning
        try:
            module = importlib.import_module(COMMANDS[name][0])
            return int(module.main(rest) or 0)
        except SystemExit as e:  # --help (0) and bad usage (2) from `biglm.config.parse_cli`
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except KeyboardInterrupt as e:
            code = getattr(e, "exit_code", None)  # a training run's TrainingInterrupted: it said where it stopped
            if code is None:
                print("\n[biglm] interrupted", file=sys.stderr)
            return code if isinstance(code, int) else 130


if __name__ == "__main__":
    sys.exit(main())
