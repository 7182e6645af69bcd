"""Fine-tuning metrics against hand-computed values: SQuAD v1.1 EM/F1, accuracy ties, nDCG@10/recall@100."""

from __future__ import annotations

import math

import numpy as np
import pytest

from biglm.scoring.metrics import (
    accuracy,
    normalize_answer,
    predict_labels,
    retrieval_scores,
    squad_evaluate,
    squad_exact_match,
    squad_f1,
    squad_max_over_ground_truths,
)

# ---------------------------------------------------------------- SQuAD v1.1


@pytest.mark.parametrize("text, expected", [
    ("The Quick, brown fox!", "quick brown fox"),          # lower, punctuation, leading article
    ("an apple a day", "apple day"),                       # every article, spaces collapsed
    ("Theory of the Atom", "theory of atom"),              # word boundaries: "Theory" keeps its "the"
    ("the/a", "thea"),                                     # punctuation goes first, so no article is left
    ("A-B", "ab"),
    ("  Denver\tBroncos \n", "denver broncos"),
    ("\u201cDenver\u201d", "\u201cdenver\u201d"),          # curly quotes are not string.punctuation
    ("1,000.5 $", "10005"),
])
def test_normalize_answer_follows_the_official_order(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_and_f1_by_hand():
    assert squad_exact_match("the Denver Broncos", "Denver Broncos!") == 1.0
    assert squad_exact_match("Denver", "Denver Broncos") == 0.0
    # pred {denver, broncos, won} vs gold {denver, broncos}: P = 2/3, R = 1, F1 = 0.8
    assert squad_f1("Denver Broncos won", "the Denver Broncos") == pytest.approx(0.8)
    # repeated tokens count once per gold occurrence: overlap of [new york new] and [new york] is 2
    assert squad_f1("new york new", "New York") == pytest.approx(0.8)
    # P = 1/1, R = 1/3 -> 2 * 1/3 / (4/3) = 0.5
    assert squad_f1("Panthers", "the Carolina Panthers team") == pytest.approx(0.5)
    assert squad_f1("Levi's Stadium", "Santa Clara") == 0.0


def test_max_over_ground_truths_takes_each_metric_separately():
    golds = ["Levi's Stadium", "Santa Clara", "Levi's Stadium in the San Francisco Bay Area at Santa Clara"]
    em, f1 = squad_max_over_ground_truths("Santa Clara, California", golds)
    assert em == 0.0
    # best F1 is against "Santa Clara": P = 2/3, R = 1 -> 0.8 (the 10-token long answer gives 4/13)
    assert f1 == pytest.approx(0.8)
    assert squad_max_over_ground_truths("Broncos", ["Denver Broncos", "the Broncos"]) == (1.0, 1.0)


def test_empty_prediction_quirks_of_the_official_script():
    assert squad_max_over_ground_truths("", ["Denver"]) == (0.0, 0.0)
    # a gold answer that normalises to "" (just an article) matches an empty prediction on EM but
    # not on F1, which is 0 whenever no token is shared
    assert squad_exact_match("", "The") == 1.0
    assert squad_f1("", "The") == 0.0


def test_squad_evaluate_counts_unanswered_questions_as_zero():
    refs = {"q1": ["Denver Broncos"], "q2": ["Santa Clara", "Levi's Stadium"], "q3": ["1973"]}
    preds = {"q1": "the Denver Broncos", "q2": "Santa Clara, California"}
    res = squad_evaluate(preds, refs)
    assert res.total == 3 and res.unanswered == 1
    assert res.exact_match == pytest.approx(100 / 3)             # (1 + 0 + 0) / 3
    assert res.f1 == pytest.approx(100 * (1 + 0.8 + 0) / 3)      # 60.0
    with pytest.raises(ValueError, match="no reference"):
        squad_evaluate({"q1": "x", "q9": "y"}, refs)


# ---------------------------------------------------------------- accuracy


def test_accuracy_breaks_ties_toward_the_lowest_label():
    scores = [[1.0, 1.0, 0.0],    # tie 0/1 -> 0
              [0.0, 2.0, 2.0],    # tie 1/2 -> 1
              [3.0, 3.0, 3.0],    # all tied -> 0
              [0.0, 0.0, 1.0]]    # clear -> 2
    assert predict_labels(scores).tolist() == [0, 1, 0, 2]
    # with ties to the highest label the predictions would be [1, 2, 2, 2] and accuracy 0.5
    assert accuracy(scores, [1, 1, 0, 2]) == 0.75
    # a constant model is at the share of class 0, not at 1/num_classes
    assert accuracy(np.zeros((4, 3)), [0, 1, 2, 0]) == 0.5


def test_accuracy_refuses_nan_and_bad_labels():
    with pytest.raises(ValueError, match="NaN"):
        predict_labels([[0.1, float("nan")]])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        accuracy([[0.1, 0.2]], [-1])
    with pytest.raises(ValueError, match="labels of shape"):
        accuracy([[0.1, 0.2], [0.3, 0.1]], [0])


# ---------------------------------------------------------------- retrieval (ir-measures)


def test_ndcg_and_recall_by_hand():
    qrels = {
        "q1": {"d1": 1, "d2": 2, "d5": 1},
        "q2": {"d3": 1},
        "q3": {"d9": 1},                # judged but absent from the run: scores 0
    }
    run = {
        "q1": {"d1": 0.9, "d3": 0.8, "d2": 0.7, "d4": 0.6},  # d5 never retrieved
        "q2": {"d4": 0.9, "d3": 0.8},
        "q4": {"d1": 1.0},              # not judged: ignored
    }
    # q1: gains by rank [1, 0, 2, 0]: DCG = 1/log2(2) + 2/log2(4) = 2;
    #     ideal [2, 1, 1]: IDCG = 2 + 1/log2(3) + 1/log2(4)
    ndcg_q1 = 2 / (2 + 1 / math.log2(3) + 0.5)
    ndcg_q2 = (1 / math.log2(3)) / 1.0     # the one relevant document at rank 2
    res = retrieval_scores(qrels, run)
    assert res.num_queries == 3 and res.queries_without_results == 1
    assert res.scores["nDCG@10"] == pytest.approx((ndcg_q1 + ndcg_q2 + 0) / 3, abs=1e-6)
    assert res.scores["R@100"] == pytest.approx((2 / 3 + 1 + 0) / 3, abs=1e-6)


def test_ndcg_cuts_at_ten_and_recall_at_a_hundred():
    docs = {f"n{i:02d}": 1.0 - i / 200 for i in range(150)}      # 150 non-relevant documents, ranked in order
    qrels = {"q": {"rel11": 1, "rel120": 1}}
    run = {"q": {**docs}}
    run["q"]["rel11"] = 1.0 - 9.5 / 200                          # after n00..n09: rank 11
    run["q"]["rel120"] = 1.0 - 119.5 / 200                       # after n00..n119 and rel11: rank 122
    res = retrieval_scores(qrels, run, measures=("nDCG@10", "nDCG@20", "R@100"))
    assert res.scores["nDCG@10"] == 0.0
    ideal = 1 + 1 / math.log2(3)
    assert res.scores["nDCG@20"] == pytest.approx((1 / math.log2(12)) / ideal, abs=1e-6)
    assert res.scores["R@100"] == pytest.approx(0.5)
