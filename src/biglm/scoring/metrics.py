"""Task metrics shared by fine-tuning and evaluation: SQuAD v1.1 EM/F1, accuracy, retrieval nDCG/recall, and the
generation metrics ROUGE, BLEU-4, BLEU-2, METEOR, Distinct-n.

No model and no training here: the fine-tuning tasks (`biglm.finetune.tasks`) and the multitask suite
(`biglm.scoring.multitask`) both score with these functions. Each metric is its reference's, with the settings fixed
here, so a number is comparable with the papers' (scores in percent unless said):
- SQuAD EM/F1 reproduce the official ``evaluate-v1.1.py``: lower-case, drop ``string.punctuation``, the articles
  a/an/the and extra whitespace, in that order; F1 on the bag of tokens; max over gold answers; over *all*
  references, an unanswered question scoring 0. Kept quirk: an empty prediction against a gold answer that
  normalises to "" (e.g. "The") has EM 100 but F1 0.
- Accuracy: the argmax of each row of scores, an exact tie to the lowest label index (``numpy.argmax``), so equal
  scores predict class 0 everywhere; NaN scores are refused.
- Retrieval: ``ir-measures`` over ``pytrec_eval`` (trec_eval's C code, BEIR's numbers and conventions: linear gain,
  ties by document id in descending string order, recall counts grades >= 1), except that a judged query with no
  results scores 0 and stays in the mean.
- ROUGE-1/2/L F1: ``rouge-score`` with ``use_stemmer=True`` and its own tokeniser; mean of per-example F1, each the
  max over its references.
- BLEU-4: ``sacrebleu`` corpus BLEU (tokenisation ``"13a"``, 'exp' smoothing, case-sensitive unless ``lowercase=True``,
  which SQuAD-QG's lower-cased text wants; ``tokenize="none"`` for pre-tokenised text, closest to the nltk BLEU the
  MSQG/GLGE papers report); several references are sacrebleu's native multi-reference BLEU. BLEU-2 (Genset): the
  same call with ``max_ngram_order=2``, not nltk's ``corpus_bleu(weights=(0.5, 0.5))``.
- METEOR: nltk's ``meteor_score`` (exact, Porter-stem and WordNet synonym matches; alpha 0.9, beta 3, gamma 0.5) on
  whitespace tokens, the mean of sentence scores (each the max over references); not the Java METEOR 1.5 of
  coco-caption, and nltk's quirk is kept (synonyms of the Porter *stems*: "automobile" never matches "car").
  WordNet is read from nltk's data path (``NLTK_DATA``, ``<venv>/nltk_data``, ...), which ``scripts/quickstart.sh``
  fills from Debian's ``wordnet-base`` + ``wordnet-sense-index`` (``/usr/share/wordnet`` alone is no nltk corpus);
  absent data is a clear error naming that step, never a download.
- Distinct-n: distinct n-grams / all n-grams over all outputs together, on whitespace tokens, case kept; no n-grams at
  all is an error, not 0.
"""

from __future__ import annotations

import dataclasses
import re
import string
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "RetrievalResult", "SquadResult", "WORDNET_INSTALL_HINT", "accuracy", "bleu", "bleu2", "distinct_n",
    "load_wordnet", "meteor", "normalize_answer", "predict_labels", "retrieval_scores", "rouge", "squad_evaluate",
    "squad_exact_match", "squad_f1", "squad_max_over_ground_truths",
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
    """EM: the share of questions whose normalised prediction equals a gold answer, in percent"""
    f1: float
    """the mean over questions of the best token-overlap F1 against the gold answers, in percent"""
    total: int
    """questions scored: every reference, answered or not"""
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


# ---------------------------------------------------------------- generation (ROUGE, BLEU, METEOR, Distinct-n)

WORDNET_INSTALL_HINT = (
    "run scripts/quickstart.sh (as root it runs `apt-get install wordnet-base wordnet-sense-index` and "
    "lays the files out as <venv>/nltk_data/corpora/wordnet), or point NLTK_DATA at a directory holding "
    "corpora/wordnet in nltk's format"
)

References = Sequence[str | Sequence[str]]


def _reference_lists(predictions: Sequence[str], references: References) -> list[list[str]]:
    """One list of reference strings per prediction; checks lengths and emptiness before any scoring."""
    if isinstance(predictions, str):
        raise TypeError("predictions must be a sequence of strings, not one string")
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    out = []
    for i, refs in enumerate(references):
        refs = [refs] if isinstance(refs, str) else list(refs)
        if not refs:
            raise ValueError(f"example {i} has no reference")
        out.append(refs)
    return out


def rouge(*, predictions: Sequence[str], references: References) -> dict[str, float]:
    """ROUGE-1/2/L F1 in percent (rouge-score, Porter stemming), mean over examples, max over references."""
    from rouge_score import rouge_scorer

    refs = _reference_lists(predictions, references)
    keys = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(keys), use_stemmer=True)
    totals = dict.fromkeys(keys, 0.0)
    for pred, example_refs in zip(predictions, refs):
        scores = [scorer.score(ref, pred) for ref in example_refs]  # score(target, prediction)
        for k in keys:
            totals[k] += max(s[k].fmeasure for s in scores)
    return {k: 100.0 * v / len(predictions) for k, v in totals.items()}


def _sacrebleu(predictions: Sequence[str], references: References, *, order: int, lowercase: bool,
               tokenize: str) -> float:
    from sacrebleu.metrics import BLEU

    refs = _reference_lists(predictions, references)
    # sacrebleu wants reference *streams* (the k-th reference of every example); None pads short lists
    width = max(len(r) for r in refs)
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(width)]
    metric = BLEU(max_ngram_order=order, lowercase=lowercase, tokenize=tokenize)
    return float(metric.corpus_score(list(predictions), streams).score)


def bleu(*, predictions: Sequence[str], references: References, lowercase: bool = False,
         tokenize: str = "13a") -> float:
    """Corpus BLEU-4 in percent by sacrebleu (tokenisation '13a' by default; ``"none"`` for pre-tokenised text)."""
    return _sacrebleu(predictions, references, order=4, lowercase=lowercase, tokenize=tokenize)


def bleu2(*, predictions: Sequence[str], references: References, lowercase: bool = False,
          tokenize: str = "13a") -> float:
    """Corpus BLEU-2 in percent (Genset): sacrebleu with ``max_ngram_order=2``, weights 1/2 each."""
    return _sacrebleu(predictions, references, order=2, lowercase=lowercase, tokenize=tokenize)


def distinct_n(*, outputs: Sequence[str], n: int = 2) -> float:
    """Distinct-n in percent: distinct n-grams / all n-grams over all outputs (whitespace tokens)."""
    if isinstance(outputs, str):
        raise TypeError("outputs must be a sequence of strings, not one string")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ngrams = [tuple(toks[i:i + n]) for toks in (o.split() for o in outputs) for i in range(len(toks) - n + 1)]
    if not ngrams:
        raise ValueError(f"the outputs hold no {n}-gram (every output has fewer than {n} tokens)")
    return 100.0 * len(set(ngrams)) / len(ngrams)


def load_wordnet():
    """nltk's WordNet reader from nltk's data path; a clear error naming the install step if absent."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    try:
        root = nltk.data.find("corpora/wordnet")
    except LookupError:
        raise RuntimeError(f"WordNet (needed by METEOR) is not on nltk's data path {nltk.data.path}: "
                           f"{WORDNET_INSTALL_HINT}") from None
    try:
        with warnings.catch_warnings():  # "multilingual functions are not available": OMW is not needed
            warnings.simplefilter("ignore", UserWarning)
            return WordNetCorpusReader(root, None)
    except OSError as e:  # e.g. Debian's files copied without lexnames/index.sense
        raise RuntimeError(f"WordNet at {root} is incomplete ({e}): {WORDNET_INSTALL_HINT}") from None


def meteor(*, predictions: Sequence[str], references: References) -> float:
    """METEOR in percent (nltk, WordNet synonyms): mean of sentence scores, whitespace tokens."""
    from nltk.translate.meteor_score import meteor_score

    refs = _reference_lists(predictions, references)
    wordnet = load_wordnet()  # before any scoring, so a missing install fails fast
    total = 0.0
    for pred, example_refs in zip(predictions, refs):
        total += meteor_score([r.split() for r in example_refs], pred.split(), wordnet=wordnet)
    return 100.0 * total / len(predictions)
