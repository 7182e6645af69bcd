"""Scoring: likelihood estimators for zero-shot evaluation, the suites' definitions, held-out metrics, and the task
metrics shared with fine-tuning (`metrics`).

Nothing here imports lm-eval: the lm-eval model ``biglm`` and the runners that drive lm-eval are in
`biglm.integrations.lm_eval`, which `biglm eval` (``cli``, an entry point) calls.
"""

from .estimators import ESTIMATORS, default_estimator, fit_window, rolling_requests, score_requests, score_rolling

__all__ = ["ESTIMATORS", "default_estimator", "fit_window", "rolling_requests", "score_requests", "score_rolling"]
