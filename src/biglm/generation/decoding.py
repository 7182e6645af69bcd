"""Decoding loops that write an answer by iterative unmasking (paper §4.1).

Notable features
- The answer is N slots that start as the mask token. Every strategy runs in one loop (`_unmask`), with
  one model call (`AnswerDenoiser`) and one sampler (`sampling.sample`); the strategy (a class in the
  registry of `strategies`: ``mask-predict``, ``confidence``, ``threshold``, or any registered later)
  only says how many tokens each step re-masks and how many predictions it keeps. Optional
  semi-autoregressive blocks: slots are filled block by block, left to right.
- Exact prefix cache, on by default: the prompt is encoded once (`encode_prefix`) and every
  iteration runs only the N answer slots, with logits computed only at the slots being predicted
  (`logits_positions`). ``use_cache=False`` runs prompt + answer with ``prefix_len`` instead; the
  two give the same logits up to float rounding (tested), because under the BiGLM mask no prompt
  token attends to the answer.
- Block decoding (``block_length``, every strategy): blocks are decoded left to right; a finished
  block joins the prefix cache, so a step runs only the current block (``block_suffix="block"``)
  or the block and the masks after it (``"rest"``). With ``block_cache="exact"`` (default) the
  grown prefix is re-encoded as one BiGLM prefix, the training condition with the split at the
  block, so the cache is exact (tested against recomputing prompt + blocks every call);
  ``"append"`` encodes only the new block, which the earlier prefix never sees (cheaper, approximate), and
  its pass folds into the next block's first step.
- One set-up (`Decode`): candidate lengths, the seeded sampler, the prompt encoded into the cache, finished
  blocks joining it (the append fold included) and the work accounting exist once; `generate_ids` drives one
  `Decode` over a batch, the server's `engine.DecodeEngine` one per request inside merged model calls.
- Batches of prompts of different lengths are left-padded to a common length P (RoPE is
  relative, so the padding needs no position shift); every answer starts at P.
- Length beam: several candidate lengths per prompt decoded side by side as extra rows (shorter
  candidates are right-padded and masked out as keys); the candidate with the highest average
  log-probability wins, as in CMLM.
- ``on_step`` receives a `StepInfo` after every model call, so a CLI can show the answer unmask.
- Options arrive as one validated `config.DecodingConfig`; `generate_ids` takes no loose option
  keywords except as overrides that build that object once at its entry.
- Speculative decoding (``draft_length``: the answer of confidence decoding at blocks of 1, one token per call, in
  fewer calls) is a state machine of its own (`speculative.SpeculativeDecode`, the same contract as `Decode`);
  `generate_ids` hands such a config to it, and the server's engine runs one per speculative request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..model.modeling import PrefixCache
from .config import (DEFAULT_MASK_PREDICT_STEPS, SPECULATIVE_ALONE, STRATEGIES,  # noqa: F401  (re-exported)
                     DecodingConfig, for_model)
from .sampling import sample
from .strategies import DecodingStrategy, StepState, get_strategy, rank


@dataclass
class StepInfo:
    """What one decoding step did. Tensors have one row per (prompt, length candidate).

    Attributes:
        strategy: the decoding strategy.
        step: 1-based number of model calls made so far.
        total_steps: the planned number of model calls (a run may stop earlier).
        block: 0-based block index (always 0 without semi-autoregressive blocks).
        input_ids: (R, N) the answer as fed to the model (mask token at masked slots).
        output_ids: (R, N) the answer after this step (mask token where still masked).
        predicted: (R, N) bool, slots the model predicted in this step.
        committed: (R, N) bool, slots whose prediction was written into the answer.
        probs: (R, N) float, model probability of each prediction made in this step (0 elsewhere).
        num_masked: (R,) long, masked slots in the input (Mask-Predict: n_t, the re-mask count).
        valid: (R, N) bool, slots inside each row's candidate length.
        prompt_index: (R,) long, the prompt each row belongs to.
        candidate_length: (R,) long, each row's answer length N_r.
        drafts: (R, N) long, speculative decoding: the drafted token checked at each slot in this call (-1 where none
            was); None for iterative unmasking.
        accepted: (R, N) bool, speculative decoding: slots whose draft this call kept (the others were rejected).
    """

    strategy: str
    step: int
    total_steps: int
    block: int
    input_ids: torch.Tensor
    output_ids: torch.Tensor
    predicted: torch.Tensor
    committed: torch.Tensor
    probs: torch.Tensor
    num_masked: torch.Tensor
    valid: torch.Tensor
    prompt_index: torch.Tensor
    candidate_length: torch.Tensor
    drafts: torch.Tensor | None = None
    accepted: torch.Tensor | None = None


StepCallback = Callable[[StepInfo], None]


@dataclass
class GenerationOutput:
    """Answers chosen for each prompt.

    Attributes:
        tokens: (B, N) answer ids of the chosen candidate, untrimmed; slots past the candidate's
            length hold the pad id.
        lengths: (B,) long, answer length after cutting at the first EOS (the EOS excluded).
        candidate_length: (B,) long, the chosen candidate length (the length beam's pick).
        avg_logprob: (B,) float, the chosen candidate's mean log-probability per slot.
        token_logprobs: (B, N) float, each answer slot's log-probability under the model when its token was written
            (temperature 1, before top-k/top-p, over the tokens the decoder may write; 0 past the candidate's length).
        steps: denoising steps made (per row set; all candidates run together).
        forward_calls: model forward calls in all: the steps plus the cache's own encoding passes (the prompt,
            and each finished block unless its append pass shares the next block's first step).
        positions: query positions those calls processed, summed over rows (the work per committed token is
            ``positions / (rows * N)``; an autoregressive model with a KV cache processes 1 per token).
        row_calls: (B,) long, the decoding calls each row took part in, where rows stop apart (speculative
            decoding); None: every row took part in all ``steps`` (`calls_per_row`).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    candidate_length: torch.Tensor
    avg_logprob: torch.Tensor
    steps: int
    forward_calls: int = 0
    positions: int = 0
    token_logprobs: torch.Tensor | None = None
    row_calls: torch.Tensor | None = None

    def calls_per_row(self) -> list[int]:
        """Model calls each answer took: its own count where rows of a batch stop at different calls (speculative
        decoding), else the steps, which every row takes part in."""
        return self.row_calls.tolist() if self.row_calls is not None else [self.steps] * self.tokens.shape[0]

    def token_lists(self) -> list[list[int]]:
        """Each answer as a list of ids, cut at the first EOS."""
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths.tolist())]

class AnswerDenoiser:
    """One model call over a window of the answer slots of a batch, with or without the exact prefix cache.

    Built once per batch: with ``use_cache`` the prompt keys/values are computed here, once, and
    reused by every call; `extend` grows them by a committed block (block decoding's growing cache).
    ``prompt_ids`` (B, P) are left-padded, ``prompt_mask`` (B, P) marks real tokens; ``rows`` (R,)
    maps each answer row to its prompt (length-beam candidates share one); ``valid`` (R, N) marks
    slots inside each row's candidate length (the rest are padding keys).

    ``block_cache`` says what the grown prefix is. ``exact``: prompt + committed blocks form one
    BiGLM prefix (every prefix token sees the whole prefix), i.e. the training condition with the
    split point at the window's start, so `extend` re-encodes prompt + blocks once per block.
    ``append``: only the new block is encoded, seeing the cache and itself; earlier prefix
    tokens never see it (block-causal attention: the training condition of a ``prefix_attention="blocks"``
    model, an approximation for the paper's bidirectional one).
    Without the cache every call recomputes prompt + answer[:end] from scratch under the same rule:
    ``prefix_len`` = P + window start (exact), plus ``prompt_len`` = P and ``block_len`` (append: the
    `biglm-blocks` attention rule, which a ``prefix_attention="blocks"`` model was trained with, so there
    append is exact and re-encoding is the approximation).

    ``reserve_cache`` (the append cache with more than one block): the prompt's cache gets room for the whole
    answer up front (`PrefixCache.reserve`), so each committed block is written into it in place instead of
    copying the whole cache per block; False keeps the copying cache (the same tokens; for checking).
    ``prompt_cache``: the prompts' cache (B rows), already encoded as `encode_prefix` would (not encoded again).
    """

    def __init__(self, model: torch.nn.Module, *, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 rows: torch.Tensor, valid: torch.Tensor, use_cache: bool, block_length: int | None = None,
                 block_cache: str = "exact", reserve_cache: bool = True,
                 prompt_cache: PrefixCache | None = None) -> None:
        self.model = model
        self.prompt_len = prompt_ids.shape[1]
        self.use_cache = use_cache
        self.block_length = block_length or valid.shape[1]
        self.block_cache = block_cache
        self.forward_calls = self.positions = 0  # the work done, for benchmarks (GenerationOutput)
        # what an exact `extend` re-encodes: each row's prompt, then the committed slots so far
        self._prompt, self._valid, self._done = (prompt_ids, prompt_mask, rows), valid, valid[:, :0].long()
        # masks are fixed for the whole decode: build them once (each `.all()` is a host sync)
        self.answer_mask = None if bool(valid.all()) else valid.long()
        prompt_padded = not bool(prompt_mask.all())
        if self.use_cache:
            if self.prompt_len == 0:
                param = next(model.parameters())
                cache = PrefixCache.empty(model.config, batch=rows.numel(), device=param.device, dtype=param.dtype)
            else:  # (``prompt_cache``: the same pass made elsewhere, the server's engine's over several steps)
                cache = (model.encode_prefix(prompt_ids, prompt_mask if prompt_padded else None)
                         if prompt_cache is None else prompt_cache)
                self.count(prompt_ids.shape[0], self.prompt_len)
                # the identity selection is skipped: `select` copies every layer's keys/values
                same = rows.numel() == prompt_ids.shape[0] and bool(
                    (rows == torch.arange(rows.numel(), device=rows.device)).all())
                cache = cache if same else cache.select(rows)
            # only the append cache grows by extension (the exact one is re-encoded per block): room for the answer
            grows = block_cache == "append" and self.block_length < valid.shape[1]
            self.cache = cache.reserve(valid.shape[1]) if reserve_cache and grows else cache
        else:
            self.prompt_ids = prompt_ids.index_select(0, rows)
            self.prompt_mask = prompt_mask.index_select(0, rows)
            self.valid = valid
            self.masked_keys = prompt_padded or self.answer_mask is not None
            self.no_logits = torch.zeros_like(self.prompt_ids, dtype=torch.bool)

    def count(self, rows: int, length: int) -> None:
        """Record one model call over ``length`` positions of ``rows`` rows (the work `GenerationOutput` reports)."""
        self.forward_calls += 1
        self.positions += rows * length

    @property
    def folds(self) -> bool:
        """True when a finished block's cache pass can share the next block's first step (append cache: the
        block's keys/values need only the cache and the block, so one call computes them beside the step)."""
        return self.use_cache and self.block_cache == "append"

    def trims(self, query: Query, commit: Commit | None = None) -> bool:
        """Whether a cached call for ``query`` runs without its one slot's row: a ``shift_logits`` model predicts a
        slot from the row before it (the held block's last token, or the cache's last hidden state), and with a
        window of one slot nothing else reads that slot's row (held tokens are prefix: they never see it). The
        same logits, one position per written token instead of two."""
        return (self.use_cache and bool(getattr(self.model.config, "shift_logits", False))
                and query.end - query.start == 1
                and (commit is not None or (self.cache.hidden is not None and self.cache.length > 0)))

    def segment(self, query: Query, commit: Commit | None = None, *, valid: torch.Tensor | None = None,
                trim: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """What a cached call runs for ``query``: ``(ids, valid, where)`` over its slots ``start:end``, the block
        ``commit`` (when folded in) first as prefix tokens that predict nothing. ``valid`` (R, N): the key mask
        to slice (default: the denoiser's, None when no slot is padding). When the call `trims` (and ``trim``), the
        slot's own column is left out of ``ids`` and ``valid``: ``where`` then has one column more than ``ids``,
        the position after the input (`BiGLMForMaskedLM.forward`'s ``logits_positions``)."""
        valid = self.answer_mask if valid is None else valid
        cut = query.end - 1 if trim and self.trims(query, commit) else query.end
        ids, where = query.inputs[:, query.start:cut], query.where[:, query.start:query.end]
        keys = None if valid is None else valid[:, query.start:cut]
        if commit is not None:
            if not self.folds or commit.end != query.start:
                raise ValueError(f"a block folds into the next step only with the append cache and when it ends where "
                                 f"the step starts (block ends at {commit.end}, step starts at {query.start}).")
            ids = torch.cat((commit.ids, ids), dim=1)
            where = torch.cat((torch.zeros_like(commit.ids, dtype=torch.bool), where), dim=1)
            keys = None if valid is None else torch.cat((valid[:, commit.start:commit.end], keys), dim=1)
        return ids, keys, where

    def absorb(self, block: PrefixCache) -> None:
        """A folded block's keys/values (computed by the call it rode on) join the cache."""
        self.cache = self.cache.extend(block)

    def __call__(self, answer: torch.Tensor, positions: torch.Tensor, *, start: int = 0, end: int | None = None,
                 commit: Commit | None = None) -> torch.Tensor:
        """Logits (M, V) at the ``positions`` (R, N) bool of ``answer`` (R, N), in row-major order.

        Slots ``start:end`` run as the suffix (``positions`` must lie inside them); slots before
        ``start`` are committed blocks (in the cache, or recomputed as such without it); slots from
        ``end`` on are left out of the call. ``commit`` (only when `folds`): the block that ends at ``start``,
        not yet in the cache; it joins this call as prefix (it sees the cache and itself) and its keys/values
        extend the cache, exactly as a separate `extend` would, one call fewer."""
        end = answer.shape[1] if end is None else end
        if self.use_cache:
            ids, mask, where = self.segment(Query(answer, positions, start, end), commit)
            self.count(answer.shape[0], ids.shape[1])
            if commit is None:
                return self.model(ids, prefix_cache=self.cache, attention_mask=mask, logits_positions=where).logits
            n = commit.end - commit.start
            out = self.model(ids, prefix_cache=self.cache, prefix_len=self.cache.length + n, attention_mask=mask,
                             logits_positions=where, return_cache=True)
            self.absorb(out["cache"].first(n))
            return out.logits
        self.count(answer.shape[0], self.prompt_len + end)
        ids = torch.cat((self.prompt_ids, answer[:, :end]), dim=1)
        where = torch.cat((self.no_logits, positions[:, :end]), dim=1)
        mask = torch.cat((self.prompt_mask, self.valid[:, :end].long()), dim=1) if self.masked_keys else None
        if start == 0 or self.block_cache == "exact":
            # the grown prefix recomputed from scratch: prompt + committed blocks, then the window
            split = self.prompt_len + start
            return self.model(ids, prefix_len=split if split else None, attention_mask=mask,
                              logits_positions=where).logits
        # the append cache's rule from scratch (biglm-blocks): the prompt sees itself, each committed block the
        # prompt, earlier blocks and itself, the window everything
        return self.model(ids, prefix_len=self.prompt_len + start, prompt_len=self.prompt_len,
                          block_len=self.block_length, attention_mask=mask, logits_positions=where).logits

    def extend(self, commit: Commit) -> None:
        """Committed slots join the prefix (without the cache there is nothing to keep: every call
        recomputes them). ``exact``: prompt + every committed slot re-encoded as one prefix; ``append``:
        only the new slots, seeing the cache and each other."""
        if not self.use_cache:
            return
        if self.block_cache == "append":
            mask = None if self.answer_mask is None else self.answer_mask[:, commit.start:commit.end]
            self.count(commit.ids.shape[0], commit.end - commit.start)
            self.cache = self.model.encode_prefix(commit.ids, mask, past=self.cache)
            return
        if commit.start != self._done.shape[1]:
            raise ValueError(f"blocks commit left to right: expected slot {self._done.shape[1]}, got {commit.start}.")
        prompt_ids, prompt_mask, rows = self._prompt
        self._done = torch.cat((self._done, commit.ids), dim=1)  # (R, end)
        ids = torch.cat((prompt_ids.index_select(0, rows), self._done), dim=1)
        mask = torch.cat((prompt_mask.index_select(0, rows), self._valid[:, :commit.end].long()), dim=1)
        self.count(ids.shape[0], ids.shape[1])
        self.cache = self.model.encode_prefix(ids, mask)


def left_pad(prompts: Sequence[Sequence[int]], *, pad_id: int, device: torch.device | str = "cpu",
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to a common length: ``(ids (B, P), mask (B, P))``, mask 1 on real tokens."""
    P = max((len(p) for p in prompts), default=0)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, P - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, P - len(p):] = 1
    return ids.to(device), mask.to(device)


def mask_predict_count(*, length: int, step: int, steps: int) -> int:
    """n_t = floor(N·(T-t)/T): slots masked at iteration t (0-based; t = 0 masks all N)."""
    return length * (steps - step) // steps


def candidate_lengths(*, max_new_tokens: int, length_beam: int) -> list[int]:
    """Answer lengths tried by a length beam of width ``length_beam``, longest first.

    A pre-trained BiGLM has no length-prediction head (CMLM's), so the candidates spread evenly
    over [ceil(N/2), N]; a model with a length head passes its own to `generate_ids(lengths=...)`.
    """
    if length_beam < 1:
        raise ValueError(f"length_beam={length_beam} must be >= 1.")
    if length_beam == 1:
        return [max_new_tokens]
    lo = max(1, math.ceil(max_new_tokens / 2))
    span = max_new_tokens - lo
    out = [max_new_tokens - round(i * span / (length_beam - 1)) for i in range(length_beam)]
    return sorted(set(out), reverse=True)


def _block_steps(*, steps: int, num_blocks: int) -> list[int]:
    # steps spread as evenly as possible over the blocks, at least one each
    base, extra = divmod(steps, num_blocks)
    return [max(1, base + (b < extra)) for b in range(num_blocks)]


# --- the decoding loops as state machines ----------------------------------------------------------------


@dataclass
class Query:
    """A model call a decoding loop asks for: predict the slots ``where`` (R, N) of ``inputs`` (R, N),
    running slots ``start:end`` as the suffix (slots before ``start`` are in the prefix cache)."""

    inputs: torch.Tensor
    where: torch.Tensor
    start: int
    end: int


@dataclass
class Commit:
    """Slots ``start:end`` are final in every row: their ids (R, end - start) join the prefix cache."""

    start: int
    end: int
    ids: torch.Tensor


@dataclass
class Progress:
    """The answer a loop is writing, updated in place after every model call (read by the engine).

    ``final`` (R, N) marks slots that can no longer change (committed blocks; every committed token
    of the confidence strategies, which never re-mask)."""

    answer: torch.Tensor
    probs: torch.Tensor
    final: torch.Tensor


Loop = Generator[Query | Commit, tuple[torch.Tensor, torch.Tensor] | None, int]


def parse_lengths(lengths: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor, *, batch: int) -> torch.Tensor:
    """Candidate lengths as a (B, K) long tensor: one list for every prompt, or one row per prompt
    (a length head's predictions)."""
    t = torch.as_tensor(lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths, dtype=torch.long)
    if t.ndim == 1:
        t = t[None].expand(batch, -1)
    if t.ndim != 2 or t.shape[0] != batch or t.shape[1] == 0:
        raise ValueError(f"candidate lengths must be a list of K lengths or a (batch={batch}, K) table, "
                         f"got shape {tuple(t.shape)}.")
    if int(t.min()) < 1:
        raise ValueError(f"candidate lengths must be integers >= 1, got {t.tolist()}.")
    return t.contiguous()


class DecodeRun:
    """One decode of R rows (prompts × length candidates) as a state machine, independent of who calls
    the model: ``pending`` is the next `Query` (answer it with `advance(logits)`) or `Commit` (extend
    the cache, then `advance()`), or None when done; `output` then picks each prompt's candidate.

    `Decode` wires a run to a model (its cache); `generate_ids` drives one over a whole batch, and
    `engine.DecodeEngine` one per request, merging their queries into one model call. A run samples with its own ``generator``, so its tokens do
    not depend on what else shares the model call."""

    def __init__(self, model_config, *, config: DecodingConfig, cand_len: torch.Tensor,
                 generator: torch.Generator, suppress_ids: Sequence[int] = (), on_step: StepCallback | None = None,
                 ) -> None:
        self.config = config = for_model(config, model_config)
        self.batch, K = cand_len.shape
        device = cand_len.device
        self.cand_len = cand_len.reshape(-1)  # (R,), row r = prompt r // K, candidate r % K
        self.rows = torch.arange(self.batch, device=device).repeat_interleave(K)
        N = int(self.cand_len.max())
        self.valid = torch.arange(N, device=device)[None, :] < self.cand_len[:, None]  # (R, N)
        self.mask_id = model_config.mask_token_id
        self.eos_id, self.pad_id = model_config.eos_token_id, model_config.pad_token_id
        banned = {self.mask_id, *suppress_ids}
        if config.ignore_eos and self.eos_id is not None:
            banned.add(self.eos_id)
        if self.pad_id is not None and self.pad_id != self.eos_id:
            banned.add(self.pad_id)  # a pad in the middle of an answer is never what a user wants
        self.banned = torch.tensor(sorted(i for i in banned if 0 <= i < model_config.vocab_size), dtype=torch.long,
                                   device=device)
        # runs with the same key draw alike from logits (`draw_greedy` batches them); None: a sampled run
        self.greedy_key = tuple(self.banned.tolist()) if config.temperature == 0.0 else None
        self.generator = generator
        R = self.valid.shape[0]
        self.progress = Progress(answer=torch.full((R, N), self.mask_id, dtype=torch.long, device=device),
                                 probs=torch.zeros(R, N, dtype=torch.float32, device=device),
                                 final=torch.zeros(R, N, dtype=torch.bool, device=device))
        info = dict(strategy=config.strategy, valid=self.valid, prompt_index=self.rows, candidate_length=self.cand_len)
        self.strategy: DecodingStrategy = get_strategy(config.strategy)(config)
        self._loop = _unmask(self.progress, self.strategy, valid=self.valid, mask_id=self.mask_id,
                             steps=config.num_steps(N), early_stop=config.early_stop,
                             block_length=config.block_length or N, suffix=config.block_suffix, on_step=on_step,
                             info=info)
        self.calls = 0
        self.pending: Query | Commit | None = None
        self._send(None)

    def _send(self, value: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        try:
            self.pending = self._loop.send(value)
        except StopIteration as stop:
            self.pending, self.calls = None, stop.value

    def advance(self, logits: torch.Tensor | None = None, *,
                drawn: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Answer the pending `Query` with its logits (M, V), or acknowledge the pending `Commit` (no logits).
        ``drawn``: the query's tokens and confidences already drawn from its logits (`draw_greedy`), instead of them.

        The logits are consumed: the banned tokens' columns are set to -inf in place (copying the (M, V) tensor
        instead was 8% of the profiled CPU time of a batch-32, length-beam-3 seq2seq decode at V = 8,192)."""
        if isinstance(self.pending, Query):
            if drawn is None:
                if logits is None:
                    raise ValueError("the pending query needs the model's logits at its positions.")
                cfg = self.config
                logits.index_fill_(-1, self.banned, float("-inf"))
                drawn = sample(logits, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                               generator=self.generator)
            self.calls += 1
            self._send(drawn)
        elif self.pending is not None:
            self._send(None)

    def output(self) -> GenerationOutput:
        """Each prompt's chosen candidate: the highest mean log-probability per slot (CMLM's length beam)."""
        if self.pending is not None:
            raise RuntimeError("the decode is not finished.")
        answer, probs, valid, cand_len = self.progress.answer, self.progress.probs, self.valid, self.cand_len
        B = self.batch
        K = cand_len.numel() // B
        logp = torch.where(valid, probs.clamp_min(torch.finfo(torch.float32).tiny).log(), 0.0)
        avg = logp.sum(1) / cand_len
        best = avg.view(B, K).argmax(dim=1) + torch.arange(B, device=avg.device) * K  # (B,) row index
        fill = self.pad_id if self.pad_id is not None else (self.eos_id if self.eos_id is not None else 0)
        tokens = torch.where(valid, answer, fill)[best]
        chosen_len = cand_len[best]
        out_len = chosen_len.clone()
        if self.eos_id is not None:
            is_eos = (tokens == self.eos_id) & valid[best]
            first = torch.where(is_eos.any(1), is_eos.int().argmax(1), chosen_len)
            out_len = torch.minimum(first, chosen_len)
        return GenerationOutput(tokens=tokens, lengths=out_len, candidate_length=chosen_len, avg_logprob=avg[best],
                                steps=self.calls, token_logprobs=logp[best])


def draw_greedy(runs: Sequence[DecodeRun], logits: torch.Tensor, counts: Sequence[int],
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The draws of greedy runs that ban the same tokens (one `DecodeRun.greedy_key`) for their pending queries, from
    their logits stacked in order (``counts`` rows each), in one pass instead of a pass per run: a server step of 32
    requests made 32 small passes over the vocabulary. The same tokens and confidences as each run's own `advance`
    (a row's argmax and log-softmax do not depend on the rows beside it; tested). Pass each one's part as
    ``advance(drawn=...)``. The logits are consumed (the banned columns set to -inf in place)."""
    keys = {run.greedy_key for run in runs}
    if len(keys) != 1 or None in keys:
        raise ValueError("draw_greedy draws for greedy runs that ban the same tokens (one greedy_key).")
    logits.index_fill_(-1, runs[0].banned, float("-inf"))
    tokens, probs = sample(logits)
    return list(zip(tokens.split(list(counts)), probs.split(list(counts))))


@torch.inference_mode()
def generate_ids(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None = None,
    *,
    config: DecodingConfig | None = None,
    lengths: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    suppress_ids: Sequence[int] = (),
    on_step: StepCallback | None = None,
    fold_blocks: bool = True,
    reserve_cache: bool = True,
    **overrides: Any,
) -> GenerationOutput:
    """Generate answers for left-padded prompts ``prompt_ids`` (B, P) by iterative unmasking.

    Args:
        model: a `BiGLMForMaskedLM` (or anything with its ``encode_prefix`` / forward API).
        prompt_ids, prompt_mask: (B, P) left-padded prompts and their 1/0 mask (None = no padding).
        config: the decoding options (`DecodingConfig`; default: its defaults, i.e. Mask-Predict with
            T = 10 model calls). ``config.stop`` is a text-level option, applied by `api.generate`.
        lengths: candidate answer lengths: K lengths for every prompt, or a (B, K) table (a length head's
            per-prompt predictions); default: the model's length head when it has one and
            ``config.length_head`` is not False, else the length beam of ``config``.
        generator: the sampler's random stream (default: seeded with ``config.seed``).
        suppress_ids: token ids never generated (the mask token and, when it is not EOS, the pad
            token are always suppressed).
        on_step: called with a `StepInfo` after every model call.
        fold_blocks: with the append cache, a finished block's cache pass shares the next block's first step
            (one call per block saved; the same answer). False runs them apart (for checking).
        reserve_cache: a cache that grows (the append cache's blocks, speculative decoding's tokens) is allocated
            for prompt + answer up front and written in place; False copies it per block (the same answer; for
            checking and timing).
        **overrides: `DecodingConfig` fields changed on top of ``config`` (validated together, once).
    """
    cfg = (config or DecodingConfig()).override(**overrides)
    require_mask_token(model.config)
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] == 0:
        raise ValueError(f"prompt_ids must be a non-empty (batch, length) tensor, got shape {tuple(prompt_ids.shape)}.")
    check_prompt_ids(model.config, prompt_ids)
    if cfg.draft_length:
        check_speculative(model, cfg, lengths=lengths)
        from .speculative import speculative_generate

        return speculative_generate(model, prompt_ids, prompt_mask, config=cfg, generator=generator,
                                    suppress_ids=suppress_ids, on_step=on_step, reserve_cache=reserve_cache)
    decode = Decode(model, prompt_ids, prompt_mask, config=cfg, lengths=lengths, generator=generator,
                    suppress_ids=suppress_ids, on_step=on_step, fold_blocks=fold_blocks, reserve_cache=reserve_cache)
    with _unchecked(model):
        while decode.run.pending is not None:
            decode.step()
    return decode.output()


def require_mask_token(model_config: Any) -> None:
    """Refuse a model without a mask token: iterative unmasking starts from an all-mask answer."""
    if getattr(model_config, "mask_token_id", None) is None:
        raise ValueError("the model has no mask_token_id: set model.config.mask_token_id = tokenizer.mask_token_id "
                         "(iterative unmasking starts from an all-mask answer).")


def check_speculative(model: torch.nn.Module, config: DecodingConfig, *,
                      lengths: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None) -> None:
    """Refuse candidate lengths (given, or the model's length head's by default) with speculative decoding: it writes
    up to max_new_tokens left to right and stops at EOS (`generate_ids` and the server's engine ask the same)."""
    if config.draft_length and (lengths is not None or uses_length_head(model, config)):
        raise ValueError("speculative decoding (draft_length) writes up to max_new_tokens left to right and stops at "
                         "EOS: it takes no candidate lengths (set length_head=False, pass no lengths).")


def check_prompt_ids(model_config: Any, prompt_ids: torch.Tensor) -> None:
    """Refuse prompt ids outside the model's vocabulary (a prompt encoded with another tokenizer)."""
    if prompt_ids.numel() and (int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= model_config.vocab_size):
        raise ValueError(f"prompt token ids must lie in [0, vocab_size={model_config.vocab_size}): was the prompt "
                         "encoded with this model's tokenizer?")


class Decode:
    """One decode set up on a model: its `DecodeRun`, its `AnswerDenoiser` (the prompt encoded into the prefix
    cache) and the block held back to fold into the next step. `generate_ids` builds one over a whole batch and
    drives it with `step`; `engine.DecodeEngine` builds one per request, merges the pending queries of many into
    one model call, and calls `settle` after each.

    Set-up: candidate lengths (given, from the model's length head, or the length beam of ``config``), the
    sampler's stream (``generator``, default seeded with ``config.seed``), the run and the cache. With the append
    cache (and ``fold_blocks``), a finished block's cache pass is not run alone: the block rides on the next step
    as its leading prefix tokens (they see the cache and themselves, and their keys/values extend the cache),
    one call per block saved, the same answer. The work done (model calls and positions, prompt and block passes
    included) is counted by the denoiser and reported in `output`. ``use_cache`` (default: ``config.use_cache``)
    False recomputes the prompt every step. ``reserve_cache`` False: the append cache copies itself per block
    instead of growing in place (`AnswerDenoiser`; the same answer). ``prompt_cache``: the prompts' cache, already
    encoded (`AnswerDenoiser`)."""

    def __init__(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None, *,
                 config: DecodingConfig, lengths: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
                 generator: torch.Generator | None = None, suppress_ids: Sequence[int] = (),
                 on_step: StepCallback | None = None, fold_blocks: bool = True, use_cache: bool | None = None,
                 reserve_cache: bool = True, prompt_cache: PrefixCache | None = None) -> None:
        B, P = prompt_ids.shape
        model_cfg = model.config
        device = prompt_ids.device
        if config.draft_length:
            raise ValueError(SPECULATIVE_ALONE)
        if prompt_mask is None:
            prompt_mask = torch.ones_like(prompt_ids)
        use_head = uses_length_head(model, config)
        if lengths is None and use_head:
            lengths = predict_lengths(model, prompt_ids, prompt_mask, config=config)
        if lengths is None:
            lengths = candidate_lengths(max_new_tokens=config.max_new_tokens, length_beam=config.length_beam)
        cand_len = parse_lengths(lengths, batch=B).to(device)
        N = int(cand_len.max())
        if P + N > model_cfg.max_position_embeddings:
            raise ValueError(f"prompt ({P}) + answer ({N}) tokens exceed max_position_embeddings="
                             f"{model_cfg.max_position_embeddings}: shorten the prompt or max_new_tokens.")
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(config.seed)
        self.run = run = DecodeRun(model_cfg, config=config, cand_len=cand_len, generator=generator,
                                   suppress_ids=suppress_ids, on_step=on_step)
        use_cache = config.use_cache if use_cache is None else use_cache
        with _unchecked(model):
            self.denoise = AnswerDenoiser(model, prompt_ids=prompt_ids, prompt_mask=prompt_mask, rows=run.rows,
                                          valid=run.valid, use_cache=use_cache, block_length=run.config.block_length,
                                          block_cache=run.config.block_cache, reserve_cache=reserve_cache,
                                          prompt_cache=prompt_cache)
        self.fold = fold_blocks and self.denoise.folds
        self.held: Commit | None = None  # a finished block whose cache pass rides on the next step (append cache)

    @property
    def calls(self) -> int:
        """Decoding model calls so far (`SpeculativeDecode` has the same)."""
        return self.run.calls

    @property
    def finished(self) -> bool:
        return self.run.pending is None

    @property
    def cache(self) -> PrefixCache:
        """The prefix cache the next call runs over."""
        return self.denoise.cache

    def settle(self) -> None:
        """Finished blocks join the cache: each pending `Commit` is encoded now, or held to fold into the next step
        (a held block followed by another without a step between goes in alone). Then ``run.pending`` is the next
        `Query`, or None when the decode is done; a block still held then is the last one: nothing reads its
        keys/values, so it is never encoded."""
        while isinstance(item := self.run.pending, Commit):
            if self.held is not None:
                self.denoise.extend(self.held)
                self.held = None
            if self.fold:
                self.held = item
            else:
                self.denoise.extend(item)
            self.run.advance()

    def segment(self, *, trim: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the pending query runs in a call made elsewhere (the engine merges many decodes into one call):
        ``(ids, valid, where)``, each (R, held + end - start), the held block first as prefix tokens; a call that
        `AnswerDenoiser.trims` (unless ``trim`` is False) leaves the slot's own column out of ``ids`` and ``valid``."""
        return self.denoise.segment(self.run.pending, self.held, valid=self.run.valid, trim=trim)

    def step(self) -> None:
        """Answer the pending query with a model call of its own (the held block folded in), then `settle`."""
        q = self.run.pending
        self.run.advance(self.denoise(q.inputs, q.where, start=q.start, end=q.end, commit=self.held))
        self.held = None
        self.settle()

    def answered(self, logits: torch.Tensor | None, block: PrefixCache | None = None, *,
                 absorbed: PrefixCache | None = None, drawn: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """The pending query answered by a call made elsewhere over `segment`: its logits (or ``drawn``, the tokens
        drawn from them: `draw_greedy`), and the held block's keys/values that call computed (when a block was held),
        or ``absorbed``: the cache with them already written in (a server engine writes every request's block at
        once); then `settle`."""
        q = self.run.pending
        width = q.end - q.start - self.denoise.trims(q, self.held)
        if self.held is not None:
            if block is None and absorbed is None:
                raise ValueError("a block was held for this call: pass the keys/values the call computed for it.")
            width += self.held.end - self.held.start
            if absorbed is not None:
                self.denoise.cache = absorbed
            else:
                self.denoise.absorb(block)
        self.denoise.count(self.run.valid.shape[0], width)
        self.held = None
        self.run.advance(logits, drawn=drawn)
        self.settle()

    def output(self) -> GenerationOutput:
        """Each prompt's chosen candidate (`DecodeRun.output`) with the work done."""
        out = self.run.output()
        out.forward_calls, out.positions = self.denoise.forward_calls, self.denoise.positions
        return out


def uses_length_head(model: torch.nn.Module, config: DecodingConfig) -> bool:
    """Whether candidate lengths come from the model's length head (``predict_lengths``): when asked
    (``length_head=True``, refused with a clear error on a model without one) or by default when the
    model has one."""
    has = callable(getattr(model, "predict_lengths", None))
    if config.length_head and not has:
        raise ValueError(f"length_head=True but {type(model).__name__} has no length head (predict_lengths): "
                         "fine-tune a seq2seq model with one (biglm finetune xsum|squad-qg), or set length_head=False "
                         "to use the length beam over [ceil(N/2), N].")
    return has and config.length_head is not False


def predict_lengths(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
                    config: DecodingConfig) -> torch.Tensor:
    """The length head's (B, length_beam) candidate lengths, clamped to [1, max_new_tokens]."""
    with torch.inference_mode():
        out = model.predict_lengths(prompt_ids, prompt_mask, beam=config.length_beam)
    if out.ndim != 2 or out.shape[0] != prompt_ids.shape[0]:
        raise ValueError(f"predict_lengths returned shape {tuple(out.shape)}; expected (batch={prompt_ids.shape[0]}, "
                         "beam).")
    return out.long().clamp(1, config.max_new_tokens)


class _unchecked:
    """Context: the model's host-side input checks off (the answer ids are written by the loop, not a
    user, and each check is a device sync per call); restored on exit."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.inner = getattr(model, "model", None)
        self.saved = getattr(self.inner, "validate_inputs", None)

    def __enter__(self) -> None:
        if self.saved is not None:
            self.inner.validate_inputs = False

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            self.inner.validate_inputs = self.saved


def _windows(*, N: int, block_length: int, suffix: str) -> list[tuple[int, int, int]]:
    # (block start, block end, suffix end) of each block
    return [(s, min(s + block_length, N), min(s + block_length, N) if suffix == "block" else N)
            for s in range(0, N, block_length)]


def _unmask(progress: Progress, strategy: DecodingStrategy, *, valid: torch.Tensor, mask_id: int, steps: int,
            early_stop: bool, block_length: int, suffix: str, on_step: StepCallback | None, info: dict) -> Loop:
    """The loop every strategy shares, block by block (one block = the published algorithms); returns the model
    calls made. Each step predicts the block's masked slots plus those ``strategy`` re-masks (least confident
    first) and writes the predictions it keeps (most confident first); the others stay masked."""
    R, N = valid.shape
    device = valid.device
    masked = valid.clone()
    windows = _windows(N=N, block_length=block_length, suffix=suffix)
    per_block = _block_steps(steps=steps, num_blocks=len(windows))
    slot = torch.arange(N, device=device)
    calls = 0
    for b, (s0, s1, end) in enumerate(windows):
        block = valid & (slot >= s0) & (slot < s1)
        T = per_block[b]
        active = torch.ones(R, dtype=torch.bool, device=device)  # rows not yet converged (early_stop)
        for t in range(T):
            state = StepState(step=t, steps=T, block=block, masked=masked & block, probs=progress.probs, active=active)
            where = state.masked
            n = strategy.remask(state)
            if n is not None:
                # written tokens of the block, least confident first; masked slots and other blocks are never chosen
                written = block & ~masked
                where = where | ((rank(torch.where(written, progress.probs, float("inf")), descending=False)
                                  < n[:, None]) & written)
            if t > 0 and not bool(where.any()):
                break  # every row converged or filled its block early, or the strategy has nothing left to do
            before = progress.answer
            # masked slots already hold the mask token: only re-masked ones need writing
            inputs = before if n is None else torch.where(where, mask_id, before)
            tok, p = yield Query(inputs, where, s0, end)
            cand = inputs.masked_scatter(where, tok)
            conf = torch.full((R, N), float("-inf"), device=device).masked_scatter(where, p)
            k = strategy.commit(state, where, conf)
            if k is None:  # every prediction kept
                keep = where
                progress.answer = cand
            else:  # the k the strategy chooses (most confident) kept, the others masked again
                keep = strategy.choose(where, conf, k)
                progress.answer = torch.where(keep, cand, inputs)
            progress.probs = torch.where(keep, conf, progress.probs)
            masked = (masked if n is None else masked | where) & ~keep
            if not strategy.remasks:
                progress.final = valid & ~masked  # a kept token never changes again
            calls += 1
            if t > 0 and early_stop:
                active = active & (progress.answer != before).any(1)  # an iteration that changes nothing ends the row
            if on_step is not None:
                on_step(StepInfo(step=calls, total_steps=sum(per_block), block=b, input_ids=inputs,
                                 output_ids=progress.answer, predicted=where, committed=keep,
                                 probs=torch.where(where, conf, 0.0), num_masked=where.sum(1), **info))
        if strategy.remasks:
            progress.final = progress.final | (slot < s1)  # re-masking ends with the block
        if s1 < N:
            yield Commit(s0, s1, progress.answer[:, s0:s1])
    return calls
