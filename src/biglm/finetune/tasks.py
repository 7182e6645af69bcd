"""The registry of fine-tuning tasks (`biglm tasks`): a name, its settings dataclass (given as
``--task.FIELD value``), the loop settings the paper uses for it, and how to build the task. A task can
also be a YAML file: ``kind:`` (a registry name or ``classification``), the task's settings, and an
optional ``finetune:`` mapping of loop settings.

Choices the paper does not state, written down here: learning rates (2e-5, the BERT/RoBERTa fine-tuning
default), warm-up 6% (RoBERTa), batch 32, linear decay to 0.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config import ConfigError, from_dict, load_yaml
from .classification import BUILTIN_TEMPLATES, ClassificationSettings, ClassificationTask


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


def _mnli() -> ClassificationSettings:
    return ClassificationSettings(
        train="hf:nyu-mll/glue:mnli@train", validation="hf:nyu-mll/glue:mnli@validation_matched", template="mnli",
        validation_name="MNLI-m",
        notes=["MNLI-mm (validation_mismatched) is not evaluated: give --task.validation to another split file "
               "to add it"])


TASKS: dict[str, TaskRecipe] = {
    "mnli": TaskRecipe("mnli", "MNLI by prompt: label word True/Neither/False at an answer slot; accuracy (MNLI-m)",
                       _mnli, lambda s: ClassificationTask(s, name="mnli"), loop={"epochs": 5, "lr": 2e-5}),
    "classification": TaskRecipe("classification", "any GLUE/SuperGLUE-style set by prompt: give --task.train, "
                                 "--task.validation and --task.template", ClassificationSettings,
                                 lambda s: ClassificationTask(s, name="classification"), loop={"epochs": 5}),
}


def register(recipe: TaskRecipe) -> None:
    """Add a task to the registry (tasks in other modules register themselves on import)."""
    TASKS[recipe.name] = recipe


def _load_optional() -> None:
    """Tasks whose modules need optional pieces register when importable."""
    import importlib

    for module in ("biglm.finetune.squad_task", "biglm.finetune.retrieval", "biglm.finetune.seq2seq",
                   "biglm.finetune.instruct"):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def get_task_recipe(name: str) -> TaskRecipe:
    _load_optional()
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
