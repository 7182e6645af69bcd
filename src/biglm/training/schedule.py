"""Learning-rate schedules (paper §3.2, Table 7): cosine and warmup-stable-decay (WSD)."""

from __future__ import annotations

import math


def lr_at(step: int, *, schedule: str, lr: float, min_lr: float, total_steps: int, warmup_steps: int,
          anneal_steps: int = 0) -> float:
    """Learning rate for optimizer step ``step`` (0-based).

    - ``cosine``: linear warm-up to ``lr``, then cosine decay to ``min_lr`` at ``total_steps``.
    - ``wsd``: linear warm-up, constant ``lr``, then linear decay to ``min_lr`` over the last
      ``anneal_steps`` steps (the annealing phase, which may also switch the data mixture).
      ``anneal_steps=0`` is the paper's "no annealing" run.
    - ``constant``: warm-up then constant.
    - ``linear``: linear warm-up, then linear decay to ``min_lr`` at ``total_steps`` (fine-tuning, e.g. the
      paper's FLAN tuning: lr 5e-5, linear decay).
    """
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        span = max(1, total_steps - warmup_steps)
        return lr + (min_lr - lr) * min(1.0, (step - warmup_steps + 1) / span)
    if schedule == "wsd":
        anneal_start = total_steps - anneal_steps
        if anneal_steps <= 0 or step < anneal_start:
            return lr
        progress = min(1.0, (step - anneal_start + 1) / anneal_steps)
        return lr + (min_lr - lr) * progress
    raise ValueError(f"unknown schedule {schedule!r}: choose cosine, wsd, linear or constant.")
