"""Load a BiGLM for inference from an exported Hugging Face directory or a training run/checkpoint."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..model import BiGLMConfig, BiGLMForConditionalGeneration, BiGLMForMaskedLM
from .layout import META, checkpoint_dirs, checkpoint_to_read, run_dir_of

warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def read_tokenizer(folder: Path, config: BiGLMConfig, *, model_dir: Path | None = None):
    """The tokenizer in ``folder`` for a model of ``config``, refused in one line when it is missing
    (`FileNotFoundError` naming where it was looked for, not transformers' "install sentencepiece or tiktoken") or
    does not fit the model (`check_tokenizer_fits`, a ValueError: its size, its special ids, or the fingerprint that
    `biglm convert` recorded in ``model_dir``'s biglm_source.json). Every loader reads a tokenizer through here."""
    from transformers import AutoTokenizer

    from ..data.tokenizer import TOKENIZER_FILES, check_tokenizer_fits
    from .source import SOURCE_FILE

    folder = Path(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"the model's tokenizer is missing: looked for {' or '.join(TOKENIZER_FILES)} in "
                                f"{folder}; copy the tokenizer the model was trained or converted with there")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    recorded = None
    if model_dir is not None and (model_dir / SOURCE_FILE).is_file():
        try:
            recorded = json.loads((model_dir / SOURCE_FILE).read_text()).get("tokenizer_fingerprint")
        except (OSError, ValueError, AttributeError):
            recorded = None
    check_tokenizer_fits(tokenizer, config, where=folder, fingerprint=recorded)
    return tokenizer


def _read_weights(path: Path, cls, dtype: torch.dtype | None):
    """``cls.from_pretrained(path)``, with weights that cannot be read (a truncated or damaged safetensors file:
    safetensors' own error, not an OSError) said in one line as a ValueError."""
    try:
        return cls.from_pretrained(path, dtype=dtype)
    except Exception as e:
        if type(e).__name__ != "SafetensorError":
            raise
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        files = ", ".join(sorted(p.name for p in path.glob("*.safetensors")))
        raise ValueError(f"the weights in {path} ({files}) cannot be read ({first}): the file is truncated or damaged; "
                         "copy it again, or export or convert the model again") from None


def load_inference_checkpoint(path: str | Path):
    """``(model, tokenizer)`` from a run directory (its newest intact checkpoint) or one checkpoint directory.

    The checkpoint is verified against its manifest first (`checkpoint_to_read`: sizes and sha256), so damaged
    weights are refused or passed over with a warning, never loaded. `FileNotFoundError` when ``path`` holds no
    checkpoint, `DamagedCheckpointError` when none is intact (both one line)."""
    ckpt = checkpoint_to_read(Path(path))
    if ckpt is None:
        raise FileNotFoundError(
            f"{path} holds neither an exported model (config.json + model.safetensors) nor a training checkpoint "
            "(checkpoints/step_*/meta.json): pass a `biglm export` directory or a `biglm pretrain` run directory."
        )
    return read_checkpoint_model(ckpt)


def read_checkpoint_model(ckpt: Path):
    """``(model, tokenizer)`` of checkpoint ``ckpt``, which the caller has verified (`checkpoint_to_read`).

    Reads the model part of a torch.distributed.checkpoint (sharded or not) in one process, with no
    process group: the optimizer state in the same files is skipped.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    run_dir = run_dir_of(ckpt)
    config = BiGLMConfig.from_pretrained(run_dir)
    tokenizer = read_tokenizer(run_dir / "tokenizer", config)  # before the weights: a wrong one costs no reading
    model = BiGLMForMaskedLM(config)
    state = {"model": get_model_state_dict(model, options=StateDictOptions())}
    try:
        dcp.load(state, checkpoint_id=str(ckpt))
    except Exception as e:  # intact files that do not fit the run's config.json (DCP's planner says it at length)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"checkpoint {ckpt} does not fit the model of {run_dir / 'config.json'} ({first}): "
                         "keep a run's checkpoints beside the config.json they were written with") from None
    model.load_state_dict(state["model"])
    return model.eval(), tokenizer


def check_model_path(path: str | Path) -> None:
    """Refuse (`FileNotFoundError`, one line) a ``path`` `load_model` cannot read, without reading any weights: what
    a command checks before it makes or locks its output folder (a `biglm finetune` run's best epoch, an exported
    directory, a checkpoint, or a run holding checkpoints)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}: pass a directory written by `biglm export` or `biglm pretrain`.")
    if (path / "task.json").is_file():
        if not (path / "best" / "config.json").is_file():
            raise FileNotFoundError(f"{path} is a `biglm finetune` run without a finished epoch yet ({path / 'best'} "
                                    "is missing): let it finish an epoch, or pass another model")
        return
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return
    if not ((path / META).is_file() or checkpoint_dirs(path)):
        raise FileNotFoundError(
            f"{path} holds neither an exported model (config.json + model.safetensors) nor a training checkpoint "
            "(checkpoints/step_*/meta.json): pass a `biglm export` directory or a `biglm pretrain` run directory.")


def load_model(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
               pack: bool = False, compile: bool = False, batch_invariant: bool = False):
    """Return ``(model, tokenizer)`` in eval mode from ``path``.

    ``batch_invariant``: each row of a call computed independently of the rows beside it (`BiGLMModel.batch_invariant`:
    one attention kernel over each row's real keys, RoPE positions counted per row), so a request's answer does not
    depend on what it is decoded with. For bfloat16 weights on a CPU, without ``compile`` (where its kernels were
    measured row-invariant; anything else is refused). It replaces ``pack``: the linear layers run `F.linear`, each
    measured here, at load, with the model's own activations, and one found to depend on the row count computes its
    rows one at a time (`model.packed.make_rows_invariant`; the swapped layers' names in
    ``model.model.row_by_row``).

    ``pack``: on a CPU, hold every linear layer's weight prepacked for oneDNN (`model.packed`: faster decoding calls
    at a real model's shape, docs/LOG.md); for inference only (generate, serve, eval), never for a model that will train.
    Bfloat16 / float16 weights on a CPU without oneDNN kernels for them (`packed.reduced_precision_kernels`: an AVX2
    CPU) compute in float32 unless ``dtype`` asks for theirs (a warning says so).
    ``compile``: `torch.compile` each decoder layer in place (dynamic shapes, so a decoding loop's growing cache and
    changing row counts compile once, not per call; the first call pays the compilation). It replaces ``pack`` (the
    prepacked kernels do not compile). On this project's CPU at batch 1 it is slower than prepacked eager (a call
    there is bound by reading the weights: docs/LOG.md); it is for accelerators, where a small model's
    call is bound by per-kernel overhead that compilation fuses away.

    ``path`` is either a Hugging Face directory (config.json + model.safetensors + tokenizer files, as
    written by `biglm export` or `save_pretrained`), a training run / checkpoint directory written by
    `biglm pretrain` (the latest checkpoint of a run is used), or a `biglm finetune` run (its best epoch,
    ``RUN/best``). A directory saved as ``BiGLMForConditionalGeneration`` (a CMLM seq2seq fine-tune) loads
    as that class, so decoding uses its length head. A model trained with FlexAttention (a GPU run) loads on a CPU
    with sdpa: the same attention, without FlexAttention's uncompiled CPU path.
    """
    path = Path(path)
    if batch_invariant and (compile or torch.device(device).type != "cpu"):
        raise ValueError("batch_invariant runs on a CPU without compile (its kernels are measured row-invariant there): "
                         f"drop compile / use device cpu, or drop batch_invariant (device {device}, compile {compile}).")
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}: pass a directory written by `biglm export` or `biglm pretrain`.")
    if (path / "task.json").is_file() and (path / "best" / "config.json").is_file():
        path = path / "best"  # a fine-tuning run: its best epoch's export
    if (path / "config.json").exists() and any(path.glob("*.safetensors")):
        config = BiGLMConfig.from_pretrained(path)
        archs = config.architectures or []
        cls = BiGLMForConditionalGeneration if BiGLMForConditionalGeneration.__name__ in archs else BiGLMForMaskedLM
        tokenizer = read_tokenizer(path, config, model_dir=path)
        model = _read_weights(path, cls, dtype)
    else:
        model, tokenizer = load_inference_checkpoint(path)
        if dtype is not None:
            model = model.to(dtype)
    model.model.validate_inputs = True
    if torch.device(device).type == "cpu" and model.config.attn_backend == "flex":
        # a GPU run's FlexAttention runs uncompiled on a CPU (forward only, several times slower per decoding call
        # than sdpa, docs/LOG.md); sdpa applies the same mask (tested for every backend)
        model.set_attn_backend("sdpa")
    model = model.to(device).eval()
    if compile:
        for layer in model.model.layers:
            layer.compile(dynamic=True)  # in place: parameter names and state_dict unchanged
    elif pack and torch.device(device).type == "cpu" and not batch_invariant:
        from ..model.packed import pack_linears, reduced_precision_kernels

        held = next(model.parameters()).dtype
        widened = dtype is None and not reduced_precision_kernels(held)
        if widened:
            read = (" (read as bfloat16 by biglm's own kernel where it builds: biglm.model.cpu_kernels)"
                    if held == torch.bfloat16 else "")
            warnings.warn(f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no {held} matrix kernels: the "
                          f"model's {held} weights compute in float32{read}, the faster here (pass dtype {held}, "
                          f"--dtype {str(held).removeprefix('torch.')}, to keep PyTorch's {held})", stacklevel=2)
            model = model.float()
        # bfloat16 weights computed in float32: read as bfloat16 by biglm's own kernel where it runs (`cpu_kernels`)
        pack_linears(model, bf16_weights=widened and held == torch.bfloat16)
    # a model loaded to serve or generate: decoding may time its calls to choose its drafts (`generation.speculative
    # .DraftCosts`; greedy float32, where the answer does not depend on them); not compiled (a new shape compiles)
    model.measure_drafts = not compile and not batch_invariant
    if batch_invariant:
        held = next(model.parameters()).dtype
        if held != torch.bfloat16:
            raise ValueError(f"batch_invariant is measured for bfloat16 weights, and these are {held}: load them with "
                             "dtype bfloat16 (--dtype bfloat16), or drop batch_invariant (in float32 the matrix kernels "
                             "pick their summation order by shape).")
        model.model.batch_invariant = True
        from ..model.packed import make_rows_invariant

        # the linear layers measured with real activations (text, then mask tokens: the rows a decoding call carries)
        probe = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"][: model.config.max_position_embeddings - 4]
        probe = probe + [model.config.mask_token_id] * 4
        model.model.row_by_row = make_rows_invariant(model, torch.tensor([probe], device=device))
    return model, tokenizer


# the text whose activations `load_model(..., batch_invariant=True)` measures the linear layers with
PROBE_TEXT = ("In 1492, Columbus sailed across the Atlantic Ocean. The recipe starts with two eggs, flour and milk; "
              "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)")


@dataclass(frozen=True)
class ModelSource:
    """Where a pre-trained BiGLM's parts lie (`model_source`): the start of continued pre-training."""

    path: Path
    """the directory as given"""
    kind: str
    """"export" (a Hugging Face directory) or "run" (a `biglm pretrain` run or one of its checkpoints)"""
    config_dir: Path
    """holds config.json"""
    tokenizer_dir: Path
    """holds the tokenizer the model was trained with"""
    weights: Path
    """what `load_model` reads: the export directory, one checkpoint, or the run directory (whose newest intact
    checkpoint `load_model` picks when it reads it: verifying is reading every byte, done once, there)"""


def model_source(path: str | Path) -> ModelSource:
    """The parts of a pre-trained BiGLM at ``path``: an exported directory (config.json + model.safetensors +
    tokenizer), a `biglm pretrain` run directory or one checkpoint directory (verified when `load_model` reads it).
    `FileNotFoundError` in one line when ``path`` is none of these (a fine-tuning run included)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory: give a `biglm export` directory or a `biglm pretrain` run")
    if (path / "task.json").is_file():
        raise FileNotFoundError(f"{path} is a `biglm finetune` run: continued pre-training starts from a pre-trained "
                                "BiGLM (a `biglm export` directory or a `biglm pretrain` run)")
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return ModelSource(path=path, kind="export", config_dir=path, tokenizer_dir=path, weights=path)
    if (path / META).is_file():  # one checkpoint of a run
        run = run_dir_of(path)
        return ModelSource(path=path, kind="run", config_dir=run, tokenizer_dir=run / "tokenizer", weights=path)
    if not checkpoint_dirs(path) or not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} holds neither an exported model (config.json + model.safetensors) nor a training "
            "checkpoint (checkpoints/step_*/meta.json): give a `biglm export` directory or a `biglm pretrain` run")
    return ModelSource(path=path, kind="run", config_dir=path, tokenizer_dir=path / "tokenizer", weights=path)
