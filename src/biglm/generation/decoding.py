"""Decoding loops that write an answer by iterative unmasking (DESIGN §4, paper §4.1).

Notable features
- The answer is N slots that start as the mask token. Three strategies share one model call
  (`AnswerDenoiser`) and one sampler (`sampling.sample`):
  * ``mask-predict`` (Ghazvininejad et al. 2019): T iterations t = 0..T-1. Iteration 0 predicts
    every slot; iteration t >= 1 re-masks the n_t = floor(N·(T-t)/T) lowest-probability tokens
    and predicts only those again (the others keep their earlier probabilities). This is the
    paper's own numbering (t = 0 is the all-mask pass, so n_0 = N and T iterations are T model
    calls). By default all T run, as published; ``early_stop`` (opt-in) ends a row once an
    iteration changes none of its tokens. Only when N < T do late iterations have n_t = 0: they
    would predict nothing and are skipped (same answer, fewer calls).
  * ``confidence`` (LLaDA's low-confidence remasking): each step predicts the masked slots and
    commits the k most confident ones; a committed token is never re-masked. k follows LLaDA's
    schedule (remaining masks spread evenly over the remaining steps). Optional
    semi-autoregressive blocks: slots are filled block by block, left to right.
  * ``threshold`` (Fast-dLLM): like ``confidence`` but every prediction with probability > τ is
    committed, and at least the schedule's k (>= 1) per step. With the default steps = N this is
    exactly "all above τ, at least one".
- Exact prefix cache, on by default: the prompt is encoded once (`encode_prefix`) and every
  iteration runs only the N answer slots, with logits computed only at the slots being predicted
  (`logits_positions`). ``use_cache=False`` runs prompt + answer with ``prefix_len`` instead; the
  two give the same logits up to float rounding (tested), because under the BiGLM mask no prompt
  token attends to the answer.
- Batches of prompts of different lengths are left-padded to a common length P (RoPE is
  relative, so the padding needs no position shift); every answer starts at P.
- Length beam: several candidate lengths per prompt decoded side by side as extra rows (shorter
  candidates are right-padded and masked out as keys); the candidate with the highest average
  log-probability wins, as in CMLM.
- ``on_step`` receives a `StepInfo` after every model call, so a CLI can show the answer unmask.
- Options arrive as one validated `config.DecodingConfig`; `generate_ids` takes no loose option
  keywords except as overrides that build that object once at its entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .config import DEFAULT_MASK_PREDICT_STEPS, STRATEGIES, DecodingConfig  # noqa: F401  (re-exported)
from .sampling import sample


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
        steps: model calls made (per row set; all candidates run together).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    candidate_length: torch.Tensor
    avg_logprob: torch.Tensor
    steps: int

    def token_lists(self) -> list[list[int]]:
        """Each answer as a list of ids, cut at the first EOS."""
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths.tolist())]


class AnswerDenoiser:
    """One model call over the answer slots of a batch, with or without the exact prefix cache.

    Built once per batch: with ``use_cache`` the prompt keys/values are computed here, once, and
    reused by every call. ``prompt_ids`` (B, P) are left-padded, ``prompt_mask`` (B, P) marks real
    tokens; ``rows`` (R,) maps each answer row to its prompt (length-beam candidates share one);
    ``valid`` (R, N) marks slots inside each row's candidate length (the rest are padding keys).
    """

    def __init__(self, model: torch.nn.Module, *, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 rows: torch.Tensor, valid: torch.Tensor, use_cache: bool) -> None:
        self.model = model
        self.prompt_len = prompt_ids.shape[1]
        self.use_cache = use_cache and self.prompt_len > 0  # nothing to cache for empty prompts
        # masks are fixed for the whole decode: build them once (each `.all()` is a host sync)
        self.answer_mask = None if bool(valid.all()) else valid.long()
        prompt_padded = not bool(prompt_mask.all())
        if self.use_cache:
            cache = model.encode_prefix(prompt_ids, prompt_mask if prompt_padded else None)
            # the identity selection is skipped: `select` copies every layer's keys/values
            same = rows.numel() == prompt_ids.shape[0] and bool((rows == torch.arange(rows.numel(), device=rows.device)).all())
            self.cache = cache if same else cache.select(rows)
        else:
            self.prompt_ids = prompt_ids.index_select(0, rows)
            attn = torch.cat((prompt_mask.index_select(0, rows), valid.long()), dim=1)
            self.full_mask = attn if prompt_padded or self.answer_mask is not None else None
            self.no_logits = torch.zeros_like(self.prompt_ids, dtype=torch.bool)

    def __call__(self, answer: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits (M, V) at the ``positions`` (R, N) bool of ``answer`` (R, N), in row-major order."""
        if self.use_cache:
            return self.model(answer, prefix_cache=self.cache, attention_mask=self.answer_mask,
                              logits_positions=positions).logits
        if self.prompt_len == 0:
            return self.model(answer, attention_mask=self.answer_mask, logits_positions=positions).logits
        ids = torch.cat((self.prompt_ids, answer), dim=1)
        where = torch.cat((self.no_logits, positions), dim=1)
        return self.model(ids, prefix_len=self.prompt_len, attention_mask=self.full_mask, logits_positions=where).logits


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


def _rank(scores: torch.Tensor, *, descending: bool) -> torch.Tensor:
    """Rank (R, N) of each entry within its row; a stable sort so ties break by slot index, the
    same way on the cached and uncached paths."""
    order = scores.argsort(dim=1, descending=descending, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(scores.shape[1], device=scores.device).expand_as(order))
    return ranks


def _block_steps(*, steps: int, num_blocks: int) -> list[int]:
    # steps spread as evenly as possible over the blocks, at least one each
    base, extra = divmod(steps, num_blocks)
    return [max(1, base + (b < extra)) for b in range(num_blocks)]


@torch.inference_mode()
def generate_ids(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None = None,
    *,
    config: DecodingConfig | None = None,
    lengths: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    suppress_ids: Sequence[int] = (),
    on_step: StepCallback | None = None,
    **overrides: Any,
) -> GenerationOutput:
    """Generate answers for left-padded prompts ``prompt_ids`` (B, P) by iterative unmasking.

    Args:
        model: a `BiGLMForMaskedLM` (or anything with its ``encode_prefix`` / forward API).
        prompt_ids, prompt_mask: (B, P) left-padded prompts and their 1/0 mask (None = no padding).
        config: the decoding options (`DecodingConfig`; default: its defaults, i.e. Mask-Predict with
            T = 10 model calls). ``config.stop`` is a text-level option, applied by `api.generate`.
        lengths: candidate answer lengths, for a model with its own length head; default: the length
            beam of ``config`` (``[max_new_tokens]`` without one).
        generator: the sampler's random stream (default: seeded with ``config.seed``).
        suppress_ids: token ids never generated (the mask token and, when it is not EOS, the pad
            token are always suppressed).
        on_step: called with a `StepInfo` after every model call.
        **overrides: `DecodingConfig` fields changed on top of ``config`` (validated together, once).
    """
    cfg = (config or DecodingConfig()).override(**overrides)
    model_cfg = model.config
    mask_id = getattr(model_cfg, "mask_token_id", None)
    if mask_id is None:
        raise ValueError("the model has no mask_token_id: set config.mask_token_id to the tokenizer's mask token id "
                         "(iterative unmasking starts from an all-mask answer).")
    if lengths is None:
        lengths = candidate_lengths(max_new_tokens=cfg.max_new_tokens, length_beam=cfg.length_beam)
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"candidate lengths {lengths} must be a non-empty list of integers >= 1.")
    N = max(lengths)
    steps = cfg.num_steps(N)
    strategy = cfg.strategy
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] == 0:
        raise ValueError(f"prompt_ids must be a non-empty (batch, length) tensor, got shape {tuple(prompt_ids.shape)}.")
    B, P = prompt_ids.shape
    if P + N > model_cfg.max_position_embeddings:
        raise ValueError(f"prompt ({P}) + answer ({N}) tokens exceed max_position_embeddings="
                         f"{model_cfg.max_position_embeddings}: shorten the prompt or max_new_tokens.")

    if prompt_ids.numel() and (int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= model_cfg.vocab_size):
        raise ValueError(f"prompt token ids must lie in [0, vocab_size={model_cfg.vocab_size}): was the prompt encoded "
                         "with this model's tokenizer?")
    device = prompt_ids.device
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids)
    if generator is None:
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
    K = len(lengths)
    rows = torch.arange(B, device=device).repeat_interleave(K)  # row r = prompt r // K, candidate r % K
    cand_len = torch.tensor(lengths, device=device).repeat(B)  # (R,)
    valid = torch.arange(N, device=device)[None, :] < cand_len[:, None]  # (R, N)
    denoise = AnswerDenoiser(model, prompt_ids=prompt_ids, prompt_mask=prompt_mask, rows=rows, valid=valid,
                             use_cache=cfg.use_cache)

    eos_id, pad_id = model_cfg.eos_token_id, model_cfg.pad_token_id
    banned = {mask_id, *suppress_ids}
    if pad_id is not None and pad_id != eos_id:
        banned.add(pad_id)  # a pad in the middle of an answer is never what a user wants
    banned_t = torch.tensor(sorted(i for i in banned if 0 <= i < model_cfg.vocab_size), dtype=torch.long, device=device)

    def predict(answer: torch.Tensor, where: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = denoise(answer, where)
        logits = logits.index_fill(-1, banned_t, float("-inf"))
        return sample(logits, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, generator=generator)

    info = dict(strategy=strategy, valid=valid, prompt_index=rows, candidate_length=cand_len)
    # the answer ids are written by this loop, not by a user: the model's host-side input checks (a
    # device sync per call) add nothing after the prompt was checked
    inner = getattr(model, "model", None)
    checks = getattr(inner, "validate_inputs", None)
    if checks is not None:
        inner.validate_inputs = False
    try:
        if strategy == "mask-predict":
            answer, probs, calls = _mask_predict(predict, valid=valid, mask_id=mask_id, steps=steps,
                                                 early_stop=cfg.early_stop, on_step=on_step, info=info)
        else:
            answer, probs, calls = _commit_by_confidence(
                predict, valid=valid, mask_id=mask_id, steps=steps, block_length=cfg.block_length or N,
                threshold=cfg.threshold if strategy == "threshold" else None, on_step=on_step, info=info)
    finally:
        if checks is not None:
            inner.validate_inputs = checks

    # length beam: the candidate with the highest mean log-probability per slot
    logp = torch.where(valid, probs.clamp_min(torch.finfo(torch.float32).tiny).log(), 0.0)
    avg = logp.sum(1) / cand_len
    best = avg.view(B, K).argmax(dim=1) + torch.arange(B, device=device) * K  # (B,) row index
    fill = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
    tokens = torch.where(valid, answer, fill)[best]
    chosen_len = cand_len[best]
    out_len = chosen_len.clone()
    if eos_id is not None:
        is_eos = (tokens == eos_id) & valid[best]
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1), chosen_len)
        out_len = torch.minimum(first, chosen_len)
    return GenerationOutput(tokens=tokens, lengths=out_len, candidate_length=chosen_len, avg_logprob=avg[best],
                            steps=calls)


Predict = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _mask_predict(predict: Predict, *, valid: torch.Tensor, mask_id: int, steps: int, early_stop: bool,
                  on_step: StepCallback | None, info: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Mask-Predict over all rows at once; returns (answer, probs, model calls)."""
    R, N = valid.shape
    lengths = valid.sum(1)
    answer = torch.full((R, N), mask_id, dtype=torch.long, device=valid.device)
    probs = torch.zeros(R, N, dtype=torch.float32, device=valid.device)
    active = torch.ones(R, dtype=torch.bool, device=valid.device)  # rows not yet converged
    calls = 0
    for t in range(steps):
        if t == 0:
            where = valid
        else:
            n = torch.where(active, lengths * (steps - t) // steps, 0)  # n_t per row
            # lowest-probability tokens first; slots outside a row's length are never chosen
            ranks = _rank(torch.where(valid, probs, float("inf")), descending=False)
            where = ranks < n[:, None]
            if not bool(where.any()):
                break  # every row converged, or n_t = 0 from here on
        before = answer
        inputs = torch.where(where, mask_id, answer)
        tok, p = predict(inputs, where)
        answer = inputs.masked_scatter(where, tok)
        probs = probs.masked_scatter(where, p)
        calls += 1
        if t > 0 and early_stop:
            active = active & (answer != before).any(1)  # an iteration that changes nothing ends the row
        if on_step is not None:
            on_step(StepInfo(step=calls, total_steps=steps, block=0, input_ids=inputs, output_ids=answer,
                             predicted=where, committed=where, probs=torch.where(where, probs, 0.0),
                             num_masked=where.sum(1), **info))
    return answer, probs, calls


def _commit_by_confidence(predict: Predict, *, valid: torch.Tensor, mask_id: int, steps: int, block_length: int,
                          threshold: float | None, on_step: StepCallback | None, info: dict,
                          ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """LLaDA-style commit of the most confident predictions, block by block; never re-masks."""
    R, N = valid.shape
    device = valid.device
    answer = torch.full((R, N), mask_id, dtype=torch.long, device=device)
    probs = torch.zeros(R, N, dtype=torch.float32, device=device)
    masked = valid.clone()
    num_blocks = math.ceil(N / block_length)
    per_block = _block_steps(steps=steps, num_blocks=num_blocks)
    slot = torch.arange(N, device=device)
    calls = 0
    for b in range(num_blocks):
        in_block = (slot >= b * block_length) & (slot < (b + 1) * block_length)
        for s in range(per_block[b]):
            where = masked & in_block
            if not bool(where.any()):
                break  # the threshold rule filled this block early
            tok, p = predict(answer, where)
            cand = answer.masked_scatter(where, tok)
            conf = torch.full((R, N), float("-inf"), device=device).masked_scatter(where, p)
            remaining = where.sum(1)
            # LLaDA's schedule: the masks left in the block spread evenly over the steps left
            quota = -(-remaining // (per_block[b] - s))
            if threshold is not None:
                quota = torch.maximum(quota, (conf > threshold).sum(1))
            commit = (_rank(conf, descending=True) < quota[:, None]) & where
            inputs = answer
            answer = torch.where(commit, cand, answer)
            probs = torch.where(commit, conf, probs)
            masked = masked & ~commit
            calls += 1
            if on_step is not None:
                on_step(StepInfo(step=calls, total_steps=sum(per_block), block=b, input_ids=inputs,
                                 output_ids=answer, predicted=where, committed=commit,
                                 probs=torch.where(where, conf, 0.0), num_masked=where.sum(1), **info))
    return answer, probs, calls
