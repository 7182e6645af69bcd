"""Generation metric wrappers against hand-checked values (rouge-score, sacrebleu, nltk METEOR)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

pytest.importorskip("rouge_score", reason="the `finetune` extra: pip install -e '.[finetune]'")
pytest.importorskip("sacrebleu", reason="the `finetune` extra: pip install -e '.[finetune]'")
pytest.importorskip("nltk", reason="the `finetune` extra: pip install -e '.[finetune]'")

from biglm.scoring import metrics as genmetrics  # noqa: E402


def test_rouge_identical_disjoint_and_stemmed_example():
    assert genmetrics.rouge(predictions=["the cat sat"], references=["the cat sat"]) == pytest.approx(
        {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0})
    assert genmetrics.rouge(predictions=["dog barks loudly"], references=["the cat sat"]) == pytest.approx(
        {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0})
    # stemmed: pred [the cat was run], ref [the cat run]: 3 shared unigrams, P 3/4, R 3/3 -> F 6/7
    # (without stemming only 2 would match: F 4/7); bigrams: "the cat" only, P 1/3, R 1/2 -> F 2/5
    got = genmetrics.rouge(predictions=["The cat was running"], references=["the cat runs"])
    assert got["rouge1"] == pytest.approx(100 * 6 / 7)
    assert got["rouge2"] == pytest.approx(100 * 2 / 5)
    assert got["rougeL"] == pytest.approx(100 * 6 / 7)  # LCS "the cat run", same as the unigrams


def test_rouge_mean_over_examples_and_max_over_references():
    got = genmetrics.rouge(predictions=["the cat sat", "a b"], references=[["x y z", "the cat sat"], "c d"])
    assert got["rouge1"] == pytest.approx(50.0)  # (100 from the best reference + 0) / 2


def test_bleu4_identity_disjoint_and_lowercase():
    ref = "The quick brown fox jumps over the lazy dog ."
    assert genmetrics.bleu(predictions=[ref], references=[ref]) == pytest.approx(100.0)
    assert genmetrics.bleu(predictions=["a b c d e"], references=["v w x y z"]) == pytest.approx(0.0, abs=1e-9)
    upper = "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG ."
    assert genmetrics.bleu(predictions=[upper], references=[ref]) < 10.0  # only "." matches
    assert genmetrics.bleu(predictions=[upper], references=[ref], lowercase=True) == pytest.approx(100.0)


def test_bleu_tokenize_passthrough():
    # '13a' splits the full stop off "mat."; "none" keeps "mat." and "mat" apart
    assert genmetrics.bleu(predictions=["the cat sat on the mat."],
                           references=["the cat sat on the mat ."]) == pytest.approx(100.0)
    assert genmetrics.bleu(predictions=["the cat sat on the mat."], references=["the cat sat on the mat ."],
                           tokenize="none") < 100.0


def test_bleu2_hand_example_and_multi_reference():
    # unigrams 5/6 match, bigrams 3/5, equal lengths (BP 1): BLEU-2 = sqrt(5/6 * 3/5) = sqrt(1/2)
    pred, ref = "the cat sat on the mat", "the cat sat on a mat"
    assert genmetrics.bleu2(predictions=[pred], references=[ref]) == pytest.approx(100 * math.sqrt(0.5))
    assert genmetrics.bleu2(predictions=[pred], references=[[ref, pred]]) == pytest.approx(100.0)
    # ragged reference lists are padded for sacrebleu, not refused
    assert genmetrics.bleu2(predictions=[pred, "a dog"], references=[[ref, pred], ["a dog"]]) == pytest.approx(100.0)


def test_distinct2_hand_example():
    # bigrams: (a b) (b a) (a b) | (a b) (b c) -> 3 distinct of 5
    assert genmetrics.distinct_n(outputs=["a b a b", "a b c"]) == pytest.approx(60.0)
    assert genmetrics.distinct_n(outputs=["a b c d"]) == pytest.approx(100.0)
    assert genmetrics.distinct_n(outputs=["a b a b", "a b c"], n=1) == pytest.approx(100 * 3 / 7)
    with pytest.raises(ValueError, match="no 2-gram"):
        genmetrics.distinct_n(outputs=["a", ""])


def test_bad_input_refused_before_scoring():
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        genmetrics.bleu(predictions=["a", "b"], references=["a"])
    with pytest.raises(ValueError, match="no reference"):
        genmetrics.rouge(predictions=["a"], references=[[]])
    with pytest.raises(TypeError, match="not one string"):
        genmetrics.meteor(predictions="a b", references=["a b"])


def _wordnet_install_ran() -> bool:
    """The quickstart step ran here (or someone provided Debian's files): then METEOR must work, not skip."""
    import nltk

    return any((Path(p) / "corpora" / "wordnet").exists() for p in nltk.data.path) or \
        Path("/usr/share/wordnet/index.sense").exists() or bool(os.environ.get("NLTK_DATA"))


def _require_wordnet():
    if not _wordnet_install_ran():
        pytest.skip("WordNet absent: " + genmetrics.WORDNET_INSTALL_HINT)


def test_meteor_identical_and_synonym(monkeypatch):
    _require_wordnet()
    # WordNet read once (~5 s a read): the four scores below share the reader `meteor` loads for each call
    wordnet = genmetrics.load_wordnet()
    monkeypatch.setattr(genmetrics, "load_wordnet", lambda: wordnet)
    sentence = "the cat sat on the mat"
    # identical: P = R = 1, one chunk of 6 matches -> nltk's fragmentation penalty 0.5 * (1/6)^3
    assert genmetrics.meteor(predictions=[sentence], references=[sentence]) == pytest.approx(
        100 * (1 - 0.5 * (1 / 6) ** 3))
    # "car" and "auto" share WordNet's synset car.n.01 (and are their own Porter stems: nltk looks up
    # synonyms of the *stemmed* leftovers); "banana" shares nothing with "auto"
    synonym = genmetrics.meteor(predictions=["the car is red"], references=["the auto is red"])
    unrelated = genmetrics.meteor(predictions=["the banana is red"], references=["the auto is red"])
    assert synonym > unrelated + 20
    assert synonym == pytest.approx(genmetrics.meteor(predictions=["the car is red"], references=["the car is red"]))


def test_meteor_missing_wordnet_is_a_clear_error(tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(RuntimeError, match="scripts/quickstart.sh"):
        genmetrics.meteor(predictions=["a"], references=["a"])
    (tmp_path / "corpora" / "wordnet").mkdir(parents=True)  # present but empty: incomplete, not a crash
    with pytest.raises(RuntimeError, match="incomplete"):
        genmetrics.load_wordnet()
