"""The step-level decoding engine of `biglm serve` (and of sampled batch files): many requests, one model call a step.

Each request is a `decoding.Decode`, the set-up `generate_ids` builds (its `DecodeRun` state machine, its prefix
cache, its own seeded sampler), or with ``draft_length`` a `speculative.SpeculativeDecode`. `DecodeEngine.step`
admits waiting requests (continuous batching, up to ``max_batch_rows`` rows; a length beam of K is K rows), encodes
at most ``prefill_chunk`` prompt tokens' worth beside the decoding call (`_Prefill`: a BiGLM prompt is one
bidirectional prefix, so it is cut by layers and query rows, never causally), merges every running request's pending
call into one padded forward over their caches (rows of one pool read in place, `_CachePool`), and hands each request
its logits. A committed block joins its request's cache after the step (with the append cache it rides on the next
call as leading prefix tokens); a speculative request's drafted branches ride in the same call, every row then said
as an explicit attention rule. So a request's tokens are those `generate_ids` gives it alone with the same config and
seed: in float32, and in bfloat16 with a batch-invariant model (`load_model(..., batch_invariant=True)`).

After each step, one `EngineEvent` per request that took part: its answer so far and ``stable_ids``, the part that
can no longer change (what a server streams); a request ends once that part holds an EOS or a stop string. Drafts pay
only while a step is bound by reading the weights: above ``draft_rows`` rows, greedy speculative requests go on as one
token per call in the pool (`DecodeEngine._one_per_call`). Prompt passes are not counted in ``steps``;
``prefill_work`` counts their token-layers. The design at more length: docs/concepts/engine.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..model.attention import BACKENDS, AttentionMask, batch_invariant_attention
from ..model.modeling import BiGLMForMaskedLM, PrefixCache, _CacheBuffers, _LazyView, apply_rope
from .api import cut_at_stop
from .config import DecodingConfig
from .decoding import (Decode, DecodeRun, Query, StepCallback, _unchecked, check_prompt_ids, check_speculative,
                       draw_greedy, require_mask_token, uses_length_head)
from .speculative import DRAFT_ROWS, SpeculativeDecode, TreeCall, draft_costs

DEFAULT_PREFILL_CHUNK = 64
"""`DecodeEngine`'s default ``prefill_chunk``: a step's prompt encoding, in prompt tokens through every layer. Lower
shortens each step while a long prompt is encoded; higher encodes it in fewer steps. On a CPU (SmolLM2-135M, one
thread, a 4,000-token prompt beside three 8-token requests, docs/serving.md) 64 beat 256 on both; a GPU's steps
afford more (vLLM's chunks are 512 and up)."""


@dataclass
class EngineEvent:
    """What happened to one request in one `DecodeEngine.step`.

    Attributes:
        request_id: the id given to `submit`.
        token_ids: the answer so far (the best candidate; masked slots left out); when finished, the
            final answer cut at its first EOS (the EOS excluded).
        stable_ids: the leading part of the answer that can no longer change (committed blocks, or the
            committed run from the left); grows monotonically; equals ``token_ids`` when finished.
        finished: no further events follow for this request.
        finish_reason: "length", "stop" (EOS or a stop string), "cancelled", "error" (this request alone
            failed: ``error`` says why), or None while running.
        steps: decoding model calls this request has taken part in.
        logprobs: the log-probability of each of ``stable_ids`` under the model when it was written (temperature 1,
            before top-k/top-p; over the tokens the decoder may write), as `GenerationOutput.token_logprobs`.
        error: why the request failed (finish_reason "error").
    """

    request_id: str
    token_ids: list[int]
    stable_ids: list[int]
    finished: bool
    finish_reason: str | None
    steps: int
    logprobs: list[float] | None = None
    error: str | None = None


class _Request:
    """One submitted request: its prompt and, once admitted, its `Decode` or `SpeculativeDecode` (state machine and
    growing cache)."""

    def __init__(self, request_id: str, prompt_ids: list[int], config: DecodingConfig,
                 on_step: StepCallback | None = None) -> None:
        self.id = request_id
        self.prompt_ids = prompt_ids
        self.config = config
        self.on_step = on_step  # called with each call's `StepInfo` (a client drawing the canvas)
        self.decode: Decode | SpeculativeDecode | None = None
        self.stable: list[int] = []
        self.logprobs: list[float] = []  # of ``stable``
        self.prefill: _Prefill | None = None  # its prompt's pass while spread over steps (a long prompt)
        self.slot = 0  # its first row in the engine's `_CachePool` (an iterative-unmasking request)
        self.pooled: _CacheBuffers | None = None  # the pool's rows its cache views
        # what it wrote speculatively before the engine's load moved it to one token per call (`_one_per_call`): its
        # decode then goes on after them (they are its prompt's tail), and its answer, logprobs and calls start with them
        self.done_ids: list[int] = []
        self.done_logprobs: list[float] = []
        self.done_calls = 0

    @property
    def run(self) -> DecodeRun | None:
        """The iterative-unmasking run (None before admission, and for a speculative request)."""
        return self.decode.run if isinstance(self.decode, Decode) else None

    @property
    def calls(self) -> int:
        return self.done_calls + (0 if self.decode is None else self.decode.calls)

    @property
    def rows(self) -> int:
        return self.config.length_beam


class _Prefill:
    """A long prompt's cache pass (`encode_prefix`: every prompt token sees the whole prompt), spread over engine steps.

    Why layers, not token chunks: a BiGLM prompt is one bidirectional prefix, so each layer's keys/values of its first
    tokens depend on its last ones; encoding it chunk by chunk causally (vLLM's chunked prefill) would change every
    key. The pass is cut where nothing is approximated instead: layer by layer, and inside a layer by query rows (a
    layer's keys/values come first, from the whole prompt's input to that layer; then any rows' queries attend to all
    of them and run their MLP alone). `advance` does ``n`` token-layers of that work, so a step's share is bounded
    whatever the prompt's length. The cache equals `encode_prefix`'s up to float rounding (different matrix shapes;
    tested), for every model (a shift or `biglm-blocks` model encodes its prompt the same way)."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor) -> None:
        self.inner = model.model
        self.ids, self.P, self.L = ids, ids.shape[1], len(self.inner.layers)
        self.layer = self.row = 0  # the next work: rows from ``row`` of layer ``layer``
        self.x = self.normed = self.rope = None
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    @property
    def left(self) -> int:
        """Token-layers still to encode."""
        return (self.L - self.layer) * self.P - self.row

    def advance(self, n: int) -> int:
        """Encode up to ``n`` token-layers; returns how many."""
        inner, done = self.inner, 0
        if self.x is None:
            self.x = inner.embed_tokens(self.ids)
            self.rope = inner.rotary_emb(torch.arange(self.P, device=self.ids.device)[None], self.x.dtype)
        while done < n and self.layer < self.L:
            block = inner.layers[self.layer]
            attn = block.self_attn
            cos, sin = self.rope
            if self.row == 0:  # this layer's keys/values, from the whole prompt's input to it
                self.normed = block.input_layernorm(self.x)
                shape = (1, self.P, attn.n_kv, attn.head_dim)
                self.keys.append(apply_rope(attn.k_proj(self.normed).view(shape).transpose(1, 2), cos, sin))
                self.values.append(attn.v_proj(self.normed).view(shape).transpose(1, 2))
            a = self.row
            b = min(self.P, a + n - done)
            q = attn.q_proj(self.normed[:, a:b]).view(1, b - a, attn.n_heads, attn.head_dim).transpose(1, 2)
            q = apply_rope(q, cos[:, :, a:b], sin[:, :, a:b])
            # every prompt token sees the whole prompt (a causal model's: itself and the tokens before it)
            # (a batch-invariant model's kernel too: the keys `encode_prefix` gives the prompt alone in that mode)
            mask = AttentionMask(batch=1, q_len=b - a, k_len=self.P, q_offset=a,
                                 causal=inner.config.prefix_attention == "causal", batch_invariant=inner.batch_invariant)
            attend = batch_invariant_attention if inner.batch_invariant else BACKENDS[inner.config.attn_backend]
            out = attend(q, self.keys[-1], self.values[-1], mask, 0.0)
            y = self.x[:, a:b] + attn.o_proj(out.transpose(1, 2).reshape(1, b - a, attn.n_heads * attn.head_dim))
            # (rows a:b of the input are read by these queries alone now: the layer's output overwrites them)
            self.x[:, a:b] = y + block.mlp(block.post_attention_layernorm(y))
            done += b - a
            self.row = b
            if b == self.P:
                self.layer, self.row = self.layer + 1, 0
        return done

    def cache(self) -> PrefixCache:
        """The finished pass's cache, as `encode_prefix` returns it."""
        hidden = self.inner.norm(self.x) if self.inner.config.shift_logits else None
        valid = torch.ones(1, self.P, dtype=torch.bool, device=self.ids.device)
        return PrefixCache(keys=self.keys, values=self.values, key_valid=valid, padded=False, hidden=hidden)


class _CachePool:
    """The prefix caches of the running iterative-unmasking requests as rows of one set of buffers, so that a step's
    call reads them all as one batch in place. (`PrefixCache.merge` copied every request's cache, every layer, at
    every step: with many clients at one position per token, most of a step's time; docs/LOG.md.)

    A request holds rows ``slot : slot + rows`` and sees them through its own cache, a reserved `PrefixCache` view of
    its rows (`extend` writes its committed blocks there in place). Rows are right-padded (``key_valid`` False past
    each row's length), so the batch's cache is a view of the first rows with each row's length in ``ends``. A request
    whose cache was replaced (the exact cache re-encodes its prefix per block) is copied in again by `sync`; one that
    leaves frees its rows, which the last member moves into (`remove`), so the running rows stay contiguous from row 0.
    The buffers grow (rows and columns) as requests need them, never past ``max_rows``."""

    def __init__(self, model: torch.nn.Module, *, max_rows: int) -> None:
        p = next(model.parameters())
        self.config, self.max_rows, self.device, self.dtype = model.config, max_rows, p.device, p.dtype
        self.members: list[_Request] = []  # in row order
        self.buffers, self.stacked = self._allocate(0, 0)

    @property
    def rows(self) -> int:
        return self.buffers.key_valid.shape[0]

    @property
    def columns(self) -> int:
        return self.buffers.capacity

    def _allocate(self, rows: int, columns: int) -> tuple[_CacheBuffers, tuple[torch.Tensor, torch.Tensor]]:
        """New buffers and the two tensors behind their layers: every layer's keys are one tensor (layers, rows, Hkv,
        columns, D), and so are the values, the buffers' layers its views, so a step's new keys (`absorb`) and a
        leaving request's rows (`remove`) move in one copy for every layer, not one per layer."""
        cfg = self.config
        kv = lambda: torch.zeros(cfg.num_hidden_layers, rows, cfg.num_key_value_heads,  # noqa: E731
                                 columns, cfg.head_dim, device=self.device, dtype=self.dtype)
        keys, values = kv(), kv()
        hidden = (torch.zeros(rows, columns, cfg.hidden_size, device=self.device, dtype=self.dtype)
                  if getattr(cfg, "shift_logits", False) else None)
        return _CacheBuffers(keys=list(keys.unbind(0)), values=list(values.unbind(0)),
                             key_valid=torch.zeros(rows, columns, dtype=torch.bool, device=self.device),
                             hidden=hidden, filled=0, extra=0), (keys, values)

    def _ensure(self, rows: int, columns: int, *, keep: _Request | None = None) -> None:
        """Room for ``rows`` rows of ``columns`` keys: grown (doubling, what is held copied over) when short; every
        member's view then points at the new buffers, except ``keep``'s (a cache about to be written in)."""
        r, c = self.rows, self.columns
        if rows <= r and columns <= c:
            return
        old = self.buffers
        new, stacked = self._allocate(min(self.max_rows, max(rows, 2 * r)) if rows > r else r,
                                      max(columns, 2 * c) if columns > c else c)
        for dst, src in zip(stacked, self.stacked):
            dst[:, :r, :, :c] = src
        new.key_valid[:r, :c] = old.key_valid
        if new.hidden is not None:
            new.hidden[:r, :c] = old.hidden
        self.buffers, self.stacked = new, stacked
        for req in self.members:  # their views read the old buffers: point them at the new ones
            if req is not keep:
                self._view(req, req.decode.denoise.cache)

    def _view(self, req: _Request, cache: PrefixCache) -> None:
        """``req``'s cache becomes a reserved view of its rows, holding ``cache``'s length (already in the rows)."""
        req.pooled = self.buffers.rows(slice(req.slot, req.slot + req.rows), filled=cache.length)
        req.decode.denoise.cache = PrefixCache._view(req.pooled, cache.length, padded=cache.padded)

    def _write(self, req: _Request, cache: PrefixCache) -> None:
        b, n, rows = self.buffers, cache.length, slice(req.slot, req.slot + req.rows)
        for buf, src in zip(b.keys + b.values, cache.keys + cache.values):
            buf[rows, :, :n] = src
        b.key_valid[rows, :n] = cache.key_valid
        b.key_valid[rows, n:] = False
        if b.hidden is not None:
            b.hidden[rows, :n] = cache.hidden
        self._view(req, cache)

    def add(self, req: _Request) -> None:
        """A request just started: its rows after the last member's, its prompt's cache copied in."""
        cache = req.decode.denoise.cache
        req.slot = sum(m.rows for m in self.members)
        self._ensure(req.slot + req.rows, cache.length + req.decode.run.config.max_new_tokens)
        self.members.append(req)
        self._write(req, cache)

    def sync(self, req: _Request) -> None:
        """After a step: a cache that is no longer a view of the request's rows (re-encoded) is copied in again."""
        cache = req.decode.denoise.cache
        if cache._buffers is not req.pooled or not cache._owns_tail():
            self._ensure(req.slot + req.rows, cache.length + req.decode.run.config.max_new_tokens, keep=req)
            self._write(req, cache)

    @torch.inference_mode()  # (`DecodeEngine.cancel` runs outside a step)
    def remove(self, req: _Request) -> None:
        """A request left: the last member moves into its rows when it holds as many (one copy of its rows), else the
        members after it move up (one copy of all their rows); moving every member after it each time made a wave of
        finishing requests stall a step (docs/LOG.md)."""
        if req not in self.members:
            return
        i = self.members.index(req)
        del self.members[i]
        b = self.buffers
        end = sum(m.rows for m in self.members)  # the rows in use once the hole is filled
        last = self.members[-1] if i < len(self.members) else None
        if last is not None and last.rows == req.rows:  # the last member takes the hole (and its place in the order)
            moved, src, dst = [last], slice(last.slot, last.slot + last.rows), slice(req.slot, req.slot + req.rows)
            self.members.insert(i, self.members.pop())
        elif last is not None:  # every row after it moves up by its row count
            moved, src, dst = self.members[i:], slice(req.slot + req.rows, end + req.rows), slice(req.slot, end)
        else:
            moved = []
        if moved:
            width = max(m.decode.denoise.cache.length for m in moved)
            for buf in self.stacked:
                buf[:, dst, :, :width] = buf[:, src, :, :width].clone()
            b.key_valid[dst] = b.key_valid[src].clone()
            if b.hidden is not None:
                b.hidden[dst, :width] = b.hidden[src, :width].clone()
            slot = dst.start
            for m in moved:
                m.slot, slot = slot, slot + m.rows
                self._view(m, m.decode.denoise.cache)
        b.key_valid[end:] = False  # the rows freed at the end

    def absorb(self, reqs: list[_Request], call: PrefixCache, leads: list[int], *,
               written: bool = False) -> list[PrefixCache | None] | None:
        """The held blocks a pooled call computed (each request's first ``leads`` positions of ``call``, its rows in
        pool order) written into the pool's rows in one indexed copy for the keys of every layer and one for the
        values, instead of a copy per request and layer (32 requests at one position per token: 1,920 small copies a
        call); ``written``: the call wrote its keys/values there itself (`batch`'s room), only the key mask and hidden
        states are copied. Returns each request's longer cache view (None where it held no block), or None where a
        block does not fit the buffers (the caller extends each cache as usual)."""
        rows, cols, src = [], [], []
        for req, lead in zip(reqs, leads):
            n = req.decode.denoise.cache.length
            if n + lead > self.columns:
                return None
            for j in range(lead):
                for r in range(req.slot, req.slot + req.rows):
                    rows.append(r)
                    cols.append(n + j)
                    src.append(j)
        if not rows:
            return [None] * len(reqs)
        r, c, j = (torch.tensor(x, device=self.device) for x in (rows, cols, src))
        b = self.buffers
        if not written:
            for buf, new in zip(self.stacked, (call.keys, call.values)):
                buf[:, r, :, c] = torch.stack(new)[:, r, :, j]
        valid = call.key_valid[r, j]
        b.key_valid[r, c] = valid
        if b.hidden is not None:
            b.hidden[r, c] = call.hidden[r, j]
        valid, at, out = valid.tolist(), 0, []  # (read once: a host read per request cost as much as the copies)
        for req, lead in zip(reqs, leads):
            old = req.decode.denoise.cache
            if not lead:
                out.append(None)
                continue
            n = lead * req.rows  # its entries, in the order ``rows`` was built
            real, at = all(valid[at:at + n]), at + n
            req.pooled.filled = old.length + lead
            out.append(_LazyView(req.pooled, old.length + lead, padded=old.padded or not real))
        return out

    def order(self, reqs: list[_Request]) -> list[_Request]:
        """``reqs`` in row order when they are exactly the members (a call over them reads the pool in place), else as
        given."""
        if len(reqs) == len(self.members) and set(map(id, reqs)) == set(map(id, self.members)):
            return list(self.members)
        return reqs

    def batch(self, reqs: list[_Request], call: int, *, room: bool = True) -> PrefixCache | None:
        """The cache of one call of ``call`` positions a row over ``reqs`` (the members, in row order: `order`): a view
        of the first rows, each row's length in ``ends``, and, with ``room`` where the call fits after the longest, the
        rows' room (`PrefixCache.room`: the call writes its keys there, after each row's own); None when they are not
        exactly the members (the caller merges instead)."""
        if reqs != self.members:
            return None
        total = sum(r.rows for r in reqs)
        lengths = [r.decode.denoise.cache.length for r in reqs]
        width = max(lengths)
        ends = torch.tensor([n for r, n in zip(reqs, lengths) for _ in range(r.rows)], device=self.device)
        b = self.buffers
        fits = room and width + call <= self.columns
        room = ([k[:total] for k in b.keys], [v[:total] for v in b.values]) if fits else None
        return PrefixCache(keys=[k[:total, :, :width] for k in b.keys], values=[v[:total, :, :width] for v in b.values],
                           key_valid=b.key_valid[:total, :width], padded=True,
                           hidden=None if b.hidden is None else b.hidden[:total, :width], ends=ends, room=room)


LOAD_MEMORY_S = 3.0
"""Seconds a step of more than ``draft_rows`` rows counts as load, from its end, when a greedy request starts
(`DecodeEngine._start`): requests of the same length started together end together, and the next wave arrives one by
one into an empty engine, where its first few would otherwise start speculative and then need a call of their own
beside every pooled call of the wave (docs/LOG.md). A request that did start speculative moves into the pool at the
first loaded step (`DecodeEngine._one_per_call`)."""

def _one_token_per_call(config: DecodingConfig, **changes) -> DecodingConfig:
    """A speculative request's settings as the plain decoding its drafts are checked under (confidence at blocks of 1,
    the append cache): the same answer greedy, the same distribution sampled. ``changes``: other fields to set."""
    return dataclasses.replace(config, draft_length=0, draft_ngram=0, draft_model=True, draft_branches=1,
                               block_length=1, block_cache="append", **changes)


DEFAULT_PROMPT_CACHE_MB = 256
"""`DecodeEngine`'s default ``prompt_cache_mb``: memory for the encoded caches of recent prompts (`_PromptCache`).
SmolLM2-135M holds 23 KB a prompt token (bfloat16), so 256 MB keeps ~11,000 prompt tokens."""


class _PromptCache:
    """The encoded caches of recent prompts, by their token ids (least recently used dropped past ``limit`` bytes).

    Why: a server sees the same prompt again (a retry, a benchmark's prompts, a few-shot template sent as is, n
    choices asked in separate requests); encoding it costs as much as a decoding call of as many rows. vLLM reuses
    cached prompt blocks by default.
    A BiGLM prompt is one bidirectional prefix, so only a whole prompt is reused, never a shared beginning (its
    first tokens' keys depend on its last ones). The cache is the same pass's result, so an answer does not change.
    The stored tensors are never written: a request's cache is copied into the pool (or its own buffers) before it
    grows."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self.entries: OrderedDict[tuple[int, ...], tuple[PrefixCache, int]] = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def _size(cache: PrefixCache) -> int:
        tensors = [*cache.keys, *cache.values, cache.key_valid] + ([] if cache.hidden is None else [cache.hidden])
        return sum(t.numel() * t.element_size() for t in tensors)

    def get(self, ids: list[int]) -> PrefixCache | None:
        hit = self.entries.get(key := tuple(ids))
        if hit is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return hit[0]

    def put(self, ids: list[int], cache: PrefixCache) -> None:
        size = self._size(cache)
        if size > self.limit or tuple(ids) in self.entries:
            return
        while self.used + size > self.limit:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.used -= dropped
        self.entries[tuple(ids)] = (cache, size)
        self.used += size


DEFAULT_DRAFT_ROWS = DRAFT_ROWS  # rows up to which a step drafts with the model (`speculative.DRAFT_ROWS`)


class DecodeEngine:
    """Decode many requests at once, one merged model call per `step` (see the module docstring).

    Not thread-safe: one caller (e.g. a server's decoding loop) calls `submit`, `cancel` and `step`.
    """

    def __init__(self, model: torch.nn.Module, *, max_batch_rows: int = 64, device: torch.device | str | None = None,
                 tokenizer=None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, draft_rows: int = DEFAULT_DRAFT_ROWS,
                 prompt_cache_mb: float = DEFAULT_PROMPT_CACHE_MB) -> None:
        """``model``: a `BiGLMForMaskedLM` in eval mode; ``max_batch_rows``: rows (requests × length
        candidates) decoded together; ``device``: where prompts go (default: the model's);
        ``tokenizer``: needed only for requests with stop strings, and to drop ids past its vocabulary;
        ``prefill_chunk``: the prompt encoding one step does, in prompt tokens through every layer (a longer prompt
        is encoded over several steps, see the module docstring); ``draft_rows``: the rows up to which a step is
        bound by reading the weights, so drafts are nearly free (more: see `_drafts_pay`); ``prompt_cache_mb``: memory
        for the encoded caches of recent prompts, reused when the same prompt comes again (`_PromptCache`; 0: off)."""
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows={max_batch_rows} must be >= 1.")
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk={prefill_chunk!r} must be an integer >= 1 (prompt tokens encoded per step).")
        require_mask_token(model.config)
        self.model = model
        self.max_batch_rows = max_batch_rows
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.tokenizer = tokenizer
        self.suppress = list(range(len(tokenizer), model.config.vocab_size)) if tokenizer is not None else []
        pad, eos = model.config.pad_token_id, model.config.eos_token_id
        self._plain_id = pad if pad is not None else eos if eos is not None else 0  # what pads a merged call's rows
        self.positions = 0  # query positions the merged calls have computed (padding included): a cost counter
        self.prefill_chunk = prefill_chunk
        if isinstance(draft_rows, bool) or not isinstance(draft_rows, int) or draft_rows < 0:
            raise ValueError(f"draft_rows={draft_rows!r} must be an integer >= 0 (0: never draft with the model).")
        self.draft_rows = draft_rows
        if (isinstance(prompt_cache_mb, bool) or not isinstance(prompt_cache_mb, (int, float))
                or not 0 <= prompt_cache_mb < float("inf")):
            raise ValueError(f"prompt_cache_mb={prompt_cache_mb!r} must be a finite number >= 0 (0: no prompt cache).")
        self.prompt_cache = _PromptCache(int(prompt_cache_mb * 2**20))
        self.prefill_work = 0  # prompt token-layers encoded (a prompt of P tokens: P x layers): a cost counter
        self._loaded_at = float("-inf")  # when a step last held more than ``draft_rows`` rows (`LOAD_MEMORY_S`)
        self._waiting: OrderedDict[str, _Request] = OrderedDict()
        self._prefilling: OrderedDict[str, _Request] = OrderedDict()  # admitted, prompt being encoded
        self._running: OrderedDict[str, _Request] = OrderedDict()  # decoding
        self._cancelled: list[EngineEvent] = []  # (and failed ones), reported by the next step
        self._pool = _CachePool(model, max_rows=max_batch_rows)

    @property
    def num_running(self) -> int:
        """Requests admitted (holding rows): decoding, or with their prompt being encoded (`num_prefilling`)."""
        return len(self._running) + len(self._prefilling)

    @property
    def num_prefilling(self) -> int:
        """Admitted requests whose long prompt is being encoded, a share per step (not decoding yet)."""
        return len(self._prefilling)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def submit(self, request_id: str, prompt_ids: list[int], config: DecodingConfig, *,
               on_step: StepCallback | None = None) -> None:
        """Queue a request; it joins the running batch at a coming `step`. Bad input fails here, at once. ``on_step``:
        called in the engine's thread with a `decoding.StepInfo` after each of this request's model calls."""
        cfg = self.model.config
        if not isinstance(config, DecodingConfig):
            raise TypeError(f"config must be a DecodingConfig, got {type(config).__name__}.")
        if request_id in self._waiting or request_id in self._prefilling or request_id in self._running:
            raise ValueError(f"request id {request_id!r} is already in the engine: use a unique id per request.")
        ids = [int(i) for i in prompt_ids]
        check_prompt_ids(cfg, torch.tensor(ids, dtype=torch.long))
        if len(ids) + config.max_new_tokens > cfg.max_position_embeddings:
            raise ValueError(f"prompt ({len(ids)}) + max_new_tokens ({config.max_new_tokens}) tokens exceed the model's "
                             f"window max_position_embeddings={cfg.max_position_embeddings}: shorten one of them.")
        if config.length_beam > self.max_batch_rows:
            raise ValueError(f"length_beam={config.length_beam} exceeds the engine's max_batch_rows="
                             f"{self.max_batch_rows}: lower length_beam.")
        if config.stop and self.tokenizer is None:
            raise ValueError("stop strings need the tokenizer: build DecodeEngine(model, tokenizer=...).")
        uses_length_head(self.model, config)  # length_head=True on a model without one fails here
        check_speculative(self.model, config)
        self._waiting[request_id] = _Request(request_id, ids, config, on_step)

    def cancel(self, request_id: str) -> None:
        """Drop a waiting or running request; the next `step` reports it (finish_reason "cancelled").
        An unknown or already finished id is ignored (a client may disconnect after its answer ended)."""
        req = (self._waiting.pop(request_id, None) or self._prefilling.pop(request_id, None)
               or self._running.pop(request_id, None))
        if req is not None:
            self._pool.remove(req)
            self._cancelled.append(EngineEvent(request_id, list(req.stable), list(req.stable), True, "cancelled",
                                               req.calls))

    @torch.inference_mode()
    def step(self) -> list[EngineEvent]:
        """Admit waiting requests, encode up to ``prefill_chunk`` tokens' worth of their prompts, run one merged model
        call over every running request (those whose prompt was just finished included), and report."""
        events, self._cancelled = self._cancelled, []
        with _unchecked(self.model):
            self._admit()
            self._prefill()
            if not self._running:
                events, self._cancelled = events + self._cancelled, []  # (requests that failed to start)
                return events
            if not self._drafts_pay():
                for req in list(self._running.values()):
                    if self._moves_to_the_pool(req):
                        self._one_per_call(req)
            reqs = list(self._running.values())
            self._decode(reqs)  # (each request's committed blocks join its cache before its next query)
            if sum(r.rows for r in reqs) > self.draft_rows:
                self._loaded_at = time.monotonic()  # (the load is remembered from its end: `LOAD_MEMORY_S`)
            for req in reqs:
                if req.id in self._running:
                    try:
                        events.append(self._report(req))
                    except Exception as e:  # noqa: BLE001 - its stop check (the tokenizer): this request's alone
                        self._fail(req, e)
        events, self._cancelled = events + self._cancelled, []
        return events

    def _drafts_pay(self) -> bool:
        """Whether a step of the admitted rows (decoding, or with their prompt being encoded) is bound by reading the
        weights, where checking drafts costs next to nothing (at most ``draft_rows`` rows): above it the engine calls speculative
        requests without the model's mask drafts (n-gram drafts still ride: a few positions) and starts new exact
        ones as one token per call (docs/serving.md). Always, for a batch-invariant model (`load_model(...,
        batch_invariant=True)`): a sampled answer would follow the load."""
        if getattr(self.model.model, "batch_invariant", False):
            return True
        admitted = itertools.chain(self._running.values(), self._prefilling.values())  # (a starting request included)
        return sum(r.rows for r in admitted) <= self.draft_rows

    # --- internals -----------------------------------------------------------------------------------------

    def _admit(self) -> None:
        """Waiting requests take free rows, in order; their prompts are encoded by `_prefill`."""
        used = sum(r.rows for r in itertools.chain(self._running.values(), self._prefilling.values()))
        if used > self.draft_rows:
            self._loaded_at = time.monotonic()
        while self._waiting:
            req = next(iter(self._waiting.values()))
            if used + req.rows > self.max_batch_rows:
                break
            del self._waiting[req.id]
            self._prefilling[req.id] = req
            used += req.rows

    def _prefill(self) -> None:
        """This step's prompt encoding: ``prefill_chunk`` x layers token-layers, shortest remaining work first (a short
        prompt is not held up behind a long one: one `encode_prefix` pass, as `generate_ids`), the rest to a long
        prompt's `_Prefill`; the oldest admitted request always gets a share, so none starves. A request whose
        prompt is done starts decoding in this step's call."""
        if not self._prefilling:
            return
        layers = self.model.config.num_hidden_layers
        budget = self.prefill_chunk * layers
        oldest = next(iter(self._prefilling.values()))
        left = lambda r: r.prefill.left if r.prefill is not None else len(r.prompt_ids) * layers  # noqa: E731
        for req in sorted(self._prefilling.values(), key=left):
            if budget <= 0 and req is not oldest:
                continue
            try:
                cached = self._cached_prompt(req)
                if cached is not None:  # encoded before: nothing to spend
                    spent = 0
                    self._start(req, cached)
                elif req.prefill is None and not self._chunks(req):  # one pass, as `generate_ids` encodes it
                    spent = left(req)
                    if spent > budget and req is not oldest:
                        continue
                    self._start(req, self._encode(req))
                else:
                    req.prefill = req.prefill or _Prefill(self.model, self._prompt(req))
                    spent = req.prefill.advance(max(budget, self.prefill_chunk))
                    if not req.prefill.left:
                        cache = req.prefill.cache()
                        self._remember(req, cache)
                        self._start(req, cache)
                        req.prefill = None
            except Exception as e:  # noqa: BLE001 - its sampler, its prompt's pass: this request fails alone
                self._fail(req, e)
                continue
            budget -= spent
            self.prefill_work += spent
            if req.prefill is None:
                del self._prefilling[req.id]
                self._running[req.id] = req

    def _cached_prompt(self, req: _Request) -> PrefixCache | None:
        """``req``'s prompt cache when the same prompt was encoded before (`_PromptCache`), else None."""
        if req.prefill is not None or not req.prompt_ids or not self.prompt_cache.limit:
            return None
        return self.prompt_cache.get(req.prompt_ids)

    def _encode(self, req: _Request) -> PrefixCache | None:
        """``req``'s prompt encoded in one pass (what `Decode` would do: `encode_prefix`, no padding), remembered;
        None for an empty prompt (the decode starts from an empty cache) or a model without `encode_prefix`."""
        if not req.prompt_ids or not hasattr(self.model, "encode_prefix"):
            return None
        cache = self.model.encode_prefix(self._prompt(req))
        self._remember(req, cache)
        return cache

    def _remember(self, req: _Request, cache: PrefixCache) -> None:
        if self.prompt_cache.limit:
            self.prompt_cache.put(req.prompt_ids, cache)

    def _chunks(self, req: _Request) -> bool:
        """Whether ``req``'s prompt is encoded over several steps: longer than ``prefill_chunk``, on a `BiGLMForMaskedLM`
        whose candidate lengths do not come from a length head (that head's pass reads the whole prompt at once)."""
        return (len(req.prompt_ids) > self.prefill_chunk and isinstance(self.model, BiGLMForMaskedLM)
                and not uses_length_head(self.model, req.config))

    def _prompt(self, req: _Request) -> torch.Tensor:
        return torch.tensor([req.prompt_ids], dtype=torch.long, device=self.device)

    def _fail(self, req: _Request, error: Exception) -> None:
        """``req`` alone ends with ``error`` (reported by the next event list); the other requests go on."""
        self._waiting.pop(req.id, None)
        self._prefilling.pop(req.id, None)
        self._running.pop(req.id, None)
        self._pool.remove(req)
        self._cancelled.append(EngineEvent(req.id, list(req.stable), list(req.stable), True, "error", req.calls,
                                           error=f"{type(error).__name__}: {error}"))

    def _start(self, req: _Request, cache: PrefixCache | None = None) -> None:
        """``req``'s decode set up, its prompt encoded in one pass or given (``cache``, a `_Prefill`'s)."""
        prompt = self._prompt(req)
        # (the load a moment ago counts for greedy requests only, whose answer is the same either way: a sampled one's
        # draw would then follow the clock)
        recent = req.config.temperature == 0.0 and time.monotonic() - self._loaded_at < LOAD_MEMORY_S
        loaded = not self._drafts_pay() or (recent and not getattr(self.model.model, "batch_invariant", False))
        if req.config.draft_length and req.config.draft_accept == 1.0 and loaded:
            # exact drafts only save calls; under this load (now, or a moment ago: `LOAD_MEMORY_S`) a call is bound by
            # arithmetic, where every checked position costs: one token per call writes the same answer (greedy;
            # sampled: the same distribution)
            req.config = _one_token_per_call(req.config)
        if req.config.draft_length:
            req.decode = SpeculativeDecode(self.model, prompt, config=req.config, suppress_ids=self.suppress,
                                           prompt_cache=cache, on_step=req.on_step)
            return
        # always cached: the merged call runs every request's suffix over its own cache, a view of the pool's rows
        req.decode = Decode(self.model, prompt, config=req.config, suppress_ids=self.suppress, use_cache=True,
                            reserve_cache=False, prompt_cache=cache, on_step=req.on_step)
        self._pool.add(req)

    @staticmethod
    def _moves_to_the_pool(req: _Request) -> bool:
        """Whether a running request decodes speculatively though the engine is loaded and may go on as one token per
        call in the pool instead (`_one_per_call`): exact drafts (greedy, ``draft_accept`` 1: the same answer either
        way; a sampled answer's draws would follow the load), and no one drawing its canvas (`on_step`)."""
        return (isinstance(req.decode, SpeculativeDecode) and not req.decode.finished and req.on_step is None
                and req.config.temperature == 0.0 and req.config.draft_accept == 1.0)

    def _one_per_call(self, req: _Request) -> None:
        """A greedy speculative request, started while the engine was idle, goes on as one token per call in the pool
        once the engine is loaded. Kept apart, it cost a call of its own beside every pooled call for the rest of its
        answer (a burst of requests into an idle engine: the first one started speculative). Its tokens so far stay
        (they were final); the last one, written by the last call, joins its cache as one token per call's held
        token would (seeing the cache and itself: one extra position), and a `Decode` of the rest starts from that
        cache with the prompt and those tokens as its prompt: the state one token per call would be in, so the same
        answer (float32; in bfloat16 a call's shape may move a near-tie, as drafting itself does)."""
        spec = req.decode
        written = spec.written_ids()
        try:
            cache = spec.cache
            if written:
                cache = self.model.encode_prefix(spec.answer[:, len(written) - 1:len(written)], past=cache)
                self.positions += 1
            config = _one_token_per_call(req.config, max_new_tokens=spec.N - len(written))
            decode = Decode(self.model, torch.tensor([req.prompt_ids + written], dtype=torch.long, device=self.device),
                            config=config, suppress_ids=self.suppress, use_cache=True, reserve_cache=False,
                            prompt_cache=cache)
        except Exception as e:  # noqa: BLE001 - (this request's own pass): it fails alone
            self._fail(req, e)
            return
        req.done_ids, req.done_logprobs = written, spec.logprobs[0, :len(written)].tolist()
        req.done_calls = spec.calls + bool(written)
        req.config, req.decode = config, decode
        self._pool.add(req)

    def _decode(self, reqs: list[_Request]) -> None:
        """One model call over every request's pending query (each one's held block first, as prefix tokens)."""
        speculative = [r for r in reqs if isinstance(r.decode, SpeculativeDecode)]
        if speculative:
            rest = [r for r in reqs if not isinstance(r.decode, SpeculativeDecode)]
            if rest and not self._drafts_pay():
                # under load a call is bound by arithmetic: merged, the speculative rows would pad every row to
                # their width and send every cache through a copy (`_decode_rules`); apart, the others keep the
                # pooled path at one position per token, and the speculative ones cost a call of their own
                self._decode_rules(speculative)
                self._decode(rest)
            else:
                self._decode_rules(reqs)
            return
        reqs = self._pool.order(reqs)  # (a leaving request's rows go to the last member: row order is not arrival's)
        segments = [r.decode.segment() for r in reqs]
        held = [0 if r.decode.held is None else r.decode.held.end - r.decode.held.start for r in reqs]
        width = max(seg_ids.shape[1] for seg_ids, _, _ in segments)
        # a one-slot query of a shift model runs without the slot's row (`AnswerDenoiser.trims`): its `where` has a
        # column more than its ids, the position after them; every row's `where` then gets that extra column
        nxt = int(any(seg_where.shape[1] > seg_ids.shape[1] for seg_ids, _, seg_where in segments))
        ids, valid, where, pos, lead = [], [], [], [], []
        for req, (seg_ids, seg_valid, seg_where), h in zip(reqs, segments, held):
            pad = (0, width - seg_ids.shape[1])
            ids.append(torch.nn.functional.pad(seg_ids, pad, value=req.run.mask_id))
            valid.append(torch.nn.functional.pad(seg_valid, pad, value=False))
            where.append(torch.nn.functional.pad(seg_where, (0, width + nxt - seg_where.shape[1]), value=False))
            # each row continues from its own cache: positions cache length onwards
            rows = seg_ids.shape[0]
            pos.append((req.decode.denoise.cache.length + torch.arange(width, device=self.device)).expand(rows, -1))
            lead.append(torch.full((rows,), h, dtype=torch.long, device=self.device))
        # (the batch-invariant mode lays each row's keys out itself: its calls get no room)
        pooled = self._pool.batch(reqs, width, room=not getattr(self.model.model, "batch_invariant", False))
        cache = pooled or PrefixCache.merge([r.decode.denoise.cache for r in reqs])
        where_all = torch.cat(where)
        self.positions += sum(x.shape[0] for x in ids) * width
        folded = any(held)
        # prefix_len counts keys from the merged cache's start: a row's held block is prefix, the rest suffix
        out = self.model(torch.cat(ids), prefix_cache=cache, attention_mask=torch.cat(valid).long(),
                         position_ids=torch.cat(pos), logits_positions=where_all,
                         prefix_len=cache.length + torch.cat(lead) if folded else None, return_cache=folded)
        counts = torch.stack([w.sum() for w in where]).tolist()
        absorbed = (self._pool.absorb(reqs, out["cache"], held, written=pooled.room is not None)
                    if pooled is not None and folded else None)
        self._hand_out(reqs, out, counts=counts, rows=[x.shape[0] for x in ids], leads=held, absorbed=absorbed)

    def _decode_rules(self, reqs: list[_Request]) -> None:
        """One model call over every request's pending query when a speculative one is among them: its drafted
        branches need an explicit attention rule, and the model takes a rule or a prefix split, not both, so every
        row is said as a rule (`_as_tree`). Rows are right-padded to the widest (masked keys, queries that see
        everything, read by no one); each request's cache columns sit at the right end of the merged cache's."""
        start = time.perf_counter()
        model_drafts, n_rows = self._drafts_pay(), sum(r.rows for r in reqs)
        speculative = [r.decode for r in reqs if isinstance(r.decode, SpeculativeDecode)]
        for decode in speculative:  # the mask blocks that draft the next call cost (m + 1)^2 positions: only while
            decode.drafts_pay(model_drafts, rows=n_rows)  # drafts pay (and draft_fill's, while measured to pay)
        calls = [self._as_tree(r) if isinstance(r.decode, Decode) else (r.decode.segment(), None) for r in reqs]
        cache = PrefixCache.merge([r.decode.cache for r in reqs])
        C, width = cache.length, max(call.ids.shape[1] for call, _ in calls)
        # a call read at the position after its rows (`TreeCall.next`): every row is read in rows of width + 1, the
        # last the model's next position (a narrower row's is its first padding column, shifted from its last row)
        nxt = int(any(call.next for call, _ in calls))
        ids, valid, pos, rules, read = [], [], [], [], []
        base = 0  # merged rows before this request's
        for call, keys in calls:
            rows, w = call.ids.shape
            own = call.rule.shape[2] - w  # the request's own cache length
            pad = (0, width - w)
            # (padding queries are read by no one: a plain token, so the mask adapters run only where masks are)
            ids.append(torch.nn.functional.pad(call.ids, pad, value=self._plain_id))
            keys = torch.ones_like(call.ids, dtype=torch.bool) if keys is None else keys
            valid.append(torch.nn.functional.pad(keys, pad, value=False))
            pos.append(torch.nn.functional.pad(call.positions, pad))
            rule = torch.zeros(rows, width, C + width, dtype=torch.bool, device=self.device)
            rule[:, w:] = True  # padded queries see everything (so no attention row is empty); no one reads them
            rule[:, :w, C - own:C] = call.rule[:, :, :own]
            rule[:, :w, C:C + w] = call.rule[:, :, own:]
            rules.append(rule)
            stride = w + int(call.next)
            read.append((base + call.read // stride) * (width + nxt) + call.read % stride)
            base += rows
        self.positions += base * width
        lead = max(call.lead for call, _ in calls)
        out = self.model(torch.cat(ids), prefix_cache=cache, attention_mask=torch.cat(valid).long(),
                         position_ids=torch.cat(pos), attention_rule=torch.cat(rules),
                         logits_positions=torch.cat(read), return_cache=lead > 0, next_position=bool(nxt))
        self._hand_out(reqs, out, counts=[call.read.numel() for call, _ in calls],
                       rows=[call.ids.shape[0] for call, _ in calls], leads=[call.lead for call, _ in calls])
        costs = draft_costs(self.model)
        if costs is not None and len(speculative) == len(reqs) and all(d.called_pending == 1 for d in speculative):
            # a call with nothing to check, whole: its time feeds the model's table of costs (`DraftCosts`)
            costs.timed(n_rows, any(bool(d.block) for d in speculative), time.perf_counter() - start)

    def _hand_out(self, reqs: list[_Request], out, *, counts: list[int], rows: list[int], leads: list[int],
                  absorbed: list[PrefixCache | None] | None = None) -> None:
        """Give each request its logits (``counts`` of them, in order) and, when its call led with cache-bound
        tokens (``leads``: a held block, or speculative pending tokens), their keys/values: its ``rows`` of the
        merged call's cache, their leading positions (hidden states too, for a shift model); or, ``absorbed``, its
        cache with them already written (`_CachePool.absorb`)."""
        row, failed = 0, []
        parts = out.logits.split(counts)
        drawn = self._draws(reqs, out.logits, parts)
        for i, (req, part, n, lead) in enumerate(zip(reqs, parts, rows, leads)):
            block = None
            if lead and absorbed is None:
                block = out["cache"].rows(row, n).first(lead)  # the request's rows of the call's keys/values
            row += n
            try:  # its sampling and its cache's growth are this request's own: a failure ends it alone
                if absorbed is not None and absorbed[i] is not None:
                    req.decode.answered(part, absorbed=absorbed[i], drawn=drawn[i])
                elif drawn[i] is not None:
                    req.decode.answered(None, block, drawn=drawn[i])
                else:
                    req.decode.answered(part, block)
                if isinstance(req.decode, Decode):
                    self._pool.sync(req)
            except Exception as e:  # noqa: BLE001
                failed.append((req, e))
        for req, e in failed:  # (after the loop: leaving moves the pool's rows)
            self._fail(req, e)

    @staticmethod
    def _draws(reqs: list[_Request], logits: torch.Tensor, parts: tuple[torch.Tensor, ...],
               ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """The greedy iterative-unmasking requests' tokens drawn from the call's logits in one pass per set of banned
        tokens (`decoding.draw_greedy`; the same draws as each request's own), None for the others (they draw as they
        answer). A request whose draw fails ends alone, as when it draws itself: its group draws one by one."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, req in enumerate(reqs):
            run = req.run
            if run is not None and isinstance(run.pending, Query) and run.greedy_key is not None:
                groups.setdefault(run.greedy_key, []).append(i)
        drawn: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(reqs)
        for members in groups.values():
            if len(members) < 2:
                continue
            whole = len(members) == len(reqs)  # (every request's rows, in order: the logits as they are)
            rows = logits if whole else torch.cat([parts[i] for i in members])
            try:
                draws = draw_greedy([reqs[i].run for i in members], rows, [parts[i].shape[0] for i in members])
            except Exception:  # noqa: BLE001 - (each then draws itself, and a failure ends that request alone)
                continue
            for i, d in zip(members, draws):
                drawn[i] = d
        return drawn

    def _as_tree(self, req: _Request) -> tuple[TreeCall, torch.Tensor]:
        """An iterative-unmasking request's query said as an attention rule (what its prefix split means): every
        query sees the request's cache; its held block's queries see the block, the others the whole segment.
        With it, the segment's key mask (R, w): a shorter length candidate's slots are padding."""
        ids, valid, where = req.decode.segment(trim=False)
        rows, w = ids.shape
        h = 0 if req.decode.held is None else req.decode.held.end - req.decode.held.start
        own = req.decode.denoise.cache.length
        q = torch.arange(w, device=self.device)
        held = q[None, :] < h
        if self.model.config.prefix_attention == "causal":  # a causal model reads its held block causally (the
            held = held & (q[None, :] <= q[:, None])        # prefix split's meaning for it: blocks of 1)
        tail = (q[:, None] >= h) | held  # (w, w): held queries see the held block only
        rule = torch.cat((tail.new_ones(w, own), tail), 1).expand(rows, w, own + w)
        positions = (own + q).expand(rows, -1)
        return TreeCall(ids=ids, positions=positions, rule=rule, read=where.reshape(-1).nonzero().squeeze(1),
                        lead=h), valid

    def _best_row(self, run: DecodeRun) -> int:
        if run.valid.shape[0] == 1:
            return 0
        p = run.progress.probs
        seen = p > 0
        score = torch.where(seen, p.clamp_min(torch.finfo(torch.float32).tiny).log(), 0.0).sum(1) / seen.sum(1).clamp_min(1)
        return int(score.argmax())

    def _report(self, req: _Request) -> EngineEvent:
        if req.decode.finished:  # the answer generate_ids would return
            out = req.decode.output()
            own = out.token_lists()[0]
            tokens = req.done_ids + own
            reason = "stop" if int(out.lengths[0]) < int(out.candidate_length[0]) else "length"
            if reason == "length" and self._stop_hit(req, tokens):
                reason = "stop"
            return self._finish(req, tokens, reason, req.done_logprobs + out.token_logprobs[0, :len(own)].tolist())
        shown, stable = self._progress(req)
        if stable is not None:
            if len(stable) > len(req.stable):
                probs = (req.decode.logprobs[0] if isinstance(req.decode, SpeculativeDecode) else
                         req.run.progress.probs[0].clamp_min(torch.finfo(torch.float32).tiny).log())
                req.logprobs = req.done_logprobs + probs[:len(stable) - len(req.done_ids)].tolist()
            eos = self.model.config.eos_token_id
            if eos is not None and eos in stable:
                return self._finish(req, stable[: stable.index(eos)], "stop", req.logprobs[:stable.index(eos)])
            if self._stop_hit(req, stable):
                return self._finish(req, stable, "stop", req.logprobs)
            req.stable = stable
        return EngineEvent(req.id, shown, list(req.stable), False, None, req.calls, logprobs=list(req.logprobs))

    def _progress(self, req: _Request) -> tuple[list[int], list[int] | None]:
        """A running request's answer so far (its written slots) and its stable part (None: nothing is stable yet,
        as with a length beam, whose winner is open until the end). A speculative request's written tokens are
        final; iterative unmasking's stable part is its leading run of final slots."""
        if isinstance(req.decode, SpeculativeDecode):
            written = req.decode.written_ids()
            return written, written
        run = req.run
        row = self._best_row(run)
        answer, final, valid = run.progress.answer[row], run.progress.final[row], run.valid[row]
        shown = req.done_ids + answer[valid & (answer != run.mask_id)].tolist()
        if run.valid.shape[0] > 1:
            return shown, None
        lead = int((final & valid).long().cumprod(0).sum())  # leading run of final slots
        return shown, req.done_ids + answer[:lead].tolist()

    def _stop_hit(self, req: _Request, ids: list[int]) -> bool:
        if not req.config.stop or not ids:
            return False
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return cut_at_stop(text, req.config.stop) != text

    def _finish(self, req: _Request, tokens: list[int], reason: str, logprobs: list[float] | None = None) -> EngineEvent:
        del self._running[req.id]
        self._pool.remove(req)
        req.stable = tokens
        return EngineEvent(req.id, list(tokens), list(tokens), True, reason, req.calls, logprobs=logprobs)
