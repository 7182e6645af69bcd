"""`biglm tasks`: the fine-tuning tasks (see `biglm.finetune.tasks`)."""

from .cli import tasks_main as main

__all__ = ["main"]
