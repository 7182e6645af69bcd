"""The BiGLM pre-training objective (paper §2.1, eq. 2, Appendix C) and its variants.

Notable features
- Pure, seeded, vectorised tensor code on the batch's own device: no Python loop over samples,
  no host synchronisation. Masks depend only on (seed, step, rank), so a resumed run sees exactly
  the masks it would have seen.
- Exact counts: a row's suffix gets exactly max(1, round(β_Y·|Y|)) masks and its prefix exactly
  round(β_X·|X|), chosen uniformly. Both are drawn with one argsort of random keys: prefix keys lie
  in [0, 1), suffix keys in [2, 3), so ranks count positions within each part.
- Variants are named configs (`OBJECTIVES`): `biglm`, `biglm-no-attn` (same masks, full attention),
  `mlm` (classic fixed ratio over the whole window, no split), `diffusion` (LLaDA/MDLM: t ~ U(ε, 1),
  each token masked with probability t, loss weight 1/t), and `biglm-blocks` (beyond the paper: the same
  masks, and past a drawn prompt boundary the prefix is cut into blocks that see the prompt, earlier blocks
  and themselves, so block decoding's append cache is exact). Every Table 8 knob is a field.
- The blocks' draws come after every draw of the paper's objective, so its masks (and golden files) are
  the same with or without them.
- The loss (`biglm.objective.loss`) is the (weighted) cross-entropy summed over masked tokens and divided by a
  count kept on device (masked tokens; B·L for `diffusion`, as in LLaDA).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .loss import IGNORE_INDEX


@dataclass(frozen=True)
class ObjectiveConfig:
    """How a window of L tokens becomes a training example (a named variant in `OBJECTIVES`)."""

    name: str = "biglm"
    """variant name (biglm, biglm-no-attn, mlm, diffusion); selecting one sets every field below"""
    decompose: bool = True
    """split the window into prefix X = C[:p] and suffix Y = C[p:] (false: plain MLM)"""
    prefix_attention: bool = True
    """prefix queries cannot see suffix keys (the BiGLM mask); false: full attention"""
    alpha: float = 0.2
    """p ~ U{round(αL) .. round((1-α)L)}, α in (0, 0.5); paper 0.2 (ablations 0.1-0.4)"""
    suffix_ratio: tuple[float, float] = (0.0, 1.0)
    """β_Y ~ U(lo, hi); paper (0, 1), ablations (.1,.9) (.2,.8) (.3,.7)"""
    prefix_lambda: tuple[float, float] = (0.3, 0.2)
    """(λ1, λ2) with β_X = λ1 - λ2·β_Y; paper (0.3, 0.2), ablations (0.5,0.2) (0.5,0.4) (0.4,0.2)"""
    mlm_ratio: float = 0.15
    """fixed masking ratio without the split (the paper does not state it; 0.15 is BERT's)"""
    corruption: tuple[float, float, float] | None = None
    """(mask, random, keep) shares of masked positions, e.g. BERT's 0.8,0.1,0.1; `mlm` only (unset: all <mask>)"""
    diffusion: bool = False
    """LLaDA/MDLM masking: t ~ U(diffusion_eps, 1) per row, Bernoulli(t) per token, loss weight 1/t"""
    diffusion_eps: float = 1e-3
    """lower bound of t"""
    prefix_blocks: tuple[int, ...] = ()
    """biglm-blocks: block lengths, one drawn per window; past a prompt boundary q ~ U{0..p} the prefix is cut
    into blocks of it (empty: the paper's bidirectional prefix)"""
    plain_prefix_prob: float = 0.25
    """biglm-blocks: share of windows drawn with q = p (no blocks), so the model stays a plain BiGLM on
    understanding inputs"""
    suffix_block_prob: float = 0.0
    """biglm-blocks: share of windows whose suffix is one block of the window's block length (p = L - B):
    block decoding's own condition, where the block being written is the whole suffix and nothing follows it
    (the paper's draw of p leaves at least αL suffix tokens); 0: every window draws p as the paper does"""
    draft_prob: float = 0.0
    """biglm-blocks: share of windows in speculative decoding's drafting condition: the text written so far as
    blocks of 1 (past a prompt boundary q), none of it masked, then ``draft_width`` masks, all masked, which learn
    the tokens that follow (a draft slot k tokens ahead); 0: none"""
    draft_width: int = 4
    """biglm-blocks: the masks after the text in a drafting window, and in each group of a draft-tree step
    (speculative decoding's draft_length + 1)"""
    draft_tree_every: int = 0
    """biglm-blocks: every N-th step lays its windows out as speculative decoding's call (`draft_tree_layout`): the
    text as blocks of 1 after a prompt (a model with ``shift_logits`` learns each next token there, the check), and
    ``draft_groups`` blocks of ``draft_width`` masks, each seeing the text up to a drawn token t and itself, which
    learn the tokens after t + 1 (the draft slots); 0: none; -1: auto, 2 when every training data folder is a
    teacher's greedy text (`biglm data distill`), else 0 (the trainer decides and says so)"""
    draft_groups: int = 16
    """biglm-blocks: mask groups per window in a draft-tree step (each a draft of ``draft_width`` - 1 slots)"""
    draft_targets: Literal["text", "source"] | None = None
    """biglm-blocks: what a draft-tree step's slots learn: "text" the text's tokens; "source" the source's whole
    next-token distribution at each slot, read off the frozen text rows (the slot's token given the text before it),
    whose argmax is the token on the source's greedy text: only where the text path is frozen (a causal conversion's
    mask adapters trained alone); None: "source" there, else "text" """

    def __post_init__(self) -> None:
        if self.diffusion:
            if self.decompose or self.prefix_attention:
                raise ValueError("diffusion masking has no prefix/suffix split: set decompose=False, prefix_attention=False.")
            if not 0.0 < self.diffusion_eps < 1.0:
                raise ValueError(f"diffusion_eps={self.diffusion_eps} must lie in (0, 1).")
        if self.prefix_attention and not self.decompose:
            raise ValueError("prefix_attention=True needs decompose=True (there is no prefix without a split).")
        if self.decompose:
            if not 0.0 < self.alpha < 0.5:
                raise ValueError(f"alpha={self.alpha} must lie in (0, 0.5): p is drawn from [αL, (1-α)L].")
            lo, hi = self.suffix_ratio
            if not 0.0 <= lo <= hi <= 1.0:
                raise ValueError(f"suffix_ratio={self.suffix_ratio}: need 0 <= lo <= hi <= 1 for β_Y ~ U(lo, hi).")
            l1, l2 = self.prefix_lambda
            ends = (l1 - l2 * lo, l1 - l2 * hi)
            if min(ends) < 0.0 or max(ends) > 1.0:
                raise ValueError(
                    f"prefix_lambda={self.prefix_lambda} with suffix_ratio={self.suffix_ratio} gives β_X in "
                    f"[{min(ends):.3g}, {max(ends):.3g}], outside [0, 1]: choose λ1, λ2 so that λ1 - λ2·β_Y stays in [0, 1]."
                )
        elif not self.diffusion and not 0.0 < self.mlm_ratio < 1.0:
            raise ValueError(f"mlm_ratio={self.mlm_ratio} must lie in (0, 1).")
        if self.prefix_blocks:
            if not self.prefix_attention:
                raise ValueError("prefix_blocks (biglm-blocks) cut the prefix of the BiGLM mask: it needs "
                                 "prefix_attention=True and decompose=True.")
            if min(self.prefix_blocks) < 1:
                raise ValueError(f"prefix_blocks={self.prefix_blocks}: every block length must be >= 1.")
            if not 0.0 <= self.plain_prefix_prob <= 1.0:
                raise ValueError(f"plain_prefix_prob={self.plain_prefix_prob} must lie in [0, 1].")
            if not 0.0 <= self.suffix_block_prob <= 1.0:
                raise ValueError(f"suffix_block_prob={self.suffix_block_prob} must lie in [0, 1].")
            if not 0.0 <= self.draft_prob <= 1.0:
                raise ValueError(f"draft_prob={self.draft_prob} must lie in [0, 1].")
            if self.draft_width < 1:
                raise ValueError(f"draft_width={self.draft_width} must be >= 1.")
            if self.draft_tree_every < -1 or self.draft_groups < 1:
                raise ValueError(f"draft_tree_every={self.draft_tree_every} must be >= 0 (or -1: auto) and "
                                 f"draft_groups={self.draft_groups} >= 1.")
            if self.draft_targets not in (None, "text", "source"):
                raise ValueError(f"draft_targets={self.draft_targets!r} must be 'text' or 'source' (or None: auto).")
            if self.draft_tree_every and self.draft_width < 2:
                raise ValueError(f"draft_width={self.draft_width}: a draft-tree group needs >= 2 masks (its first "
                                 "slot is the check's).")
        elif self.draft_tree_every > 0:
            raise ValueError(f"draft_tree_every={self.draft_tree_every} applies to biglm-blocks only (it needs "
                             "prefix_blocks): set prefix_blocks or leave draft_tree_every at 0.")
        elif self.draft_prob:
            raise ValueError(f"draft_prob={self.draft_prob} applies to biglm-blocks only (it needs prefix_blocks): "
                             "set prefix_blocks or leave draft_prob at 0.")
        elif self.suffix_block_prob:
            raise ValueError(f"suffix_block_prob={self.suffix_block_prob} applies to biglm-blocks only (it needs "
                             "prefix_blocks): set prefix_blocks or leave suffix_block_prob at 0.")
        if self.corruption is not None:
            if self.decompose or self.diffusion:
                raise ValueError("corruption (80/10/10) is an option of the plain `mlm` variant only.")
            if len(self.corruption) != 3 or min(self.corruption) < 0 or abs(sum(self.corruption) - 1.0) > 1e-6:
                raise ValueError(f"corruption={self.corruption} must be three non-negative shares summing to 1.")

    @property
    def prefix_ratio_range(self) -> tuple[float, float]:
        """The range of β_X implied by λ and the β_Y range (paper Appendix C writes these)."""
        l1, l2 = self.prefix_lambda
        a, b = l1 - l2 * self.suffix_ratio[1], l1 - l2 * self.suffix_ratio[0]
        return (a, b)

    def replace(self, **changes) -> "ObjectiveConfig":
        return dataclasses.replace(self, **changes)


OBJECTIVES: dict[str, ObjectiveConfig] = {
    "biglm": ObjectiveConfig(name="biglm"),
    "biglm-no-attn": ObjectiveConfig(name="biglm-no-attn", prefix_attention=False),
    "mlm": ObjectiveConfig(name="mlm", decompose=False, prefix_attention=False),
    "diffusion": ObjectiveConfig(name="diffusion", decompose=False, prefix_attention=False, diffusion=True),
    # blocks of 8, 16 or 32: the lengths block decoding uses (benchmarks/bench_generation.py)
    "biglm-blocks": ObjectiveConfig(name="biglm-blocks", prefix_blocks=(8, 16, 32)),
}


def get_objective(name: str, **overrides) -> ObjectiveConfig:
    """A named objective variant with fields overridden, e.g. ``get_objective("biglm", alpha=0.3)``."""
    if name not in OBJECTIVES:
        raise KeyError(f"unknown objective {name!r}; available: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name].replace(**overrides) if overrides else OBJECTIVES[name]


@dataclass
class MaskedBatch:
    """A training example built from token windows. All tensors live on the windows' device.

    input_ids: (B, L) with masked positions replaced; labels: (B, L), original id at masked positions
    else -100; prefix_len: (B,) for the BiGLM mask, None for full attention; split: (B,) the drawn p
    (also for the no-attn variant), None without a split; loss_weight: (B, L) or None; normalizer:
    scalar tensor dividing the summed loss; ratios: (B, 2) the drawn (β_X, β_Y) or (t, t), for logs/tests;
    positions: (M,) flat indices of the masked positions once `find_positions` has run, else None;
    prompt_len, block_len: (B,) the biglm-blocks rule, None for the paper's bidirectional prefix;
    lookahead: attention annealing (`annealed_lookahead`): queries also never see keys more than this many
    positions ahead (0: causal), None for the objective's own attention; attention_rule (B, L, L) and position_ids
    (B, L): a draft-tree layout's own attention and RoPE positions (`draft_tree_layout`), None otherwise;
    context_ids (B, C): text read causally before the rows, without gradient, as their cache (the rule's first C
    keys; `draft_tree_layout`'s ``frozen_text``), None otherwise.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    prefix_len: torch.Tensor | None
    split: torch.Tensor | None
    loss_weight: torch.Tensor | None
    normalizer: torch.Tensor
    ratios: torch.Tensor
    positions: torch.Tensor | None = None
    prompt_len: torch.Tensor | None = None
    block_len: torch.Tensor | None = None
    lookahead: int | None = None
    attention_rule: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    context_ids: torch.Tensor | None = None

    def attention(self) -> dict[str, torch.Tensor | int | None]:
        """The model's attention arguments for this batch (``model(batch.input_ids, **batch.attention())``)."""
        if self.attention_rule is not None:  # a draft-tree layout: every query's keys given outright
            return {"attention_rule": self.attention_rule, "position_ids": self.position_ids}
        out = {"prefix_len": self.prefix_len}
        if self.prompt_len is not None:
            out.update(prompt_len=self.prompt_len, block_len=self.block_len)
        if self.lookahead is not None:
            out.update(lookahead=self.lookahead)
        return out

    def _map(self, fn) -> "MaskedBatch":
        return dataclasses.replace(self, **{f.name: fn(v) for f in dataclasses.fields(self)
                                            if isinstance(v := getattr(self, f.name), torch.Tensor)})

    def to(self, device: torch.device | str) -> "MaskedBatch":
        """This batch on ``device``, copied without blocking (from pinned memory: asynchronously)."""
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> "MaskedBatch":
        """This (host) batch in pinned memory, so `to` a GPU does not block."""
        return self._map(lambda t: t.pin_memory())

    def find_positions(self) -> "MaskedBatch":
        """Set ``positions``: the (M,) indices of the labelled positions in the flattened (B·L) batch, row-major.
        One host sync; a trainer does it before queuing any forward, so the model and the loss select the
        masked positions by index, with no sync in the middle of the step."""
        self.positions = (self.labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)
        return self


def annealed_lookahead(step: int, *, anneal_steps: int, seq_len: int) -> int | None:
    """Attention annealing from an autoregressive start: how far ahead a query may look at training step ``step``
    (0-based), or None once the objective's own attention applies.

    Over the first ``anneal_steps`` steps the lookahead grows linearly from 0 (causal attention: what the
    converted AR model was trained with) to the window, floor(step·(L-1)/anneal_steps), ANDed into the objective's
    rule; from ``anneal_steps`` on (and always when it is 0: switching at once) the rule applies unchanged. A
    function of the step alone, so a resumed run sees the masks the uninterrupted one saw.
    """
    if step >= anneal_steps:
        return None
    return (step * (seq_len - 1)) // anneal_steps


def make_generator(*, seed: int, step: int, rank: int, device: torch.device | str) -> torch.Generator:
    """A generator on `device` seeded from (seed, step, rank) alone, so masks can be replayed on resume."""
    state = np.random.SeedSequence([int(seed), int(step), int(rank)]).generate_state(2, dtype=np.uint32)
    g = torch.Generator(device=device)
    g.manual_seed(int(state[0]) << 32 | int(state[1]))
    return g


def _round(x: torch.Tensor) -> torch.Tensor:
    # round half up (torch.round is half-to-even); counts are formulas users will check by hand
    return torch.floor(x + 0.5).long()


@dataclass
class MaskPattern:
    """Which positions of R rows × L are masked, drawn without looking at the tokens.

    Drawing the pattern for a whole global batch and handing each rank its rows makes the masks a
    function of (seed, step, global window index) only: the same for any number of ranks, micro-batch
    size or accumulation, so a 2-process run reproduces the 1-process loss curve.
    """

    masked: torch.Tensor  # (R, L) bool
    split: torch.Tensor | None  # (R,) p, None without a split
    prefix_attention: bool
    ratios: torch.Tensor  # (R, 2)
    weight: torch.Tensor | None  # (R,) per-row loss weight (diffusion: 1/t)
    corrupt_random: torch.Tensor | None = None  # (R, L) bool: replace with a random token
    corrupt_keep: torch.Tensor | None = None  # (R, L) bool: keep the original token
    random_ids: torch.Tensor | None = None  # (R, L) long
    prompt_len: torch.Tensor | None = None  # (R,) biglm-blocks: the prompt boundary q <= p
    block_len: torch.Tensor | None = None  # (R,) biglm-blocks: the block length

    def count(self) -> torch.Tensor:
        """The loss normaliser of these rows, on device: masked tokens (all tokens for diffusion, as in LLaDA)."""
        if self.weight is not None:
            return torch.tensor(float(self.masked.numel()), device=self.masked.device)
        return self.masked.sum()

    def rows(self, index: torch.Tensor | slice) -> "MaskPattern":
        """The pattern of some rows (a rank's / micro-batch's share)."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return MaskPattern(masked=self.masked[index], split=pick(self.split), prefix_attention=self.prefix_attention,
                           ratios=self.ratios[index], weight=pick(self.weight), corrupt_random=pick(self.corrupt_random),
                           corrupt_keep=pick(self.corrupt_keep), random_ids=pick(self.random_ids),
                           prompt_len=pick(self.prompt_len), block_len=pick(self.block_len))


def _split_masks(split: torch.Tensor, beta_x: torch.Tensor, beta_y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: round(β_Y·|Y|) (at least 1) suffix and round(β_X·|X|) prefix positions of each row, uniformly
    at random by the uniforms ``u`` (B, L), for the split ``split`` (B,)."""
    L = u.shape[1]
    k_y = _round(beta_y * (L - split)).clamp(min=1)
    k_x = _round(beta_x * split)
    in_suffix = torch.arange(L, device=u.device)[None, :] >= split[:, None]  # (B, L)
    keys = u + 2.0 * in_suffix  # prefix keys in [0,1), suffix keys in [2,3)
    rank_ = keys.argsort(dim=1).argsort(dim=1)  # rank within prefix for prefix, p + rank within suffix for suffix
    return torch.where(in_suffix, rank_ - split[:, None] < k_y[:, None], rank_ < k_x[:, None])


def draw_masks(
    rows: int,
    length: int,
    objective: ObjectiveConfig,
    *,
    generator: torch.Generator,
    device: torch.device | str,
    vocab_size: int | None = None,
) -> MaskPattern:
    """Draw the masks of ``rows`` windows of ``length`` tokens under ``objective`` (all on ``device``)."""
    B, L, dev = rows, length, torch.device(device)

    def uniform(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, device=dev, generator=generator)

    weight = split = None
    if objective.diffusion:
        t = objective.diffusion_eps + (1 - objective.diffusion_eps) * uniform(B)  # (B,)
        masked = uniform(B, L) < t[:, None]
        weight = 1.0 / t
        ratios = torch.stack((t, t), dim=1)
    elif not objective.decompose:
        k = int(objective.mlm_ratio * L + 0.5)  # a Python constant: no device sync
        masked = uniform(B, L).argsort(dim=1).argsort(dim=1) < max(1, k)
        ratios = torch.full((B, 2), objective.mlm_ratio, device=dev)
    else:
        lo, hi = max(1, round(objective.alpha * L)), min(L - 1, round((1 - objective.alpha) * L))
        if hi < lo:
            raise ValueError(f"window length L={L} is too short to split with alpha={objective.alpha}.")
        split = lo + (uniform(B) * (hi - lo + 1)).long().clamp_max(hi - lo)  # (B,) p
        y_lo, y_hi = objective.suffix_ratio
        beta_y = y_lo + (y_hi - y_lo) * uniform(B)
        l1, l2 = objective.prefix_lambda
        beta_x = l1 - l2 * beta_y
        masked = _split_masks(split, beta_x, beta_y, uniform(B, L))
        ratios = torch.stack((beta_x, beta_y), dim=1)
    prompt_len = block_len = None
    if objective.prefix_blocks:  # drawn after everything above: the paper's masks do not move
        u_prompt, u_plain = uniform(B), uniform(B)
        sizes = torch.tensor(objective.prefix_blocks, dtype=torch.long, device=dev)
        block_len = sizes[(uniform(B) * len(sizes)).long().clamp_max(len(sizes) - 1)]
        if objective.suffix_block_prob:  # drawn after the block lengths: without it no draw moves
            one = uniform(B) < objective.suffix_block_prob
            split = torch.where(one, (L - block_len).clamp(min=1), split)
            masked = torch.where(one[:, None], _split_masks(split, beta_x, beta_y, uniform(B, L)), masked)
        q = (u_prompt * (split + 1)).long().clamp_max(split)  # q ~ U{0..p}
        prompt_len = torch.where(u_plain < objective.plain_prefix_prob, split, q)
        if objective.draft_prob:  # drawn last: without it no draw moves
            draft = uniform(B) < objective.draft_prob
            p = torch.full_like(split, max(1, L - objective.draft_width))
            split = torch.where(draft, p, split)
            masked = torch.where(draft[:, None], torch.arange(L, device=dev)[None, :] >= p[:, None], masked)
            block_len = torch.where(draft, torch.ones_like(block_len), block_len)
            prompt_len = torch.where(draft, (u_prompt * (p + 1)).long().clamp_max(p), prompt_len)
            ratios = torch.where(draft[:, None], torch.tensor([0.0, 1.0], device=dev), ratios)
    pattern = MaskPattern(masked=masked, split=split, prefix_attention=objective.prefix_attention, ratios=ratios,
                          weight=weight, prompt_len=prompt_len, block_len=block_len)
    if objective.corruption is not None:
        _, p_random, p_keep = objective.corruption
        if vocab_size is None and p_random > 0:
            raise ValueError("corruption with a random-token share needs vocab_size.")
        u = uniform(B, L)
        pattern.corrupt_random = masked & (u < p_random)
        pattern.corrupt_keep = masked & (u >= p_random) & (u < p_random + p_keep)
        if p_random > 0:
            pattern.random_ids = torch.randint(0, vocab_size, (B, L), device=dev, generator=generator)
    return pattern


@dataclass
class DraftTree:
    """Where a draft-tree step's windows are cut (`draw_draft_tree`): ``prompt_len`` (B,) q, the prompt that sees
    itself both ways (0: none), and ``anchors`` (B, G), each group's last visible text token t >= q - 1."""

    prompt_len: torch.Tensor
    anchors: torch.Tensor

    def rows(self, idx: torch.Tensor) -> "DraftTree":
        return DraftTree(self.prompt_len.index_select(0, idx), self.anchors.index_select(0, idx))

    def count(self, seq_len: int, width: int, *, shift: bool, frozen_text: bool = False) -> torch.Tensor:
        """The labelled positions of these windows (`draft_tree_layout`): the groups' slots, and with ``shift`` the
        text tokens each predicted from the one before (from q on; the first token has nothing before it), unless
        ``frozen_text``."""
        groups = self.anchors.numel() * (width - 1)
        text = (seq_len - self.prompt_len.clamp(min=1)).sum() if shift and not frozen_text else 0
        return torch.as_tensor(groups, device=self.anchors.device) + text


def draw_draft_tree(batch: int, seq_len: int, objective: ObjectiveConfig, *, generator: torch.Generator,
                    device: torch.device | str) -> DraftTree:
    """A draft-tree step's cuts: q ~ U{0..L/2}, then each of ``draft_groups`` anchors t ~ U{max(q-1, 0)..L-1-W}."""
    W = objective.draft_width
    if seq_len < 2 * W + 2:
        raise ValueError(f"window length L={seq_len} is too short for draft-tree groups of draft_width={W}: "
                         f"need L >= {2 * W + 2}.")
    uniform = lambda *shape: torch.rand(*shape, generator=generator, device=device)  # noqa: E731
    q = (uniform(batch) * (seq_len // 2 + 1)).long().clamp_max(seq_len // 2)
    lo, hi = (q - 1).clamp(min=0), seq_len - 1 - W
    anchors = lo[:, None] + (uniform(batch, objective.draft_groups) * (hi - lo + 1)[:, None]).long()
    return DraftTree(prompt_len=q, anchors=anchors.clamp_max(hi))


def draft_tree_layout(windows: torch.Tensor, tree: DraftTree, *, width: int, shift: bool, mask_token_id: int,
                      normalizer: torch.Tensor | None = None, frozen_text: bool = False) -> MaskedBatch:
    """Windows (B, L) laid out as speculative decoding's call (`generation.speculative`), (B, L + G·W) per row:

    - the text, positions 0..L-1: the prompt (i < q) sees the prompt, each later token itself and what precedes it
      (blocks of 1, the append cache's keys); with ``shift`` token i >= max(q, 1) is a label, predicted from token
      i - 1's row: what one token per call writes (the check);
    - group g, positions t+1..t+W (RoPE) of its anchor t: W masks that see the text up to t and each other (the
      block of masks after a check); its rows k = 1..W-1 are labels, the text's tokens t+1+k: with ``shift``
      predicted from row k - 1, else from row k itself, as a call reads its drafts (slot k). No text row sees a group.

    ``frozen_text`` (a causal model whose mask adapters train alone: text rows compute what its source computes, with
    nothing to learn): the text is no label and no row of the batch but its ``context_ids``, which the trainer encodes
    without gradient as the groups' cache (what decoding does); the rows are the groups', their rule (B, G·W, L + G·W).
    The groups' logits and gradients are those of the whole layout (tested).
    """
    B, L = windows.shape
    G, W = tree.anchors.shape[1], width
    dev = windows.device
    Lt = L + G * W
    i = torch.arange(L, device=dev)
    q = tree.prompt_len[:, None, None]
    rule = torch.zeros(B, Lt, Lt, dtype=torch.bool, device=dev)
    rule[:, :L, :L] = (i[None, :, None] >= i[None, None, :]) | ((i[None, :, None] < q) & (i[None, None, :] < q))
    group_rows = L + torch.arange(G * W, device=dev).view(G, W)  # (G, W) layout rows of each group
    t = tree.anchors  # (B, G)
    sees_text = i[None, None, :] <= t[:, :, None]  # (B, G, L)
    rule[:, L:, :L] = sees_text[:, :, None, :].expand(B, G, W, L).reshape(B, G * W, L)
    same_group = torch.block_diag(*[torch.ones(W, W, dtype=torch.bool, device=dev)] * G)
    rule[:, L:, L:] = same_group
    k = torch.arange(W, device=dev)
    slots = t[:, :, None] + 1 + k  # (B, G, W) positions of each group's rows
    position_ids = torch.cat((i.expand(B, L), slots.reshape(B, G * W)), 1)
    input_ids = torch.cat((windows, torch.full((B, G * W), mask_token_id, dtype=windows.dtype, device=dev)), 1)
    labels = torch.full((B, Lt), IGNORE_INDEX, dtype=windows.dtype, device=dev)
    if shift and not frozen_text:
        text_labelled = i[None, :] >= tree.prompt_len.clamp(min=1)[:, None]
        labels[:, :L] = torch.where(text_labelled, windows, labels[:, :L])
    targets = windows.gather(1, (slots[:, :, 1:]).reshape(B, -1)).view(B, G, W - 1)  # text tokens t+2..t+W
    labels[:, group_rows[:, 1:].reshape(-1)] = targets.reshape(B, -1)
    count = tree.count(L, W, shift=shift, frozen_text=frozen_text) if normalizer is None else normalizer
    if frozen_text:
        if bool((tree.prompt_len > 0).any()):
            raise ValueError("frozen_text reads the text causally (the cache of a causal model): prompt_len must be 0.")
        return MaskedBatch(input_ids=input_ids[:, L:], labels=labels[:, L:], prefix_len=None, split=None,
                           loss_weight=None, normalizer=count, ratios=torch.zeros(B, 2, device=dev),
                           attention_rule=rule[:, L:], position_ids=position_ids[:, L:], context_ids=windows)
    return MaskedBatch(input_ids=input_ids, labels=labels, prefix_len=None, split=None, loss_weight=None,
                       normalizer=count, ratios=torch.zeros(B, 2, device=dev), attention_rule=rule,
                       position_ids=position_ids)


def apply_masks(windows: torch.Tensor, pattern: MaskPattern, *, mask_token_id: int,
                normalizer: torch.Tensor | None = None) -> MaskedBatch:
    """Build the training example of ``windows`` (B, L) under ``pattern`` (B rows).

    ``normalizer`` defaults to this batch's masked-token count (B·L for diffusion, as in LLaDA).
    """
    if windows.dim() != 2 or windows.shape != pattern.masked.shape:
        raise ValueError(f"windows {tuple(windows.shape)} do not match the mask pattern {tuple(pattern.masked.shape)}.")
    masked = pattern.masked
    labels = torch.where(masked, windows, torch.full_like(windows, IGNORE_INDEX))
    input_ids = torch.where(masked, torch.full_like(windows, mask_token_id), windows)
    if pattern.random_ids is not None:
        input_ids = torch.where(pattern.corrupt_random, pattern.random_ids, input_ids)
    if pattern.corrupt_keep is not None:
        input_ids = torch.where(pattern.corrupt_keep, windows, input_ids)
    weight = None if pattern.weight is None else pattern.weight[:, None].expand_as(windows)
    return MaskedBatch(input_ids=input_ids, labels=labels,
                       prefix_len=pattern.split if pattern.prefix_attention else None, split=pattern.split,
                       loss_weight=weight, normalizer=pattern.count() if normalizer is None else normalizer,
                       ratios=pattern.ratios, prompt_len=pattern.prompt_len if pattern.prefix_attention else None,
                       block_len=pattern.block_len if pattern.prefix_attention else None)


def mask_batch(
    windows: torch.Tensor,
    objective: ObjectiveConfig,
    *,
    mask_token_id: int,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    step: int = 0,
    rank: int = 0,
) -> MaskedBatch:
    """Turn token windows (B, L) into a masked training example under `objective`.

    Pass either a ``generator`` on the windows' device or ``seed`` (with ``step`` and ``rank``).
    ``vocab_size`` is needed only for the random-token share of ``corruption``.
    """
    if windows.dim() != 2:
        raise ValueError(f"windows must be (batch, length), got shape {tuple(windows.shape)}.")
    if generator is None:
        if seed is None:
            raise ValueError("mask_batch needs a generator or a seed (with step and rank).")
        generator = make_generator(seed=seed, step=step, rank=rank, device=windows.device)
    pattern = draw_masks(windows.shape[0], windows.shape[1], objective, generator=generator,
                         device=windows.device, vocab_size=vocab_size)
    return apply_masks(windows, pattern, mask_token_id=mask_token_id)
