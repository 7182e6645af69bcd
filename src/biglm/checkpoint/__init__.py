"""The checkpoint room: the run-directory layout, loading a model for inference, and export.

It sits below both training and inference: `training/` writes checkpoints in this layout (its
`Checkpointer` adds the optimizer and the process-group barriers), while `generation/`, `scoring/`
and serving read them through `load_model` without importing `training/`. `RunLock` keeps one run per
directory (pretrain, finetune, and any command that writes a run directory).
"""

from .convert import ConvertError, convert_checkpoint
from .export import export_checkpoint
from .layout import CheckpointError, checkpoint_dirs, latest_checkpoint, newest_intact_checkpoint, verify_checkpoint
from .loading import ModelSource, check_model_path, load_inference_checkpoint, load_model, model_source
from .lock import RunDirLockedError, RunLock

__all__ = ["CheckpointError", "ConvertError", "convert_checkpoint", "ModelSource", "RunDirLockedError", "RunLock", "check_model_path", "checkpoint_dirs", "export_checkpoint",
           "latest_checkpoint", "load_inference_checkpoint", "load_model", "model_source", "newest_intact_checkpoint",
           "verify_checkpoint"]
