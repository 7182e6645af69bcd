"""Load a BiGLM for inference from an exported Hugging Face directory or a training checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from .model import BiGLMForMaskedLM


def load_model(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Return ``(model, tokenizer)`` in eval mode from ``path``.

    ``path`` is either a Hugging Face directory (config.json + model.safetensors + tokenizer files, as
    written by `biglm export` or `save_pretrained`) or a training run / checkpoint directory written by
    `biglm pretrain` (the latest checkpoint of a run is used).
    """
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}: pass a directory written by `biglm export` or `biglm pretrain`.")
    if (path / "config.json").exists() and any(path.glob("*.safetensors")):
        model = BiGLMForMaskedLM.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    else:
        from .training.checkpoint import load_inference_checkpoint

        model, tokenizer = load_inference_checkpoint(path)
        if dtype is not None:
            model = model.to(dtype)
    model.model.validate_inputs = True
    return model.to(device).eval(), tokenizer
