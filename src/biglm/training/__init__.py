"""Pre-training: config and recipes, the loop, schedules, checkpoints, distributed setup."""

from .checkpoint import Checkpointer
from .config import TrainConfig
from .loop import TrainingInterrupted
from .recipes import RECIPES, get_recipe
from .schedule import lr_at
from .trainer import NonFiniteLossError, Trainer, TrainResult

__all__ = ["Checkpointer", "TrainConfig",
           "RECIPES", "get_recipe", "lr_at", "NonFiniteLossError", "Trainer", "TrainingInterrupted", "TrainResult"]
