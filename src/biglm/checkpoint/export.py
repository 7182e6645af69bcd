"""`biglm export RUN_OR_CHECKPOINT OUT_DIR`: write a Hugging Face directory (config.json,
model.safetensors, tokenizer) that `AutoModelForMaskedLM.from_pretrained` loads (after `import biglm`).
For a `biglm finetune` run it is the best epoch's model: the task's HF class, tokenizer and template. A model card
(README.md, `model_card`) says what the model is, how it was trained and evaluated, and how to load it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .layout import checkpoint_to_read, run_dir_of
from .loading import read_checkpoint_model
from .model_card import DEFAULT_LICENSE, finetune_card, pretrain_card
from .output import check_output_dir, staged_output
from .source import keep_lineage


WEIGHT_DTYPES = ("float32", "bfloat16", "float16")


def export_checkpoint(path: str | Path, out_dir: str | Path, *, card: bool = True, license: str = DEFAULT_LICENSE,
                      base_model: str | None = None, dtype: str | None = None, overwrite: bool = False) -> Path:
    """Write a plain Hugging Face directory (config.json, model.safetensors, tokenizer) from a run, with a model card
    (README.md) unless ``card`` is False: ``license`` and ``base_model`` (default: the run's --init_from, or a
    fine-tuning run's --model) go into its front matter.

    The checkpoint read is verified against its manifest first: a damaged newest step is passed over with a
    warning (the card names the step exported), a damaged checkpoint asked for by name is refused.

    ``dtype`` (one of ``WEIGHT_DTYPES``; default: the checkpoint's, float32 for training checkpoints) is the dtype the
    floating weights are written in and config.json records, so `load_model`, `biglm generate` and `biglm serve` load
    the model in it by default (what the hub's bfloat16 releases do: half the bytes to read per call).

    OUT is checked before anything is read (`check_output_dir`: never a run's folder; a non-empty one only with
    ``overwrite``, and then only a model folder), written into a temporary folder beside it and renamed into place
    at the end (`staged_output`): a failed export leaves no OUT, or the old one intact, and one line (`OutputError`).

    Every file gets the mode a plain ``open()`` gives (0644 under the usual umask 022), so the directory can
    be shared as it is: safetensors writes its file through a private temporary file (mode 0600).
    """
    path, final = Path(path), Path(out_dir)
    if dtype is not None and dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not a weight dtype: choose one of {', '.join(WEIGHT_DTYPES)}.")
    check_output_dir(final, overwrite=overwrite)
    if (path / "task.json").is_file():  # a `biglm finetune` run: its best epoch, with the task's class and template
        best = path / "best"
        if not (best / "config.json").is_file():
            raise FileNotFoundError(f"{path} is a fine-tuning run without a finished epoch yet ({best} is missing): "
                                    "let it finish an epoch, or resume it with the same `biglm finetune` command")
        with staged_output(final, overwrite=overwrite) as out:
            shutil.copytree(best, out, dirs_exist_ok=True)
            text = None
            if card:
                from ..model import BiGLMConfig

                text = finetune_card(path, config=BiGLMConfig.from_pretrained(best), name=final.name,
                                     license=license, base_model=base_model)
            _finish(out, path, card=text, base_model=base_model, dtype=dtype)
        return final
    ckpt = checkpoint_to_read(path)  # verified (sizes and sha256) before anything is written to OUT_DIR
    if ckpt is None:
        raise FileNotFoundError(f"{path} holds no training checkpoint (checkpoints/step_*/meta.json) and is no "
                                "fine-tuning run: pass a `biglm pretrain` or `biglm finetune` run directory")
    model, tokenizer = read_checkpoint_model(ckpt)
    with staged_output(final, overwrite=overwrite) as out:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        text = (pretrain_card(run_dir_of(ckpt), checkpoint=ckpt, config=model.config, name=final.name,
                              license=license, base_model=base_model) if card else None)
        _finish(out, path, card=text, base_model=base_model, dtype=dtype)
    return final


def _finish(out: Path, source: Path, *, card: str | None, base_model: str | None, dtype: str | None) -> None:
    """What every export writes after its weights, in the staged folder: the card, the lineage, the dtype, modes."""
    if card is not None:
        (out / "README.md").write_text(card)
    keep_lineage(out, source, base_model=base_model)
    cast_weights(out, dtype)
    share_files(out)


def cast_weights(out: Path, dtype: str | None) -> None:
    """Rewrite the floating tensors of OUT's safetensors files in ``dtype`` and record it in config.json (``None``:
    leave them). Works on the files, so a fine-tuned model of any task class is cast the same way."""
    if dtype is None:
        return
    import json

    import torch
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype)
    for f in sorted(Path(out).glob("*.safetensors")):
        tensors = {k: v.to(target) if v.is_floating_point() else v for k, v in load_file(f).items()}
        save_file(tensors, str(f), metadata={"format": "pt"})
    config_path = Path(out) / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = dtype
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def share_files(out: Path) -> None:
    """Give the weights the mode a plain ``open()`` gives (safetensors writes through a private 0600 file)."""
    mode = 0o666 & ~_umask()
    for f in Path(out).glob("*.safetensors*"):  # the weights (and a shard index); the other files come from open()
        f.chmod(mode)


def _umask() -> int:
    current = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(current)
    return current
