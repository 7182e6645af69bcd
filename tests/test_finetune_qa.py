"""SQuAD windows and answer search with a real byte-level BPE: gold positions round-trip to the gold text."""

from __future__ import annotations

import random

import numpy as np
import pytest

from biglm.finetune.tasks.squad import QAWindows, build_qa_features, postprocess_qa_predictions

WORDS = ["river", "mountain", "village", "castle", "forest", "harbour", "bridge", "valley", "tower", "market",
         "garden", "island", "meadow", "temple", "canyon", "lake"]


def long_context(rng: random.Random, n_sentences: int) -> str:
    return " ".join(f"The {rng.choice(WORDS)} near the {rng.choice(WORDS)} was built in {rng.randint(1000, 1999)}."
                    for _ in range(n_sentences))


@pytest.fixture(scope="module")
def tok():
    from biglm.data import train_tokenizer

    rng = random.Random(0)
    return train_tokenizer(texts=[long_context(rng, 20) for _ in range(50)] + ["When was it built? Who?"] * 20,
                           vocab_size=400)


def make_examples(n: int, n_sentences: int, seed: int) -> dict[str, list]:
    """Examples whose answer is a year in a random sentence of a long context (often past the first window)."""
    rng = random.Random(seed)
    cols: dict[str, list] = {"id": [], "question": [], "context": [], "answers": []}
    for i in range(n):
        ctx = long_context(rng, n_sentences)
        sentence = rng.randrange(n_sentences)
        start = 0
        for _ in range(sentence):
            start = ctx.index(".", start) + 2
        year_at = ctx.index(" in ", start) + 4
        cols["id"].append(f"ex{i}")
        cols["question"].append("   When was it built?")            # leading spaces, as some SQuAD questions
        cols["context"].append(ctx)
        cols["answers"].append({"text": [ctx[year_at:year_at + 4]], "answer_start": [year_at]})
    return cols


def one_hot_logits(features: dict[str, list], width: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(features["input_ids"])
    start, end = np.zeros((n, width)), np.zeros((n, width))
    for w, (s, e) in enumerate(zip(features["start_positions"], features["end_positions"])):
        if s:                                                      # (0, 0) = the answer is not in this window
            start[w, s] = 10.0
            end[w, e] = 10.0
    return start, end


@pytest.mark.parametrize("windows", [QAWindows(max_length=64, stride=16, max_question_tokens=16), QAWindows()])
def test_gold_positions_round_trip_to_the_gold_text(tok, windows):
    n_sentences = 12 if windows.max_length == 64 else 80              # 2+ windows at either size
    examples = make_examples(12, n_sentences, seed=1)
    feats = build_qa_features(examples, tok, windows=windows)
    n_windows = np.bincount([int(e[2:]) for e in feats["example_id"]])
    assert n_windows.min() >= 2
    assert max(len(ids) for ids in feats["input_ids"]) <= windows.max_length
    # some answer lies only past the first window, whose label is then (0, 0)
    first = {e: w for w, e in reversed(list(enumerate(feats["example_id"])))}
    assert any(feats["start_positions"][first[e]] == 0 for e in examples["id"])
    start, end = one_hot_logits(feats, windows.max_length)
    preds = postprocess_qa_predictions(examples, feats, start, end)
    for ex_id, answers in zip(examples["id"], examples["answers"]):
        assert preds[ex_id].text == answers["text"][0]
        assert preds[ex_id].start_char == answers["answer_start"][0]
    assert any(p.window > first[e] for e, p in preds.items())       # recovered from a later window


def test_windows_overlap_by_stride_and_cover_the_context(tok):
    windows = QAWindows(max_length=64, stride=16, max_question_tokens=16)
    examples = make_examples(1, 15, seed=2)
    feats = build_qa_features(examples, tok, windows=windows)
    full = tok(examples["context"][0], add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    at = 0
    for w, ids in enumerate(feats["input_ids"]):
        ctx = ids[ids.index(eos) + 2: -1]                                # <s> question </s> </s> context </s>
        assert ctx == full[at: at + len(ctx)], f"window {w} is not the next slice of the context"
        at += len(ctx) - windows.stride                                 # consecutive windows share `stride` tokens
    assert at + windows.stride == len(full)                             # the last window ends the context
    assert len(feats["input_ids"]) >= 3


def test_question_is_stripped_and_cut_to_max_question_tokens(tok):
    windows = QAWindows(max_length=64, stride=8, max_question_tokens=8)
    examples = make_examples(1, 3, seed=3)
    examples["question"] = ["  " + "When was the castle near the river built? " * 10]
    feats = build_qa_features(examples, tok, windows=windows)
    ids = feats["input_ids"][0]
    n_question = ids.index(tok.eos_token_id) - 1                       # <s> question </s> </s> context </s>
    assert n_question == 8
    assert tok.decode(ids[1:1 + n_question]).startswith("When was")  # leading spaces dropped


def test_out_of_window_labels_cls_or_drop(tok):
    windows = QAWindows(max_length=64, stride=16, max_question_tokens=16)
    examples = make_examples(6, 12, seed=4)
    cls = build_qa_features(examples, tok, windows=windows)
    drop = build_qa_features(examples, tok, windows=windows, out_of_window="drop")
    n_outside = sum(s == 0 for s in cls["start_positions"])
    assert n_outside > 0 and 0 not in drop["start_positions"]
    assert len(drop["input_ids"]) == len(cls["input_ids"]) - n_outside
    assert all(e == 0 for s, e in zip(cls["start_positions"], cls["end_positions"]) if s == 0)


def test_answer_search_rules():
    examples = {"id": ["a"], "context": ["one two three four"]}
    offsets = [None, (0, 3), (4, 7), (8, 13), (14, 18), None]             # <s> one two three four </s>
    feats = {"example_id": ["a"], "offset_mapping": [offsets]}

    def best(start, end, **kw):
        return postprocess_qa_predictions(examples, feats, [start], [end], **kw)["a"]

    # the highest start+end wins; end before start is never a span
    assert best([0, 5, 0, 0, 0, 0], [0, 0, 0, 4, 0, 0]).text == "one two three"
    assert best([0, 0, 0, 9, 0, 0], [0, 8, 0, 0, 1, 0]).text == "three four"
    # spans longer than max_answer_tokens are skipped: "one ... four" (score 18) is 4 tokens; the spans
    # left all score 9 ("one", "one two", "three four", "four"): the earliest start, then the shortest wins
    assert best([0, 9, 0, 0, 0, 0], [0, 0, 0, 0, 9, 0], max_answer_tokens=2).text == "one"
    assert best([0, 9, 0, 0, 0, 0], [0, 0, 0, 0, 9, 0], max_answer_tokens=4).text == "one two three four"
    # positions without an offset (specials, padding) are never chosen, even with the top logits
    assert best([99, 0, 0, 0, 0, 99, 99], [99, 1, 0, 0, 0, 99, 99]).text == "one"
    # ties go to the earliest start
    assert best([0, 1, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0]).text == "one two"
    # no valid span at all -> ""
    empty = postprocess_qa_predictions(examples, {"example_id": ["a"], "offset_mapping": [[None, None]]},
                                       [[1.0, 2.0]], [[1.0, 2.0]])["a"]
    assert empty.text == "" and empty.window == -1


def test_real_squad_round_trip_and_datasets_map(shared_data):
    from functools import partial

    from biglm.data import train_tokenizer
    from biglm.finetune.tasks.squad import load_squad, split_by_article

    ds = load_squad(shared_data / "finetune" / "squad_v1.1" / "dev-v1.1.reconstructed.json").dataset
    _, two = split_by_article(ds, fraction=2 / 48, seed=0)             # two whole articles
    tok = train_tokenizer(texts=list(dict.fromkeys(two["context"])), vocab_size=600)
    feats = two.map(partial(build_qa_features, tokenizer=tok), batched=True, remove_columns=two.column_names)
    assert len(feats) > len(two)                                       # some contexts need 2+ windows at 384
    cols = feats.to_dict()
    start, end = one_hot_logits(cols, 384)
    examples = two.to_dict()
    preds = postprocess_qa_predictions(examples, cols, start, end, max_answer_tokens=10_000)
    exact = 0
    for ex_id, ctx, answers in zip(examples["id"], examples["context"], examples["answers"]):
        gold, at = answers["text"][0], answers["answer_start"][0]
        p = preds[ex_id]
        # the span is the gold answer widened to token boundaries (identical when they align)
        assert p.start_char <= at and p.end_char >= at + len(gold) and gold in p.text, (gold, p.text)
        exact += p.text == gold
    assert exact / len(two) > 0.97
