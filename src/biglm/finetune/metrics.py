"""Task metrics of fine-tuning (DESIGN §9): SQuAD v1.1 EM/F1, accuracy, retrieval nDCG/recall.

Notable features
- SQuAD EM/F1 reproduce the official ``evaluate-v1.1.py``: answers normalised by lower-casing,
  removing ``string.punctuation`` (32 ASCII characters), the articles a/an/the and extra
  whitespace, in that order; F1 on the bag of normalised tokens; the max over the gold answers;
  scores in percent over *all* references, an unanswered question scoring 0 (as the script).
  Quirks kept on purpose: an empty prediction against a gold answer that normalises to ""
  (e.g. "The") has EM 100 but F1 0.
- Accuracy predicts the argmax of each row of scores; an exact tie goes to the lowest label
  index (``numpy.argmax``'s first-occurrence rule). So a model whose scores are all equal
  predicts class 0 everywhere, and its accuracy is the share of class 0, not 1/num_classes.
  NaN scores are refused (``argmax`` would silently pick them).
- Retrieval measures come from ``ir-measures`` (the ``finetune`` extra), which calls
  ``pytrec_eval`` (trec_eval's C code): the same numbers BEIR reports. trec_eval's conventions
  hold: nDCG gain is the relevance grade (linear, not 2^rel - 1), documents with equal scores
  are ranked by document id in descending string order, recall counts grades >= 1.
  One rule differs from a plain ``pytrec_eval`` call: a judged query with no results scores 0
  and stays in the mean (pytrec_eval drops it, which would inflate the mean).
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "RetrievalResult", "SquadResult", "accuracy", "normalize_answer", "predict_labels", "retrieval_scores",
    "squad_evaluate", "squad_exact_match", "squad_f1", "squad_max_over_ground_truths",
]

# ---------------------------------------------------------------- SQuAD v1.1 (evaluate-v1.1.py)

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (official order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def squad_exact_match(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def squad_f1(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1 of the normalised answers (0.0 when they share no token)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_max_over_ground_truths(prediction: str, ground_truths: Sequence[str]) -> tuple[float, float]:
    """(EM, F1) of one prediction, each the max over the gold answers (fractions in [0, 1])."""
    if not ground_truths:
        raise ValueError("a SQuAD v1.1 question needs at least one gold answer")
    em = max(squad_exact_match(prediction, g) for g in ground_truths)
    f1 = max(squad_f1(prediction, g) for g in ground_truths)
    return em, f1


@dataclasses.dataclass(frozen=True)
class SquadResult:
    """Official SQuAD v1.1 scores in percent, over ``total`` questions."""

    exact_match: float
    f1: float
    total: int
    unanswered: int
    """Questions with no prediction; each scored 0 and counted in ``total``."""


def squad_evaluate(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> SquadResult:
    """EM and F1 (percent) of ``predictions`` (question id -> text) against ``references`` (id -> gold texts).

    A prediction for an id that has no reference is refused: it means predictions and references
    come from different splits (the official script would silently ignore it).
    """
    extra = [qid for qid in predictions if qid not in references]
    if extra:
        raise ValueError(f"{len(extra)} prediction id(s) have no reference, e.g. {extra[:5]}; "
                         "score predictions against the references of the same split")
    if not references:
        raise ValueError("no references to score against")
    em_sum = f1_sum = 0.0
    unanswered = 0
    for qid, golds in references.items():
        if qid not in predictions:
            unanswered += 1
            continue
        em, f1 = squad_max_over_ground_truths(predictions[qid], golds)
        em_sum += em
        f1_sum += f1
    total = len(references)
    return SquadResult(exact_match=100.0 * em_sum / total, f1=100.0 * f1_sum / total, total=total,
                       unanswered=unanswered)


# ---------------------------------------------------------------- classification accuracy


def predict_labels(scores: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """The predicted label of each row of ``scores`` [N, C]: the argmax, ties to the lowest index."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"scores must be a [num_examples, num_classes] array, got shape {arr.shape}")
    if np.isnan(arr).any():
        rows = np.flatnonzero(np.isnan(arr).any(axis=1))
        raise ValueError(f"{rows.size} row(s) of scores hold NaN (first rows: {rows[:5].tolist()}); "
                         "a NaN score has no rank: fix the model's output before scoring")
    return np.argmax(arr, axis=1)  # first occurrence of the max = lowest label index on ties


def accuracy(scores: np.ndarray | Sequence[Sequence[float]], labels: np.ndarray | Sequence[int]) -> float:
    """Share of rows whose ``predict_labels`` equals the gold label (a fraction in [0, 1])."""
    pred = predict_labels(scores)
    gold = np.asarray(labels)
    if gold.shape != pred.shape:
        raise ValueError(f"{pred.shape[0]} rows of scores but labels of shape {gold.shape}")
    if gold.size and (gold.min() < 0 or gold.max() >= np.asarray(scores).shape[1]):
        raise ValueError(f"labels must lie in [0, {np.asarray(scores).shape[1]}), got "
                         f"min {gold.min()} max {gold.max()}; drop unlabeled (-1) rows before scoring")
    return float((pred == gold).mean()) if gold.size else 0.0


# ---------------------------------------------------------------- retrieval (ir-measures / trec_eval)


@dataclasses.dataclass(frozen=True)
class RetrievalResult:
    """Mean retrieval measures over the judged queries (fractions in [0, 1])."""

    scores: dict[str, float]
    """Measure name as ir-measures writes it ("nDCG@10", "R@100") -> mean over ``num_queries``."""
    num_queries: int
    """Judged queries (those with at least one qrel) averaged over."""
    queries_without_results: int
    """Judged queries absent from the run; each scored 0."""


def retrieval_scores(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    *,
    measures: Sequence[str] = ("nDCG@10", "R@100"),
) -> RetrievalResult:
    """Mean ``measures`` of ``run`` (query id -> doc id -> score, higher is better) against ``qrels``.

    ``qrels`` maps query id -> doc id -> relevance grade (BEIR's layout). Queries in the run but
    not in the qrels are ignored (BEIR retrieves for every query; only the judged ones count).
    """
    try:
        import ir_measures
    except ImportError as e:  # pragma: no cover - the extra is part of `all`
        raise ImportError("retrieval metrics need ir-measures: pip install 'biglm[finetune]'") from e

    if not qrels:
        raise ValueError("qrels are empty: nothing to evaluate against")
    parsed = [ir_measures.parse_measure(m) for m in measures]
    judged = sorted(qrels)
    qrels_clean = {q: {d: int(g) for d, g in docs.items()} for q, docs in qrels.items()}
    run_clean = {q: {d: float(s) for d, s in run[q].items()} for q in judged if q in run and run[q]}
    missing = len(judged) - len(run_clean)
    sums = {str(m): 0.0 for m in parsed}
    if run_clean:
        for metric in ir_measures.iter_calc(parsed, qrels_clean, run_clean):
            sums[str(metric.measure)] += float(metric.value)
    means = {name: total / len(judged) for name, total in sums.items()}
    return RetrievalResult(scores=means, num_queries=len(judged), queries_without_results=missing)
