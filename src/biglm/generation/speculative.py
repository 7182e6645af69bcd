"""Speculative decoding: confidence decoding at blocks of 1 (one token per call), in fewer calls.

A `biglm-blocks` model decoding one token per call (``strategy="confidence", block_length=1``, the append cache) runs,
per call, the answer's last token as a block of one (it sees the cache and itself; its keys/values are final) and one
mask for the next slot (it sees everything). That is an autoregressive model made of masks: exact and linear, but one
call per token. This module writes the same answer with
several tokens per call, drafting them with the model itself (the masks of a block predict several slots in one pass)
and checking each draft under the one-token-per-call condition in the same pass.

One call, for ``draft_length`` m and W = m + 1, per row (``tree_rule`` builds who sees whom):
- ``pending``: the last committed token c and the m drafts d_1..d_m for the slots after it, each a block of one (token
  i sees the cache and tokens 0..i: the keys/values one-token-per-call decoding computes for them, if they are kept);
- W groups; group j (j = 0..m) sees the cache and pending tokens 0..j, i.e. the answer as it is if d_1..d_j are right:
  * its check, a mask at the slot after d_j that sees only that and itself: exactly the mask of one-token-per-call
    decoding, so its prediction p_j is what that decoding would write there;
  * a block of W masks from that slot on, seeing each other (a suffix block, as in training): the predictions of its
    masks after the first are the next call's drafts, should the answer stop at d_j.
Then d_1..d_a are kept while each agrees with the check before it (greedy: d_j = argmax p_{j-1}; ``draft_accept`` < 1:
p_{j-1}(d_j) >= draft_accept * max p_{j-1}; sampling: with probability p_{j-1}(d_j), as in speculative sampling), the
check p_a writes one more token (on a rejection when sampling: from p_a without the rejected draft, which keeps
the one-token-per-call distribution), group a's masks give the next drafts, and pending tokens 0..a join the cache. A
call writes a + 1 tokens and runs W + W(W + 1) positions (logits at W² of them). The first call has no pending tokens
and one group.

With n-gram drafts instead (``draft_model`` false, ``draft_ngram``) a call carries no mask block: the pending tokens
and their checks alone; one that has nothing to check (no n-gram matched) carries the one group's block of W masks
with ``draft_fill``, so the next call has the model's drafts to check (a call of 1 + W positions costs about what one
of 2 costs on a CPU at batch 1).

A shift model (``shift_logits``: converted from an autoregressive checkpoint, a row's logits are the previous row's
hidden state) needs no check rows: one-token-per-call decoding predicts the slot after a token from that token's own
row (it sees the cache and itself), so pending token j's row is check j, read one row later; group j is the block of
W masks alone, its drafts read at its rows 1..m. A call then runs W + W·W positions.

Greedy with ``draft_accept=1`` the answer equals confidence decoding at blocks of 1, one token per call (tested token
for token, batches of different prompt lengths included), in float32. In bfloat16 a call of 24 positions rounds
differently from a call of 3, so a near-tie can flip and the two answers part from there.
Rows of a batch keep different numbers of drafts: a call appends the widest row's pending tokens to the cache and
marks the others' extra ones as padding keys.

The step logic is one state machine, `SpeculativeDecode` (the contract of `decoding.Decode`: `segment`, `answered`,
`output`): `speculative_generate` runs one over a batch with calls of its own; the server's `engine.DecodeEngine` runs
one per request and merges its call with other requests' rows (tested token for token against `generate_ids`, in
float32; in bfloat16 only with a batch-invariant model, `load_model(..., batch_invariant=True)`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..model.modeling import PrefixCache
from .config import DecodingConfig, for_model
from .decoding import GenerationOutput, StepCallback, StepInfo, _unchecked
from .sampling import filter_logits


SOURCES = ("model", "ngram", "repeat")  # where drafts come from (`SpeculativeDecode.source`)
DRAFT_ROWS = 4
"""Rows up to which a call drafts with the model's mask blocks: a call of so few rows is bound by reading the weights,
so checked drafts cost next to nothing; above it a CPU call is bound by arithmetic and the (m + 1)^2 positions of the
mask blocks cost more than their drafts save (measured: docs/LOG.md). The server's engine reads it too; a benchmark
of the model's drafts decodes one prompt at a time."""


def tree_rule(*, pending: int, width: int, checks: bool = True, block: int | None = None,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """(L, L) bool: which of a speculative call's own rows each row may see (module docstring); every row also sees
    the whole cache. Rows: ``pending`` tokens (0 on the first call), then max(pending, 1) groups: with ``checks``,
    the check, then a block of ``block`` masks (default ``width``), the first at the check's slot; without (a shift
    model, whose checks are the pending tokens' own rows), the block of masks alone. ``block`` 0 (n-gram drafts only:
    no mask drafts the next call) leaves the groups their checks alone, and a shift model one row after the pending
    tokens, whose logits are the last pending token's (its own row sees itself only, and no one reads it)."""
    block = width if block is None else block
    groups, size = max(pending, 1), block + int(checks)
    carrier = int(not checks and block == 0)
    L = pending + groups * size + carrier
    rule = torch.zeros(L, L, dtype=torch.bool, device=device)
    k = torch.arange(pending, device=device)
    rule[:pending, :pending] = k[None, :] <= k[:, None]  # pending tokens: blocks of one
    for j in range(groups if size else 0):
        start = pending + j * size
        if pending:
            rule[start:start + size, :j + 1] = True  # the answer as it is if d_1..d_j are right
        if checks:
            rule[start, start] = True  # the check: its own slot only
        first = start + int(checks)
        rule[first:start + size, first:start + size] = True  # the drafts: a block of masks
    if carrier:
        rule[L - 1, L - 1] = True
    return rule


def tree_offsets(*, pending: int, width: int, checks: bool = True, block: int | None = None,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """(L,) long: each row's position relative to the first unwritten slot (pending token i: i - 1; group j: its
    check j (with ``checks``), then its block j, j + 1, ..., j + block - 1; a shift model's row after the pending
    tokens with ``block`` 0: the slot after them)."""
    block = width if block is None else block
    groups = max(pending, 1)
    own = torch.arange(pending, device=device) - 1
    grid = torch.arange(groups, device=device)[:, None] + torch.arange(block, device=device)[None, :]
    if checks:
        grid = torch.cat((torch.arange(groups, device=device)[:, None], grid), 1)
    tail = [own, grid.reshape(-1)]
    if not checks and block == 0:
        tail.append(torch.full((1,), max(pending - 1, 0), dtype=torch.long, device=device))
    return torch.cat(tail)


def tree_predictions(*, pending: int, width: int, checks: bool = True, block: int | None = None,
                     device: torch.device | str = "cpu") -> torch.Tensor:
    """(G * max(block, 1),) long: the rows whose logits a call reads, group by group: the check, then the drafts (the
    block's masks after the check's slot; the block's first mask only gives them context).

    Without ``checks`` (a shift model: a row's logits are the previous row's hidden state, the first row's the
    cache's last), group j's check is the logits of row j + 1: those of pending token j, the answer's last token if
    d_1..d_j are right (row ``pending`` is group 0's first mask, or with ``block`` 0 the row after the pending
    tokens, whose logits are pending token m's), or row 0 on the first call (the prompt's last position); its drafts
    are the logits of its block's rows 1..block-1, i.e. its masks at slots j..j+block-2 predicting the slots after
    them."""
    block = width if block is None else block
    groups, size = max(pending, 1), block + int(checks)
    starts = pending + torch.arange(groups, device=device)[:, None] * size
    if checks:
        within = torch.cat((torch.zeros(1, dtype=torch.long, device=device), torch.arange(2, max(size, 2), device=device)))
        return (starts + within[None, :]).reshape(-1)
    check = (torch.arange(groups, device=device) + 1 if pending else torch.zeros(1, dtype=torch.long, device=device))
    drafts = starts + torch.arange(1, max(block, 1), device=device)[None, :]
    return torch.cat((check[:, None], drafts), 1).reshape(-1)


def tree_layout(parents: torch.Tensor, *, checks: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layout of a call over a tree of drafts (``draft_branches`` > 1; no mask block): ``parents`` (B, n), each
    pending token's parent among the pending tokens (-1 for the first, the last committed token c; a parent comes
    before its children). Each pending token is a block of one that sees the cache, its ancestors and itself: the
    keys/values one-token-per-call decoding computes for it if its path is the answer. Returns

    - rule (B, L, L) bool, which of the call's rows each row sees;
    - offsets (B, L) long, each row's position relative to the first unwritten slot (a token at depth d: d - 1);
    - read (n,) long, the row whose logits are each pending token's check: with ``checks``, its check row n + i (a
      mask at the slot after it, seeing what it sees and itself); without (a shift model), row i + 1, whose logits are
      row i's hidden state (a carrier row after the tokens, read by no one).

    A chain (parents i - 1) gives `tree_rule` / `tree_offsets` / `tree_predictions` with ``block`` 0."""
    B, n = parents.shape
    device = parents.device
    eye = torch.eye(n, dtype=torch.bool, device=device)
    seen = eye.expand(B, n, n).clone()  # seen[b, i, j]: j is i or an ancestor of i
    depth = torch.zeros(B, n, dtype=torch.long, device=device)
    up = parents.clone()
    while bool((up >= 0).any()):
        has = up >= 0
        seen |= eye[up.clamp(min=0)] & has[..., None]
        depth += has.long()
        up = torch.where(has, parents.gather(1, up.clamp(min=0)), up)
    L = 2 * n if checks else n + 1
    rule = torch.zeros(B, L, L, dtype=torch.bool, device=device)
    rule[:, :n, :n] = seen
    if checks:
        rule[:, n:, :n] = seen
        rule[:, n:, n:] = eye
        offsets = torch.cat((depth - 1, depth), 1)
        read = n + torch.arange(n, device=device)
    else:
        rule[:, n, n] = True
        offsets = torch.cat((depth - 1, depth.max(1, keepdim=True).values), 1)
        read = torch.arange(1, n + 1, device=device)
    return rule, offsets, read


def ngram_drafts(history: torch.Tensor, *, length: int, max_n: int, count: int = 1, min_n: int = 1,
                 ) -> list[torch.Tensor]:
    """Up to ``count`` different drafts of up to ``length`` tokens: what followed earlier occurrences of
    ``history``'s last n tokens, the latest first, for the largest n from ``max_n`` down to ``min_n`` first (prompt
    lookup decoding, as vLLM's n-gram speculator: drafts that cost no model work, strong where the answer repeats the
    prompt or itself). A draft that begins another one already found adds nothing and is skipped. ``history`` (L,):
    the prompt's tokens, then the answer's so far."""
    L, found = history.numel(), []
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        starts = history[:L - 1].unfold(0, n, 1)  # windows followed by at least one token
        hits = (starts == history[L - n:]).all(1).nonzero().squeeze(1).tolist()
        for start in reversed(hits[-64:]):  # (the latest 64 occurrences: enough different continuations)
            draft = history[start + n:start + n + length]
            if not any(torch.equal(f[:draft.numel()], draft) for f in found):
                found.append(draft)
                if len(found) == count:
                    return found
    return found


def ngram_draft(history: torch.Tensor, *, length: int, max_n: int, min_n: int = 1) -> torch.Tensor | None:
    """Up to ``length`` tokens that followed the latest earlier occurrence of ``history``'s last n tokens, for the
    largest n from ``max_n`` down to ``min_n`` that occurs (`ngram_drafts`' first); None when none occurs."""
    found = ngram_drafts(history, length=length, max_n=max_n, min_n=min_n)
    return found[0] if found else None


FILL_MIN_CHECKS = 4
"""Checks of the model's drafts a `DraftCosts` counts before it may find ``draft_fill``'s block not paying."""
FILL_PROBE_EVERY = 32
"""Calls with nothing to check after which a block found not paying rides once again, so that a change in the drafts
or the machine is seen (`DraftCosts.pays`)."""


class DraftCosts:
    """Whether ``draft_fill``'s mask block pays on this machine, measured as decoding goes: the table of a model
    loaded for inference (`draft_costs`), shared by every decode of it.

    A call with nothing to check (one pending token) either carries the block of W masks, and the next call checks its
    drafts, or carries none. With t_block and t_plain the time of such a call each way (at the call's row count:
    a moving average of the calls as they run, the first of each kind skipped as a warm-up) and g the model's drafts
    kept per check (decayed sums over the calls that checked them), the block pays when (1 + g) * t_plain >= t_block:
    its call plus the tokens its drafts save cost no more than plain calls writing them. Where a call of W more
    positions costs what one of 2 does (a GPU, a CPU bound by reading the weights) it rides; where each position costs
    (this project's AVX2 CPU: a mask block also runs the mask adapters) it does not. Each kind is measured before the
    first decision (a block, then a call without), the drafts' yield after `FILL_MIN_CHECKS` checks; a block found
    not paying rides again every `FILL_PROBE_EVERY` calls with nothing to check. Only for greedy exact decoding in
    float32, whose answer does not depend on the drafts (a sampled answer's draws, or a bfloat16 call's rounding, would
    then follow the clock)."""

    def __init__(self, *, smoothing: float = 0.3, decay: float = 0.98) -> None:
        self.smoothing, self.decay = smoothing, decay
        self.seconds: dict[tuple[int, bool], float] = {}  # (rows, block) -> moving average of a call's seconds
        self.seen: dict[tuple[int, bool], int] = {}  # calls of each kind timed (the first skipped)
        self.kept = self.checked = 0.0  # the model's drafts kept, and checks of them (decayed sums)
        self.checks = 0  # checks of them counted
        self.waited = 0  # calls with nothing to check since a block last rode while found not paying

    def timed(self, rows: int, block: bool, seconds: float) -> None:
        """A call with one pending token, of ``rows`` rows, with or without the block, took ``seconds``."""
        key = (rows, block)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] == 1:
            return  # (a first call of a shape: the kernels' set-up)
        old = self.seconds.get(key)
        self.seconds[key] = seconds if old is None else old + self.smoothing * (seconds - old)

    def gave(self, kept: int, checked: int) -> None:
        """A call checked ``checked`` rows' drafts from the model and kept ``kept`` of their tokens."""
        if checked:
            self.checks += checked
            self.kept = self.kept * self.decay + kept
            self.checked = self.checked * self.decay + checked

    def gain(self) -> float | None:
        """The model's drafts kept per check, None before `FILL_MIN_CHECKS` checks."""
        return self.kept / self.checked if self.checks >= FILL_MIN_CHECKS else None

    def pays(self, rows: int) -> bool:
        """Whether the next call with nothing to check, of ``rows`` rows, carries the block."""
        block, plain = self.seconds.get((rows, True)), self.seconds.get((rows, False))
        if block is None:
            return True  # (measured first: a call with the block)
        if plain is None:
            return False  # (then one without)
        g = self.gain()
        if g is None or (1.0 + g) * plain >= block:
            return True
        self.waited += 1
        if self.waited >= FILL_PROBE_EVERY:
            self.waited = 0
            return True
        return False


def draft_costs(model: torch.nn.Module) -> DraftCosts | None:
    """The model's table of draft costs (made on first use), or None for a model not loaded for inference by
    `checkpoint.load_model` (its ``measure_drafts``): a model built or trained in-process keeps every block."""
    if not getattr(model, "measure_drafts", False):
        return None
    costs = model.__dict__.get("draft_costs")
    if costs is None:
        costs = model.__dict__["draft_costs"] = DraftCosts()
    return costs


class TreeCall(NamedTuple):
    """One speculative call's input for the rows of a `SpeculativeDecode`, as `SpeculativeDecode.segment` gives it
    (whoever makes the call may merge it with other requests' rows)."""

    ids: torch.Tensor
    """(B, L) the pending tokens, then mask tokens."""
    positions: torch.Tensor
    """(B, L) each row's RoPE positions."""
    rule: torch.Tensor
    """(B, L, C + L) bool, which keys each query sees: the decode's own cache (C keys), then the call's rows."""
    read: torch.Tensor
    """(B * G * W,) long, the rows whose logits `answered` wants, as indices into the flattened (B * L) call."""
    lead: int
    """Leading tokens whose keys/values may join the cache (the pending ones; 0 on the first call): `answered`
    wants the call's cache of at least these positions."""
    next: bool = False
    """``read`` indexes rows of L + 1 positions, the last the one after the call's rows (a shift model's call with
    nothing masked, made without the carrier row `tree_rule` lays out: the model's ``next_position``)."""


class SpeculativeDecode:
    """Speculative decoding of B left-padded prompts as a state machine (the module docstring), independent of who
    calls the model: `segment` gives the pending call, `answered` takes its logits and cache, `finished` says when
    to stop and `output` gives the answers. The same contract as `decoding.Decode`, so the server's
    `engine.DecodeEngine` runs one per request inside merged calls, and `speculative_generate` one over a batch with
    calls of its own (`step`): one implementation of the step logic for both.

    Set-up: the prompt encoded into the decode's own `PrefixCache` (one pass, counted in `output`'s work), with room
    reserved for the answer and a last call's overshoot (N + W slots, `PrefixCache.reserve`: each call's kept tokens
    are written in place, not a copy of the whole cache per call; ``reserve_cache`` False copies, for checking), the
    sampler's stream (``generator``, default seeded with ``config.seed``)."""

    def __init__(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None, *,
                 config: DecodingConfig, generator: torch.Generator | None = None, suppress_ids: Sequence[int] = (),
                 on_step: StepCallback | None = None, reserve_cache: bool = True,
                 prompt_cache: PrefixCache | None = None) -> None:
        self.config = cfg = for_model(config, model.config)
        self.model, self.on_step = model, on_step
        mc = model.config
        if not cfg.draft_length:
            raise ValueError("SpeculativeDecode runs speculative decoding: set draft_length >= 1 (iterative unmasking "
                             "is decoding.Decode).")
        self.checks = not getattr(mc, "shift_logits", False)  # a shift model's checks are its pending tokens' own rows
        B, P = prompt_ids.shape
        N, m = cfg.max_new_tokens, cfg.draft_length
        self.B, self.P, self.N, self.m, self.W = B, P, N, m, m + 1
        W = self.W
        device = self.device = prompt_ids.device
        if P + N > mc.max_position_embeddings:
            raise ValueError(f"prompt ({P}) + answer ({N}) tokens exceed max_position_embeddings="
                             f"{mc.max_position_embeddings}: shorten the prompt or max_new_tokens.")
        if prompt_mask is None:
            prompt_mask = torch.ones_like(prompt_ids)
        self.generator = generator if generator is not None else torch.Generator(device=device).manual_seed(cfg.seed)
        self.mask_id, self.eos_id, pad_id = mc.mask_token_id, mc.eos_token_id, mc.pad_token_id
        banned = {self.mask_id, *suppress_ids}
        if cfg.ignore_eos and self.eos_id is not None:
            banned.add(self.eos_id)
        if pad_id is not None and pad_id != self.eos_id:
            banned.add(pad_id)
        self.banned = torch.tensor(sorted(i for i in banned if 0 <= i < mc.vocab_size), dtype=torch.long, device=device)
        self.fill = pad_id if pad_id is not None else (self.eos_id if self.eos_id is not None else 0)
        self.answer = torch.full((B, N + W), self.mask_id, dtype=torch.long, device=device)  # a last call's overshoot
        self.logprobs = torch.zeros(B, N + W, dtype=torch.float32, device=device)
        self.written = torch.zeros(B, dtype=torch.long, device=device)  # tokens committed per row
        self.active = torch.ones(B, dtype=torch.bool, device=device)
        self.rows = torch.arange(B, device=device)
        self.slots = torch.arange(W, device=device)[None, :]
        # the mask blocks that draft the next call (``draft_model``; the engine may drop them for a step), and the one
        # a call without drafts to check carries (``draft_fill``; dropped alike)
        self.model_drafts, self.fill_drafts = cfg.draft_model, cfg.draft_fill
        # where the model's table of costs says whether draft_fill's block pays (greedy exact float32 only)
        exact = cfg.temperature == 0.0 and cfg.draft_accept == 1.0
        self.costs = (draft_costs(model) if cfg.draft_measure and cfg.draft_fill and not cfg.draft_model and exact
                      and next(model.parameters()).dtype == torch.float32 else None)
        self.called_pending = 0  # the pending tokens of the call `segment` last gave
        self.branches = cfg.draft_branches
        self.layouts = {(n, b): tuple(f(pending=n, width=W, checks=self.checks, block=b, device=device)
                                      for f in (tree_rule, tree_offsets, tree_predictions))
                        for n, b in ((0, W), (1, W), (W, W), (0, 0), (1, 0), (W, 0))}  # by pending tokens and mask block
        self.calls = self.forward_calls = self.positions = 0
        self.row_calls = torch.zeros(B, dtype=torch.long, device=device)  # calls each row took part in
        # n-gram drafts (``draft_ngram``) look up each row's own text: its prompt's tokens, then its answer's
        self.prompts = [row[keep.bool()] for row, keep in zip(prompt_ids, prompt_mask)] if cfg.draft_ngram else []
        # where each row's pending drafts came from (`SOURCES`: the model's masks, an n-gram, or the last token repeated
        # where a call without mask drafts found no n-gram for a row beside one that did)
        self.source = torch.zeros(B, dtype=torch.long, device=device)
        self.kept_by_source = dict.fromkeys(SOURCES, 0)  # drafts kept, by source
        self.kept_counts = torch.zeros(len(SOURCES), W, dtype=torch.long, device=device)  # calls keeping 0..m drafts
        with _unchecked(model):
            if P:  # (``prompt_cache``: this pass made elsewhere, the server's engine's over several steps)
                padded = not bool(prompt_mask.all())
                self.cache = (model.encode_prefix(prompt_ids, prompt_mask if padded else None)
                              if prompt_cache is None else prompt_cache)
                self.forward_calls, self.positions = 1, B * P
            else:
                param = next(model.parameters())
                self.cache = PrefixCache.empty(mc, batch=B, device=device, dtype=param.dtype)
        # a row appends at most N + W tokens; a batch's cache grows by its widest row per call, so it may outgrow
        # this (then one copy into new buffers with N + W free slots again)
        if reserve_cache:
            self.cache = self.cache.reserve(N + W)
        # where each row's answer starts (B, 1): after its prompt as the model placed it (`BiGLMModel.next_positions`:
        # its real tokens counted in the batch-invariant mode, so a left-padded row's answer sits where it would alone)
        base = getattr(model, "model", None)
        self.start = (base.next_positions(prompt_mask.bool()) if hasattr(base, "next_positions")
                      else torch.full((B,), P, dtype=torch.long, device=device))[:, None]
        self.pending = prompt_ids[:, :0]  # (B, 0) on the first call, then (B, W): the last token and m drafts
        # ``draft_branches`` > 1: the pending tokens as a tree (`tree_layout`): each one's parent among them, whether it
        # is a real draft (rows of a batch are padded to the largest tree) and where it came from (`SOURCES`); None
        # while the pending tokens are a chain
        self.parents: torch.Tensor | None = None
        self.node_valid = self.node_source = None
        self.finished = False

    def drafts_pay(self, pays: bool, *, rows: int | None = None) -> None:
        """Whether the next call may carry the model's mask drafts (``draft_model``'s blocks, ``draft_fill``'s one)
        and more than one draft (``draft_branches``): while a call is bound by reading the weights (few rows), where
        they cost next to nothing (`DRAFT_ROWS`); ``draft_fill``'s block also only while it pays on this machine
        (`DraftCosts`, for a call of ``rows`` rows: default this decode's)."""
        self.model_drafts = self.config.draft_model and pays
        self.fill_drafts = self.config.draft_fill and pays and (
            self.costs is None or self.pending.shape[1] > 1 or self.costs.pays(self.B if rows is None else rows))
        self.branches = self.config.draft_branches if pays else 1  # (a tree's further drafts: positions too)

    def timed(self, seconds: float, *, rows: int | None = None) -> None:
        """The call `segment` last gave took ``seconds`` (a call of ``rows`` rows, default this decode's): one with
        nothing to check feeds the model's table of costs (`DraftCosts`)."""
        if self.costs is not None and self.called_pending == 1:
            self.costs.timed(self.B if rows is None else rows, bool(self.block), seconds)

    def segment(self) -> TreeCall:
        """The pending call over this decode's rows and its own cache (`TreeCall`)."""
        n, nxt = self.pending.shape[1], False
        # this call's mask block (`answered` reads it): every call's with the model's drafts, else a call's that has
        # nothing to check (its last token alone, or the first call)
        self.block = self.W if self.model_drafts or (self.fill_drafts and n <= 1) else 0
        self.called_pending = n
        B, C = self.B, self.cache.length
        if self.parents is not None:  # a tree of drafts (never with a mask block: `_tree_drafts`)
            tail, offsets, read = tree_layout(self.parents, checks=self.checks)
            L = tail.shape[1]
            rule = torch.cat((tail.new_ones(B, L, C), tail), 2)
        else:
            tail, offsets, read = self.layouts[n, self.block]
            if n and not self.checks and not self.block:  # a shift model's carrier row, only there to carry the last
                tail, offsets = tail[:-1, :-1], offsets[:-1]  # token's prediction: the model's next position instead
                nxt = True
            L = tail.shape[0]
            rule = torch.cat((tail.new_ones(L, C), tail), 1).expand(B, L, C + L)
        self.width = L
        # the rows after the pending tokens: masks (checks and blocks), or only a shift model's carrier row (no block),
        # which sees itself alone and is read by no one: a plain token there, so that such a call runs no mask adapter
        # (they act where a mask token stands: `BiGLMModel.forward`'s gate)
        carrier = not self.checks and not self.block
        ids = torch.cat((self.pending, self.pending.new_full((B, L - n), self.fill if carrier else self.mask_id)), 1)
        return TreeCall(ids=ids, positions=self.start + self.written[:, None] + offsets, rule=rule,
                        read=(self.rows[:, None] * (L + nxt) + read).reshape(-1), lead=n, next=nxt)

    def step(self) -> None:
        """Make the pending call alone (this decode's rows only) and take its answer."""
        call = self.segment()
        out = self.model(call.ids, prefix_cache=self.cache, position_ids=call.positions, attention_rule=call.rule,
                         logits_positions=call.read, return_cache=call.lead > 0, next_position=call.next)
        self.answered(out.logits, out["cache"] if call.lead else None)

    def answered(self, logits: torch.Tensor, block: PrefixCache | None = None) -> None:
        """The pending call answered (made here or merged elsewhere): its logits at `TreeCall.read`, (B * G * W, V),
        and, after the first call, the call's keys/values of this decode's rows (their first `TreeCall.lead`
        positions at least). Keeps the drafts the checks accept, writes one more token, lets the kept pending tokens'
        keys/values join the cache and takes the next drafts (the module docstring)."""
        if self.finished:
            raise RuntimeError("the decode is finished: nothing is pending.")
        cfg, B, N, m, W = self.config, self.B, self.N, self.m, self.W
        rows, slots, active, generator = self.rows, self.slots, self.active, self.generator
        pending = self.pending
        n = pending.shape[1]
        if n and block is None:
            raise ValueError("the pending tokens' keys/values join the cache: pass the call's cache for this decode.")
        L, G = self.width, max(n, 1)
        self.calls, self.forward_calls, self.positions = self.calls + 1, self.forward_calls + 1, self.positions + B * L
        logits = logits.float().view(B, G, max(self.block, 1), -1).index_fill_(-1, self.banned, float("-inf"))
        checks = logits[:, :, 0]  # (B, G, V): p_j, what one-token-per-call decoding writes after d_1..d_j
        tree = self.parents is not None
        shown = None  # the drafts `on_step` reports, where they differ from those checked along the kept path
        if tree:  # the path the checks agree with, from the root; then as a chain along it
            path, kept, first_rejected = self._walk(checks)
            checks = checks.gather(1, path[..., None].expand(-1, -1, checks.shape[-1]))
            m, drafts, rejected = self.m, pending.gather(1, path[:, 1:]), None
            shown = torch.where(slots[:, 1:] <= kept[:, None], drafts, -1)
            shown = shown.scatter(1, kept.clamp(max=m - 1)[:, None],
                                  torch.where(kept < m, first_rejected, drafts[:, -1])[:, None])
        logp = checks.log_softmax(-1)
        if not tree:
            m = max(n - 1, 0)  # this call's drafts (none on the first call, or when nothing drafted)
            if m:
                drafts = pending[:, 1:]  # (B, m): d_1..d_m
                kept, rejected = _accept(checks[:, :m], drafts, cfg, generator)
            else:
                kept, rejected = torch.zeros(B, dtype=torch.long, device=self.device), None
        bonus = _one_more(checks[rows, kept], cfg, generator, kept=kept, rejected=rejected, m=m)
        bonus_logp = logp[rows, kept, bonus][:, None]
        if m:  # this call's tokens: d_1..d_a, then the bonus at slot a (slots past a are not taken)
            new = torch.cat((drafts, bonus[:, None]), 1).scatter(1, kept[:, None], bonus[:, None])
            new_logp = torch.cat((logp[:, :m].gather(-1, drafts[..., None]).squeeze(-1), bonus_logp), 1)
            new_logp = new_logp.scatter(1, kept[:, None], bonus_logp)
        else:
            new, new_logp = bonus[:, None], bonus_logp
        take = (slots[:, :new.shape[1]] <= kept[:, None]) & active[:, None]
        cols = (self.written[:, None] + slots[:, :new.shape[1]]).clamp(max=N + W - 1)  # a finished row writes nothing
        answer = self.answer
        before = answer[:, :N].clone() if self.on_step else None
        answer.scatter_(1, cols, torch.where(take, new, answer.gather(1, cols)))
        self.logprobs.scatter_(1, cols, torch.where(take, new_logp, self.logprobs.gather(1, cols)))
        if n:  # pending tokens 0..a are final: their keys/values join the cache (a narrower row's extras: padding)
            width = int(kept[active].max()) + 1
            block = block.take(path[:, :width]) if tree else block.first(width)
            block.key_valid = (slots[:, :width] <= kept[:, None]) & active[:, None]
            block.padded = not bool(block.key_valid.all())
            self.cache = self.cache.extend(block)
        count = torch.where(active, kept + 1, 0)
        self.row_calls += active.long()
        if m == self.m:
            for src in range(len(SOURCES)):
                self.kept_counts[src] += torch.bincount(kept[active & (self.source == src)], minlength=W)
            if self.costs is not None and not tree:  # what the model's drafts gave (`DraftCosts`)
                checked = active & (self.source == 0)
                self.costs.gave(int(kept[checked].sum()), int(checked.sum()))
        if m and tree:  # each kept draft by where it came from
            along = self.node_source.gather(1, path[:, 1:])[(slots[:, 1:] <= kept[:, None]) & active[:, None]]
            for src, name in enumerate(SOURCES):
                self.kept_by_source[name] += int((along == src).sum())
        elif m:
            for src, name in enumerate(SOURCES):
                self.kept_by_source[name] += int(torch.where(active & (self.source == src), kept, 0).sum())
        written = self.written = self.written + count
        done = written >= N
        if self.eos_id is not None:
            done |= (answer[:, :N] == self.eos_id).any(1)
        if self.on_step:
            at = torch.arange(N, device=self.device)[None, :]
            wrote = (at >= (written - count)[:, None]) & (at < written[:, None])  # this call's slots
            checked = kept_at = None
            if m:  # d_1..d_m were checked at the slots after the tokens written before this call
                cols_d = torch.where(active[:, None], (written - count)[:, None] + slots[:, :m], 0)
                checked = answer.new_full((B, N + W), -1).scatter_(
                    1, cols_d, torch.where(active[:, None], drafts if shown is None else shown, -1))[:, :N]
                kept_at = wrote.new_zeros(B, N + W).scatter_(
                    1, cols_d, (slots[:, :m] < kept[:, None]) & active[:, None])[:, :N]
            self.on_step(StepInfo(strategy=cfg.strategy, step=self.calls, total_steps=N, block=0, input_ids=before,
                                  output_ids=answer[:, :N].clone(), predicted=wrote, committed=wrote,
                                  probs=torch.where(wrote, self.logprobs[:, :N].exp(), 0.0),
                                  num_masked=(before == self.mask_id).sum(1), valid=torch.ones_like(wrote),
                                  prompt_index=rows, candidate_length=torch.full((B,), N, device=self.device),
                                  drafts=checked, accepted=kept_at))
        self.active = active = active & ~done
        self.finished = not bool(active.any())
        if self.branches > 1:
            self._tree_drafts(bonus, logits[rows, kept, 1:] if self.block else None)
            return
        self.parents = None  # one draft a call (again, where a tree's drafts stopped paying)
        if self.block:
            self.pending = torch.cat((bonus[:, None], logits[rows, kept, 1:].argmax(-1)), 1)  # group a's masks: drafts
        else:  # no mask drafted: the n-gram drafts, else none
            self.pending = bonus[:, None].expand(B, W).clone()
        self.source.fill_(0 if self.block else 2)
        if cfg.draft_ngram:
            self._ngram_drafts()
        if not self.block and not bool((self.source == 1).any()):
            self.pending = self.pending[:, :1]  # nothing to check: the next call writes one token

    def _ngram_drafts(self) -> None:
        """Where a row's text so far repeats an n-gram (`ngram_draft`), its drafts are what followed it there, the
        model's own drafts filling any slots left; elsewhere the model's drafts stand. Either way each draft is only a
        guess that the next call checks, so the answer is the same."""
        m = self.m
        for b in self.active.nonzero().squeeze(1).tolist():
            found = ngram_draft(self._history(b), length=m, max_n=self.config.draft_ngram)
            if found is not None:
                self.pending[b, 1:1 + found.numel()] = found
                self.source[b] = 1

    def _history(self, row: int) -> torch.Tensor:
        """Row ``row``'s text so far, what n-gram drafts are looked up in: its prompt's tokens, then its answer's."""
        return torch.cat((self.prompts[row], self.answer[row, :int(self.written[row])]))

    def _walk(self, checks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The path through the tree of drafts that the checks agree with (greedy: each token on it is what the check
        of its parent writes; ``draft_accept`` < 1: a child within that share of the check's best, the likeliest such
        child). ``checks`` (B, n, V): each pending token's check. Returns the path (B, m + 1), pending indices from the
        root, padded with its last node; the drafts kept (B,); and the first draft checked after the path and
        rejected (B,), -1 where the path's last node has no child."""
        cfg, pending, rows = self.config, self.pending, self.rows
        children_of = self.parents[:, None, :] == torch.arange(pending.shape[1], device=self.device)[None, :, None]
        children_of &= self.node_valid[:, None, :]  # (B, n, n): children_of[b, i, j], j is a child of i
        node = torch.zeros(self.B, dtype=torch.long, device=self.device)
        path = node.new_zeros(self.B, self.m + 1)
        kept, rejected = node.clone(), torch.full_like(node, -1)
        going = torch.ones(self.B, dtype=torch.bool, device=self.device)
        for depth in range(1, self.m + 1):
            check = checks[rows, node]  # (B, V)
            children = children_of[rows, node]  # (B, n)
            score = check.gather(1, pending)  # each token's logit under this check
            if cfg.draft_accept == 1.0:
                ok = children & (pending == check.argmax(-1, keepdim=True))
            else:
                ok = children & (score >= check.max(-1, keepdim=True).values + math.log(cfg.draft_accept))
            best = score.masked_fill(~ok, float("-inf")).argmax(1)
            take = going & ok.any(1)
            missed = going & ~take & children.any(1)
            rejected = torch.where(missed, pending.gather(1, children.int().argmax(1, keepdim=True)).squeeze(1),
                                   rejected)
            going = take
            node = torch.where(take, best, node)
            kept += take.long()
            path[:, depth] = node
        return path, kept, rejected

    def _tree_drafts(self, bonus: torch.Tensor, model_logits: torch.Tensor | None) -> None:
        """The next call's tree of drafts (``draft_branches`` > 1) after ``bonus`` (B,), each row's last token: up to
        ``draft_branches`` drafts, the n-gram ones first (`ngram_drafts`), then, after a call that carried a mask block
        (``model_logits`` (B, m, V), its predictions of the next slots), the model's: its best token at each slot, and
        its next-best first tokens alone. They are merged into a tree (a shared beginning is one node); a row without
        any has its token alone. No row with a draft: the next call writes one token (with ``draft_fill``, carrying a
        mask block)."""
        B, m, k = self.B, self.m, self.branches
        trees = []
        for b in range(B):
            drafts: list[tuple[torch.Tensor, int]] = []
            if bool(self.active[b]):
                if self.config.draft_ngram:
                    drafts = [(d, 1) for d in ngram_drafts(self._history(b), length=m, max_n=self.config.draft_ngram,
                                                           count=k)]
                if model_logits is not None and len(drafts) < k:
                    first = model_logits[b, 0].topk(k - len(drafts)).indices
                    drafts.append((torch.cat((first[:1], model_logits[b, 1:].argmax(-1))), 0))
                    drafts += [(t[None], 0) for t in first[1:]]
            tokens, parents, sources, at_node = [int(bonus[b])], [-1], [2], {}
            for draft, src in drafts:
                at = 0
                for t in draft.tolist():
                    if (at, t) not in at_node:
                        at_node[at, t] = len(tokens)
                        tokens.append(t), parents.append(at), sources.append(src)
                    at = at_node[at, t]
            trees.append((tokens, parents, sources, drafts[0][1] if drafts else 2))
        n = max(len(t[0]) for t in trees)
        self.source = torch.tensor([t[3] for t in trees], dtype=torch.long, device=self.device)
        if n == 1:
            self.pending, self.parents = bonus[:, None], None
            return
        pad = [n - len(t[0]) for t in trees]  # padding nodes: children of the root that no check accepts
        as_tensor = lambda rows, fill: torch.tensor([r + [fill] * p for r, p in zip(rows, pad)],  # noqa: E731
                                                    dtype=torch.long, device=self.device)
        self.pending = as_tensor([t[0] for t in trees], self.fill)
        self.parents = as_tensor([t[1] for t in trees], 0)
        self.node_source = as_tensor([t[2] for t in trees], 2)
        self.node_valid = torch.arange(n, device=self.device)[None, :] < torch.tensor(
            [len(t[0]) for t in trees], device=self.device)[:, None]

    def written_ids(self, row: int = 0) -> list[int]:
        """Row ``row``'s committed tokens so far: final, never rewritten (what a server may stream)."""
        return self.answer[row, :min(int(self.written[row]), self.N)].tolist()

    def output(self) -> GenerationOutput:
        """Each row's answer, cut at its first EOS, with the work done (calls, positions, the prompt's pass)."""
        N, device = self.N, self.device
        n_written = self.written.clamp(max=N)
        tokens = self.answer[:, :N]
        in_answer = torch.arange(N, device=device)[None, :] < n_written[:, None]
        lengths = n_written
        if self.eos_id is not None:
            is_eos = (tokens == self.eos_id) & in_answer
            lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1), n_written)
        avg = torch.where(in_answer, self.logprobs[:, :N], 0.0).sum(1) / n_written.clamp(min=1)
        return GenerationOutput(tokens=torch.where(in_answer, tokens, self.fill), lengths=lengths,
                                candidate_length=torch.full((self.B,), N, device=device), avg_logprob=avg,
                                steps=self.calls, forward_calls=self.forward_calls, positions=self.positions,
                                token_logprobs=torch.where(in_answer, self.logprobs[:, :N], 0.0),
                                row_calls=self.row_calls.clone())


@torch.inference_mode()
def speculative_generate(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None,
                         *, config: DecodingConfig, generator: torch.Generator | None = None,
                         suppress_ids: Sequence[int] = (), on_step: StepCallback | None = None,
                         reserve_cache: bool = True) -> GenerationOutput:
    """Answers for left-padded prompts ``prompt_ids`` (B, P) by speculative decoding (``config.draft_length`` >= 1;
    the module docstring): one `SpeculativeDecode` over the batch, one call of its own per step. `decoding.generate_ids`
    calls it for such a config (``reserve_cache``: see `SpeculativeDecode`)."""
    decode = SpeculativeDecode(model, prompt_ids, prompt_mask, config=config, generator=generator,
                               suppress_ids=suppress_ids, on_step=on_step, reserve_cache=reserve_cache)
    with _unchecked(model):
        invariant = getattr(getattr(model, "model", None), "batch_invariant", False)  # drafts change a sample's draw
        while not decode.finished:
            if not invariant:
                decode.drafts_pay(int(decode.active.sum()) <= DRAFT_ROWS)
            start = time.perf_counter()
            decode.step()
            decode.timed(time.perf_counter() - start)
    return decode.output()


def _one_more(check: torch.Tensor, cfg: DecodingConfig, generator: torch.Generator, *, kept: torch.Tensor,
              rejected: torch.Tensor | None, m: int) -> torch.Tensor:
    """The token the check after the kept drafts writes, (B,): its argmax (greedy), or a sample; after a rejected
    draft, a sample from the check without it (speculative sampling's residual for a one-token draft)."""
    if cfg.temperature == 0.0:
        return check.argmax(-1)
    tempered = filter_logits(check / cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    if rejected is not None:
        stop = kept < m
        tempered[stop.nonzero().squeeze(1), rejected[stop]] = float("-inf")
    return torch.multinomial(tempered.softmax(-1), 1, generator=generator).squeeze(-1)


def _accept(checks: torch.Tensor, drafts: torch.Tensor, cfg: DecodingConfig, generator: torch.Generator,
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """How many leading drafts each row keeps, (B,) long, and the draft after them, (B,) long (the one rejected,
    when any). ``checks`` (B, m, V): the logits of the check before each draft; ``drafts`` (B, m)."""
    B, m = drafts.shape
    if cfg.temperature == 0.0 and cfg.draft_accept == 1.0:
        ok = checks.argmax(-1) == drafts  # exactly the token one-token-per-call decoding writes
    elif cfg.temperature == 0.0:  # p(d) >= accept * max p, i.e. l_d >= l_max + log(accept) in logits
        ok = checks.gather(-1, drafts[..., None]).squeeze(-1) >= checks.max(-1).values + math.log(cfg.draft_accept)
    else:
        tempered = filter_logits(checks / cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p).softmax(-1)
        p = tempered.gather(-1, drafts[..., None]).squeeze(-1)
        u = torch.rand(B, m, generator=generator, device=drafts.device)
        ok = u < p
    kept = ok.long().cumprod(1).sum(1)
    rejected = drafts.gather(1, kept.clamp(max=m - 1)[:, None]).squeeze(1)
    return kept, rejected
