"""Decoding strategies: at each step, which answer slots to predict and which predictions to keep.

A strategy is one class registered by name (`register`); the registry (`STRATEGIES`, name -> class, in
registration order) is the only list of strategies. `DecodingConfig.strategy` accepts exactly its names
(an unknown one is refused, naming them), ``--strategy`` lists them in every command's help, and
`decoding.DecodeRun` builds the chosen class. A new strategy is one subclass of `DecodingStrategy` and one
`register` call, nothing else.

Every strategy runs inside one loop (`decoding`): block by block, each step predicts the block's masked
slots (plus any the strategy re-masks), samples them, and writes the predictions the strategy keeps; the
rest stay masked. A strategy answers two counts per row, and the loop does the ranking (`DecodingStrategy.choose`
picks the kept predictions; override it to pick them another way):
- `DecodingStrategy.remask`: how many written tokens of the block to mask again before the step, least
  confident first (Mask-Predict), or None for none;
- `DecodingStrategy.commit`: how many of the step's predictions to keep, most confident first
  (LLaDA's schedule, the threshold rule), or None to keep them all.
Confidences are the model's probabilities of the sampled tokens (`sampling.sample`); ties break by slot
index (a stable sort), so the cached and uncached paths rank the same way.

The built-in strategies:
- ``mask-predict`` (Ghazvininejad et al. 2019): T iterations t = 0..T-1. Iteration 0 predicts every slot;
  iteration t >= 1 re-masks the n_t = floor(N·(T-t)/T) lowest-probability tokens and predicts only those
  again. T defaults to 10, the paper's main setting.
- ``confidence`` (LLaDA's low-confidence remasking): each step predicts the masked slots and keeps the k most
  confident; a kept token is never re-masked. k spreads the block's remaining masks evenly over its remaining
  steps. T defaults to N (one token per call).
- ``threshold`` (Fast-dLLM): like ``confidence``, but every prediction with probability above τ is kept, and at
  least the schedule's k. With the default T = N this is exactly "all above τ, at least one".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from .config import DecodingConfig

DEFAULT_MASK_PREDICT_STEPS = 10  # Ghazvininejad et al. 2019 report T = 10 as their main setting


@dataclass
class StepState:
    """What a strategy sees before a step. Tensors have one row per (prompt, length candidate).

    Attributes:
        step: 0-based step within the current block.
        steps: the steps planned for this block.
        block: (R, N) bool, the current block's slots inside each row's candidate length.
        masked: (R, N) bool, the block's slots still masked (each is predicted this step).
        probs: (R, N) float, the confidence of each written token (0 where none was written yet).
        active: (R,) bool, rows still decoding this block (``early_stop`` ends a row whose step changed nothing).
    """

    step: int
    steps: int
    block: torch.Tensor
    masked: torch.Tensor
    probs: torch.Tensor
    active: torch.Tensor


class DecodingStrategy:
    """Which slots a step predicts and which predictions it keeps (see the module docstring).

    A subclass sets ``name`` through `register` and overrides `commit` and, to re-mask, `remask` (then it sets
    ``remasks = True``). One instance serves one decode, built from its `DecodingConfig`."""

    name: ClassVar[str] = ""
    remasks: ClassVar[bool] = False
    """whether a written token may be masked again: then a token is final only when its block ends, and
    ``early_stop`` applies (a step that changes nothing ends the row)"""

    def __init__(self, config: DecodingConfig) -> None:
        self.config = config

    @classmethod
    def default_steps(cls, answer_length: int) -> int:
        """Model calls T when ``steps`` is unset: one per answer slot."""
        return answer_length

    def remask(self, state: StepState) -> torch.Tensor | None:
        """(R,) long: written tokens of the block to mask and predict again, least confident first; None: none."""
        return None

    def commit(self, state: StepState, predicted: torch.Tensor, conf: torch.Tensor) -> torch.Tensor | None:
        """(R,) long: predictions to keep, most confident first; None: all of them. ``predicted`` (R, N) bool marks
        this step's predictions, ``conf`` (R, N) their confidences (-inf elsewhere)."""
        return None

    def choose(self, predicted: torch.Tensor, conf: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """(R, N) bool: which ``k`` (R,) of this step's predictions (``predicted``, confidences ``conf``) to keep,
        when `commit` returned counts: the most confident (ties by slot). Override to pick them another way."""
        return (rank(conf, descending=True) < k[:, None]) & predicted


STRATEGIES: dict[str, type[DecodingStrategy]] = {}
"""The registered strategies, name -> class, in registration order (help and errors list them so)."""


def register(cls: type[DecodingStrategy], name: str | None = None) -> type[DecodingStrategy]:
    """Register ``cls`` under ``name`` (default: its ``name`` attribute); usable as a class decorator."""
    name = name or cls.name
    if not name:
        raise ValueError(f"{cls.__name__} has no name: set its `name` or pass one to register().")
    if name in STRATEGIES and STRATEGIES[name] is not cls:
        raise ValueError(f"a decoding strategy named {name!r} is already registered ({STRATEGIES[name].__name__}).")
    cls.name = name
    STRATEGIES[name] = cls
    return cls


def get_strategy(name: str) -> type[DecodingStrategy]:
    """The strategy class registered as ``name``; an unknown name is refused, listing the registered ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"strategy={name!r}: choose one of {', '.join(STRATEGIES)}.") from None


def rank(scores: torch.Tensor, *, descending: bool) -> torch.Tensor:
    """Rank (R, N) of each entry within its row; a stable sort so ties break by slot index, the
    same way on the cached and uncached paths."""
    order = scores.argsort(dim=1, descending=descending, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(scores.shape[1], device=scores.device).expand_as(order))
    return ranks


# --- the built-in strategies ------------------------------------------------------------------------------


class MaskPredict(DecodingStrategy):
    """Mask-Predict: predict every slot of the block, then re-mask and predict the n_t least confident again.

    This is the paper's own numbering (t = 0 is the all-mask pass, so n_0 = N and T iterations are T model
    calls). By default all T run, as published; ``early_stop`` (opt-in) ends a row once an iteration changes
    none of its tokens. Only when N < T do late iterations have n_t = 0: they would predict nothing and are
    skipped (same answer, fewer calls)."""

    name = "mask-predict"
    remasks = True

    @classmethod
    def default_steps(cls, answer_length: int) -> int:
        return DEFAULT_MASK_PREDICT_STEPS

    def remask(self, state: StepState) -> torch.Tensor | None:
        if state.step == 0:
            return None
        lengths = state.block.sum(1)
        return torch.where(state.active, lengths * (state.steps - state.step) // state.steps, 0)  # n_t per row


class Confidence(DecodingStrategy):
    """LLaDA's low-confidence remasking: keep the k most confident predictions, k from LLaDA's schedule (the
    masks left in the block spread evenly over the steps left); a kept token is never re-masked."""

    name = "confidence"

    def commit(self, state: StepState, predicted: torch.Tensor, conf: torch.Tensor) -> torch.Tensor | None:
        if state.steps - state.step == 1:
            return None  # the block's last step keeps every prediction (one token per call: every step)
        return -(-predicted.sum(1) // (state.steps - state.step))


class Threshold(Confidence):
    """Fast-dLLM's threshold rule: keep every prediction above τ (``config.threshold``), and at least the
    confidence schedule's k."""

    name = "threshold"

    def commit(self, state: StepState, predicted: torch.Tensor, conf: torch.Tensor) -> torch.Tensor | None:
        k = super().commit(state, predicted, conf)
        return None if k is None else torch.maximum(k, (conf > self.config.threshold).sum(1))


# the built-in strategies, registered in one place (this order is the order help and errors list them in)
for _strategy in (MaskPredict, Confidence, Threshold):
    register(_strategy)
