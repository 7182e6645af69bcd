"""`TrainConfig`: everything a pre-training run needs, as one typed dataclass (a "recipe").

Every field, nested ones included, is a command-line flag (``--steps 1000``, ``--model.hidden_dropout 0.1``,
``--objective mlm --objective.mlm_ratio 0.2``) and a key of a YAML recipe file; both go through
`biglm.config`, which refuses unknown names and wrong types before any work starts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config import ConfigError, check_device, from_dict, load_yaml, to_dict
from ..model.config import PRESETS
from ..objective import OBJECTIVES, ObjectiveConfig
from .trackers import check_report_to, resolve_report_to

# the model fields that are not its shape: training-time regularisation, and the longest input (RoPE has no
# weights per position). --init_from may change only these; every other field is the source model's (or the
# --preset's) shape
INIT_MODEL_FIELDS = ("attention_dropout", "hidden_dropout", "max_position_embeddings")
BUILTIN = "builtin"  # the data source name of the built-in corpus (prepared into OUT/data by `biglm pretrain`)


@dataclass
class ModelArgs:
    """Architecture fields that replace the preset's values (unset: the preset's value)."""

    num_hidden_layers: int | None = None
    """number of transformer blocks"""
    hidden_size: int | None = None
    """model width"""
    intermediate_size: int | None = None
    """SwiGLU inner width"""
    num_attention_heads: int | None = None
    """query heads"""
    num_key_value_heads: int | None = None
    """key/value heads (grouped-query attention); must divide the query heads"""
    max_position_embeddings: int | None = None
    """longest sequence the model accepts (default: the preset's, raised to seq_len if shorter)"""
    vocab_size: int | None = None
    """vocabulary size (default: the tokenizer's; may be larger, e.g. padded to a multiple of 64)"""
    rope_theta: float | None = None
    """RoPE base"""
    rms_norm_eps: float | None = None
    """RMSNorm epsilon"""
    initializer_range: float | None = None
    """std of the normal init of every weight matrix"""
    attention_dropout: float | None = None
    """dropout on attention probabilities (off by default; paper Table 2 shows dropout hurts)"""
    hidden_dropout: float | None = None
    """dropout on the residual branches and embeddings"""
    tie_word_embeddings: bool | None = None
    """share the input embedding with the MLM output projection"""
    mask_adapter_rank: int | None = None
    """rank of the adapters that act at mask positions only (gated LoRA); a causal model (`biglm convert`'s) adapts
    through them alone, its other weights frozen, so its next-token predictions stay its source's (default there:
    32; 0 on a causal model trains every weight instead and its text moves away from the source's)"""

    def overrides(self) -> dict[str, Any]:
        """The fields that are set, as `BiGLMConfig` keyword arguments."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class LoopConfig:
    """The settings of the one training loop (`biglm.training.loop`) that pre-training and fine-tuning share; each
    run's config adds its own and may change a default."""

    global_batch: int = 32
    """training examples (windows in pre-training, task items in fine-tuning) per optimizer step, over all ranks
    and accumulation steps"""
    micro_batch: int = 8
    """examples per forward/backward on one rank"""
    lr: float = 2e-5
    """peak learning rate"""
    min_lr: float = 0.0
    """final learning rate of the decay"""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas"""
    weight_decay: float = 0.01
    """AdamW weight decay (matrices only)"""
    grad_clip: float = 1.0
    """global gradient-norm clipping"""
    seed: int = 0
    """seed of the initialisation and new heads, the data order, the masks and dropout"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where to train (auto: cuda when available)"""
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 autocast on GPU, fp32 on CPU"""
    compile: Literal["auto", "yes", "no"] = "auto"
    """torch.compile the blocks (auto: on GPU)"""
    attn_backend: Literal["auto", "eager", "sdpa", "flex"] = "auto"
    """auto: flex on GPU (sdpa when attention dropout is on: flex has none), sdpa on CPU"""
    parallel: Literal["auto", "ddp", "fsdp"] = "auto"
    """data parallelism under torchrun: ddp, fsdp (FSDP2: parameters, gradients and optimizer state sharded per
    block; evaluations that need the whole model gather a full copy) or auto (fsdp on GPU, ddp on CPU)"""
    log_every: int = 10
    """steps between console/metrics log lines"""
    save_every: int = 0
    """steps between checkpoints (0: none between; also saved at the end, at each fine-tuning epoch's end and on
    SIGINT/SIGTERM)"""
    keep_last: int = 2
    """complete checkpoints kept"""
    report_to: list[Literal["tensorboard", "wandb", "trackio", "all", "none"]] = field(default_factory=list)
    """experiment trackers that get the logged scalars, the run's config and the run directory's name as the run's
    name (as Hugging Face Trainer's report_to): tensorboard (OUT/tensorboard), wandb (offline without an account,
    OUT/wandb), trackio (its local database); all: every one installed; none (the default): metrics.jsonl only. A
    resume continues the same tracker runs; a missing package or a tracker's error is one line, never a stop"""
    project: str = "biglm"
    """the W&B / trackio project the run is logged under ($WANDB_PROJECT, when set, for W&B)"""
    tensorboard: bool = False
    """also write TensorBoard scalars to OUT/tensorboard (the same as tensorboard in --report_to)"""
    max_minutes: float | None = None
    """a time budget: stop after the first step that ends this many minutes into the run (a checkpoint and the
    evaluations of a last step; the schedule stays that of --steps); none: train every step"""

    def validate(self, *, world_size: int = 1) -> None:
        """Refuse inconsistent settings with a message that says what to change, before any work. Checked once:
        the entry point (the command line, `run_finetune`, a `Trainer` built from Python) checks, and a later call
        on the same, unchanged settings and ranks returns at once."""
        key = (repr(to_dict(self)), world_size)
        if getattr(self, "_validated", None) == key:
            return
        self.check(world_size=world_size)
        self._validated = key

    def trackers(self) -> list[str]:
        """The experiment trackers this run reports to (--report_to resolved, with --tensorboard)."""
        names = resolve_report_to(self.report_to)
        return names + ["tensorboard"] if self.tensorboard and "tensorboard" not in names else names

    def check(self, *, world_size: int) -> None:
        """The checks of these settings; a run's config adds its own (and calls this)."""
        check_device(self.device)  # before any process group, run directory or lock
        if self.global_batch % (self.micro_batch * world_size):
            raise ConfigError(
                f"global_batch={self.global_batch} is not divisible by micro_batch={self.micro_batch} x "
                f"ranks={world_size}: choose a global batch that is a multiple of {self.micro_batch * world_size}.")
        for name in ("micro_batch", "global_batch", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.save_every < 0:
            raise ConfigError(f"--save_every must be >= 0, got {self.save_every}")
        if (why := check_report_to(self.report_to)) is not None:
            raise ConfigError(why)
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ConfigError(f"--max_minutes must be more than 0 (or none: no time budget), got {self.max_minutes}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ConfigError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")


@dataclass
class TrainConfig(LoopConfig):
    """A pre-training run."""

    name: str = "run"
    """run name (used for the default output directory runs/NAME)"""
    out_dir: str | None = None
    """where checkpoints, metrics and the exported model go (default: runs/NAME)"""

    # model
    preset: str = "biglm-124m"
    """architecture preset (see `biglm presets`; not used with --init_from, whose model has its own shape). Given on
    the command line it is the shape: the recipe's own shape fields give way (its dropouts and
    max_position_embeddings stay; --model.FIELD on the same command line still applies)"""
    model: ModelArgs = field(default_factory=ModelArgs)
    """changes to the preset's architecture (with --init_from only the non-shape fields: the dropouts and
    max_position_embeddings)"""
    init_from: str | None = None
    """continue training an existing BiGLM: an exported (Hugging Face) directory or a `biglm pretrain` run (its
    newest checkpoint). Its shape, tokenizer and weights are the start (fresh optimizer, step 0, this recipe's
    schedule); the data must be prepared with its tokenizer. A run that has checkpoints resumes from them instead"""
    requires_init: bool = False
    """the recipe continues training an existing model and refuses to start without --init_from"""

    # objective
    objective: ObjectiveConfig = field(default_factory=lambda: OBJECTIVES["biglm"], metadata={"choices": OBJECTIVES})
    """masking objective: a named variant, then any of its fields changed"""
    doc_mask: bool = False
    """attend within a document only (off in the paper, whose Megatron setup attends across EOS)"""
    attention_anneal_steps: int = 0
    """anneal the attention from causal to the objective's over the first N steps (a query may look ahead
    floor(step·(L-1)/N) positions; for a model converted from an autoregressive one, as DiffuLLaMA does);
    0: the objective's attention from the first step. Validation always uses the objective's attention"""

    # data
    tokenizer: str | None = None
    """Hugging Face tokenizer directory or hub name (default: the one recorded by `biglm data prepare`)"""
    data: dict[str, float] = field(default_factory=dict)
    """token-shard folders written by `biglm data prepare`, with sampling weights (DIR[=WEIGHT],...); `builtin`
    is the built-in corpus, prepared into OUT/data"""
    anneal_data: dict[str, float] | None = None
    """mixture used from the start of the WSD annealing phase (unset: keep `data`)"""
    val_data: list[str] | None = None
    """held-out shard folders (default: the val-*.bin shards of the `data` folders)"""
    hub_sources: dict[str, str] = field(default_factory=dict)
    """for messages: shard folder -> the `biglm data prepare` source that builds it"""
    seq_len: int = 2048
    """window length L in tokens (documents packed across boundaries)"""

    # optimisation (the loop's settings, `LoopConfig`, with pre-training's defaults)
    global_batch: int = 1024
    steps: int = 50_000
    """optimizer steps"""
    lr: float = 3e-3
    min_lr: float = 3e-4
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    """learning-rate schedule after the linear warm-up"""
    warmup_steps: int = 2000
    """linear warm-up steps"""
    anneal_fraction: float = 0.0
    """WSD: share of the steps spent in the final linear decay (paper: 0.1-0.2)"""
    betas: tuple[float, float] = (0.9, 0.95)
    adapter_lr: float | None = None
    """peak lr of mask adapters trained alone (`--init_from` a causal model, `biglm convert`'s; --min_lr scales with
    it); default 10 x --lr: the adapters start at zero, as LoRA's, and train at about ten times a full fine-tune's rate"""

    # systems
    activation_checkpointing: bool = False
    """recompute each block in the backward pass (less activation memory, dropout masks replayed exactly)"""
    peak_tflops: float | None = None
    """per-device peak for MFU (default: known GPUs; none on CPU)"""
    loss_chunk: int = 1024
    """masked positions per chunk of the loss fused with the output projection (the masked positions' logits over
    the whole vocabulary never exist at once, in the forward or the backward); 0: all their logits, then the loss
    (the previous path)"""
    host_masks: bool = True
    """draw each step's masks and find its masked positions on the host, a step ahead in a background thread, the
    windows pinned and copied without blocking: no host sync in the step (on a GPU the masks differ from the device
    generator's, drawn from the same distribution; on a CPU they are the same); false: drawn on the device, one sync
    per micro-batch (the previous path)"""
    deferred_finite_check: bool = True
    """check the gradient norm for NaN/inf on the device: the fused optimizer skips a non-finite step and every step
    after it, and the run stops at the next log line, checkpoint or evaluation naming that step (weights and
    checkpoints untouched); false: one host sync per step, before the optimizer step (the previous path)"""

    # bookkeeping
    eval_every: int = 500
    """steps between validation losses (0: only at the end)"""
    eval_windows: int = 160
    """held-out windows in the validation loss (the same windows and masks for any batch layout)"""
    save_every: int = 1000
    keep_last: int = 3
    eval_tasks_every: int = 0
    """steps between zero-shot evaluations of the current model (0: none), by the scorer of `biglm eval`"""
    eval_tasks: list[str] = field(default_factory=lambda: ["ARC-E", "ARC-C"])
    """zero-shot suite columns or lm-eval task names for --eval_tasks_every (default: the ARC average of Fig. 3)"""
    eval_tasks_limit: int | None = 200
    """first N documents of each task (a fixed subset: every evaluation scores the same questions); none: all"""
    eval_tasks_data: str | None = None
    """eval data in hub layout for --eval_tasks_every (default: $BIGLM_EVAL_DATA, else ./data/eval)"""
    eval_tasks_scorer: Literal["chain", "one-pass", "pll", "mc"] = "chain"
    """likelihood estimator of the in-training evaluation (as `biglm eval --model_args scorer=...`)"""

    @property
    def anneal_steps(self) -> int:
        return int(round(self.anneal_fraction * self.steps)) if self.schedule == "wsd" else 0

    @property
    def output_dir(self) -> Path:
        return Path(self.out_dir or Path("runs") / self.name)

    def check(self, *, world_size: int) -> None:
        if self.preset not in PRESETS:
            import difflib

            close = difflib.get_close_matches(self.preset, list(PRESETS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"--preset {self.preset!r} is not a preset ({', '.join(PRESETS)}){hint}")
        super().check(world_size=world_size)
        for name in ("steps", "seq_len", "eval_windows"):
            if getattr(self, name) < (2 if name == "seq_len" else 1):
                raise ConfigError(f"--{name} must be at least {2 if name == 'seq_len' else 1}, got {getattr(self, name)}")
        if self.loss_chunk < 0:
            raise ConfigError(f"--loss_chunk must be >= 0 (0: the unfused loss), got {self.loss_chunk}")
        for name in ("eval_every", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.eval_tasks_every < 0:
            raise ConfigError(f"--eval_tasks_every must be >= 0, got {self.eval_tasks_every}")
        if self.eval_tasks_limit is not None and self.eval_tasks_limit < 1:
            raise ConfigError(f"--eval_tasks_limit must be at least 1 (or none for every document), got {self.eval_tasks_limit}")
        if self.eval_tasks_every:
            from ..scoring.suite import select_tasks

            if not self.eval_tasks:
                raise ConfigError("--eval_tasks_every needs tasks: --eval_tasks ARC-E,ARC-C")
            try:
                select_tasks(self.eval_tasks)
            except ValueError as e:
                raise ConfigError(f"--eval_tasks: {e}") from None
        if not 0.0 <= self.anneal_fraction < 1.0:
            raise ConfigError(f"--anneal_fraction {self.anneal_fraction} must lie in [0, 1).")
        if self.adapter_lr is not None and not self.adapter_lr > 0:
            raise ConfigError(f"--adapter_lr must be > 0 (or unset: 10 x --lr), got {self.adapter_lr}")
        if self.warmup_steps > self.steps:
            raise ConfigError(f"--warmup_steps {self.warmup_steps} is more than --steps {self.steps}: lower it.")
        if not 0 <= self.attention_anneal_steps <= self.steps:
            raise ConfigError(f"--attention_anneal_steps {self.attention_anneal_steps} must lie in [0, --steps "
                              f"{self.steps}] (0: the objective's attention from the first step).")
        if self.requires_init and not self.init_from:
            raise ConfigError(f"recipe {self.name!r} continues training an existing BiGLM: give --init_from DIR (a "
                              "`biglm export` directory or a `biglm pretrain` run directory)")
        if self.init_from:
            shape = {k: v for k, v in self.model.overrides().items() if k not in INIT_MODEL_FIELDS}
            if shape:
                fields = ", ".join(f"--model.{k}" for k in shape)
                raise ConfigError(f"{fields} with --init_from: the model's shape comes from {self.init_from}; only "
                                  f"{', '.join('--model.' + k for k in INIT_MODEL_FIELDS)} may change")
            if self.tokenizer:
                raise ConfigError(f"--tokenizer {self.tokenizer} with --init_from: the tokenizer is the one of "
                                  f"{self.init_from} (prepare the data with it); drop --tokenizer")
        if not self.data:
            raise ConfigError("no training data: give --data DIR (a folder written by `biglm data prepare`).")
        width = self.objective.draft_width
        if self.objective.draft_tree_every and self.objective.prefix_blocks and self.seq_len < 2 * width + 2:
            raise ConfigError(f"--seq_len {self.seq_len} is too short for draft-tree groups of --objective.draft_width "
                              f"{width}: need >= {2 * width + 2} (or --objective.draft_tree_every 0)")
        if self.objective.draft_tree_every > 0 and self.doc_mask:
            raise ConfigError("--objective.draft_tree_every with --doc_mask: a draft-tree step gives its attention "
                              "outright and keeps no document bounds; drop one of them")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """A config from plain data (a YAML recipe, a saved train_config.json); every key checked."""
        return from_dict(cls, d)


def load_recipe_file(path: str | Path) -> TrainConfig:
    """A recipe written as YAML or JSON with TrainConfig fields."""
    data = load_yaml(path) or {}
    try:
        return from_dict(TrainConfig, data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
