"""The BiGLM network: an encoder-only transformer that can also write (paper §2.2, §3.1, Table 7).

The model room's core, below generation, scoring and training, which all call it; written for one device
(parallelism and compilation are applied from outside, `biglm.training.distributed`).

- Llama-style blocks (pre-norm RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases) with Llama's parameter
  names (`q_proj`, `gate_proj`, `input_layernorm`, ...), so weights and tools map across the ecosystem by name.
- Attention is bidirectional; given a per-sample prefix length p, prefix tokens cannot see the suffix (query i sees
  key j iff i >= p or j < p); how the prefix reads itself is `BiGLMConfig.prefix_attention` (bidirectional, blocks,
  or causal for a conversion). Backends: `attention.py`.
- Exact prefix cache: prefix keys/values do not depend on the suffix, so `encode_prefix` computes them once and
  `forward(..., prefix_cache=...)` runs only the suffix positions, exactly.
- `BiGLMForMaskedLM` computes logits only at labelled positions when labels are given (sparse prediction).
- Mask adapters (`BiGLMConfig.mask_adapter_rank`): gated low-rank adapters that act at mask tokens only, so text
  positions compute exactly what the model without them computes.
- The AR "shift" (`BiGLMConfig.shift_logits`, for models converted from AR checkpoints): position i's logits come
  from position i-1's final hidden state; the prefix cache then also carries the prefix's final hidden states.
- Batch invariance (``BiGLMModel.batch_invariant``, `load_model(..., batch_invariant=True)`): in bfloat16 a row's
  result does not depend on the rows beside it (`attention.batch_invariant_attention`; linear layers measured at
  load, `packed`), and every RoPE position counts each row's real tokens (`BiGLMModel.next_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput

from ..objective.loss import IGNORE_INDEX, linear_cross_entropy, token_loss
from .attention import BACKENDS, AttentionMask, batch_invariant_attention
from .config import BiGLMConfig



class BiGLMRMSNorm(nn.Module):
    """RMSNorm computed in fp32 (same numerics as Llama's; fp32 inputs take PyTorch's one-call `rms_norm`, bitwise the
    same as the formula below, which lower-precision inputs keep so their rounding stays Llama's)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one call: a decoding step's overhead
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class BiGLMRotaryEmbedding(nn.Module):
    """RoPE tables for given positions (Llama's half-rotation convention).

    Returns ``cos`` and a *signed* ``sin`` (its first half negated), each (B, 1, L, D), so `apply_rope` rotates with a
    roll instead of Llama's split-negate-concatenate: the same numbers, fewer calls per layer (a batch-1 decoding
    call is mostly per-call overhead on a CPU)."""

    def __init__(self, config: BiGLMConfig) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # position_ids (B, L) -> cos, signed sin (B, 1, L, D)
        freqs = position_ids[:, None, :, None].float() * self.inv_freq.to(position_ids.device)
        sin = freqs.sin()
        return torch.cat((freqs, freqs), dim=-1).cos().to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, D); cos and signed sin (B, 1, L, D) from `BiGLMRotaryEmbedding`. Llama's ``x * cos +
    rotate_half(x) * sin``: rolling x by D/2 and multiplying by the signed sin is rotate_half(x) * sin exactly."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class BiGLMMaskAdapter(nn.Module):
    """A low-rank update ``up(down(x))`` added to a linear layer's output at mask positions only (``gate`` (B, L, 1):
    1 at a mask token, 0 elsewhere): the gated LoRA of `BiGLMConfig.mask_adapter_rank`. ``up`` starts at zero, so a
    fresh adapter changes nothing."""

    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=False)
        self.up.zero_init = True  # `_init_weights`: a fresh adapter is no change

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x)) * gate


class BiGLMMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: BiGLMConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_proj: nn.Module | None = None  # gate and up as one product (`packed.pack_linears`, inference)
        r = config.mask_adapter_rank
        self.gate_up_adapter = BiGLMMaskAdapter(config.hidden_size, 2 * config.intermediate_size, r) if r else None
        self.down_adapter = BiGLMMaskAdapter(config.intermediate_size, config.hidden_size, r) if r else None

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if gate is not None and self.gate_up_adapter is not None:  # mask positions: the adapters' updates added
            both = (self.gate_up_proj(x) if self.gate_up_proj is not None
                    else torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1))
            g, up = (both + self.gate_up_adapter(x, gate)).chunk(2, dim=-1)
            h = F.silu(g) * up
            return self.down_proj(h) + self.down_adapter(h, gate)
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class _CacheBuffers:
    """The preallocated storage behind a reserved `PrefixCache` (`PrefixCache.reserve`): per-layer key/value buffers
    (B, Hkv, capacity, D), ``key_valid`` (B, capacity) and, for a shift model, ``hidden`` (B, capacity, h). Every
    cache viewing them sees their first ``length`` slots. ``filled`` is the longest prefix any view was given: only a
    view of exactly that length owns the slots after it (may write there), so an older view, extended again, can
    never overwrite keys a newer one reads. ``extra``: the headroom asked for, granted again when it runs out."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_valid: torch.Tensor
    hidden: torch.Tensor | None
    filled: int
    extra: int

    @property
    def capacity(self) -> int:
        return self.key_valid.shape[1]

    def rows(self, rows: slice, *, filled: int) -> "_CacheBuffers":
        """Rows ``rows`` of these buffers as buffers of their own (views: writes land here), ``filled`` slots held."""
        return _CacheBuffers(keys=[k[rows] for k in self.keys], values=[v[rows] for v in self.values],
                             key_valid=self.key_valid[rows], hidden=None if self.hidden is None else self.hidden[rows],
                             filled=filled, extra=self.capacity)


@dataclass
class PrefixCache:
    """Keys/values of an encoded prefix, one (k, v) pair per layer, each (B, Hkv, P, D) after RoPE.

    ``key_valid`` (B, P) marks real (non-padding) prefix tokens. Rows can be repeated or selected
    (`select`) so several continuations share one encoded context. ``hidden`` (B, P, h): the prefix's final
    hidden states, kept only for a model with ``shift_logits`` (the first suffix position's logits come from the
    last prefix position's); every operation (`first`, `extend`, `merge`, `select`) keeps it aligned with the keys.

    Growing a cache block by block (block decoding's append cache, speculative decoding) would copy the whole
    cache per block with `torch.cat` (O(P) per block, O(N^2) per answer). `reserve` gives a cache whose tensors
    are views of buffers with room for more slots; `extend` then writes the new block into that room in place and
    returns a longer view of the same buffers. The rule that keeps this safe: only the newest view (the one as
    long as the most the buffers were ever filled) owns the room after it; extending any other view (an older
    state of the same cache) copies, exactly as an unreserved cache does, and never writes into the buffers.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_valid: torch.Tensor
    padded: bool = True  # False when every prefix token is real: suffix passes then need no key mask
    hidden: torch.Tensor | None = None
    _buffers: _CacheBuffers | None = field(default=None, repr=False, compare=False)
    ends: torch.Tensor | None = None
    """(B,) long, each row's length when rows are right-padded (the server engine's pooled caches, read by one model
    call); None: every row ends at the last column (left padding, as everywhere else)"""
    room: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
    """with ``ends``: the per-layer key and value buffers (B, Hkv, capacity, D) this cache's columns are the first of.
    A model call over the cache then writes its own keys/values into each row's room, right after its ``ends``, and
    attends to them there (`AttentionMask.moved`), instead of concatenating them to the whole cache in every layer
    (at 32 rows of 200 keys, 0.7 ms a layer; docs/LOG.md). The columns after a row's keys are the room's to write:
    what lies there is no one's"""

    def last_hidden(self) -> torch.Tensor:
        """(B, 1, h): each row's last prefix token's hidden state (a shift model's prediction for the next slot)."""
        if self.ends is None:
            return self.hidden[:, -1:]
        index = (self.ends - 1).clamp_min(0).view(-1, 1, 1).expand(-1, 1, self.hidden.shape[2])
        return self.hidden.gather(1, index)

    @property
    def length(self) -> int:
        return self.key_valid.shape[1]

    @property
    def batch(self) -> int:
        return self.key_valid.shape[0]

    @property
    def capacity(self) -> int:
        """Slots this cache's buffers hold (its length when unreserved): `extend` up to here writes in place."""
        return self.length if self._buffers is None else self._buffers.capacity

    @classmethod
    def empty(cls, config: BiGLMConfig, *, batch: int, device: torch.device | str, dtype: torch.dtype) -> "PrefixCache":
        """A cache of zero prefix tokens (an empty prompt): suffix passes then see only the suffix."""
        shape = (batch, config.num_key_value_heads, 0, config.head_dim)
        kv = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        hidden = (torch.zeros(batch, 0, config.hidden_size, device=device, dtype=dtype)
                  if getattr(config, "shift_logits", False) else None)
        return cls(keys=kv, values=list(kv), key_valid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
                   padded=False, hidden=hidden)

    def reserve(self, extra: int) -> "PrefixCache":
        """This cache copied once into buffers with ``extra`` free slots after it, so that `extend` by up to
        ``extra`` tokens in all writes in place (no per-block copy of the whole cache); past that, one copy into
        new buffers with ``extra`` free slots again. A decoding loop reserves prompt + answer (+ overshoot) up
        front. ``extra`` <= 0 returns this cache as it is."""
        if extra <= 0:
            return self
        n = self.length

        def room(x: torch.Tensor, dim: int) -> torch.Tensor:
            shape = list(x.shape)
            shape[dim] += extra
            buf = x.new_empty(shape)
            buf.narrow(dim, 0, n).copy_(x)
            return buf

        buffers = _CacheBuffers(keys=[room(k, 2) for k in self.keys], values=[room(v, 2) for v in self.values],
                                key_valid=room(self.key_valid, 1),
                                hidden=None if self.hidden is None else room(self.hidden, 1), filled=n, extra=extra)
        return PrefixCache._view(buffers, n, padded=self.padded)

    @staticmethod
    def _view(buffers: _CacheBuffers, n: int, *, padded: bool) -> "PrefixCache":
        # the first n slots of the buffers, as a cache that can grow into the rest
        return PrefixCache(keys=[k.narrow(2, 0, n) for k in buffers.keys],
                           values=[v.narrow(2, 0, n) for v in buffers.values],
                           key_valid=buffers.key_valid.narrow(1, 0, n), padded=padded,
                           hidden=None if buffers.hidden is None else buffers.hidden.narrow(1, 0, n), _buffers=buffers)

    def _owns_tail(self) -> bool:
        """Whether this view may write the slots after it: the newest view of its buffers (nothing wrote past it),
        still reading them (no tensor replaced since)."""
        b = self._buffers
        return (b is not None and b.filled == self.length and self.key_valid.data_ptr() == b.key_valid.data_ptr()
                and self.keys[0].data_ptr() == b.keys[0].data_ptr())

    def first(self, n: int) -> "PrefixCache":
        """The first ``n`` positions of this cache (a call's keys/values of its leading prefix tokens); views of a
        reserved cache's buffers, which a shorter view never writes (see the class docstring)."""
        return PrefixCache(keys=[k[:, :, :n] for k in self.keys], values=[v[:, :, :n] for v in self.values],
                           key_valid=self.key_valid[:, :n], padded=self.padded and not bool(self.key_valid[:, :n].all()),
                           hidden=None if self.hidden is None else self.hidden[:, :n], _buffers=self._buffers)

    def take(self, index: torch.Tensor) -> "PrefixCache":
        """Each row's positions ``index`` (B, n), in that order (a speculative call's kept path through its tree of
        drafts); copies."""
        def pick(x: torch.Tensor) -> torch.Tensor:  # (B, Hkv, P, D)
            return x.gather(2, index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))

        valid = self.key_valid.gather(1, index)
        return PrefixCache(keys=[pick(k) for k in self.keys], values=[pick(v) for v in self.values], key_valid=valid,
                           padded=not bool(valid.all()),
                           hidden=None if self.hidden is None else self.hidden.gather(
                               1, index[..., None].expand(-1, -1, self.hidden.shape[2])))

    def extend(self, other: "PrefixCache") -> "PrefixCache":
        """This cache followed by ``other`` (keys/values of later prefix tokens, encoded seeing this one).

        A reserved cache (`reserve`) that is the newest view of its buffers writes ``other`` into them in place and
        returns the longer view (the same buffers: no copy of what it already holds); past their capacity it moves
        into new buffers with the reserved headroom again. Any other cache (unreserved, or an older state of a
        reserved one) is concatenated into new tensors, and the buffers it views stay untouched."""
        n, total = self.length, self.length + other.length
        padded = self.padded or other.padded
        same_hidden = (self.hidden is None) == (other.hidden is None)
        if self._owns_tail() and same_hidden:
            b = self._buffers
            if total > b.capacity:  # out of room: one copy into buffers with the headroom again
                return self.reserve(b.extra + other.length).extend(other)
            for buf, new in zip(b.keys + b.values, other.keys + other.values):
                buf.narrow(2, n, other.length).copy_(new)
            b.key_valid.narrow(1, n, other.length).copy_(other.key_valid)
            if b.hidden is not None:
                b.hidden.narrow(1, n, other.length).copy_(other.hidden)
            b.filled = total  # this view (and any other of length n) no longer owns the tail: the new one does
            return PrefixCache._view(b, total, padded=padded)
        return PrefixCache(
            keys=[torch.cat((a, b), dim=2) for a, b in zip(self.keys, other.keys)],
            values=[torch.cat((a, b), dim=2) for a, b in zip(self.values, other.values)],
            key_valid=torch.cat((self.key_valid, other.key_valid), dim=1),
            padded=padded,
            hidden=(None if self.hidden is None or other.hidden is None
                    else torch.cat((self.hidden, other.hidden), dim=1)),
        )

    @staticmethod
    def merge(caches: list["PrefixCache"]) -> "PrefixCache":
        """Caches of different lengths stacked row-wise, each left-padded to the longest (padding masked out).

        Keys keep the RoPE positions they were encoded at, so a suffix pass over the merged cache must
        give each row its own ``position_ids`` (its cache length onwards)."""
        if len(caches) == 1:
            return caches[0]
        width = max(c.length for c in caches)

        def pad(x: torch.Tensor, n: int) -> torch.Tensor:
            return x if n == 0 else F.pad(x, (0, 0, n, 0))  # (R, Hkv, C, D): left-pad C

        keys, values, valid = [], [], []
        for c in caches:
            n = width - c.length
            keys.append([pad(k, n) for k in c.keys])
            values.append([pad(v, n) for v in c.values])
            valid.append(F.pad(c.key_valid, (n, 0), value=False))
        with_hidden = all(c.hidden is not None for c in caches)
        return PrefixCache(
            keys=[torch.cat(layer, dim=0) for layer in zip(*keys)],
            values=[torch.cat(layer, dim=0) for layer in zip(*values)],
            key_valid=torch.cat(valid, dim=0),
            padded=any(c.padded or c.length < width for c in caches),
            # (R, C, h) left-padded like the keys: each row's last column stays its last prefix token
            hidden=torch.cat([pad(c.hidden, width - c.length) for c in caches]) if with_hidden else None,
        )

    def rows(self, start: int, n: int) -> "PrefixCache":
        """Rows ``start : start + n`` of the cache, as views (`select` copies)."""
        return PrefixCache(keys=[k[start:start + n] for k in self.keys], values=[v[start:start + n] for v in self.values],
                           key_valid=self.key_valid[start:start + n], padded=self.padded,
                           hidden=None if self.hidden is None else self.hidden[start:start + n])

    def select(self, index: torch.Tensor) -> "PrefixCache":
        """Rows ``index`` of the cache (e.g. ``repeat_interleave`` indices for several choices)."""
        return PrefixCache(
            keys=[k.index_select(0, index) for k in self.keys],
            values=[v.index_select(0, index) for v in self.values],
            key_valid=self.key_valid.index_select(0, index),
            padded=self.padded,
            hidden=None if self.hidden is None else self.hidden.index_select(0, index),
        )


class _LazyView(PrefixCache):
    """`PrefixCache._view` of ``buffers``' first ``n`` slots whose per-layer ``keys``/``values`` are views made only
    when read: a server engine's pooled request grows by a token a call and is read through the pool's rows, so 2 x
    layers views per request and call would be made for nothing."""

    def __init__(self, buffers: _CacheBuffers, n: int, *, padded: bool) -> None:  # (no dataclass __init__: no lists)
        self._buffers, self._n, self.padded, self.ends = buffers, n, padded, None
        self.key_valid = buffers.key_valid.narrow(1, 0, n)
        self.hidden = None if buffers.hidden is None else buffers.hidden.narrow(1, 0, n)

    @property
    def keys(self) -> list[torch.Tensor]:
        return [k.narrow(2, 0, self._n) for k in self._buffers.keys]

    @property
    def values(self) -> list[torch.Tensor]:
        return [v.narrow(2, 0, self._n) for v in self._buffers.values]

    def _owns_tail(self) -> bool:
        b = self._buffers
        return b.filled == self._n and self.key_valid.data_ptr() == b.key_valid.data_ptr()


class BiGLMAttention(nn.Module):
    def __init__(self, config: BiGLMConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.is_causal = False  # transformers' integrations assume causal when unset
        h = config.hidden_size
        bias = config.attention_bias  # Qwen2-style q/k/v biases (converted checkpoints); o_proj never has one
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)
        self.qkv_proj: nn.Module | None = None  # q, k and v as one product (`packed.pack_linears`, inference)
        r = config.mask_adapter_rank
        self.qkv_adapter = BiGLMMaskAdapter(h, (self.n_heads + 2 * self.n_kv) * self.head_dim, r) if r else None
        self.o_adapter = BiGLMMaskAdapter(self.n_heads * self.head_dim, h, r) if r else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: AttentionMask,
                past: tuple[torch.Tensor, torch.Tensor] | None = None, gate: torch.Tensor | None = None,
                write: tuple[torch.Tensor, torch.Tensor, int] | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``write`` ``(rows, columns, width)``: ``past`` are buffers with room (`PrefixCache.room`); this call's keys
        and values go into them at ``rows``/``columns`` (B * L each, row-major) and attention reads their first
        ``width`` columns, instead of the cache and the call's keys concatenated."""
        B, L, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        cos, sin = rope
        adapted = gate is not None and self.qkv_adapter is not None  # mask positions: the adapters' updates added
        if adapted:
            qkv = (self.qkv_proj(x) if self.qkv_proj is not None
                   else torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)) + self.qkv_adapter(x, gate)
            qk = apply_rope(qkv[..., :(H + Hkv) * D].view(B, L, H + Hkv, D).transpose(1, 2), cos, sin)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[..., (H + Hkv) * D:].view(B, L, Hkv, D).transpose(1, 2)
        elif self.qkv_proj is not None:  # q and k side by side in one product: one rotation for both (a decoding
            qkv = self.qkv_proj(x)       # call's per-op overhead; each element rotated as alone, bitwise)
            qk = apply_rope(qkv[..., :(H + Hkv) * D].view(B, L, H + Hkv, D).transpose(1, 2), cos, sin)
            q, k = qk[:, :H], qk[:, H:]  # (B, H, L, D), (B, Hkv, L, D)
            v = qkv[..., (H + Hkv) * D:].view(B, L, Hkv, D).transpose(1, 2)
        else:
            q = self.q_proj(x).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
            k = self.k_proj(x).view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
            v = self.v_proj(x).view(B, L, Hkv, D).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        new_kv = (k, v)
        if write is not None:
            rows, columns, width = write
            past[0][rows, :, columns] = k.transpose(1, 2).reshape(B * L, Hkv, D)
            past[1][rows, :, columns] = v.transpose(1, 2).reshape(B * L, Hkv, D)
            k, v = past[0][:, :, :width], past[1][:, :, :width]
        elif past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        dropout = self.config.attention_dropout if self.training else 0.0
        attend = batch_invariant_attention if mask.batch_invariant else BACKENDS[self.config.attn_backend]
        out = attend(q, k, v, mask, dropout)  # (B, H, L, D)
        out = out.transpose(1, 2).reshape(B, L, self.n_heads * self.head_dim)
        if adapted:
            return self.o_proj(out) + self.o_adapter(out, gate), new_kv
        return self.o_proj(out), new_kv


class BiGLMBlock(nn.Module):
    def __init__(self, config: BiGLMConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = BiGLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = BiGLMAttention(config, layer_idx)
        self.post_attention_layernorm = BiGLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = BiGLMMLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.kernel_forward = None  # the whole layer in one call on a CPU (`packed.KernelLayer`, inference)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: AttentionMask,
                past: tuple[torch.Tensor, torch.Tensor] | None = None, gate: torch.Tensor | None = None,
                write: tuple[torch.Tensor, torch.Tensor, int] | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if self.kernel_forward is not None and not self.training:
            done = self.kernel_forward(x, rope, mask, past, gate, write)
            if done is not None:
                return done
        attn, kv = self.self_attn(self.input_layernorm(x), rope, mask, past, gate, write)
        # dropout is the identity in eval: its calls are skipped (a batch-1 decoding step is mostly per-call overhead)
        x = x + (self.dropout(attn) if self.training else attn)
        out = self.mlp(self.post_attention_layernorm(x), gate)
        return x + (self.dropout(out) if self.training else out), kv


class BiGLMPreTrainedModel(PreTrainedModel):
    config_class = BiGLMConfig
    config: BiGLMConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False  # activation checkpointing is applied by `parallelize`
    _no_split_modules = ["BiGLMBlock"]
    _supports_sdpa = True
    _supports_flex_attn = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear) and getattr(module, "zero_init", False):
            init.zeros_(module.weight)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, BiGLMRMSNorm):
            init.ones_(module.weight)

        elif isinstance(module, BiGLMRotaryEmbedding):
            d = self.config.head_dim
            init.copy_(module.inv_freq,
                       1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float) / d)))

    def set_attn_backend(self, name: str) -> None:
        """Switch every layer to attention backend `name` ("eager", "sdpa", "flex")."""
        self.config.attn_backend = name
        self.config.validate_architecture()


class BiGLMModel(BiGLMPreTrainedModel):
    """The BiGLM encoder: token ids -> final hidden states."""

    def __init__(self, config: BiGLMConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([BiGLMBlock(config, i) for i in range(config.num_hidden_layers)])
        self.norm = BiGLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = BiGLMRotaryEmbedding(config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        # host-side input checks (one device sync per call) for users and inference; the trainer checks only its
        # first micro-batch (its shards were checked against the tokenizer when opened) and then turns them off
        self.validate_inputs = True
        # each row's result independent of the rows beside it, for inference (module docstring); not saved
        self.batch_invariant = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def next_positions(self, key_valid: torch.Tensor) -> torch.Tensor:
        """(B,) long: the RoPE position each row's next token takes after keys ``key_valid`` (B, C) (a cache's) read at
        the positions `forward` gives by default: each row's real keys counted in the batch-invariant mode (a
        left-padded row sits where it would alone), else the keys' count, padding included (RoPE is relative, so that
        is the same in exact arithmetic). A caller that gives later tokens' positions itself (speculative decoding's
        branches) counts from here."""
        if self.batch_invariant:
            return key_valid.long().sum(1)
        return torch.full(key_valid.shape[:1], key_valid.shape[1], dtype=torch.long, device=key_valid.device)

    def _check_inputs(self, input_ids: torch.Tensor, prefix_len: torch.Tensor | None, offset: int) -> None:
        L = input_ids.shape[1] + offset
        if L > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {L} exceeds max_position_embeddings={self.config.max_position_embeddings}: "
                "use shorter windows or build the model with a larger max_position_embeddings."
            )
        if prefix_len is not None and prefix_len.shape != (input_ids.shape[0],):
            raise ValueError(f"prefix_len must have shape (batch,) = ({input_ids.shape[0]},), got {tuple(prefix_len.shape)}.")
        stats = [input_ids.min(), input_ids.max()] if input_ids.numel() else []
        if prefix_len is not None and prefix_len.numel():
            stats += [prefix_len.min().to(input_ids.dtype), prefix_len.max().to(input_ids.dtype)]
        if not stats:
            return
        values = torch.stack(stats).tolist()  # one host sync for every range check
        if input_ids.numel():
            lo, hi = values[:2]
            values = values[2:]
            if lo < 0 or hi >= self.config.vocab_size:
                raise ValueError(
                    f"token ids must lie in [0, vocab_size={self.config.vocab_size}), got [{lo}, {hi}]: the data was "
                    "tokenised with a different tokenizer, or the model's vocab_size is too small."
                )
        if values and (values[0] < 0 or values[1] > L):
            raise ValueError(f"prefix_len must lie in [0, L={L}], got [{values[0]}, {values[1]}].")

    def _check_blocks(self, prefix_len: torch.Tensor | None, prompt_len: torch.Tensor, block_len: torch.Tensor) -> None:
        if prefix_len is None:
            raise ValueError("prompt_len/block_len (the biglm-blocks rule) need prefix_len: the blocks cut the prefix.")
        for name, t in (("prompt_len", prompt_len), ("block_len", block_len)):
            if t.shape != prefix_len.shape:
                raise ValueError(f"{name} must have shape (batch,) = {tuple(prefix_len.shape)}, got {tuple(t.shape)}.")
        bad_prompt = bool(((prompt_len < 0) | (prompt_len > prefix_len)).any())
        if bad_prompt or bool((block_len < 1).any()):
            raise ValueError("the biglm-blocks rule needs 0 <= prompt_len <= prefix_len and block_len >= 1 for every row.")

    def forward(
        self,
        input_ids: torch.Tensor,
        prefix_len: torch.Tensor | int | None = None,
        attention_mask: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        prefix_cache: PrefixCache | None = None,
        return_cache: bool = False,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizer compatibility; BiGLM has no segments
        prompt_len: torch.Tensor | int | None = None,
        block_len: torch.Tensor | int | None = None,
        causal: bool = False,
        lookahead: torch.Tensor | int | None = None,
        attention_rule: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        """Encode a batch.

        Args:
            input_ids: (B, L) token ids (only the suffix when ``prefix_cache`` is given).
            prefix_len: (B,) prefix length per sample, or an int for all; None = full bidirectional attention.
            attention_mask: (B, L) 1 for real tokens, 0 for padding (keys that no one attends to).
            doc_ids: (B, L) document index per token for "same document only" attention.
            position_ids: (B, L) RoPE positions; default ``offset + arange(L)`` (RoPE is relative, so
                left padding needs no shift).
            prefix_cache: keys/values of an already encoded prefix; ``input_ids`` is then the suffix and
                every suffix token sees the whole prefix and suffix. With ``prefix_len`` too (counted from the
                cache's start, so >= its length), the leading new tokens are more prefix: they see the cache and
                each other, not what follows (block decoding's append pass fused with the next block's first call).
            return_cache: also return this call's keys/values as a `PrefixCache` (``outputs.cache``).
            prompt_len, block_len: (B,) or int, the `biglm-blocks` rule with ``prefix_len``: prefix tokens
                before ``prompt_len`` see the prompt only; the rest of the prefix is cut into blocks of
                ``block_len`` that see the prompt, earlier blocks and themselves. Unset: the paper's
                bidirectional prefix. Block decoding's append cache is this rule computed incrementally.
            causal: also forbid every query to see later keys (a causal mask ANDed into the rule): how a
                ``prefix_attention="causal"`` model's `encode_prefix` reads its text, and a diagnostic switch that
                checks any converted model against its autoregressive source. A causal model given ``prefix_len``
                reads its prefix causally by itself (the blocks rule with no prompt and blocks of 1).
            lookahead: training's attention annealing: a query at position i also never sees keys beyond
                i + lookahead (0: causal; None: no limit). The pre-training program grows it over the first
                ``attention_anneal_steps``; decoding and evaluation never pass it.
            attention_rule: (B, L, offset + L) bool, which keys (the cache's, then this call's) each query may see,
                given outright instead of a prefix split: speculative decoding's drafted branches
                (`generation.speculative`). Padding (``attention_mask``, the cache's) still applies on top.
        """
        B, L = input_ids.shape
        offset = 0 if prefix_cache is None else prefix_cache.length
        as_rows = lambda v: torch.full((B,), v, dtype=torch.long, device=input_ids.device) if isinstance(v, int) else v  # noqa: E731
        prefix_len, prompt_len, block_len = as_rows(prefix_len), as_rows(prompt_len), as_rows(block_len)
        if (prompt_len is None) != (block_len is None):
            raise ValueError("prompt_len and block_len come together (the biglm-blocks rule): pass both or neither.")
        if self.config.prefix_attention == "causal" and prefix_len is not None:
            # a causal model reads its text as its AR source did, whatever a caller's blocks: no prompt, blocks of 1
            prompt_len, block_len = torch.zeros_like(prefix_len), torch.ones_like(prefix_len)
        if attention_rule is not None:
            if prefix_len is not None or prompt_len is not None or doc_ids is not None or causal or lookahead is not None:
                raise ValueError("attention_rule gives every query's keys outright: pass it without prefix_len, "
                                 "prompt_len/block_len, doc_ids, causal or lookahead.")
            if attention_rule.shape != (B, L, L + offset) or attention_rule.dtype != torch.bool:
                raise ValueError(f"attention_rule must be a bool tensor of shape (batch, length, cache + length) = "
                                 f"({B}, {L}, {L + offset}), got {attention_rule.dtype} {tuple(attention_rule.shape)}.")
        if self.validate_inputs:
            self._check_inputs(input_ids, prefix_len, offset)
            if prompt_len is not None:
                self._check_blocks(prefix_len, prompt_len, block_len)
            if prefix_cache is not None and prefix_len is not None and bool((prefix_len < offset).any()):
                raise ValueError(f"with a prefix_cache of {offset} tokens, prefix_len counts from the cache's start and "
                                 f"must be >= {offset}: cached tokens are prefix.")
        key_valid = None if attention_mask is None else attention_mask.bool()
        if prefix_cache is not None:
            if key_valid is None and not prefix_cache.padded:
                pass  # nothing padded anywhere: no mask, and no host sync per decoding step
            else:
                suffix_valid = key_valid if key_valid is not None else torch.ones(B, L, dtype=torch.bool, device=input_ids.device)
                key_valid = torch.cat((prefix_cache.key_valid, suffix_valid), dim=1)
        elif key_valid is not None and bool(key_valid.all()):
            key_valid = None  # nothing padded: keep the fast unmasked path
        if lookahead is not None:  # a tensor read inside the rule: a compiled flex mask does not recompile per step
            lookahead = torch.as_tensor(lookahead, device=input_ids.device)
        mask = AttentionMask(batch=B, q_len=L, k_len=L + offset, q_offset=offset,
                             prefix_len=prefix_len, key_valid=key_valid, doc_ids=doc_ids, prompt_len=prompt_len,
                             block_len=block_len, causal=causal, lookahead=lookahead, rule=attention_rule,
                             batch_invariant=self.batch_invariant)
        write = None
        if prefix_cache is not None and prefix_cache.room is not None:
            # the call's keys/values written into each row's room after its own keys (`PrefixCache.room`)
            if self.batch_invariant:  # (its attention lays the keys out itself: `batch_invariant_attention`)
                raise ValueError("a prefix_cache with room is not for the batch-invariant mode: pass the cache "
                                 "without room (room=None).")
            if prefix_cache.ends is None or offset + L > prefix_cache.room[0][0].shape[2]:
                raise ValueError(f"a prefix_cache with room needs each row's length (ends) and room for the call's {L} "
                                 f"tokens after its {offset} columns (it has {prefix_cache.room[0][0].shape[2]}).")
            columns = prefix_cache.ends[:, None] + torch.arange(L, device=input_ids.device)
            rows = torch.arange(B, device=input_ids.device)[:, None].expand(B, L)
            write = (rows.reshape(-1), columns.reshape(-1), offset + L)
            mask = mask.moved(prefix_cache.ends)
        # build the mask once, outside the (possibly compiled) blocks, for the backend that will read it
        if self.config.attn_backend == "flex":
            mask.block_mask(input_ids.device)
        else:
            mask.dense(input_ids.device)
        if position_ids is None and self.batch_invariant and key_valid is not None:
            # each row's real tokens counted: a left-padded row's RoPE angles (its rounding) are those it has alone
            position_ids = (key_valid.long().cumsum(1) - 1).clamp_min(0)[:, offset:]
        elif position_ids is None:
            position_ids = torch.arange(offset, offset + L, device=input_ids.device).expand(B, L)
        x = self.embed_tokens(input_ids)
        if self.training:
            x = self.dropout(x)
        rope = self.rotary_emb(position_ids, x.dtype)
        gate = None
        if self.config.mask_adapter_rank:  # the mask adapters act at mask tokens only (none in a text-only call)
            is_mask = input_ids == self.config.mask_token_id
            gate = is_mask[..., None].to(x.dtype) if bool(is_mask.any()) else None
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            if write is not None:
                past = (prefix_cache.room[0][i], prefix_cache.room[1][i])
            else:
                past = None if prefix_cache is None else (prefix_cache.keys[i], prefix_cache.values[i])
            x, (k, v) = layer(x, rope, mask, past, gate, write)
            if return_cache:
                keys.append(k)
                values.append(v)
        out = BaseModelOutput(last_hidden_state=self.norm(x))
        if return_cache:
            valid = attention_mask.bool() if attention_mask is not None else torch.ones(B, L, dtype=torch.bool, device=input_ids.device)
            padded = attention_mask is not None and not bool(valid.all())  # one check per prompt, not per step
            hidden = out.last_hidden_state if self.config.shift_logits else None
            out["cache"] = PrefixCache(keys=keys, values=values, key_valid=valid, padded=padded, hidden=hidden)
        return out


class BiGLMForMaskedLM(BiGLMPreTrainedModel):
    """BiGLM with its MLM head (final RMSNorm -> vocabulary projection, optionally tied)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: BiGLMConfig) -> None:
        super().__init__(config)
        self.model = BiGLMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def diffusion_generate(self, inputs: torch.Tensor | None = None, generation_config=None,
                           **kwargs) -> torch.LongTensor:
        """Answers for the prompts ``inputs`` (B, P) (or ``input_ids=``, with ``attention_mask=``) written by biglm's
        iterative unmasking with the model's decoding settings (those of `biglm generate`) under ``kwargs``
        (`DecodingConfig` fields: ``max_new_tokens``, ``steps``, ``strategy``...; transformers' options as
        transformers reads them: ``do_sample``, ``temperature``, ``pad_token_id``, ``eos_token_id``, ``streamer``;
        ``generation_config``: a transformers ``GenerationConfig``, default `generation_config`, or a
        `DecodingConfig`): (B, P + n) ids, the prompts then the answers. A BiGLM does not write left to right, so
        transformers' next-token ``generate`` loop does not apply (as Dream's ``diffusion_generate``). The decoding
        lives in `biglm.generation`, reached by name (`model/` imports no decoding)."""
        from .. import adapter

        return adapter("diffusion-generate")(self, inputs, generation_config=generation_config, **kwargs)

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, **kwargs) -> torch.LongTensor:
        """`diffusion_generate`: a BiGLM answers ``generate`` with biglm's decoding, not transformers' next-token
        loop."""
        return self.diffusion_generate(inputs, generation_config=generation_config, **kwargs)

    output_modalities = ("text",)  # what a model that can generate writes (transformers' `GenerationMixin` says it)

    @classmethod
    def can_generate(cls) -> bool:
        """True: `generate` takes transformers' prompts and options and returns the prompt then the answer, so the
        model has a ``generation_config`` (transformers' defaults, its special ids) and pipelines call `generate`."""
        return True

    def encode_prefix(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                      past: PrefixCache | None = None, position_ids: torch.Tensor | None = None) -> PrefixCache:
        """Encode prompts once (full attention among prefix tokens, exactly as under the BiGLM mask; a causal model's
        each token sees itself and the ones before it, as its AR source read them) and return their per-layer
        keys/values for reuse by every suffix pass.

        With ``past``, ``input_ids`` are later prefix tokens (a committed block of an answer): they see
        ``past`` and each other, ``past`` is not recomputed, and the result is ``past`` extended by them.
        Their positions default to ``past.length`` onwards (pass ``position_ids`` for a merged cache).
        """
        new = self.model(input_ids, attention_mask=attention_mask, prefix_cache=past, position_ids=position_ids,
                         return_cache=True, causal=self.config.prefix_attention == "causal")["cache"]
        if past is not None:
            return past.extend(new)
        # keys/values of their own: a layer's are views of its q/k/v product, which would keep every head alive in a
        # cache a server holds (its prompt cache counts the keys' and values' own sizes)
        new.keys, new.values = [k.contiguous() for k in new.keys], [v.contiguous() for v in new.values]
        return new

    @staticmethod
    def _shifted(hidden: torch.Tensor, prefix_cache: PrefixCache | None, *, next_position: bool = False,
                 valid: torch.Tensor | None = None) -> torch.Tensor:
        """``shift_logits``: the hidden state each position predicts from, (B, L, h): position i's is i-1's; the
        first position's is the cached prefix's last (a suffix pass) or its own (the sequence's first token).
        ``next_position``: (B, L + 1), position L (the one after the input) predicted from the input's last.

        A row's first real token predicts from its own state whatever pads it (an empty prompt beside others: a
        cache row with no valid key, or left padding ``valid`` (B, L) before it), as it does alone: padding is
        never a token to predict from."""
        if hidden.shape[1] == 0 and not next_position:
            return hidden
        if next_position and (prefix_cache is None or prefix_cache.length == 0) and hidden.shape[1] == 0:
            raise ValueError("nothing to predict the next position from: no input and no cached prefix.")
        if prefix_cache is None or prefix_cache.length == 0:
            first = hidden[:, :1]
        elif prefix_cache.hidden is None:
            raise ValueError("this model predicts from the previous position (shift_logits), but the prefix cache has "
                             "no hidden states: build it with this model's encode_prefix / return_cache (or keep its "
                             "`hidden` when slicing a cache by hand).")
        else:
            first = prefix_cache.last_hidden().to(hidden.dtype)
            if prefix_cache.padded and hidden.shape[1]:  # a row with an empty prefix: its own first state
                first = torch.where(prefix_cache.key_valid.any(1)[:, None, None], first, hidden[:, :1])
        rest = hidden if next_position else hidden[:, :-1]
        if valid is not None and (prefix_cache is None or prefix_cache.length == 0) and hidden.shape[1] > 1:
            # after left padding, the first real token predicts from itself, not from the padding before it
            n = hidden.shape[1] - 1
            after_pad = (valid[:, 1:].bool() & ~valid[:, :-1].bool())[:, :, None]
            rest = torch.cat((torch.where(after_pad, hidden[:, 1:], rest[:, :n]), rest[:, n:]), dim=1)
        return torch.cat((first, rest), dim=1)

    def forward(
        self,
        input_ids: torch.Tensor,
        prefix_len: torch.Tensor | int | None = None,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        prefix_cache: PrefixCache | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        logits_positions: torch.Tensor | None = None,
        loss_targets: torch.Tensor | None = None,
        loss_weight: torch.Tensor | None = None,
        loss_chunk: int = 1024,
        next_position: bool = False,
        **kwargs,
    ) -> MaskedLMOutput:
        """MLM forward.

        With ``labels`` (B, L; -100 = no loss) and ``config.sparse_prediction``, logits are computed only
        at labelled positions and returned flattened as (M, V) in row-major order of the labelled
        positions. The loss is the mean cross-entropy over labelled tokens, or the sum divided by
        ``num_items_in_batch`` (a device tensor, e.g. the global masked-token count under gradient
        accumulation) when given. ``logits_positions`` restricts logits the same way without a loss: a
        (B, L) bool mask, or the (M,) long indices of the selected positions in the flattened (B·L) batch.
        Decoding scores only masked answer slots with it, and the trainer passes the masked positions'
        indices and computes its one loss with `biglm.objective.masked_lm_loss` (passing ``labels`` here
        would compute a second, discarded fp32 loss kept alive through backward). A bool mask costs one
        host sync (the number of selected rows); indices cost none (the trainer finds them before it
        queues any forward, where a sync stalls nothing).

        A model with ``shift_logits`` also predicts the position after its input (from the input's last hidden
        state, or the cached prefix's last with no input): a bool ``logits_positions`` of (B, L + 1) columns selects
        it in its last. Decoding one slot at a time runs no row for the slot itself (its own row's hidden state
        predicts the slot after it, which that call does not ask for): one position per written token, as an
        autoregressive model, where the slot's row would make two. ``next_position`` does the same for
        ``logits_positions`` given as indices: they index (B, L + 1) positions, each row's last the one after its input
        (speculative decoding's call with nothing masked: no row after its tokens only to carry their last one's
        prediction).

        ``loss_targets`` (M,), with ``logits_positions`` as indices: the loss of those positions' logits against
        them (times ``loss_weight`` (M,) if given, summed, divided by ``num_items_in_batch``) fused with the output
        projection, ``loss_chunk`` rows at a time (`objective.linear_cross_entropy`): no (M, V) logits are built, and
        ``logits`` is None. Pre-training's step (`TrainConfig.loss_chunk`).
        """
        B, L = input_ids.shape
        if next_position and (not self.config.shift_logits or logits_positions is None
                              or logits_positions.dtype == torch.bool):
            raise ValueError("next_position indexes the position after the input with logits_positions given as "
                             "indices, for a model that predicts from the previous position (shift_logits).")
        next_position = next_position or (self.config.shift_logits and logits_positions is not None
                                          and logits_positions.dtype == torch.bool
                                          and logits_positions.shape[1] == L + 1)
        if L == 0 and next_position and prefix_cache is not None and not kwargs.get("return_cache"):
            base = BaseModelOutput(last_hidden_state=prefix_cache.hidden[:, :0])  # only the cache's last: no pass
        else:
            base = self.model(input_ids, prefix_len=prefix_len, attention_mask=attention_mask, doc_ids=doc_ids,
                              position_ids=position_ids, prefix_cache=prefix_cache, **kwargs)
        hidden = base.last_hidden_state
        if self.config.shift_logits:
            hidden = self._shifted(hidden, prefix_cache, next_position=next_position, valid=attention_mask)
        select = None
        if labels is not None and self.config.sparse_prediction:
            select = labels != IGNORE_INDEX
        elif logits_positions is not None:
            select = logits_positions
        if select is not None and select.dtype != torch.bool:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, select)  # (M, h), no host sync
        elif select is not None:
            hidden = hidden[select]  # (M, h)
        if loss_targets is not None:
            if select is None or labels is not None:
                raise ValueError("loss_targets needs logits_positions (the positions they belong to) and no labels.")
            loss = linear_cross_entropy(hidden, self.lm_head.weight, loss_targets, loss_weight=loss_weight,
                                        normalizer=num_items_in_batch, chunk=loss_chunk)
            out = MaskedLMOutput(loss=loss, logits=None)
            if "cache" in base:
                out["cache"] = base["cache"]
            return out
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            flat_labels = labels[select] if select is not None else labels.reshape(-1)
            loss = token_loss(logits.reshape(-1, logits.shape[-1]), flat_labels, normalizer=num_items_in_batch)
        out = MaskedLMOutput(loss=loss, logits=logits)
        if "cache" in base:  # return_cache=True: this call's keys/values, as `BiGLMModel` returns them
            out["cache"] = base["cache"]
        return out
