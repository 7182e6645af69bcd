"""Likelihood scoring for zero-shot evaluation: estimators (DESIGN §5) and the lm-eval adapter.

`estimators` and `suite` need only torch and PyYAML; `lm_eval_adapter`, `harness` and `cli` import lm-eval
(the ``eval`` extra) when they run.
"""

from .estimators import ESTIMATORS, fit_window, rolling_requests, score_requests, score_rolling

__all__ = ["ESTIMATORS", "fit_window", "rolling_requests", "score_requests", "score_rolling"]
