"""The checkpoint room: the run-directory layout, loading a model for inference, and export.

It sits below both training and inference: `training/` writes checkpoints in this layout (its
`Checkpointer` adds the optimizer and the process-group barriers), while `generation/`, `scoring/`
and serving read them through `load_model` without importing `training/`.
"""

from .export import export_checkpoint
from .layout import CheckpointError, checkpoint_dirs, latest_checkpoint
from .loading import load_inference_checkpoint, load_model

__all__ = ["CheckpointError", "checkpoint_dirs", "export_checkpoint", "latest_checkpoint", "load_inference_checkpoint",
           "load_model"]
