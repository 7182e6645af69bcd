"""`biglm finetune TASK --model RUN_OR_HF_DIR [--field value ...] [--task.FIELD value ...]`

Fine-tune a pre-trained BiGLM on a task with one loop for every task: epochs, the task's metric on the
validation split after each, the best epoch kept in OUT/best (a Hugging Face directory usable without
biglm's trainer). TASK is a name from `biglm tasks` or a YAML task file. Loop fields are flags
(``--epochs 3 --lr 3e-5``); the task's own settings are ``--task.FIELD`` (``--task.train data.jsonl``).
The same command runs under ``torchrun --nproc_per_node N -m biglm finetune ...``; started again with the
same output directory, a run resumes from its newest checkpoint.

    biglm finetune mnli --model runs/default --task.train ../shared/data/finetune/mnli/train_subset_300.jsonl \\
        --task.validation ../shared/data/finetune/mnli/validation_matched.jsonl
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..config import ConfigError, apply_overrides, fail, format_help
from .config import FinetuneConfig

PROG = "biglm finetune"


def _split_task_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(``--task.X`` flags as ``--X``, everything else)."""
    task, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in arg
        chunk = argv[i:i + 2] if takes_value else argv[i:i + 1]
        if arg.startswith("--task."):
            task += ["--" + chunk[0][len("--task."):], *chunk[1:]]
            i += len(chunk)
        else:
            rest.append(arg)
            i += 1
    return task, rest


def resolve(argv: list[str]):
    """``(task, FinetuneConfig)`` from the command line; `ConfigError` on anything wrong."""
    from .tasks import get_task_recipe, load_task_file

    if not argv or argv[0].startswith("--"):
        raise ConfigError("missing TASK: a name from `biglm tasks` or a task .yaml file")
    name, flags = argv[0], argv[1:]
    if Path(name).suffix in {".yaml", ".yml"}:
        recipe, settings, loop = load_task_file(name)
    else:
        recipe, loop = get_task_recipe(name), {}
        settings = recipe.settings()
    loop = {**recipe.loop, **loop}
    task_flags, rest = _split_task_flags(flags)
    try:
        settings = apply_overrides(settings, task_flags) if task_flags else settings
    except ConfigError as e:  # name the flags as the user wrote them
        raise ConfigError(str(e).replace("--", "--task.")) from None
    from ..config import from_dict

    cfg = apply_overrides(from_dict(FinetuneConfig, loop), rest)
    try:
        task = recipe.build(settings)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return task, settings, cfg


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"} or any(a in {"-h", "--help"} for a in argv):
        print(format_help(FinetuneConfig, prog=PROG + " TASK", doc=__doc__))
        if argv and not argv[0].startswith("-"):
            from .tasks import get_task_recipe

            try:
                recipe = get_task_recipe(argv[0])
                print(format_help(type(recipe.settings()), prog=f"task settings of {recipe.name}: --task.FIELD",
                                  doc=recipe.description, base=recipe.settings()).replace("  --", "  --task."))
            except ConfigError:
                pass
        return 0
    show = any(a in {"--print_config", "--print-config"} for a in argv)
    argv = [a for a in argv if a not in {"--print_config", "--print-config"}]
    try:
        task, settings, cfg = resolve(argv)
        cfg.validate()
    except ConfigError as e:
        fail(PROG, str(e))
    if show:
        import yaml

        from ..config import to_dict

        print(yaml.safe_dump({"finetune": to_dict(cfg), "task": to_dict(settings)}, sort_keys=False), end="")
        return 0
    from ..checkpoint import CheckpointError
    from ..data.tables import TaskDataError
    from ..training.parts import NonFiniteLossError
    from .loop import run_finetune
    from .templates import TemplateError

    try:
        run_finetune(task, cfg)
        for note in [*(getattr(settings, "notes", []) or []), *task.describe().get("notes", [])]:
            print(f"[biglm] note: {note}")
        return 0
    except NonFiniteLossError as e:
        print(f"[biglm] error: {e}", file=sys.stderr)
        return 3
    except (ConfigError, TaskDataError, TemplateError, CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


@dataclasses.dataclass
class TasksArgs:
    """`biglm tasks` takes no options."""


def tasks_main(argv: list[str]) -> int:
    """`biglm tasks`: the fine-tuning tasks, one line each."""
    from ..config import parse_cli
    from .tasks import TASKS

    parse_cli(TasksArgs, argv, prog="biglm tasks", doc="List the fine-tuning tasks `biglm finetune TASK` takes.")
    for name, recipe in TASKS.items():
        loop = " ".join(f"{k}={v}" for k, v in recipe.loop.items())
        print(f"{name:<16} {recipe.description} [{loop}]")
    print("\nrun one: biglm finetune TASK --model DIR [--field value] [--task.FIELD value]; "
          "`biglm finetune TASK --help` lists its settings")
    return 0


__all__ = ["main", "tasks_main", "resolve"]
