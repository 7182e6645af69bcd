"""The `biglm` command line.

Each subcommand lives next to the code it drives and exposes ``main(argv) -> int``; this file
only dispatches, so adding a command never touches the others.
"""

from __future__ import annotations

import importlib
import sys

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
    lines = ["usage: biglm COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `biglm COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"biglm: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except SystemExit as e:  # --help (0) and bad usage (2) from `biglm.config.parse_cli`
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)


if __name__ == "__main__":
    sys.exit(main())
