"""log P(continuation | context) for a BiGLM: six estimators, batched over an exact prefix cache. What `biglm eval`,
the lm-eval adapter, the held-out metrics and fine-tuning's label-word classifier call (`score_requests`).

One engine: each estimator turns a request (context X, continuation Y) into *variants*, copies of Y with some
positions masked, the positions scored in each and a weight. Every distinct context is encoded once
(`encode_prefix`; the choices of a question share it), its cache rows repeated for all variants (`PrefixCache.select`),
and only the suffix runs, with logits at the scored slots alone (`logits_positions`). The estimators, n = |Y|:
- ``chain``: Σ_t log P(y_t | X, y_<t, y_≥t masked), n variants; a proper distribution over length-n continuations.
- ``one-pass``: Σ_t log P(y_t | X, Y all masked), one variant; a product of marginals.
- ``blocks``: the chain rule over blocks of ``score_block`` tokens, ceil(n/b) variants (b = 1: chain; b ≥ n: one-pass).
- ``pll``: pseudo-log-likelihood (Salazar et al. 2020), variant t masks slot t only; not a distribution.
- ``mc``: LLaDA's Monte Carlo ELBO (Nie et al. 2025, eq. 6): sample i of m masks k_i = 1 + floor((i + u)·n/m) slots
  (u ~ U(0,1), clipped to n), scored with weight n/(k_i·m); seeded per request from (seed, token ids), so a score does
  not depend on batching or order; an unbiased estimate of the ELBO ≤ log P(Y | X).
- ``append``: the distribution one-token-per-call decoding writes from, under the cache that decoding runs for the
  model (`append_cache`, `generation.config.for_model`'s rule): a `biglm-blocks` model's whole continuation is one
  teacher-forced row (each committed token a block of one); other models re-encode X + y_<t per token (the exact
  cache); a causal conversion reads context + answer in one causal pass (`_score_causal`), as lm-eval's hf model.
Each also says ``is_greedy`` (the decoding it belongs to writes Y). Definitions, costs and tests: docs/scoring.md.
Context + continuation must fit ``max_length``: longer requests lose context from the left (with a warning), a
continuation that alone does not fit is an error. Contexts are left-padded (RoPE is relative), suffixes right-padded,
pads masked out as keys.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..generation.config import DecodingConfig, for_model, untrained_blocks_of_one
from ..model.modeling import BiGLMForMaskedLM, PrefixCache

ESTIMATORS: tuple[str, ...] = ("chain", "one-pass", "pll", "mc", "blocks", "append")


def default_estimator(config: object) -> str:
    """The estimator ``scorer=auto`` picks for a model: ``append`` (the distribution one-token-per-call decoding writes
    from, under the cache that decoding runs: `append_cache`) for a `biglm-blocks` model trained on prefix blocks of 1
    and for a model converted from an AR checkpoint (``shift_logits``); ``chain`` otherwise: exact for every BiGLM,
    where ``append`` would run the append cache at blocks of 1, a condition such a blocks model never trained on.
    On a blocks model ``append`` scores an answer in one row of ~2n positions (n for a shift model) against ``chain``'s
    n rows; on a converted model that is not a blocks model its decoding re-encodes the prefix per token (the exact
    cache) and so does ``append`` (docs/scoring.md)."""
    if getattr(config, "shift_logits", False):
        return "append"
    blocks = getattr(config, "prefix_attention", "bidirectional") == "blocks"
    return "append" if blocks and 1 in (getattr(config, "prefix_block_lengths", None) or []) else "chain"


def append_cache(config: object, block_cache: str | None = None) -> str:
    """The cache the ``append`` estimator scores under: the one one-token-per-call decoding (confidence at
    block_length=1, or speculative decoding with ``block_cache="append"``) runs for this model, as
    `generation.config.for_model` picks it (``append`` for a `biglm-blocks` model, ``exact`` otherwise), or
    ``block_cache`` when given, as a `DecodingConfig` takes it."""
    if block_cache not in (None, "exact", "append"):
        raise ValueError(f"block_cache={block_cache!r}: choose exact or append (or unset for the model's).")
    with warnings.catch_warnings():  # for_model's approximation warning: the scorer says its own (score_requests)
        warnings.simplefilter("ignore")
        return str(for_model(DecodingConfig(strategy="confidence", block_length=1, block_cache=block_cache),
                             config).block_cache)


@dataclass(frozen=True)
class _Variant:
    """One suffix pass row: ``tokens`` (Y with some slots masked), ``slots`` scored with their true
    ``targets``, each log-prob multiplied by ``weight``. ``slots`` index the row (a row entry's answer slot is its
    index, except in an ``append`` row). ``blocks_of_one`` None: the row sees itself bidirectionally (every estimator
    but ``append``); k: the row's first k entries are answer tokens y_0..y_{k-1} as blocks of one and the rest are
    checks, one mask per slot (`append_layout`). ``prefix`` k (``append`` under the exact cache): the row's first k
    entries join the context as one bidirectional prefix (re-encoded with it); the rest see it and themselves."""

    request: int
    tokens: tuple[int, ...]
    slots: tuple[int, ...]
    targets: tuple[int, ...]
    weight: float
    blocks_of_one: int | None = None
    prefix: int | None = None


def _variants(estimator: str, request: int, context: Sequence[int], cont: Sequence[int], *, mask_id: int,
              mc_samples: int, seed: int, score_block: int = 8, shift: bool = False,
              cache: str = "append") -> list[_Variant]:
    """The rows an estimator needs for one request (see the module docstring for the definitions); ``shift``: the
    model's ``shift_logits``, which only ``append`` lays out differently; ``cache``: ``append``'s (`append_cache`)."""
    n = len(cont)
    y = tuple(int(t) for t in cont)
    if estimator == "append" and cache == "exact":  # X + y_<t one prefix, slot t's mask (shift: read from y_{t-1})
        return [_Variant(request, y[:t] + (mask_id,), (t,), (y[t],), 1.0, prefix=t) for t in range(n)]
    if estimator == "append" and shift:  # row t's logits are token t-1's hidden state: no masks
        return [_Variant(request, y, tuple(range(n)), y, 1.0, blocks_of_one=n)]
    if estimator == "append":  # y_0..y_{n-2}, then check t (a mask at slot t) at row entry n - 1 + t
        return [_Variant(request, y[:-1] + (mask_id,) * n, tuple(range(n - 1, 2 * n - 1)), y, 1.0, blocks_of_one=n - 1)]
    if estimator == "one-pass":
        return [_Variant(request, (mask_id,) * n, tuple(range(n)), y, 1.0)]
    if estimator == "blocks":
        return [_Variant(request, y[:t] + (mask_id,) * (n - t), tuple(range(t, min(n, t + score_block))),
                         y[t:t + score_block], 1.0) for t in range(0, n, score_block)]
    if estimator == "chain":
        return [_Variant(request, y[:t] + (mask_id,) * (n - t), (t,), (y[t],), 1.0) for t in range(n)]
    if estimator == "pll":
        return [_Variant(request, y[:t] + (mask_id,) + y[t + 1:], (t,), (y[t],), 1.0) for t in range(n)]
    if estimator == "mc":
        # seed from the request's own ids: the estimate is a function of (seed, X, Y) only
        digest = zlib.crc32(np.asarray([*context, -1, *cont], dtype=np.int64).tobytes())
        rng = np.random.default_rng([seed, digest])
        u = rng.random()
        out = []
        for i in range(mc_samples):
            k = min(n, 1 + int((i + u) * n / mc_samples))
            slots = tuple(sorted(int(s) for s in rng.choice(n, size=k, replace=False)))
            tokens = tuple(mask_id if j in slots else y[j] for j in range(n))
            out.append(_Variant(request, tokens, slots, tuple(y[j] for j in slots), n / (k * mc_samples)))
        return out
    raise ValueError(f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}.")


def chain_rows(continuation: Sequence[int], *, mask_id: int) -> list[tuple[tuple[int, ...], int]]:
    """The ``chain`` estimator's suffix rows for one continuation: ``(tokens, t)`` for t = 0..n-1, ``tokens`` = y_<t
    visible and y_>=t masked, slot t scored. What `score_requests` runs for ``chain``; fine-tuning trains on the same
    rows with gradients (classification by prompt with multi-token label words)."""
    return [(v.tokens, v.slots[0]) for v in _variants("chain", 0, (), continuation, mask_id=mask_id, mc_samples=1, seed=0)]


def append_layout(*, tokens: int, length: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """An ``append`` row of ``length`` entries whose first ``tokens`` are answer tokens: ``(rule, slots)``, the
    (length, length) bool of which entries each entry sees (every entry also sees the whole context) and each entry's
    answer slot (its position past the context). Token i sits at slot i and sees tokens 0..i (a block of one, as the
    append cache commits it); check t (entry tokens + t) sits at slot t and sees tokens 0..t-1 and itself, exactly the
    mask one-token-per-call decoding predicts slot t with."""
    i = torch.arange(length, device=device)
    is_token = i < tokens
    slots = torch.where(is_token, i, i - tokens)
    # only tokens are keys to others (j < tokens): token i sees j <= i, check t sees j < t; everyone sees itself
    sees_token = (i[None, :] < tokens) & torch.where(is_token[:, None], i[None, :] <= i[:, None],
                                                      i[None, :] < slots[:, None])
    return sees_token | (i[:, None] == i[None, :]), slots


def fit_window(context: Sequence[int], continuation: Sequence[int], *, max_length: int) -> tuple[list[int], int]:
    """Return ``(context, n_dropped)`` with the context cut from the left so that context + continuation
    fits ``max_length``. Raises ValueError for an empty continuation or one longer than the window."""
    if len(continuation) == 0:
        raise ValueError("empty continuation: there is nothing to score (lm-eval puts the word-boundary space "
                         "in the continuation; check the task's target delimiter).")
    if len(continuation) > max_length:
        raise ValueError(f"continuation of {len(continuation)} tokens does not fit the window of {max_length} "
                         "tokens: use loglikelihood_rolling for long texts, or a model with a longer window.")
    keep = max_length - len(continuation)
    drop = max(0, len(context) - keep)
    return list(context[drop:]), drop


@torch.no_grad()
def score_requests(
    model: BiGLMForMaskedLM,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    estimator: str = "chain",
    batch_size: int = 16,
    row_batch_size: int = 256,
    mc_samples: int = 32,
    seed: int = 1234,
    max_length: int | None = None,
    use_cache: bool = True,
    score_block: int = 8,
    block_cache: str | None = None,
) -> list[tuple[float, bool]]:
    """Score ``requests`` = [(context_ids, continuation_ids), ...] and return [(loglik, is_greedy), ...].

    Args:
        model: a BiGLM in eval mode (any device/dtype; log-softmax runs in fp32).
        estimator: ``chain`` | ``one-pass`` | ``pll`` | ``mc`` | ``blocks`` | ``append`` (module docstring). ``append``
            under the append cache on a model not trained on prefix blocks of 1 (nor converted from an AR checkpoint)
            warns once per call (it scores a condition never trained).
        batch_size: distinct contexts encoded together (one `encode_prefix` call per batch).
        row_batch_size: suffix rows (variants) per forward pass.
        mc_samples: samples per request for ``mc``.
        seed: base seed for ``mc`` (combined with each request's ids).
        score_block: tokens per block for ``blocks`` (1: ``chain``; >= the continuation: ``one-pass``).
        block_cache: ``append``'s cache, ``exact`` | ``append`` as decoding's option (unset: the one one-token-per-call
            decoding runs for the model, `append_cache`).
        max_length: the window; default ``model.config.max_position_embeddings``.
        use_cache: False runs the full sequence (context + suffix, BiGLM mask) for every row instead of
            the prefix cache; the result is the same up to float rounding (kept for tests and debugging).

    An empty context is allowed: the row then sees only its own suffix.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}.")
    if estimator == "mc" and mc_samples < 1:
        raise ValueError(f"mc_samples={mc_samples} must be >= 1.")
    if estimator == "blocks" and score_block < 1:
        raise ValueError(f"score_block={score_block} must be >= 1.")
    if batch_size < 1 or row_batch_size < 1:
        raise ValueError("batch_size and row_batch_size must be >= 1.")
    config = model.config
    if config.mask_token_id is None:
        raise ValueError("model.config.mask_token_id is None: a BiGLM scorer needs a mask token.")
    cache = append_cache(config, block_cache)
    if estimator == "append" and cache == "append" and default_estimator(config) != "append":
        warnings.warn(untrained_blocks_of_one(config, use="the append scorer reads every answer token as a block of 1"),
                      stacklevel=3)  # past no_grad's wrapper
    shift = bool(getattr(config, "shift_logits", False))
    window = int(max_length or config.max_position_embeddings)
    pad_id = int(config.pad_token_id if config.pad_token_id is not None else 0)
    device = next(model.parameters()).device

    # fit the window, then group requests by identical (fitted) context
    fitted: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    truncated = 0
    for ctx, cont in requests:
        ctx_fit, dropped = fit_window(ctx, cont, max_length=window)
        truncated += dropped > 0
        fitted.append((tuple(int(t) for t in ctx_fit), tuple(int(t) for t in cont)))
    if truncated:
        warnings.warn(f"{truncated} of {len(requests)} requests exceed the {window}-token window: their contexts "
                      "were truncated from the left (the continuation is kept whole).", stacklevel=3)  # past no_grad's wrapper
    loglik = np.zeros(len(requests), dtype=np.float64)
    greedy = np.ones(len(requests), dtype=bool)
    if estimator == "append" and cache == "append" and config.prefix_attention == "causal" and use_cache:
        # a causal model reads context and answer as its AR source did: one causal pass per request scores the answer,
        # lm-eval's own cost (no context cache to copy into every choice's row)
        _score_causal(model, fitted, batch_size=batch_size, pad_id=pad_id, loglik=loglik, greedy=greedy)
        return [(float(ll), bool(g)) for ll, g in zip(loglik, greedy)]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx, _) in enumerate(fitted):
        groups.setdefault(ctx, []).append(i)
    # longest contexts first: similar lengths share a batch, so left padding stays small
    contexts = sorted(groups, key=len, reverse=True)

    for ctx_batch in _context_batches(contexts, groups, fitted, batch_size=batch_size, window=window):
        P = max(1, max(len(c) for c in ctx_batch))  # >= 1 so an all-empty batch still has a (padded) prefix
        ctx_ids = torch.full((len(ctx_batch), P), pad_id, dtype=torch.long)
        ctx_mask = torch.zeros((len(ctx_batch), P), dtype=torch.long)
        for b, c in enumerate(ctx_batch):
            if c:
                ctx_ids[b, P - len(c):] = torch.tensor(c)
                ctx_mask[b, P - len(c):] = 1
        ctx_ids, ctx_mask = ctx_ids.to(device), ctx_mask.to(device)
        # append under the exact cache re-encodes the context in every row: no context cache to share
        exact_rows = estimator == "append" and cache == "exact"
        prefix_cache = model.encode_prefix(ctx_ids, attention_mask=ctx_mask) if use_cache and not exact_rows else None

        rows: list[tuple[int, _Variant]] = []  # (context row in this batch, variant)
        for b, c in enumerate(ctx_batch):
            for r in groups[c]:
                rows += [(b, v) for v in _variants(estimator, r, c, fitted[r][1], mask_id=int(config.mask_token_id),
                                                   mc_samples=mc_samples, seed=seed, score_block=score_block,
                                                   shift=shift, cache=cache)]
        rows.sort(key=lambda bv: len(bv[1].tokens))  # similar suffix lengths per pass: less right padding
        for r0 in range(0, len(rows), row_batch_size):
            chunk = rows[r0:r0 + row_batch_size]
            _run_rows(model, chunk, cache=prefix_cache, ctx_ids=ctx_ids, ctx_mask=ctx_mask, pad_id=pad_id,
                      loglik=loglik, greedy=greedy)
    return [(float(ll), bool(g)) for ll, g in zip(loglik, greedy)]


def _score_causal(model: BiGLMForMaskedLM, fitted: list[tuple[tuple[int, ...], tuple[int, ...]]], *, batch_size: int,
                  pad_id: int, loglik: np.ndarray, greedy: np.ndarray) -> None:
    """``append`` on a causal model (`prefix_attention="causal"`, the shift): each request's context + answer as one
    text read causally, right-padded, ``batch_size`` requests a pass (longest first); the answer tokens' logits are the
    next-token predictions at their positions. Accumulates into ``loglik`` / ``greedy`` in place."""
    device = next(model.parameters()).device
    order = sorted(range(len(fitted)), key=lambda i: -(len(fitted[i][0]) + len(fitted[i][1])))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        lengths = [len(fitted[i][0]) + len(fitted[i][1]) for i in idx]
        ids = torch.full((len(idx), max(lengths)), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        where = torch.zeros(ids.shape, dtype=torch.bool)
        targets: list[int] = []
        owners: list[int] = []
        for b, i in enumerate(idx):
            ctx, cont = fitted[i]
            ids[b, :lengths[b]] = torch.tensor(ctx + cont)
            mask[b, :lengths[b]] = 1
            where[b, len(ctx):lengths[b]] = True
            targets += cont
            owners += [i] * len(cont)
        logits = model(ids.to(device), prefix_len=torch.tensor(lengths, device=device),
                       attention_mask=mask.to(device), logits_positions=where.to(device)).logits
        _accumulate(model, logits, targets, owners, [1.0] * len(targets), loglik=loglik, greedy=greedy)


def _accumulate(model: BiGLMForMaskedLM, logits: torch.Tensor, targets: list[int], owners: list[int],
                weights: list[float], *, loglik: np.ndarray, greedy: np.ndarray) -> None:
    """Each scored slot's log-probability of its target (times its weight) added to its request, and whether it was
    the argmax."""
    logits = logits.float()
    mask_id = model.config.mask_token_id
    if mask_id is not None and 0 <= mask_id < logits.shape[-1]:
        # the mask token is never text (decoding never writes it): a log-likelihood is over the tokens a model writes,
        # so a model converted from an AR checkpoint, whose added mask row the source never had, scores as its source
        logits[:, mask_id] = float("-inf")
    logp = torch.log_softmax(logits, dim=-1)  # (M, V)
    tgt = torch.tensor(targets, dtype=torch.long, device=logp.device)
    lp = logp.gather(1, tgt[:, None]).squeeze(1).double().cpu().numpy()
    hit = (logp.argmax(dim=-1) == tgt).cpu().numpy()
    np.add.at(loglik, np.asarray(owners), lp * np.asarray(weights))
    np.logical_and.at(greedy, np.asarray(owners), hit)


def _context_batches(contexts: list[tuple[int, ...]], groups: dict[tuple[int, ...], list[int]],
                     fitted: list[tuple[tuple[int, ...], tuple[int, ...]]], *, batch_size: int, window: int
                     ) -> list[list[tuple[int, ...]]]:
    """Up to ``batch_size`` contexts per batch, such that the left-padded prefix (the batch's longest context)
    plus its longest continuation still fits the window: every request fits alone, and so does every batch."""
    longest = {c: max(len(fitted[r][1]) for r in groups[c]) for c in contexts}
    batches: list[list[tuple[int, ...]]] = []
    current: list[tuple[int, ...]] = []
    P = S = 0
    for c in contexts:
        p, s = max(P, len(c), 1), max(S, longest[c])
        if current and (len(current) >= batch_size or p + s > window):
            batches.append(current)
            current, p, s = [], max(len(c), 1), longest[c]
        current.append(c)
        P, S = p, s
    if current:
        batches.append(current)
    return batches


def _run_rows(model: BiGLMForMaskedLM, chunk: list[tuple[int, _Variant]], *, cache: PrefixCache | None,
              ctx_ids: torch.Tensor, ctx_mask: torch.Tensor, pad_id: int, loglik: np.ndarray,
              greedy: np.ndarray) -> None:
    """One suffix pass over ``chunk``; accumulates weighted log-probs and greedy flags in place."""
    device = ctx_ids.device
    S = max(len(v.tokens) for _, v in chunk)
    R = len(chunk)
    ids = torch.full((R, S), pad_id, dtype=torch.long)
    mask = torch.zeros((R, S), dtype=torch.long)
    score = torch.zeros((R, S), dtype=torch.bool)
    targets: list[int] = []
    weights: list[float] = []
    owners: list[int] = []
    for i, (_, v) in enumerate(chunk):
        ids[i, :len(v.tokens)] = torch.tensor(v.tokens)
        mask[i, :len(v.tokens)] = 1
        score[i, list(v.slots)] = True
        # slots are sorted, so this is the row-major order of the flattened logits
        targets += v.targets
        weights += [v.weight] * len(v.slots)
        owners += [v.request] * len(v.slots)
    index = torch.tensor([b for b, _ in chunk], dtype=torch.long, device=device)
    ids, mask, score = ids.to(device), mask.to(device), score.to(device)
    P = ctx_ids.shape[1]
    rule = positions = None
    if chunk[0][1].blocks_of_one is not None:  # append rows (one estimator per call): rule and slots given outright
        rule = torch.eye(S, dtype=torch.bool).expand(R, S, S).clone()  # a padding entry sees itself only
        slots = torch.arange(S).expand(R, S).clone()
        for i, (_, v) in enumerate(chunk):
            n = len(v.tokens)
            rule[i, :n, :n], slots[i, :n] = append_layout(tokens=v.blocks_of_one, length=n)
        rule, positions = rule.to(device), P + slots.to(device)
    if cache is not None:
        if rule is not None:
            rule = torch.cat((rule.new_ones(R, S, P), rule), dim=2)
        logits = model(ids, prefix_cache=cache.select(index), attention_mask=mask, logits_positions=score,
                       attention_rule=rule, position_ids=positions).logits
    else:
        # the whole sequence: the reference path (the context seeing only itself: the BiGLM mask, or the append rule),
        # and append's exact-cache rows
        full = torch.cat((ctx_ids.index_select(0, index), ids), dim=1)
        full_mask = torch.cat((ctx_mask.index_select(0, index), mask), dim=1)
        full_score = torch.cat((torch.zeros_like(ctx_mask, dtype=torch.bool).index_select(0, index), score), dim=1)
        if chunk[0][1].prefix is not None:  # the exact cache: context + the row's leading answer tokens, one prefix
            split = P + torch.tensor([v.prefix for _, v in chunk], dtype=torch.long, device=device)
            logits = model(full, prefix_len=split, attention_mask=full_mask, logits_positions=full_score).logits
        elif rule is None:
            logits = model(full, prefix_len=P, attention_mask=full_mask, logits_positions=full_score).logits
        else:
            context = rule.new_ones(R, P, P)
            if model.config.prefix_attention == "causal":  # a causal model reads its context as its source did
                context = torch.tril(context)
            top = torch.cat((context, rule.new_zeros(R, P, S)), dim=2)
            full_rule = torch.cat((top, torch.cat((rule.new_ones(R, S, P), rule), dim=2)), dim=1)
            full_positions = torch.cat((torch.arange(P, device=device).expand(R, P), positions), dim=1)
            logits = model(full, attention_rule=full_rule, position_ids=full_positions, attention_mask=full_mask,
                           logits_positions=full_score).logits
    _accumulate(model, logits, targets, owners, weights, loglik=loglik, greedy=greedy)


def rolling_requests(tokens: Sequence[int], *, prefix_token: int, max_length: int,
                     chunk: int = 32) -> list[tuple[list[int], list[int]]]:
    """Split a text into (context, continuation) pairs for perplexity scoring.

    Every token is predicted exactly once, in chunks of at most ``chunk`` tokens; each chunk is
    conditioned on as many preceding tokens as the window allows (``max_length - len(chunk)``),
    the first on ``prefix_token`` alone (BOS, like lm-eval's EOT prefix for causal LMs). Short chunks
    keep the chain rule cheap (n² suffix positions per chunk) and leave most of the window to context.
    """
    if chunk < 1 or chunk >= max_length:
        raise ValueError(f"chunk={chunk} must lie in [1, max_length={max_length}) so some context fits.")
    full = [int(prefix_token), *map(int, tokens)]  # full[s] is the last context token before tokens[s]
    pairs = []
    for s in range(0, len(tokens), chunk):
        cont = full[s + 1:s + 1 + chunk]
        start = max(0, s + 1 - (max_length - len(cont)))
        pairs.append((full[start:s + 1], cont))
    return pairs


def score_rolling(
    model: BiGLMForMaskedLM,
    texts: Sequence[Sequence[int]],
    *,
    prefix_token: int,
    estimator: str = "chain",
    chunk: int = 32,
    max_length: int | None = None,
    **kwargs,
) -> list[float]:
    """Total log-likelihood of each token sequence in ``texts`` (for perplexity), scored window by window
    with `rolling_requests` and `score_requests` (``kwargs`` go to the latter). Empty texts score 0."""
    window = int(max_length or model.config.max_position_embeddings)
    pairs, owner = [], []
    for i, toks in enumerate(texts):
        for p in rolling_requests(toks, prefix_token=prefix_token, max_length=window, chunk=chunk):
            pairs.append(p)
            owner.append(i)
    scores = score_requests(model, pairs, estimator=estimator, max_length=window, **kwargs)
    total = [0.0] * len(texts)
    for i, (ll, _) in zip(owner, scores):
        total[i] += ll
    return total
