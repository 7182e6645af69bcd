"""`TrainConfig`: everything a pre-training run needs, as one plain dataclass (a "recipe")."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class TrainConfig:
    """A pre-training run. Every field can be overridden on the command line as ``--field value``;
    model and objective fields as ``--model.FIELD value`` and ``--objective.FIELD value``."""

    name: str = "run"
    """run name (used for the default output directory)"""
    out_dir: str | None = None
    """where checkpoints, metrics and the exported model go (default: runs/NAME)"""

    # model
    preset: str = "biglm-124m"
    """architecture preset (see `biglm presets`)"""
    model: dict[str, Any] = field(default_factory=dict)
    """overrides of BiGLMConfig fields, e.g. {hidden_dropout: 0.1}"""

    # objective
    objective: str = "biglm"
    """objective variant: biglm, biglm-no-attn, mlm, diffusion"""
    objective_args: dict[str, Any] = field(default_factory=dict)
    """overrides of ObjectiveConfig fields (alpha, suffix_ratio, prefix_lambda, mlm_ratio, ...)"""
    doc_mask: bool = False
    """attend within a document only (off in the paper, whose Megatron setup attends across EOS)"""

    # data
    tokenizer: str | None = None
    """Hugging Face tokenizer directory (default: the one recorded in the data manifest)"""
    data: dict[str, float] = field(default_factory=dict)
    """token-shard directories (written by `biglm data prepare`) -> sampling weight"""
    anneal_data: dict[str, float] | None = None
    """mixture used from the start of the WSD annealing phase (None: keep `data`)"""
    val_data: list[str] | None = None
    """held-out shard directories/files (default: the val-*.bin shards of the `data` directories)"""
    hub_sources: dict[str, str] = field(default_factory=dict)
    """for messages: shard directory -> the `biglm data prepare` source that builds it"""
    seq_len: int = 2048
    """window length L in tokens (documents packed across boundaries)"""

    # optimisation
    global_batch: int = 1024
    """windows per optimizer step, over all ranks and accumulation steps"""
    micro_batch: int = 8
    """windows per forward/backward on one rank"""
    steps: int = 50_000
    """optimizer steps"""
    lr: float = 3e-3
    min_lr: float = 3e-4
    schedule: str = "cosine"
    """cosine | wsd | constant"""
    warmup_steps: int = 2000
    anneal_fraction: float = 0.0
    """WSD: share of the steps spent in the final linear decay (paper: 0.1-0.2)"""
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0

    # systems
    device: str = "auto"
    """auto | cpu | cuda"""
    dtype: str = "auto"
    """auto (bf16 autocast on GPU, fp32 on CPU) | bf16 | fp32"""
    compile: str = "auto"
    """auto (on GPU) | yes | no"""
    attn_backend: str = "auto"
    """auto (flex on GPU, sdpa on CPU) | eager | sdpa | flex"""
    parallel: str = "auto"
    """auto (fsdp on GPU when several ranks, ddp on CPU) | ddp | fsdp"""
    activation_checkpointing: bool = False
    peak_tflops: float | None = None
    """per-device peak for MFU (default: known GPUs; none on CPU)"""

    # bookkeeping
    log_every: int = 10
    eval_every: int = 500
    eval_batches: int = 20
    save_every: int = 1000
    keep_last: int = 3
    tensorboard: bool = False
    sample_every: int = 0
    """show what the model fills in for a few masked sentences every N steps (0: only at the end)"""

    @property
    def anneal_steps(self) -> int:
        return int(round(self.anneal_fraction * self.steps)) if self.schedule == "wsd" else 0

    @property
    def output_dir(self) -> Path:
        return Path(self.out_dir or Path("runs") / self.name)

    def validate(self, *, world_size: int = 1) -> None:
        """Refuse inconsistent settings with a message that says what to change."""
        if self.global_batch % (self.micro_batch * world_size):
            raise ValueError(
                f"global_batch={self.global_batch} is not divisible by micro_batch={self.micro_batch} x "
                f"ranks={world_size}: choose a global batch that is a multiple of {self.micro_batch * world_size}."
            )
        if self.steps < 1 or self.seq_len < 2:
            raise ValueError("steps must be >= 1 and seq_len >= 2.")
        if self.schedule not in {"cosine", "wsd", "constant"}:
            raise ValueError(f"schedule={self.schedule!r}: choose cosine, wsd or constant.")
        if not 0.0 <= self.anneal_fraction < 1.0:
            raise ValueError(f"anneal_fraction={self.anneal_fraction} must lie in [0, 1).")
        if self.warmup_steps >= self.steps:
            self.warmup_steps = max(0, self.steps // 10)  # a local shrink of a paper recipe
        if not self.data:
            raise ValueError("no training data: give --data DIR (a folder written by `biglm data prepare`).")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown training option(s) {sorted(unknown)}; known: {sorted(names)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(float(b) for b in d["betas"])
        cfg = cls(**d)
        _coerce(cfg)
        return cfg

    def override(self, args: list[str]) -> "TrainConfig":
        """Apply ``--key value`` pairs (values parsed as YAML: numbers, booleans, lists, dicts)."""
        cfg = dataclasses.replace(self, model=dict(self.model), objective_args=dict(self.objective_args))
        fields = {f.name: f for f in dataclasses.fields(cfg)}
        i = 0
        while i < len(args):
            key = args[i]
            if not key.startswith("--"):
                raise ValueError(f"expected --key value, got {key!r}")
            key = key[2:]
            if "=" in key:
                key, raw = key.split("=", 1)
                i += 1
            else:
                if i + 1 >= len(args):
                    raise ValueError(f"--{key} needs a value")
                raw = args[i + 1]
                i += 2
            value = _scalar(raw)
            key = key.replace("-", "_")
            if key.startswith("model."):
                cfg.model[key[6:]] = value
            elif key.startswith("objective."):
                cfg.objective_args[key[10:]] = tuple(value) if isinstance(value, list) else value
            elif key in fields:
                if key == "data" and isinstance(value, str):
                    value = {v: 1.0 for v in value.split(",")}
                if key == "val_data" and isinstance(value, str):
                    value = value.split(",")
                if key == "betas":
                    value = tuple(value)
                setattr(cfg, key, value)
            else:
                raise ValueError(f"unknown option --{key}; see `biglm pretrain --help`.")
        _coerce(cfg)
        return cfg


def _scalar(raw: str) -> Any:
    """A command-line value: int, then float (so "6e-4" is a number, which YAML 1.1 would leave a string),
    then YAML (booleans, lists, dicts, strings)."""
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return yaml.safe_load(raw)


def _coerce(cfg: TrainConfig) -> None:
    """Numbers written as strings by YAML 1.1 ("3e-4") become floats; whole floats in int fields become ints."""
    for f in dataclasses.fields(cfg):
        value, default = getattr(cfg, f.name), f.default
        if isinstance(value, str) and (isinstance(default, float) or f.name in {"peak_tflops"}):
            try:
                setattr(cfg, f.name, float(value))
            except ValueError:
                raise ValueError(f"--{f.name} needs a number, got {value!r}") from None
        elif isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"--{f.name} needs a whole number, got {value}")
            setattr(cfg, f.name, int(value))
    for d in (cfg.model, cfg.objective_args):
        for k, v in d.items():
            if isinstance(v, str):
                try:
                    d[k] = float(v)
                except ValueError:
                    pass


def load_recipe_file(path: str | Path) -> TrainConfig:
    """A recipe written as YAML or JSON with TrainConfig fields."""
    text = Path(path).read_text()
    return TrainConfig.from_dict(yaml.safe_load(text) or {})
