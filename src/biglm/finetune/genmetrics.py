"""Generation metrics of fine-tuning (DESIGN §9-10): ROUGE, BLEU-4, BLEU-2, METEOR, Distinct-2.

Each metric (but Distinct-n, a one-line ratio) is computed by its reference library; this module
only fixes the settings, the multi-reference rule and the scale. Every corpus score is in percent.

Notable features
- ROUGE-1/2/L F1 from ``rouge-score`` (Google's package, the one the XSum numbers use) with
  ``use_stemmer=True`` (Porter: "running" and "runs" both become "run") and its own tokeniser
  (lower-cased, non-alphanumerics dropped). Corpus score = mean of the per-example F1. With
  several references an example scores the *max* F1 over its references, per measure.
- BLEU-4 from ``sacrebleu`` (``BLEU().corpus_score``, what ``corpus_bleu`` calls): corpus-level
  n-gram counts, default tokenisation ``"13a"`` (mteval-v13a: punctuation split off), 'exp'
  smoothing, case-sensitive unless ``lowercase=True`` (use it for SQuAD-QG, whose text is
  lower-cased and tokenised). ``tokenize=`` passes any sacrebleu tokeniser, e.g. ``"none"`` for
  text already tokenised, which is closest to the nltk ``corpus_bleu`` on tokens that the
  MSQG/GLGE papers report (nltk's smoothing differs, so numbers differ slightly).
  Several references per example are sacrebleu's native multi-reference BLEU (clipped counts
  against all references; the closest reference length for the brevity penalty).
- BLEU-2 (Genset) is the same sacrebleu call with ``max_ngram_order=2`` (uniform weights 1/2),
  not nltk's ``corpus_bleu(weights=(0.5, 0.5))``.
- METEOR from ``nltk.translate.meteor_score.meteor_score`` (exact, Porter-stem and WordNet synonym
  matches; alpha 0.9, beta 3, gamma 0.5), on whitespace tokens, lower-cased by nltk; the
  corpus score is the mean of sentence scores, each already the max over its references (nltk's
  rule). This is not the Java METEOR 1.5 of coco-caption/nlg-eval, so it is not comparable to
  their numbers digit for digit. nltk's quirk is kept: synonyms are looked up for the Porter
  *stems* of words left after exact and stem matching, so "automobile" (stem "automobil") never
  matches "car", while "car" matches "auto". WordNet is read from nltk's data path (``NLTK_DATA`` and nltk's
  defaults, which include ``<venv>/nltk_data``); ``scripts/quickstart.sh`` puts it there from
  Debian's ``wordnet-base`` + ``wordnet-sense-index`` (``/usr/share/wordnet`` alone is not an
  nltk corpus: it lacks ``lexnames``, and nltk refuses paths outside its data roots). Absent data
  is a clear error naming that step, never a download.
- Distinct-n = distinct n-grams / all n-grams over all outputs together (not averaged per output),
  on whitespace tokens, case kept. No n-grams at all is an error, not 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

__all__ = ["WORDNET_INSTALL_HINT", "bleu", "bleu2", "distinct_n", "load_wordnet", "meteor", "rouge"]

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
