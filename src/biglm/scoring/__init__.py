"""Likelihood scoring for zero-shot evaluation: estimators (DESIGN §5) and the lm-eval adapter.

`estimators` needs only torch; `lm_eval_adapter` and `cli` import lm-eval (the ``eval`` extra).
"""

from .estimators import ESTIMATORS, fit_window, rolling_requests, score_requests, score_rolling

__all__ = ["ESTIMATORS", "fit_window", "rolling_requests", "score_requests", "score_rolling"]
