"""Pre-training: the one loop of `biglm.training.loop` with masked windows, the masked-LM loss and the validation
loss injected: ``train()`` -> ``train_step()`` -> ``step_batches()`` + ``forward_backward()``.

Notable features
- One code path for a laptop CPU, one GPU and many GPUs/nodes under torchrun (DDP or FSDP2 via
  `distributed.parallelize`; the model file knows nothing of it).
- Loss normalisation without a host sync or collective: the masks of the whole global batch are drawn
  from (seed, step) on every rank, so the global masked-token count is known on device, and every
  micro-batch loss is divided by it — exactly "mean cross-entropy over the masked tokens of the global batch".
- Masks are a pure function of (seed, step, global window index) and the data position is part of the
  checkpoint, so a killed and resumed run reproduces the uninterrupted one step for step.
- Checkpoints every N steps, at the end, and on SIGINT/SIGTERM; a non-finite gradient norm stops the
  run before the optimizer step, so neither weights nor checkpoints are touched. A resume verifies the
  checkpoint (sizes, sha256) and falls back past damaged ones; one run at a time holds the directory.
- Metrics: console (loss, lr, tokens/s, MFU, ETA), JSONL, optional TensorBoard; optionally a zero-shot
  evaluation every K steps (an injected evaluator; `biglm pretrain` injects lm-eval's, the scorer of `biglm eval`).
  A step is logged every --log_every steps, and also the first step of a run and any step `LOG_INTERVAL_S` after
  the last line, so a slow step never leaves the console silent; validation shows a progress bar.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoint import CheckpointError, checkpoint_dirs, latest_checkpoint, model_source
from ..config import ConfigError
from ..model import BiGLMConfig, BiGLMForMaskedLM, count_parameters, resolve_attn_backend
from ..model.config import DEFAULT_MASK_ADAPTER_RANK
from ..objective import ObjectiveConfig, apply_masks, draw_masks, make_generator, masked_lm_loss
from ..objective.loss import masked_targets
from ..objective.masking import DraftTree, annealed_lookahead, draft_tree_layout, draw_draft_tree
from .config import TrainConfig
from .distributed import DistInfo, all_reduce_sum, full_model_on_rank0
from .loop import Evaluation, TrainLoop
from .parts import (FiniteWatch, MetricsWriter, NonFiniteLossError, StepPrefetcher,  # noqa: F401 - re-exported
                    autocast, fmt_time, progress_bar)
from .schedule import lr_at

ADAPTER_LR_FACTOR = 10.0
"""--adapter_lr's default, times --lr: LoRA-style adapters start at zero and train at about ten times a full
fine-tune's rate."""


def freeze_all_but_mask_adapters(model: torch.nn.Module) -> int:
    """Train a model's mask adapters alone (`BiGLMConfig.mask_adapter_rank`): every other weight frozen, so what text
    positions compute, a causal model's next-token path, never changes. Returns the number of trained parameters."""
    trained = 0
    for name, param in model.named_parameters():
        param.requires_grad_("_adapter." in name)
        trained += param.numel() if param.requires_grad else 0
    if not trained:
        raise ValueError("the model has no mask adapters to train (mask_adapter_rank 0)")
    return trained


# dense bf16 peak per device, for MFU
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "4090": 165.0}


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


@dataclass
class TrainResult:
    step: int
    losses: list[tuple[int, float]] = field(default_factory=list)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    task_scores: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    interrupted: bool = False


def _peak_flops(cfg: TrainConfig, device: torch.device) -> float | None:
    if cfg.peak_tflops:
        return cfg.peak_tflops * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, tf in PEAK_TFLOPS.items():
            if key in name:
                return tf * 1e12
    return None


def flops_per_token(config: BiGLMConfig, objective: ObjectiveConfig, seq_len: int) -> tuple[float, float]:
    """Training FLOPs per window token: (dense-attention count, count with only unmasked attention blocks).

    6·N_non-embedding + 12·layers·hidden·L for attention, plus the MLM head 6·hidden·V on masked
    positions only (sparse prediction). Under the BiGLM mask a prefix query skips the suffix: the
    attended share of the L² pairs is 1 - E[p(L-p)]/L², p uniform on [αL, (1-α)L].
    """
    n = count_parameters(config)["non_embedding"]
    attn = 12 * config.num_hidden_layers * config.hidden_size * seq_len
    if objective.diffusion:
        masked = 0.5
    elif objective.decompose:
        beta_y = sum(objective.suffix_ratio) / 2
        beta_x = objective.prefix_lambda[0] - objective.prefix_lambda[1] * beta_y
        masked = (beta_x + beta_y) / 2  # E[p] = L/2
    else:
        masked = objective.mlm_ratio
    head = 6 * config.hidden_size * config.vocab_size * masked
    dense = 6 * n + attn + head
    if objective.prefix_attention:
        a, b = objective.alpha, 1 - objective.alpha
        # E[x(1-x)] for x ~ U(a, b)
        e = ((b**2 / 2 - b**3 / 3) - (a**2 / 2 - a**3 / 3)) / (b - a)
        return dense, 6 * n + attn * (1 - e) + head
    return dense, dense


class Trainer(TrainLoop):
    """Pre-training: the one loop (`biglm.training.loop`) with masked windows as the batch source, the masked-LM
    loss as the step, and the validation loss (and, injected, the zero-shot evaluator) as evaluators.

    ``after_step(trainer, step)`` is called after every optimizer step (tests, fault injection). ``task_evaluator``
    scores the model every --eval_tasks_every steps (``evaluate(model=, tokenizer=)``; `biglm pretrain` builds
    lm-eval's). The settings are checked once, where they enter (`TrainConfig.validate`). A resume refuses another
    schedule than the run's saved one (``fixed_on_resume``: `TrainLoop.check_resume`)."""

    config_file = "train_config.json"
    fixed_on_resume = ("steps", "lr", "min_lr", "schedule", "warmup_steps", "anneal_fraction", "global_batch",
                       "seq_len", "attention_anneal_steps", "betas", "weight_decay", "host_masks")

    LOG_INTERVAL_S = 60.0  # a log line at least this often (and at the first step), whatever --log_every

    def __init__(self, cfg: TrainConfig, *, info: DistInfo, after_step: Callable[["Trainer", int], None] | None = None,
                 echo: Callable[[str], None] | None = None, task_evaluator: Any = None) -> None:
        cfg.validate(world_size=info.world_size)  # a no-op where the command line checked these settings already
        super().__init__(cfg, info=info, out=cfg.output_dir, echo=echo, after_step=after_step)
        self.total_steps = cfg.steps
        self.accum = cfg.global_batch // (cfg.micro_batch * info.world_size)
        self._prefetch: StepPrefetcher | None = None
        self._sampler_state: dict | None = None  # the data position after the last step taken (prefetching runs ahead)
        self._build(task_evaluator)
        if cfg.deferred_finite_check and not self.fsdp:  # FSDP2's sharded optimizer state: the per-step check
            self.finite_watch = FiniteWatch(info.device)

    # ------------------------------------------------------------------ setup
    def _build(self, task_evaluator: Any) -> None:
        from ..data import load_tokenizer, tokenizer_fingerprint
        from .data import check_data_tokenizer, open_train_sampler, read_data_info, validation_windows

        cfg, dev = self.cfg, self.info.device
        self.init_source = None
        if cfg.init_from:
            base_config, tok_path = self._init_parts()
        else:
            base_config, tok_path = None, cfg.tokenizer or read_data_info(cfg).tokenizer_path
        if tok_path is None:
            raise ValueError("no tokenizer: give --tokenizer DIR (the one used by `biglm data prepare`).")
        self.tokenizer = load_tokenizer(tok_path)
        if cfg.init_from:  # data in other token ids is refused before any weights are read
            check_data_tokenizer(cfg, fingerprint=tokenizer_fingerprint(self.tokenizer), source=cfg.init_from,
                                 tokenizer_dir=tok_path)
        vocab = len(self.tokenizer)
        # flex has no attention dropout: auto picks sdpa then, and an explicit flex is refused here
        backend = resolve_attn_backend(cfg.attn_backend, device_type=dev.type,
                                       attention_dropout=cfg.model.attention_dropout or 0.0)
        if base_config is not None:  # --init_from: the source's shape and token ids, with this run's settings
            model_args = base_config.to_dict()
            for key in ("architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype", "model_type"):
                model_args.pop(key, None)
            model_args.update(attn_backend=backend)
        else:
            model_args = dict(vocab_size=vocab, max_position_embeddings=max(cfg.seq_len, 128), attn_backend=backend,
                              pad_token_id=self.tokenizer.pad_token_id, mask_token_id=self.tokenizer.mask_token_id,
                              eos_token_id=self.tokenizer.eos_token_id, bos_token_id=self.tokenizer.bos_token_id)
        model_args.update(cfg.model.overrides())
        # the model records what its prefix was trained to see (decoding reads it): the objective decides, so a
        # paper model adapted with biglm-blocks becomes "blocks", and a blocks model trained on with biglm goes back
        if base_config is not None and base_config.prefix_attention == "causal":
            # a causal model (`biglm convert`'s) keeps its source's reading of the text whatever the objective, and
            # adapts through mask adapters trained alone: the next-token path stays the source's
            model_args.update(prefix_attention="causal", prefix_block_lengths=[1])
            if "mask_adapter_rank" not in cfg.model.overrides() and not base_config.mask_adapter_rank:
                model_args["mask_adapter_rank"] = DEFAULT_MASK_ADAPTER_RANK
        elif cfg.objective.prefix_blocks:
            model_args.update(prefix_attention="blocks", prefix_block_lengths=sorted(cfg.objective.prefix_blocks))
        else:
            model_args.update(prefix_attention="bidirectional", prefix_block_lengths=[])
        if model_args["vocab_size"] < vocab:
            raise ValueError(f"--model.vocab_size {model_args['vocab_size']} is smaller than the tokenizer's {vocab}.")
        if cfg.seq_len > model_args["max_position_embeddings"]:
            raise ValueError(
                f"seq_len={cfg.seq_len} is longer than the model's max_position_embeddings="
                f"{model_args['max_position_embeddings']}: lower --seq_len or raise --model.max_position_embeddings."
            )
        if base_config is not None:
            self.model_config = BiGLMConfig(**model_args)
            if base_config.prefix_attention != self.model_config.prefix_attention:
                self.echo(f"[biglm] prefix_attention {base_config.prefix_attention} -> "
                          f"{self.model_config.prefix_attention} (objective {cfg.objective.name})")
        else:
            self.model_config = BiGLMConfig.from_preset(cfg.preset, **model_args)
        self.objective = cfg.objective
        # a causal model's mask adapters trained alone: the text path is frozen (draft-tree steps encode the text
        # without gradient, as a cache) and the adapters train at their own lr
        self.frozen_text = bool(self.model_config.mask_adapter_rank and self.model_config.prefix_attention == "causal")
        if self.objective.draft_tree_every < 0:  # auto: draft-tree steps on a teacher's greedy text only
            from .distill import auto_draft_tree_every

            folders = [f for f in {**cfg.data, **(cfg.anneal_data or {})} if f != "builtin"]
            every = (auto_draft_tree_every(folders, frozen_text=self.frozen_text)
                     if self.objective.prefix_blocks and not cfg.doc_mask else 0)
            self.objective = self.objective.replace(draft_tree_every=every)
            if every:
                self.echo(f"[biglm] draft-tree steps every {every} steps: the data is a teacher's greedy text "
                          "(`biglm data distill`); --objective.draft_tree_every 0 turns them off")
        self.mask_id = self.tokenizer.mask_token_id

        torch.manual_seed(cfg.seed)
        model = BiGLMForMaskedLM(self.model_config)
        if self.init_source is not None:
            self._load_init_weights(model)
        self.lr_scale = 1.0
        if self.frozen_text:
            trained = freeze_all_but_mask_adapters(model)
            self.lr_scale = (cfg.adapter_lr if cfg.adapter_lr is not None else ADAPTER_LR_FACTOR * cfg.lr) / cfg.lr
            self.echo(f"[biglm] training the mask adapters only (rank {self.model_config.mask_adapter_rank}, "
                      f"{trained:,} parameters, peak lr {cfg.lr * self.lr_scale:g}): the text's next-token "
                      "predictions stay the source's")
        elif cfg.adapter_lr is not None:
            raise ConfigError(f"--adapter_lr {cfg.adapter_lr}: this run trains every weight (no causal model's mask "
                              "adapters alone: --init_from a `biglm convert` model trains those); set --lr instead.")
        if self.objective.draft_targets == "source" and not self.frozen_text:
            raise ConfigError("--objective.draft_targets source reads the source's distributions off a frozen text "
                              "path: only a causal conversion's mask adapters trained alone have one (--init_from a "
                              "`biglm convert` model); use text.")
        # the draft slots of a frozen text learn the source's own next-token distributions (read off its text rows)
        self.source_targets = self.frozen_text and self.objective.draft_targets in (None, "source")
        self.setup(model.to(dev), activation_checkpointing=cfg.activation_checkpointing)
        self.n_params = count_parameters(self.model_config)
        # the loaded tokenizer's own fingerprint: shards built with any other tokenizer are refused, even one of equal size
        fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.train_sampler = open_train_sampler(cfg, info=self.info, vocab_size=vocab, fingerprint=fingerprint)
        self.val_windows: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._val_pattern = None
        self.val_total = 0
        try:
            self.val_windows, self.val_total = validation_windows(cfg, info=self.info, vocab_size=vocab, fingerprint=fingerprint)
        except FileNotFoundError as e:
            self.echo(f"[biglm] no validation loss: {e}")
        self.data_fingerprint = fingerprint
        self.flops, self.flops_sparse = flops_per_token(self.model_config, self.objective, cfg.seq_len)
        self.peak = _peak_flops(cfg, dev)
        self.device_name = _device_name(dev)  # logged beside tokens/s, so a cost table can name the hardware
        self.tokens_seen = 0
        self.evaluations = [Evaluation("validation", self._validation_due, self._record_validation)]
        if cfg.eval_tasks_every:
            if task_evaluator is None and self.info.is_main:  # rank 0 scores; the others gather and wait
                raise ConfigError("--eval_tasks_every needs the zero-shot evaluator: `biglm pretrain` builds it; from "
                                  "Python pass Trainer(..., task_evaluator=zero_shot_evaluator(cfg)) "
                                  "(biglm.integrations.lm_eval)")
            self.task_evaluator = task_evaluator
            self.evaluations.append(Evaluation("zero-shot", self._tasks_due, self._record_tasks))

    def _init_parts(self) -> tuple[BiGLMConfig, Path]:
        """--init_from: the model config and tokenizer directory to start from. A run that already has checkpoints
        takes both from its own directory (it resumes; the source is not read again, and may even be gone)."""
        cfg = self.cfg
        if checkpoint_dirs(self.out) and (self.out / "config.json").is_file():
            import json

            try:
                recorded = json.loads((self.out / "train_config.json").read_text()).get("init_from")
            except (OSError, ValueError):
                recorded = None
            if recorded and recorded != cfg.init_from:  # the record stays true: the run started from `recorded`
                self.echo(f"[biglm] note: {self.out} started from {recorded} and resumes from its own checkpoints; "
                          f"--init_from {cfg.init_from} is not used")
                cfg.init_from = recorded
            return BiGLMConfig.from_pretrained(self.out), self.out / "tokenizer"
        self.init_source = model_source(cfg.init_from)
        return BiGLMConfig.from_pretrained(self.init_source.config_dir), self.init_source.tokenizer_dir

    def _load_init_weights(self, model: BiGLMForMaskedLM) -> None:
        """Copy the --init_from model's weights into ``model`` (same shape; strict: every tensor, nothing else, but
        the mask adapters a causal model gains at its first adaptation, which start as no change)."""
        from ..checkpoint import load_model

        source = self.init_source
        loaded, _ = load_model(source.weights)
        try:
            state = loaded.state_dict()
            if self.model_config.mask_adapter_rank and not loaded.config.mask_adapter_rank:
                state.update({k: v for k, v in model.state_dict().items() if "_adapter." in k})
            model.load_state_dict(state)
        except RuntimeError as e:
            first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
            raise ValueError(f"--init_from {source.path}: its weights do not fit a BiGLMForMaskedLM of its config "
                             f"({first})") from None
        self.echo(f"[biglm] starting from {source.weights} ({'a model folder' if source.kind == 'export' else 'a run checkpoint'})"
                  ": its weights, a fresh optimizer, step 0")

    # ------------------------------------------------------------------ state
    def write_run_files(self) -> None:
        if not self.info.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        saved = self.out / "config.json"
        if saved.exists():
            old = BiGLMConfig.from_pretrained(self.out)
            keys = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                    "num_key_value_heads", "vocab_size", "tie_word_embeddings")
            diff = {k: (getattr(old, k), getattr(self.model_config, k)) for k in keys
                    if getattr(old, k) != getattr(self.model_config, k)}
            if diff and latest_checkpoint(self.out) is not None:
                changes = ", ".join(f"{k}: checkpoint {a} vs now {b}" for k, (a, b) in diff.items())
                raise CheckpointError(
                    f"{self.out} holds checkpoints of a different model shape ({changes}). Resume with the original "
                    "settings, or choose a new --out_dir for the new shape."
                )
        self.model_config.save_pretrained(self.out)
        self.cfg.save(self.out / "train_config.json")
        self.tokenizer.save_pretrained(self.out / "tokenizer")

    def state_dict(self) -> dict[str, Any]:
        sampler = self._sampler_state if self._prefetch is not None else self.train_sampler.state_dict()
        return {"tokens_seen": self.tokens_seen, "train_sampler": sampler}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stop_prefetch()
        self.tokens_seen = state["tokens_seen"]
        self.train_sampler.load_state_dict(state["train_sampler"])

    def stop_prefetch(self) -> None:
        """End the background thread that builds steps ahead; the sampler is then where the last step left it."""
        if self._prefetch is not None:
            self._prefetch.close()
            self._prefetch = None
            if self._sampler_state is not None:
                self.train_sampler.load_state_dict(self._sampler_state)

    def train(self) -> TrainResult:
        try:
            return super().train()
        finally:
            self.stop_prefetch()

    # ------------------------------------------------------------------ batches and the step
    def _autocast(self):
        return autocast(self.info.device, self.autocast_dtype)

    def _doc_ids(self, windows: torch.Tensor) -> torch.Tensor | None:
        if not self.cfg.doc_mask:
            return None
        eos = self.tokenizer.eos_token_id
        # a document ends at its EOS: ids change after each EOS
        return torch.cumsum((windows == eos).long(), dim=1) - (windows == eos).long()

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        return lr_at(step, schedule=cfg.schedule, lr=cfg.lr * self.lr_scale, min_lr=cfg.min_lr * self.lr_scale,
                     total_steps=cfg.steps,
                     warmup_steps=cfg.warmup_steps, anneal_steps=cfg.anneal_steps)

    def step_batches(self) -> tuple[list[tuple[Any, torch.Tensor]], torch.Tensor]:
        """This rank's masked windows of the step and the global masked-token count. The masks of the whole global
        batch come from (seed, step) alone and each rank takes the rows of its windows, so the loss is the same
        for any number of ranks, micro-batch size or accumulation, and the count needs no all-reduce. Under
        ``attention_anneal_steps`` each batch also carries the step's lookahead (causal at step 0, growing to the
        objective's attention), a function of the step alone like the masks."""
        if not self.cfg.host_masks:
            return self._build_step(self.step, self.info.device)
        if self._prefetch is None or self._prefetch.next_step != self.step:
            self.stop_prefetch()
            self._sampler_state = self.train_sampler.state_dict()  # where the thread starts reading
            self._prefetch = StepPrefetcher(self._host_step, start=self.step, end=max(self.total_steps, self.step + 1))
        micro, normalizer, self._sampler_state = self._prefetch.get()
        dev = self.info.device
        return [(batch.to(dev), windows.to(dev, non_blocking=True)) for batch, windows in micro], \
            normalizer.to(dev, non_blocking=True)

    def _host_step(self, step: int):
        """Step ``step``'s micro-batches built on the host (the prefetch thread): pinned when a GPU reads them."""
        micro, normalizer = self._build_step(step, torch.device("cpu"))
        if self.info.device.type == "cuda":
            micro = [(batch.pin_memory(), windows.pin_memory()) for batch, windows in micro]
            normalizer = normalizer.pin_memory()
        return micro, normalizer, self.train_sampler.state_dict()

    def _build_step(self, step: int, dev: torch.device) -> tuple[list[tuple[Any, torch.Tensor]], torch.Tensor]:
        cfg = self.cfg
        W, r, mb = self.info.world_size, self.info.rank, cfg.micro_batch
        gen = make_generator(seed=cfg.seed, step=step, rank=0, device=dev)
        every = self.objective.draft_tree_every
        if every and step % every == every - 1:
            return self._draft_tree_step(step, dev, gen)
        pattern = draw_masks(cfg.global_batch, cfg.seq_len, self.objective, generator=gen, device=dev,
                             vocab_size=self.model_config.vocab_size)
        normalizer = pattern.count().float().clamp(min=1)
        lookahead = annealed_lookahead(step, anneal_steps=cfg.attention_anneal_steps, seq_len=cfg.seq_len)
        micro = []
        for i in range(self.accum):
            windows = self.train_sampler.next_batch(mb, step=step).to(dev, non_blocking=True)
            rows = i * mb * W + torch.arange(mb, device=dev) * W + r  # global window index of each row
            batch = apply_masks(windows, pattern.rows(rows), mask_token_id=self.mask_id)
            batch.lookahead = lookahead
            micro.append((batch.find_positions(), windows))  # on a device, the step's syncs: before any forward
        return micro, normalizer

    def _draft_tree_step(self, step: int, dev: torch.device, gen: torch.Generator):
        """A draft-tree step (`ObjectiveConfig.draft_tree_every`): the global batch's cuts drawn from (seed, step), as
        masks are, each rank laying out its own windows; the count is the whole batch's labels."""
        cfg, W, r, mb = self.cfg, self.info.world_size, self.info.rank, self.cfg.micro_batch
        tree = draw_draft_tree(cfg.global_batch, cfg.seq_len, self.objective, generator=gen, device=dev)
        if self.model_config.prefix_attention == "causal":  # no prompt read both ways: the text as decoding reads it
            tree = DraftTree(prompt_len=torch.zeros_like(tree.prompt_len), anchors=tree.anchors)
        shift = bool(getattr(self.model_config, "shift_logits", False))
        width = self.objective.draft_width
        normalizer = tree.count(cfg.seq_len, width, shift=shift, frozen_text=self.frozen_text).float().clamp(min=1)
        micro = []
        for i in range(self.accum):
            windows = self.train_sampler.next_batch(mb, step=step).to(dev, non_blocking=True)
            rows = i * mb * W + torch.arange(mb, device=dev) * W + r
            batch = draft_tree_layout(windows, tree.rows(rows), width=width, shift=shift, mask_token_id=self.mask_id,
                                      frozen_text=self.frozen_text)
            micro.append((batch.find_positions(), windows))
        return micro, normalizer

    def forward_backward(self, batch, windows: torch.Tensor, normalizer: torch.Tensor, *, sync: bool) -> torch.Tensor:
        """One micro-batch: forward, loss summed over its masked tokens / global count, backward.

        The model returns logits at the masked positions only and computes no loss of its own (no ``labels``):
        `masked_lm_loss` is the one loss. The model range-checks its inputs on the first micro-batch only.
        """
        if batch.positions is None:  # step_batches finds them before queuing any forward; a direct caller here
            batch.find_positions()

        def loss(model: torch.nn.Module) -> torch.Tensor:
            return self._loss(model, batch, windows, normalizer)

        return self.backward(loss, sync=sync)

    def _loss(self, model: torch.nn.Module, batch, windows: torch.Tensor, normalizer: torch.Tensor) -> torch.Tensor:
        """The masked-LM loss of one micro-batch: fused with the output projection (``loss_chunk``), or from the
        masked positions' logits (the previous path)."""
        doc_ids = None if batch.attention_rule is not None else self._doc_ids(windows)
        context = {}
        if batch.context_ids is not None:  # a frozen text (mask adapters trained alone): its cache, no gradient
            with torch.no_grad():
                context["prefix_cache"] = self.raw_model.model(batch.context_ids, causal=True, return_cache=True).cache
            if self.source_targets:
                return self._source_target_loss(model, batch, context["prefix_cache"], normalizer)
        if self.cfg.loss_chunk:
            targets, weight = masked_targets(batch)
            return model(batch.input_ids, **batch.attention(), **context, doc_ids=doc_ids,
                         logits_positions=batch.positions, loss_targets=targets, loss_weight=weight,
                         num_items_in_batch=normalizer, loss_chunk=self.cfg.loss_chunk).loss
        out = model(batch.input_ids, **batch.attention(), **context, doc_ids=doc_ids, logits_positions=batch.positions)
        return masked_lm_loss(out.logits, batch, normalizer=normalizer)

    def _source_target_loss(self, model: torch.nn.Module, batch, cache, normalizer: torch.Tensor) -> torch.Tensor:
        """A frozen text's draft slots against the source's own next-token distributions (``draft_targets``
        "source"): the slot at position s learns what the source predicts there from the text before it, the logits
        of text row s - 1 (the cache's hidden states; the mask token, which the source never had, left out), summed
        cross-entropy over the labelled slots / ``normalizer``."""
        raw = self.raw_model
        rows = batch.input_ids.shape[1]
        with torch.no_grad():
            text = cache.hidden  # (B, L, h): each text row's final state (a shift model's next-token logits)
            where = batch.positions.div(rows, rounding_mode="floor") * text.shape[1]
            where = where + batch.position_ids.reshape(-1).index_select(0, batch.positions) - 1
            teacher = raw.lm_head(text.reshape(-1, text.shape[-1]).index_select(0, where)).float()
            teacher[:, self.mask_id] = float("-inf")
            teacher = teacher.softmax(-1)
        logits = model(batch.input_ids, **batch.attention(), prefix_cache=cache,
                       logits_positions=batch.positions).logits.float()
        return -(teacher * logits.log_softmax(-1)).sum() / normalizer

    def after_optimizer_step(self) -> None:
        self.tokens_seen += self.cfg.global_batch * self.cfg.seq_len

    # ------------------------------------------------------------------ evaluators
    def val_batches(self):
        """The held-out windows with their fixed masks: one pattern for all `eval_windows` windows, seeded
        once and indexed by global window number, so every evaluation, batch layout and rank count sees the same."""
        dev = self.info.device
        if self._val_pattern is None:
            gen = make_generator(seed=self.cfg.seed + 7919, step=0, rank=0, device=dev)
            self._val_pattern = draw_masks(self.val_total, self.cfg.seq_len, self.objective, generator=gen, device=dev,
                                           vocab_size=self.model_config.vocab_size)
        for index, windows in self.val_windows:
            windows = windows.to(dev)
            yield windows, apply_masks(windows, self._val_pattern.rows(index.to(dev)), mask_token_id=self.mask_id)

    @torch.no_grad()
    def validate(self) -> float | None:
        """Masked-LM loss on the fixed held-out windows, with fixed masks (comparable across evaluations)."""
        if not self.val_windows:
            return None
        self.model.eval()
        dev = self.info.device
        loss_sum = torch.zeros((), device=dev)
        count = torch.zeros((), device=dev)
        bar = progress_bar(sum(len(index) for index, _ in self.val_windows), desc=f"step {self.step} validation",
                           unit="window", enabled=self.info.is_main)
        for windows, batch in self.val_batches():
            batch.find_positions()
            with self._autocast():
                loss_sum += self._loss(self.raw_model, batch, windows, torch.ones((), device=dev))
            count += batch.normalizer
            bar.update(len(windows))
        bar.close()
        self.model.train()
        return float(all_reduce_sum(loss_sum) / all_reduce_sum(count).clamp(min=1))

    def evaluate_tasks(self) -> dict[str, float] | None:
        """The zero-shot subset on the current (unwrapped) model: scored on rank 0 while the other ranks wait;
        every RNG state is unchanged afterwards, so a resumed run matches an uninterrupted one."""
        model = full_model_on_rank0(self.model, self.raw_model, fsdp=self.fsdp, is_main=self.info.is_main,
                                    build=lambda: BiGLMForMaskedLM(self.model_config).to(self.info.device))
        scores = None
        if model is not None:
            checks = model.model.validate_inputs
            scores = self.task_evaluator.evaluate(model=model, tokenizer=self.tokenizer)
            model.model.validate_inputs = checks
        if self.info.distributed:
            import torch.distributed as dist

            dist.barrier()
        return scores

    def _validation_due(self, step: int, last: bool) -> bool:
        return bool(self.cfg.eval_every and step % self.cfg.eval_every == 0) or last

    def _record_validation(self, result: TrainResult, metrics: MetricsWriter) -> None:
        val = self.validate()
        if val is not None:
            result.val_losses.append((self.step, val))
            metrics.write({"step": self.step, "tokens": self.tokens_seen, "val_loss": val}, kind="val")
            self.echo(f"step {self.step:>6} | val loss {val:.4f}")

    def _tasks_due(self, step: int, last: bool) -> bool:
        return step % self.cfg.eval_tasks_every == 0 or last

    def _record_tasks(self, result: TrainResult, metrics: MetricsWriter) -> None:
        # lm-eval shows its own progress bars; this line says what they are for
        self.echo(f"step {self.step:>6} | zero-shot evaluation of {', '.join(self.cfg.eval_tasks)} "
                  f"(limit {self.cfg.eval_tasks_limit})")
        scores = self.evaluate_tasks()
        if scores is not None:
            result.task_scores.append((self.step, scores))
            metrics.write({"step": self.step, "tokens": self.tokens_seen, **scores}, kind="tasks")
            self.echo(f"step {self.step:>6} | zero-shot avg {100 * scores['avg']:.1f} ("
                      + ", ".join(f"{t} {100 * scores[t]:.1f}" for t in scores
                                  if t != "avg" and not t.endswith("_stderr")) + ")")

    # ------------------------------------------------------------------ the loop's log
    def describe(self) -> str:
        cfg = self.cfg
        return (f"[biglm] {cfg.name}: {self.n_params['non_embedding'] / 1e6:.2f}M non-embedding params, "
                f"objective {self.objective.name}, L={cfg.seq_len}, global batch {cfg.global_batch} windows "
                f"({self.accum} accumulation x {cfg.micro_batch} x {self.info.world_size} ranks), "
                f"{cfg.steps} steps, device {self.info.device}")

    def new_result(self) -> TrainResult:
        self._t_last, self._tokens_last = time.perf_counter(), self.tokens_seen
        self._pending: list[tuple[int, torch.Tensor]] = []
        return TrainResult(step=self.step)

    def record_step(self, result: TrainResult, metrics: MetricsWriter, loss: torch.Tensor, grad_norm: torch.Tensor, *,
                    last: bool) -> None:
        """Every step's loss (read from the device only at log lines), and at log lines tokens/s, MFU and ETA. A
        line every --log_every steps, at the run's last step (also the one a stop signal or the time budget ends it
        at: no loss of a checkpointed step is left unlogged), at the run's first step and `LOG_INTERVAL_S` after the
        last line: the first line comes after one step and no line waits for log_every slow steps."""
        cfg = self.cfg
        self._pending.append((self.step, loss))
        now = time.perf_counter()
        if not (self.step % cfg.log_every == 0 or last or self.step == self.step_start + 1
                or now - self._t_last >= self.LOG_INTERVAL_S):
            return
        self.check_finite()
        tok_s = (self.tokens_seen - self._tokens_last) / max(now - self._t_last, 1e-9)
        self._t_last, self._tokens_last = now, self.tokens_seen
        for s, l in self._pending:
            value = float(l)
            result.losses.append((s, value))
            metrics.write({"step": s, "loss": value})
        self._pending.clear()
        mfu = tok_s * self.flops / (self.peak * self.info.world_size) if self.peak else None
        # the same, counting only the attention blocks the BiGLM mask does not skip
        mfu_unmasked = tok_s * self.flops_sparse / (self.peak * self.info.world_size) if self.peak else None
        eta = self.eta()
        lr = self.optimizer.param_groups[0]["lr"]
        record = {"step": self.step, "loss": result.losses[-1][1], "lr": lr, "grad_norm": float(grad_norm),
                  "tokens_per_s": tok_s, "tokens": self.tokens_seen, "mfu": mfu, "mfu_unmasked": mfu_unmasked,
                  "eta_s": eta, "device": self.device_name, "world_size": self.info.world_size,
                  "flops_per_token": self.flops, "flops_per_token_unmasked": self.flops_sparse}
        metrics.write(record, kind="log")
        mfu_s = f" | mfu {100 * mfu:.1f}%" if mfu is not None else ""
        self.echo(f"step {self.step:>6}/{cfg.steps} | loss {record['loss']:.4f} | lr {lr:.2e} | "
                  f"{tok_s:,.0f} tok/s{mfu_s} | eta {fmt_time(eta)}")
