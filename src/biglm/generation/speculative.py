"""Speculative decoding: confidence decoding at blocks of 1 (one token per call), in fewer calls.

A `biglm-blocks` model decoding one token per call (``strategy="confidence", block_length=1``, the append cache) runs,
per call, the answer's last token as a block of one (it sees the cache and itself; its keys/values are final) and one
mask for the next slot (it sees everything). That is an autoregressive model made of masks: exact, linear, and 98-100%
grammatical on the synthetic grammar (docs/LOG.md), but one call per token. This module writes the same answer with
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

A shift model (``shift_logits``: converted from an autoregressive checkpoint, a row's logits are the previous row's
hidden state) needs no check rows: one-token-per-call decoding predicts the slot after a token from that token's own
row (it sees the cache and itself), so pending token j's row is check j, read one row later; group j is the block of
W masks alone, its drafts read at its rows 1..m. A call then runs W + W·W positions.

Greedy with ``draft_accept=1`` the answer equals confidence decoding at blocks of 1, one token per call (tested token
for token, batches of different prompt lengths included), in float32. In bfloat16 a call of 24 positions rounds
differently from a call of 3, so a near-tie can flip and the two answers part from there (docs/LOG.md, 2026-11-26).
Rows of a batch keep different numbers of drafts: a call appends the widest row's pending tokens to the cache and
marks the others' extra ones as padding keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..model.modeling import PrefixCache
from .config import DecodingConfig, for_model
from .decoding import GenerationOutput, StepCallback, StepInfo, _unchecked
from .sampling import filter_logits


def tree_rule(*, pending: int, width: int, checks: bool = True, device: torch.device | str = "cpu") -> torch.Tensor:
    """(L, L) bool: which of a speculative call's own rows each row may see (module docstring); every row also sees
    the whole cache. Rows: ``pending`` tokens (0 on the first call, else ``width``), then max(pending, 1) groups:
    with ``checks``, 1 + ``width`` rows (the check, then a block of ``width`` masks, the first at the check's slot);
    without (a shift model, whose checks are the pending tokens' own rows), the block of ``width`` masks alone."""
    groups, size = max(pending, 1), width + int(checks)
    L = pending + groups * size
    rule = torch.zeros(L, L, dtype=torch.bool, device=device)
    k = torch.arange(pending, device=device)
    rule[:pending, :pending] = k[None, :] <= k[:, None]  # pending tokens: blocks of one
    for j in range(groups):
        start = pending + j * size
        if pending:
            rule[start:start + size, :j + 1] = True  # the answer as it is if d_1..d_j are right
        if checks:
            rule[start, start] = True  # the check: its own slot only
        block = start + int(checks)
        rule[block:start + size, block:start + size] = True  # the drafts: a block of masks
    return rule


def tree_offsets(*, pending: int, width: int, checks: bool = True, device: torch.device | str = "cpu") -> torch.Tensor:
    """(L,) long: each row's position relative to the first unwritten slot (pending token i: i - 1; group j: its
    check j (with ``checks``), then its block j, j + 1, ..., j + width - 1)."""
    groups = max(pending, 1)
    own = torch.arange(pending, device=device) - 1
    block = torch.arange(groups, device=device)[:, None] + torch.arange(width, device=device)[None, :]
    grid = torch.cat((torch.arange(groups, device=device)[:, None], block), 1) if checks else block
    return torch.cat((own, grid.reshape(-1)))


def tree_predictions(*, pending: int, width: int, checks: bool = True, device: torch.device | str = "cpu"
                     ) -> torch.Tensor:
    """(G * width,) long: the rows whose logits a call reads, group by group: the check, then the drafts (the
    block's masks after the check's slot; the block's first mask only gives them context).

    Without ``checks`` (a shift model: a row's logits are the previous row's hidden state, the first row's the
    cache's last), group j's check is the logits of row j + 1: those of pending token j, the answer's last token if
    d_1..d_j are right (row ``pending`` is group 0's first mask, whose logits are pending token m's), or row 0 on the
    first call (the prompt's last position); its drafts are the logits of its block's rows 1..width-1, i.e. its
    masks at slots j..j+width-2 predicting the slots after them."""
    groups, size = max(pending, 1), width + int(checks)
    starts = pending + torch.arange(groups, device=device)[:, None] * size
    if checks:
        within = torch.cat((torch.zeros(1, dtype=torch.long, device=device), torch.arange(2, size, device=device)))
        return (starts + within[None, :]).reshape(-1)
    check = (torch.arange(groups, device=device) + 1 if pending else torch.zeros(1, dtype=torch.long, device=device))
    drafts = starts + torch.arange(1, width, device=device)[None, :]
    return torch.cat((check[:, None], drafts), 1).reshape(-1)


@torch.inference_mode()
def speculative_generate(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None,
                         *, config: DecodingConfig, generator: torch.Generator | None = None,
                         suppress_ids: Sequence[int] = (), on_step: StepCallback | None = None) -> GenerationOutput:
    """Answers for left-padded prompts ``prompt_ids`` (B, P) by speculative decoding (``config.draft_length`` >= 1;
    the module docstring). `decoding.generate_ids` calls it for such a config."""
    cfg = for_model(config, model.config)
    mc = model.config
    checks = not getattr(mc, "shift_logits", False)  # a shift model's checks are its pending tokens' own rows
    B, P = prompt_ids.shape
    N, m = cfg.max_new_tokens, cfg.draft_length
    W = m + 1
    device = prompt_ids.device
    if P + N > mc.max_position_embeddings:
        raise ValueError(f"prompt ({P}) + answer ({N}) tokens exceed max_position_embeddings={mc.max_position_embeddings}: "
                         "shorten the prompt or max_new_tokens.")
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids)
    if generator is None:
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
    mask_id, eos_id, pad_id = mc.mask_token_id, mc.eos_token_id, mc.pad_token_id
    banned = {mask_id, *suppress_ids}
    if cfg.ignore_eos and eos_id is not None:
        banned.add(eos_id)
    if pad_id is not None and pad_id != eos_id:
        banned.add(pad_id)
    banned = torch.tensor(sorted(i for i in banned if 0 <= i < mc.vocab_size), dtype=torch.long, device=device)
    fill = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
    answer = torch.full((B, N + W), mask_id, dtype=torch.long, device=device)  # room for a last call's overshoot
    logprobs = torch.zeros(B, N + W, dtype=torch.float32, device=device)
    written = torch.zeros(B, dtype=torch.long, device=device)  # tokens committed per row
    active = torch.ones(B, dtype=torch.bool, device=device)
    rows = torch.arange(B, device=device)
    slots = torch.arange(W, device=device)[None, :]
    layouts = {n: (tree_rule(pending=n, width=W, checks=checks, device=device),
                   tree_offsets(pending=n, width=W, checks=checks, device=device),
                   tree_predictions(pending=n, width=W, checks=checks, device=device))
               for n in (0, W)}  # first call, later ones
    calls = forward_calls = positions = 0
    with _unchecked(model):
        if P:
            padded = not bool(prompt_mask.all())
            cache = model.encode_prefix(prompt_ids, prompt_mask if padded else None)
            forward_calls, positions = 1, B * P
        else:
            param = next(model.parameters())
            cache = PrefixCache.empty(mc, batch=B, device=device, dtype=param.dtype)
        pending = prompt_ids[:, :0]  # (B, 0) on the first call, then (B, W): the last token and m drafts
        while bool(active.any()):
            n = pending.shape[1]
            tail, offsets, read = layouts[n]
            L, G = tail.shape[0], max(n, 1)
            rule = torch.cat((tail.new_ones(L, cache.length), tail), 1).expand(B, L, cache.length + L)
            ids = torch.cat((pending, pending.new_full((B, L - n), mask_id)), 1)
            out = model(ids, prefix_cache=cache, position_ids=P + written[:, None] + offsets, attention_rule=rule,
                        logits_positions=(rows[:, None] * L + read).reshape(-1), return_cache=n > 0)
            calls, forward_calls, positions = calls + 1, forward_calls + 1, positions + B * L
            logits = out.logits.float().view(B, G, W, -1).index_fill_(-1, banned, float("-inf"))
            checks = logits[:, :, 0]  # (B, G, V): p_j, what one-token-per-call decoding writes after d_1..d_j
            logp = checks.log_softmax(-1)
            if n:
                drafts = pending[:, 1:]  # (B, m): d_1..d_m
                kept, rejected = _accept(checks[:, :m], drafts, cfg, generator)
            else:
                kept, rejected = torch.zeros(B, dtype=torch.long, device=device), None
            bonus = _one_more(checks[rows, kept], cfg, generator, kept=kept, rejected=rejected, m=m)
            bonus_logp = logp[rows, kept, bonus][:, None]
            if n:  # this call's tokens: d_1..d_a, then the bonus at slot a (slots past a are not taken)
                new = torch.cat((drafts, bonus[:, None]), 1).scatter(1, kept[:, None], bonus[:, None])
                new_logp = torch.cat((logp[:, :m].gather(-1, drafts[..., None]).squeeze(-1), bonus_logp), 1)
                new_logp = new_logp.scatter(1, kept[:, None], bonus_logp)
            else:
                new, new_logp = bonus[:, None], bonus_logp
            take = (slots[:, :new.shape[1]] <= kept[:, None]) & active[:, None]
            cols = (written[:, None] + slots[:, :new.shape[1]]).clamp(max=N + W - 1)  # a finished row writes nothing
            before = answer[:, :N].clone() if on_step else None
            answer.scatter_(1, cols, torch.where(take, new, answer.gather(1, cols)))
            logprobs.scatter_(1, cols, torch.where(take, new_logp, logprobs.gather(1, cols)))
            if n:  # pending tokens 0..a are final: their keys/values join the cache
                width = int(kept[active].max()) + 1
                block = out["cache"].first(width)
                block.key_valid = (slots[:, :width] <= kept[:, None]) & active[:, None]
                block.padded = not bool(block.key_valid.all())
                cache = cache.extend(block)
            count = torch.where(active, kept + 1, 0)
            written = written + count
            done = written >= N
            if eos_id is not None:
                done |= (answer[:, :N] == eos_id).any(1)
            if on_step:
                at = torch.arange(N, device=device)[None, :]
                wrote = (at >= (written - count)[:, None]) & (at < written[:, None])  # this call's slots
                on_step(StepInfo(strategy=cfg.strategy, step=calls, total_steps=N,
                                 block=0, input_ids=before, output_ids=answer[:, :N].clone(), predicted=wrote,
                                 committed=wrote, probs=torch.where(wrote, logprobs[:, :N].exp(), 0.0),
                                 num_masked=(before == mask_id).sum(1), valid=torch.ones_like(wrote),
                                 prompt_index=rows, candidate_length=torch.full((B,), N, device=device)))
            active &= ~done
            pending = torch.cat((bonus[:, None], logits[rows, kept, 1:].argmax(-1)), 1)  # group a's masks: drafts
    n_written = written.clamp(max=N)
    tokens = answer[:, :N]
    in_answer = torch.arange(N, device=device)[None, :] < n_written[:, None]
    lengths = n_written
    if eos_id is not None:
        is_eos = (tokens == eos_id) & in_answer
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1), n_written)
    avg = torch.where(in_answer, logprobs[:, :N], 0.0).sum(1) / n_written.clamp(min=1)
    return GenerationOutput(tokens=torch.where(in_answer, tokens, fill), lengths=lengths,
                            candidate_length=torch.full((B,), N, device=device), avg_logprob=avg, steps=calls,
                            forward_calls=forward_calls, positions=positions)


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
