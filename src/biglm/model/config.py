"""`BiGLMConfig`: the architecture of a BiGLM, a transformers `PreTrainedConfig`.

Presets follow paper Table 7 (and §2.2 for the 124M trial model). The paper does not give the
MLP width: SmolLM/Llama conventions are used (136M: 1536, 360M: 2560, otherwise 8/3·hidden
rounded up to a multiple of 256), except for 3.5B, where 8/3·hidden (6912) would give only 2.50B
parameters: its width 11264 (4.4·hidden, a multiple of 256) is chosen so the preset has the 3.5B
(3.51B) its name promises. Parameter counts use SmolLM's vocabulary of 49152, tied embeddings.
"""

from __future__ import annotations

import math
from typing import Any

from transformers import PreTrainedConfig

ATTENTION_BACKENDS = ("eager", "sdpa", "flex")
DEFAULT_MASK_ADAPTER_RANK = 32
"""The rank of the mask adapters a causal model gains at its first adaptation (`BiGLMConfig.mask_adapter_rank`)."""
PREFIX_ATTENTION = ("bidirectional", "blocks", "causal")


def _mlp_width(hidden: int) -> int:
    return int(math.ceil(8 * hidden / 3 / 256) * 256)


# name -> architecture fields (paper Table 7; `tiny` is for tests and the CPU default run)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, initializer_range=0.02, vocab_size=512, max_position_embeddings=256),
    "biglm-124m": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, num_key_value_heads=12,
                       intermediate_size=_mlp_width(768), initializer_range=0.02),
    "biglm-136m": dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                       intermediate_size=1536, initializer_range=0.02),
    "biglm-360m": dict(num_hidden_layers=32, hidden_size=960, num_attention_heads=15, num_key_value_heads=5,
                       intermediate_size=2560, initializer_range=0.02),
    "biglm-1.3b": dict(num_hidden_layers=24, hidden_size=2048, num_attention_heads=32, num_key_value_heads=32,
                       intermediate_size=_mlp_width(2048), initializer_range=0.013),
    # the paper gives only 30/2560/20; 8/3·hidden (6912) builds 2.50B, so the MLP width is chosen for 3.51B
    "biglm-3.5b": dict(num_hidden_layers=30, hidden_size=2560, num_attention_heads=20, num_key_value_heads=20,
                       intermediate_size=11264, initializer_range=0.013),
}


def resolve_attn_backend(requested: str, *, device_type: str, attention_dropout: float) -> str:
    """The attention backend a training run uses: ``requested`` ("auto", "eager", "sdpa", "flex") on ``device_type``.

    "auto" gives FlexAttention on CUDA when attention dropout is off (it skips masked blocks but has no
    dropout), and SDPA otherwise (its boolean-mask path applies dropout on every device). Asking for "flex"
    with dropout is refused here, before any work starts, instead of on the first training step.
    """
    if requested == "auto":
        return "flex" if device_type == "cuda" and attention_dropout == 0.0 else "sdpa"
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attn_backend={requested!r}: choose auto or one of {ATTENTION_BACKENDS}.")
    if requested == "flex" and attention_dropout > 0.0:
        raise ValueError(
            f"attn_backend='flex' has no attention dropout, but attention_dropout={attention_dropout}: use "
            "attn_backend 'sdpa' (or 'auto', which picks it), or set attention_dropout=0."
        )
    return requested


class BiGLMConfig(PreTrainedConfig):
    """Configuration of a BiGLM encoder (bidirectional, RoPE, SwiGLU, RMSNorm, GQA, no biases).

    Args:
        vocab_size: size of the token vocabulary (49152 = SmolLM's tokenizer).
        hidden_size: model width.
        intermediate_size: SwiGLU inner width.
        num_hidden_layers: number of transformer blocks.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (grouped-query attention); must divide the heads.
        max_position_embeddings: longest sequence the model accepts.
        rope_theta: RoPE base.
        rms_norm_eps: RMSNorm epsilon.
        initializer_range: std of the normal init of every weight matrix.
        attention_dropout / hidden_dropout: dropout probabilities, off by default (paper Table 2).
        tie_word_embeddings: share the input embedding with the MLM output projection.
        attn_backend: "eager" (reference), "sdpa" (CPU training, and GPU training with attention dropout)
            or "flex" (GPU, no attention dropout); `resolve_attn_backend` picks one for a training run.
        sparse_prediction: compute MLM logits only at labelled positions when labels are given.
        prefix_attention: what the prefix attends to, as the model was trained. "bidirectional" (the paper's
            BiGLM): every prefix token sees the whole prefix, so a finished answer block joins the prefix
            cache exactly only by re-encoding prompt + blocks. "blocks" (the `biglm-blocks` objective): past
            the prompt, the prefix is cut into blocks that see the prompt, earlier blocks and themselves, so
            a finished block's keys/values never change and block decoding's append cache is exact. "causal"
            (`biglm convert`'s default, with ``shift_logits``): the text, prompt included, is read as the
            autoregressive source read it (each prefix token sees itself and the tokens before it: the blocks rule
            with no prompt and blocks of 1), so the logits of the slot after the text are the source's next-token
            logits and one token per call writes the source's greedy text; masks (the suffix) still see everything.
        prefix_block_lengths: the block lengths a "blocks" model was trained with (decoding's default
            block length is the largest); empty for "bidirectional", [1] for "causal".
        attention_bias: biases on q_proj/k_proj/v_proj (not o_proj), as Qwen2 has; off for BiGLM's own presets
            (`biglm convert` sets it for a Qwen2 checkpoint).
        mask_adapter_rank: r > 0 adds a low-rank adapter (rank r) beside each linear layer of every block that acts
            only at mask-token positions (gated LoRA, as "Your LLM Knows the Future", 2025): text positions compute
            exactly what the model without them computes, so a causal model's next-token path stays its source's
            while the masks learn to draft and fill in. `blocks-adapt` on a causal model trains them alone. 0: none.
        shift_logits: the logits of position i come from the final hidden state of position i-1 (position 0 from
            itself), as an autoregressive model's head is aligned: the "shift" Dream and DiffuLLaMA keep when they
            adapt an AR checkpoint. A property of the model, so decoding, scoring and serving use it without
            knowing (the prefix cache carries the hidden states it needs). Off for models trained from scratch;
            `biglm convert --shift` sets it.
    """

    model_type = "biglm"

    def __init__(
        self,
        vocab_size: int = 49152,
        hidden_size: int = 576,
        intermediate_size: int = 1536,
        num_hidden_layers: int = 30,
        num_attention_heads: int = 9,
        num_key_value_heads: int | None = 3,
        max_position_embeddings: int = 2048,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        attention_dropout: float = 0.0,
        hidden_dropout: float = 0.0,
        tie_word_embeddings: bool = True,
        attn_backend: str = "sdpa",
        sparse_prediction: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 2,
        mask_token_id: int | None = 4,
        prefix_attention: str = "bidirectional",
        prefix_block_lengths: list[int] | tuple[int, ...] = (),
        attention_bias: bool = False,
        shift_logits: bool = False,
        mask_adapter_rank: int = 0,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.attention_dropout = attention_dropout
        self.hidden_dropout = hidden_dropout
        self.attn_backend = attn_backend
        self.sparse_prediction = sparse_prediction
        self.mask_token_id = mask_token_id
        self.prefix_attention = prefix_attention
        self.prefix_block_lengths = [int(b) for b in prefix_block_lengths]
        if prefix_attention == "causal" and not self.prefix_block_lengths:
            self.prefix_block_lengths = [1]  # the text is read in blocks of one from its first token
        self.attention_bias = bool(attention_bias)
        self.shift_logits = bool(shift_logits)
        self.mask_adapter_rank = int(mask_adapter_rank)
        # transformers' SDPA integration assumes causal attention when no mask is given.
        self.is_decoder = False
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self.validate_architecture()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate_architecture(self) -> None:
        """Refuse impossible shapes with a message naming the field and the fix."""
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}: choose a hidden size that is a multiple of the head count."
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by num_key_value_heads="
                f"{self.num_key_value_heads}: grouped-query attention needs heads to be a multiple of kv heads."
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE: change hidden_size or heads.")
        if self.attn_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attn_backend={self.attn_backend!r}: choose one of {ATTENTION_BACKENDS}.")
        for name in ("attention_dropout", "hidden_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1).")
        if self.prefix_attention not in PREFIX_ATTENTION:
            raise ValueError(f"prefix_attention={self.prefix_attention!r}: choose one of {PREFIX_ATTENTION}.")
        if self.prefix_attention == "blocks" and (not self.prefix_block_lengths or min(self.prefix_block_lengths) < 1):
            raise ValueError("prefix_attention='blocks' needs prefix_block_lengths: the block lengths (>= 1) the model "
                             f"was trained with, got {self.prefix_block_lengths}.")
        if self.prefix_attention == "causal" and self.prefix_block_lengths != [1]:
            raise ValueError(f"prefix_attention='causal' reads the text in blocks of 1: prefix_block_lengths must be [1] "
                             f"(or unset), got {self.prefix_block_lengths}.")
        if self.prefix_attention == "causal" and not self.shift_logits:
            raise ValueError("prefix_attention='causal' reads the text as an autoregressive model does and needs "
                             "shift_logits=True (the next token predicted from the last text position), as "
                             "`biglm convert` sets them.")
        if self.prefix_attention == "bidirectional" and self.prefix_block_lengths:
            raise ValueError(f"prefix_block_lengths={self.prefix_block_lengths} is set, but prefix_attention is "
                             "'bidirectional': block lengths belong to 'blocks' models only.")
        if self.mask_adapter_rank < 0:
            raise ValueError(f"mask_adapter_rank={self.mask_adapter_rank} must be >= 0 (0: no mask adapters).")
        if self.mask_adapter_rank and self.mask_token_id is None:
            raise ValueError("mask_adapter_rank > 0 gates the adapters on the mask token: set mask_token_id.")
        if self.vocab_size <= 0 or self.max_position_embeddings <= 0:
            raise ValueError("vocab_size and max_position_embeddings must be positive.")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "BiGLMConfig":
        """Build a named preset (`tiny`, `biglm-124m`, `biglm-136m`, `biglm-360m`, `biglm-1.3b`,
        `biglm-3.5b`), with any field overridden, e.g. ``from_preset("biglm-136m", vocab_size=8192)``."""
        if name not in PRESETS:
            raise KeyError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


def append_only_prefix(config: Any) -> bool:
    """Whether a model's written text is append-only (its finished tokens' keys/values never change): a `biglm-blocks`
    model ("blocks") or a causal one ("causal", converted from an autoregressive checkpoint). Decoding grows such a
    model's cache by appending (exact), and checks drafts exactly where it was trained on blocks of 1."""
    return getattr(config, "prefix_attention", "bidirectional") in ("blocks", "causal")


def count_parameters(config: BiGLMConfig) -> dict[str, int]:
    """Parameter counts from the config alone (no allocation): non-embedding and total."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * config.head_dim
    attn = h * h * 2 + h * kv * 2  # q, o and k, v projections
    if getattr(config, "attention_bias", False):
        attn += h + 2 * kv  # q/k/v biases (Qwen2-style)
    mlp = 3 * h * i
    block = attn + mlp + 2 * h  # two RMSNorm weights
    non_embedding = n * block + h  # final norm
    embedding = config.vocab_size * h
    total = non_embedding + embedding * (1 if config.tie_word_embeddings else 2)
    return {"non_embedding": non_embedding, "embedding": embedding, "total": total}
