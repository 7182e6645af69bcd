"""`biglm export RUN_OR_CHECKPOINT OUT_DIR`: write a Hugging Face directory (config.json,
model.safetensors, tokenizer) that `AutoModelForMaskedLM.from_pretrained` loads (after `import biglm`)."""

from __future__ import annotations

from pathlib import Path

from .loading import load_inference_checkpoint


def export_checkpoint(path: str | Path, out_dir: str | Path) -> Path:
    """Write a plain Hugging Face directory (config.json, model.safetensors, tokenizer) from a run."""
    model, tokenizer = load_inference_checkpoint(path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
