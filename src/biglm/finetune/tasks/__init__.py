"""The tasks wing: one module per task family, and the registry of fine-tuning tasks (`biglm tasks`).

A registered task is a name, its settings dataclass (given as ``--task.FIELD value``), the loop settings
the paper uses for it, and how to build the task. A task can also be a YAML file: ``kind:`` (a registry
name or ``classification``), the task's settings, and an optional ``finetune:`` mapping of loop settings.

Each family module (`classification`, `squad`, `retrieval`, `seq2seq`, `instruct`; `flan` is the FLAN
template and mixture side of the instruct family) lists its recipes in ``RECIPES``; `FAMILIES` below names
every family module, imported plainly, so a broken family is an import error, never a task that silently
goes missing. Adding a task: a module here with its ``RECIPES`` and one line in `FAMILIES`.

Choices the paper does not state, written down here: learning rates (2e-5, the BERT/RoBERTa fine-tuning
default), warm-up 6% (RoBERTa), batch 32, linear decay to 0.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...config import ConfigError, from_dict, load_yaml


@dataclass
class TaskRecipe:
    name: str
    description: str
    settings: Callable[[], Any]
    """a fresh settings object with this task's defaults"""
    build: Callable[[Any], Any]
    """settings -> a FinetuneTask"""
    loop: dict[str, Any] = field(default_factory=dict)
    """FinetuneConfig fields this task changes (paper settings)"""


TASKS: dict[str, TaskRecipe] = {}


def register(recipe: TaskRecipe) -> None:
    """Add a task to the registry (the families' ``RECIPES`` are registered when this package is imported)."""
    TASKS[recipe.name] = recipe


def get_task_recipe(name: str) -> TaskRecipe:
    if name not in TASKS:
        close = difflib.get_close_matches(name, list(TASKS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown task {name!r}{hint}; `biglm tasks` lists them, or give a task .yaml file")
    return TASKS[name]


def load_task_file(path: str | Path) -> tuple[TaskRecipe, Any, dict[str, Any]]:
    """A YAML task: (its recipe, its settings, loop settings)."""
    data = load_yaml(path) or {}
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError(f"{path}: a task file needs `kind:` (one of: {', '.join(TASKS)}) and the task's settings")
    recipe = get_task_recipe(str(data.pop("kind")))
    loop = data.pop("finetune", {}) or {}
    base = Path(path).parent
    for key in ("train", "validation", "template"):  # relative paths are relative to the task file
        value = data.get(key)
        if (isinstance(value, str) and not value.startswith("hf:") and value not in BUILTIN_TEMPLATES
                and not Path(value).is_absolute()):
            data[key] = str(base / value)
    try:
        settings = from_dict(type(recipe.settings()), data, base=recipe.settings(), prefix="task.")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return recipe, settings, loop


# The families, in the order `biglm tasks` lists them. Imported after TaskRecipe is defined: each family
# module builds its RECIPES with it.
from . import classification, instruct, retrieval, seq2seq, squad  # noqa: E402

FAMILIES = (classification, squad, retrieval, seq2seq, instruct)

for _family in FAMILIES:
    for _recipe in _family.RECIPES:
        register(_recipe)
del _family, _recipe

from .classification import BUILTIN_TEMPLATES  # noqa: E402

__all__ = ["FAMILIES", "TASKS", "TaskRecipe", "get_task_recipe", "load_task_file", "register"]
