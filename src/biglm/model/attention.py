"""BiGLM attention: the mask and three interchangeable backends.

Notable features
- One mask rule, written once (`allowed`): query i may see key j iff i >= p or j < p, where p is the
  sample's prefix length; optional "same document only" and key padding. No prefix length means
  full bidirectional attention. The `biglm-blocks` variant adds a prompt boundary q <= p and a block
  length b: a prefix query i < q sees j < q (the prompt, both ways); q <= i < p in the block [s, e)
  (s = q + b*floor((i-q)/b), e = min(s + b, p)) sees j < e (the prompt, earlier blocks, its own block);
  suffix queries still see everything. q = p is the paper's rule.
- A lookahead w (attention annealing from an autoregressive start) ANDs "key j <= query i + w" into the rule:
  w = 0 is causal attention, w >= L - 1 the rule itself. It is a tensor read inside the rule, so a
  compiled FlexAttention mask does not recompile as w grows.
- `eager` is the reference (explicit scores, fp32 softmax); `sdpa` uses PyTorch's fused kernels
  with a boolean mask and `enable_gqa` (the CPU training path); `flex` uses FlexAttention with a
  block mask, so blocks where prefix queries meet suffix keys are skipped (the GPU training path;
  forward-only on CPU in torch 2.13). All three share one signature: ``fn(q, k, v, mask, dropout_p)``.
- `AttentionMask` is built once per forward and shared by every layer; the dense boolean tensor
  and the FlexAttention block mask are each built lazily, only if a backend asks for them.
- Queries may be a tail of the keys (``q_offset``): that is how the exact prefix cache runs only
  the suffix positions against cached prefix keys.
- An explicit rule (``rule``, (B, Lq, Lk) bool) replaces the prefix rule for a call whose queries form no
  prefix/suffix split: speculative decoding's drafted tokens, each seen only by what follows it in its own
  branch (`generation.speculative`). Key padding still applies on top.
- Batch invariance (``AttentionMask.batch_invariant``, `batch_invariant_attention`): a row's result does not depend
  on the rows beside it, so a seed gives one answer whatever else shares the call (as vLLM's batch-invariant mode).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass
class AttentionMask:
    """Who may attend to whom, for a batch of B rows, Lq queries and Lk keys.

    Queries are the key positions ``q_offset .. q_offset+Lq-1`` (q_offset > 0 when a prefix cache
    supplies the first keys).

    Attributes:
        batch, q_len, k_len, q_offset: geometry.
        prefix_len: (B,) long, or None for full bidirectional attention.
        key_valid: (B, Lk) bool (False = padding), or None when nothing is padded.
        doc_ids: (B, Lk) long document index per key position, or None for no document masking.
        prompt_len, block_len: (B,) long, the `biglm-blocks` rule (with ``prefix_len``), or None for the
            paper's bidirectional prefix.
        causal: a query also never sees a later key (k <= q, ANDed into the rule): how a causal model
            (``prefix_attention="causal"``) encodes its text, and a check of any converted model against its source.
        lookahead: a query at position i also never sees a key beyond i + lookahead (ANDed into the rule): 0 is
            causal, None (or >= Lk - 1) no limit. Training's attention annealing (`TrainConfig.attention_anneal_steps`)
            grows it from 0 to the window over the first steps. An int or a 0-dim long tensor.
        rule: (B, Lq, Lk) bool, which keys each query may see, given outright (instead of ``prefix_len`` and the
            switches above); ``key_valid`` still applies.
        batch_invariant: every layer attends with `batch_invariant_attention` (the model's ``batch_invariant``).
    """

    batch: int
    q_len: int
    k_len: int
    q_offset: int = 0
    prefix_len: torch.Tensor | None = None
    key_valid: torch.Tensor | None = None
    doc_ids: torch.Tensor | None = None
    prompt_len: torch.Tensor | None = None
    block_len: torch.Tensor | None = None
    causal: bool = False
    lookahead: torch.Tensor | int | None = None
    rule: torch.Tensor | None = None
    batch_invariant: bool = False
    _dense: torch.Tensor | None = field(default=None, repr=False)
    _compact: tuple | None = field(default=None, repr=False)
    _block: object | None = field(default=None, repr=False)
    _bias: dict = field(default_factory=dict, repr=False)
    _flat: tuple | None = field(default=None, repr=False)

    @property
    def is_full(self) -> bool:
        """True when every query may see every key (no prefix rule, no padding, no documents)."""
        return (self.prefix_len is None and self.key_valid is None and self.doc_ids is None and not self.causal
                and self.lookahead is None and self.rule is None)

    def allowed(self, b: torch.Tensor, q_idx: torch.Tensor, k_idx: torch.Tensor) -> torch.Tensor:
        """The mask rule on broadcastable index tensors; used both densely and as a FlexAttention mask_mod."""
        q_pos = q_idx + self.q_offset
        ok = torch.ones_like(q_pos + k_idx, dtype=torch.bool)
        if self.rule is not None:
            ok = self.rule[b, q_idx, k_idx]
        if self.prefix_len is not None:
            p = self.prefix_len[b]
            if self.prompt_len is None:
                ok = (q_pos >= p) | (k_idx < p)
            else:  # biglm-blocks: how far a prefix query sees (see the module docstring)
                q0, blk = self.prompt_len[b], self.block_len[b]
                block_end = torch.minimum(q0 + ((q_pos - q0).clamp(min=0) // blk + 1) * blk, p)
                ok = (q_pos >= p) | (k_idx < torch.where(q_pos < q0, q0, block_end))
        if self.causal:
            ok = ok & (k_idx <= q_pos)
        if self.lookahead is not None:
            ok = ok & (k_idx <= q_pos + self.lookahead)
        if self.doc_ids is not None:
            ok = ok & (self.doc_ids[b, q_pos] == self.doc_ids[b, k_idx])
        if self.key_valid is not None:
            # a padded query still sees itself, so no softmax row is empty (avoids NaN)
            ok = ok & (self.key_valid[b, k_idx] | (q_pos == k_idx))
        return ok

    def dense(self, device: torch.device) -> torch.Tensor | None:
        """(B, 1, Lq, Lk) boolean mask, True = attend; None when attention is full."""
        if self.is_full:
            return None
        if self._dense is None and self.rule is not None and self.doc_ids is None:  # given outright: no index grids
            keys = self.rule
            if self.key_valid is not None:  # a padded query still sees itself (as in `allowed`)
                q_pos = torch.arange(self.q_offset, self.q_offset + self.q_len, device=device)
                own = q_pos[:, None] == torch.arange(self.k_len, device=device)[None, :]
                keys = keys & (self.key_valid[:, None, :] | own)
            self._dense = keys[:, None]
        if self._dense is None:
            b = torch.arange(self.batch, device=device)[:, None, None]
            q = torch.arange(self.q_len, device=device)[None, :, None]
            k = torch.arange(self.k_len, device=device)[None, None, :]
            self._dense = self.allowed(b, q, k)[:, None]
        return self._dense

    def flat(self, device: torch.device) -> torch.Tensor | None:
        """(B, Lq, Lk) contiguous boolean mask, True = attend, or None when attention is full: the dense mask as
        biglm's CPU layer kernel reads it (`packed.KernelLayer`), built once per call."""
        if self._flat is None:
            dense = self.dense(device)
            self._flat = (None if dense is None else
                          dense.expand(self.batch, 1, self.q_len, self.k_len)[:, 0].contiguous(),)
        return self._flat[0]

    def bias(self, device: torch.device, *, compacted: bool = False) -> torch.Tensor | None:
        """The mask as float32 scores to add, 0 where a query attends and -inf where not, (B, 1, 1, Lq, Lk) (the
        extra axis: the query heads that share a key/value head, `grouped_attention`'s layout); built once per call,
        where each layer negated and applied the boolean mask (32 rows x 150 keys: 51 of a layer's 370 us). Of the
        `compacted` layout's columns with ``compacted``; None when attention is full."""
        if compacted not in self._bias:
            dense = self.compacted(device)[2] if compacted else self.dense(device)
            bias = None
            if dense is not None:
                bias = torch.zeros(dense.shape, dtype=torch.float32, device=device).masked_fill_(~dense, float("-inf"))
                bias = bias[:, :, None]
            self._bias[compacted] = bias
        return self._bias[compacted]

    def compacted(self, device: torch.device) -> tuple[str, torch.Tensor | None, torch.Tensor]:
        """How `batch_invariant_attention` lays out a call's keys: each row's real keys first, in their order, the rest
        masked out, and the key count rounded up to `INVARIANT_KEY_BUCKET`. ``(how, index, dense)``: ``how`` "pad"
        (the keys are so already: only padded, ``index`` None), "move" (each row's cache is right-padded and so are the
        call's own keys, the engine's pooled layout: the call's keys move to just after the row's cache, to columns
        ``index`` (B, Lq)) or "gather" (``index`` (B, W) the columns to take); ``dense`` (B, 1, Lq, W) the mask of
        the laid-out columns."""
        if self._compact is None:
            B, Lk, Lq, C = self.batch, self.k_len, self.q_len, self.q_offset
            width = -(-Lk // INVARIANT_KEY_BUCKET) * INVARIANT_KEY_BUCKET
            dense = self.dense(device)
            if dense is None:
                dense = torch.ones(B, 1, Lq, Lk, dtype=torch.bool, device=device)
            dense = F.pad(dense, (0, width - Lk), value=False)
            kv, how, index = self.key_valid, "pad", None
            gaps = (lambda x: bool((x[:, 1:] & ~x[:, :-1]).any()))  # noqa: E731  (a real key after padding)
            if kv is not None and gaps(kv):
                cols = torch.arange(width, device=device).expand(B, width)
                if C + Lq == Lk and not gaps(kv[:, :C]) and not gaps(kv[:, C:]):
                    ends = kv[:, :C].sum(1, keepdim=True)  # (B, 1) each row's cache length
                    how, index = "move", ends + torch.arange(Lq, device=device)
                    src, seen = moved_columns(ends, C, Lq, width)
                else:
                    how, index = "gather", torch.argsort((~kv).to(torch.uint8), dim=1, stable=True)
                    index = torch.cat((index, index[:, :1].expand(B, width - Lk)), 1)
                    src, seen = index, cols < Lk
                dense = dense.gather(3, src[:, None, None, :].expand(-1, 1, Lq, -1)) & seen[:, None, None, :]
            self._compact = (how, index, dense)
        return self._compact

    def moved(self, ends: torch.Tensor) -> "AttentionMask":
        """This mask for a call whose keys sit right after each row's own cache, at columns ``ends`` (B,) onwards, not
        after the cache's last column (``q_offset``): the server engine's pooled rows are right-padded to the longest,
        and a call writes its keys into each row's room there (`PrefixCache.room`) instead of concatenating them to
        the cache in every layer. The same attention: each query sees the same keys, moved; a column past a row's
        keys is seen by no query. Given outright as a ``rule``, built once per call."""
        device = ends.device
        dense = self.dense(device)
        if dense is None:
            dense = torch.ones(self.batch, 1, self.q_len, self.k_len, dtype=torch.bool, device=device)
        src, seen = moved_columns(ends[:, None], self.q_offset, self.q_len, self.k_len)
        rule = dense[:, 0].gather(2, src[:, None, :].expand(-1, self.q_len, -1)) & seen[:, None, :]
        return AttentionMask(batch=self.batch, q_len=self.q_len, k_len=self.k_len, q_offset=self.q_offset, rule=rule,
                             batch_invariant=self.batch_invariant)

    def block_mask(self, device: torch.device):
        """FlexAttention BlockMask for this mask (None when attention is full)."""
        if self.is_full:
            return None
        if self._block is None:
            from torch.nn.attention.flex_attention import create_block_mask

            def mask_mod(b, h, q_idx, kv_idx):
                return self.allowed(b, q_idx, kv_idx)

            self._block = create_block_mask(
                mask_mod, self.batch, None, self.q_len, self.k_len, device=device,
                _compile=device.type == "cuda",
            )
        return self._block


def moved_columns(ends: torch.Tensor, cache_len: int, q_len: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose cache is right-padded (each row's length ``ends`` (B, 1) of ``cache_len`` columns), their call's
    ``q_len`` keys moved to just after each row's own keys: for each of ``width`` columns of that layout, the column of
    the cache-then-call layout it holds (``src`` (B, width); 0 past the row's keys) and whether it holds a key at all
    (``seen``)."""
    cols = torch.arange(width, device=ends.device).expand(ends.shape[0], width)
    src = torch.where(cols < ends, cols, torch.where(cols < ends + q_len, cols - ends + cache_len, 0))
    return src, cols < ends + q_len


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    # (B, Hkv, L, D) -> (B, Hkv*n_rep, L, D)
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
                    dropout_p: float = 0.0) -> torch.Tensor:
    """Reference: explicit scores and fp32 softmax. q (B, H, Lq, D); k, v (B, Hkv, Lk, D)."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5  # (B, H, Lq, Lk)
    dense = mask.dense(q.device)
    if dense is not None:
        scores = scores.masked_fill(~dense, float("-inf"))
    probs = scores.softmax(dim=-1).to(v.dtype)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return probs @ v


# The longest query a batched CPU call in bfloat16/float16 runs through `grouped_attention` instead of PyTorch's CPU
# flash kernel, which is slow for several rows of a few queries in those dtypes (measured at SmolLM2-135M's heads:
# docs/LOG.md). A single row takes the kernel with its query heads folded (`folded_attention`, faster still there).
# Batched decoding calls are such calls; training and prompt encoding are not.
GROUPED_MAX_QUERIES = 8
# In float32 the flash kernel is the faster for few rows and `grouped_attention` from about this many query rows
# (rows x queries) on: SmolLM2-135M's heads, one thread, AMD EPYC (AVX2): 32 rows of one query over ~250 keys, the
# server's engine under load, -9 to -15 ms of a ~275 ms step; 1-4 rows of one query, the kernel 20-90% faster
# (docs/LOG.md)
GROUPED_MIN_QUERY_ROWS_FLOAT32 = 16


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    """Attention for a few queries with grouped key/value heads as two matrix products: the query heads that share a
    key/value head become rows of one product with it (no key/value copy per head), scores and softmax in float32.
    q (B, H, Lq, D); k, v (B, Hkv, Lk, D)."""
    return _grouped(q, k, v, mask.bias(q.device))


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # `grouped_attention` given the mask as scores to add (`AttentionMask.bias`, (B, 1, 1, Lq, Lk)) or None. The
    # scaling and the mask are one op: bf16(q.k) * scale + (0 or -inf) in float32 is bitwise the scaled scores
    # with the masked ones set to -inf (x + 0.0 == x; the -0.0 it may turn +0.0 weighs the same in the softmax)
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    rep = H // Hkv
    scores = q.reshape(B, Hkv, rep * Lq, D) @ k.transpose(-1, -2)  # (B, Hkv, rep*Lq, Lk), q and k's dtype
    if bias is None:
        scores = scores.float() * D ** -0.5
    else:
        scores = torch.add(bias, scores.view(B, Hkv, rep, Lq, Lk), alpha=D ** -0.5).view(B, Hkv, rep * Lq, Lk)
    return (scores.softmax(dim=-1).to(v.dtype) @ v).view(B, H, Lq, D)


# Keys per block in `batch_invariant_attention`: a call's key count is rounded up to a multiple, so a row's real keys
# fill the same whole vectors of the kernels' reductions alone or batched (the padding after them adds whole blocks of
# zeros: 15 real keys alone and 4 padding after them batched differed, a partial vector against a full one)
INVARIANT_KEY_BUCKET = 64
# Queries per product in `batch_invariant_attention`: bounds its float32 scores (a long prompt's encoding) and, being
# fixed, is no function of the batch
INVARIANT_QUERY_CHUNK = 256


def batch_invariant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
                              dropout_p: float = 0.0) -> torch.Tensor:
    """Attention whose result for a row does not depend on the other rows of the call (their number, their lengths,
    the padding they bring), so a request's answer is the same alone or batched.

    Where a batched call's rows drift on a CPU in bfloat16 (measured on SmolLM2-135M, docs/LOG.md):
    PyTorch's fused kernel for one row vs `grouped_attention` for several, and padding keys *between* a row's real
    keys (the engine's pooled caches are right-padded to the longest, then the call's own keys follow; merged caches
    are left-padded), which moves the real keys within the kernels' vector lanes and reduction blocks: 4 of 150
    random rows differ in their last bit. Padding *after* a row's keys changed none, nor did the row count or the
    query count (padded queries), except where it turned a partial vector of the reductions into a full one. So: one
    kernel for every call (`grouped_attention`'s products, float32 softmax), each row's real keys moved to the front
    in their order and the keys padded after them to a multiple of `INVARIANT_KEY_BUCKET`, queries taken in fixed
    chunks. The linear layers are measured at load (`model.packed.make_rows_invariant`). In float32 the matrix
    kernels pick their summation order by shape (a row's result changes with the key count even when the extra keys are padding at its
    end), so this mode is bfloat16's (`load_model` refuses it for other weights)."""
    if dropout_p > 0.0:
        raise ValueError("batch_invariant attention is for inference: it has no attention dropout.")
    how, index, dense = mask.compacted(q.device)
    if how == "gather":
        idx = index[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        k, v = k.gather(2, idx), v.gather(2, idx)
    else:
        extra = dense.shape[3] - k.shape[2]
        call = (k[:, :, k.shape[2] - q.shape[2]:], v[:, :, v.shape[2] - q.shape[2]:])
        if extra or how == "move":  # (a copy: k and v may be the layer's own, returned for the cache)
            k, v = F.pad(k, (0, 0, 0, extra)), F.pad(v, (0, 0, 0, extra))
        if how == "move":  # the call's keys right after each row's cache (what was there is padding, masked out)
            idx = index[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            k.scatter_(2, idx, call[0])
            v.scatter_(2, idx, call[1])
    Lq, C = q.shape[2], INVARIANT_QUERY_CHUNK
    bias = mask.bias(q.device, compacted=True)
    if Lq <= C:
        return _grouped(q, k, v, bias)
    return torch.cat([_grouped(q[:, :, s:s + C], k, v, None if bias is None else bias[:, :, :, s:s + C])
                      for s in range(0, Lq, C)], dim=2)


def folded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    """PyTorch's fused kernel with the query heads that share a key/value head folded into the query length: q (B, H,
    Lq, D) as (B, Hkv, H / Hkv * Lq, D) against k, v (B, Hkv, Lk, D), the mask repeated for each folded head; no GQA
    in the kernel. The same attention as the kernel's GQA mode: in bfloat16 bitwise its result for 126 of 128 query
    and key counts tried (1-6 queries, up to 300 keys), the other two a last bit apart (the kernel splits the keys by
    the query count). Faster for a decoding call of one row on a CPU, where the GQA mode runs a query at a time
    (measured at SmolLM2-135M's heads: docs/LOG.md)."""
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    rep = H // Hkv
    dense = mask.dense(q.device)
    if dense is not None:
        dense = dense.expand(B, 1, Lq, Lk).repeat(1, 1, rep, 1)  # folded row r * Lq + i is query i's
    out = F.scaled_dot_product_attention(q.reshape(B, Hkv, rep * Lq, D), k, v, attn_mask=dense)
    return out.view(B, H, Lq, D)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
                   dropout_p: float = 0.0) -> torch.Tensor:
    """PyTorch scaled_dot_product_attention with a boolean mask and native GQA; a few queries in bfloat16/float16 on a
    CPU (decoding calls) go through `grouped_attention` for several rows and `folded_attention` for one, and in
    float32 through `grouped_attention` for many rows (`GROUPED_MIN_QUERY_ROWS_FLOAT32`): the same attention, faster
    there."""
    if q.shape[2] <= GROUPED_MAX_QUERIES and dropout_p == 0.0 and q.device.type == "cpu":
        if q.dtype in (torch.bfloat16, torch.float16):
            if q.shape[0] > 1:
                return grouped_attention(q, k, v, mask)
            if q.shape[1] > k.shape[1]:
                return folded_attention(q, k, v, mask)
        elif q.shape[0] > 1 and q.shape[0] * q.shape[2] >= GROUPED_MIN_QUERY_ROWS_FLOAT32:
            return grouped_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.dense(q.device), dropout_p=dropout_p, is_causal=False, enable_gqa=True
    )


@functools.cache
def _compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
                   dropout_p: float = 0.0) -> torch.Tensor:
    """FlexAttention with a block mask: fully-masked blocks are skipped. Compiled on GPU."""
    if dropout_p > 0.0:
        raise ValueError("attn_backend='flex' does not support attention dropout; use 'sdpa' or set attention_dropout=0.")
    if q.device.type == "cuda":
        fn = _compiled_flex()
    else:
        import warnings

        from torch.nn.attention.flex_attention import flex_attention as fn

        if torch.is_grad_enabled() and q.requires_grad:
            raise RuntimeError(
                "attn_backend='flex' has no backward pass on CPU (torch 2.13): train on CPU with "
                "attn_backend='sdpa', or run this on a GPU."
            )
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    return fn(q, k, v, block_mask=mask.block_mask(q.device), enable_gqa=True)


BACKENDS: dict[str, Callable] = {"eager": eager_attention, "sdpa": sdpa_attention, "flex": flex_attention}
