"""`biglm export RUN_OR_CHECKPOINT OUT_DIR`: write a Hugging Face directory (config.json,
model.safetensors, tokenizer) that `AutoModelForMaskedLM.from_pretrained` loads (after `import biglm`)."""

from __future__ import annotations

import os
from pathlib import Path

from .loading import load_inference_checkpoint


def export_checkpoint(path: str | Path, out_dir: str | Path) -> Path:
    """Write a plain Hugging Face directory (config.json, model.safetensors, tokenizer) from a run.

    Every file gets the mode a plain ``open()`` gives (0644 under the usual umask 022), so the directory can
    be shared as it is: safetensors writes its file through a private temporary file (mode 0600).
    """
    model, tokenizer = load_inference_checkpoint(path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    mode = 0o666 & ~_umask()
    for f in out.glob("*.safetensors*"):  # the weights (and a shard index); the other files come from open()
        f.chmod(mode)
    return out


def _umask() -> int:
    current = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(current)
    return current
