"""Extractive QA features and answer search for SQuAD v1.1 (DESIGN §9), independent of the model.

``build_qa_features`` turns examples into question+context windows for a start/end head;
``postprocess_qa_predictions`` turns the head's start/end logits back into answer texts. Both
follow the BERT practice as Hugging Face's ``run_qa.py`` writes it, re-implemented here.

Notable features
- Windows of ``max_length=384`` tokens, question first (truncated to ``max_question_tokens=64``
  tokens, BERT's max_query_length), the context cut with ``stride=128`` tokens of *overlap*
  between consecutive windows (the tokenizers' meaning of stride, as run_qa; BERT's original
  ``doc_stride`` was the step between window starts instead).
- Training labels: the first gold answer's start/end token; a window that does not hold the
  whole answer is labelled (0, 0), the first token (``<s>``/[CLS]), as BERT and run_qa do
  (``out_of_window="cls"``), or is dropped (``"drop"``). SQuAD v1.1 contexts of ~120-150
  words make one window each at 384 tokens; longer ones give 2+ windows.
- Context offsets are trimmed of leading/trailing whitespace per token: byte-level BPE tokens
  carry their leading space ("Ġcat" covers " cat"), so an untrimmed span would add a space to
  the answer. Whitespace-only tokens and question/special tokens get no offset (None): no answer
  starts or ends there.
- n-best search as run_qa: the ``n_best=20`` highest start and end logits of each window,
  spans with start <= end and at most ``max_answer_tokens=30`` tokens, score = start + end logit;
  the best span over all windows of an example wins (ties: earliest window, then earliest
  start, then shortest); an example with no valid span predicts "".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

__all__ = ["QAWindows", "build_qa_features", "postprocess_qa_predictions", "PredictedAnswer"]

Offset = tuple[int, int] | None


@dataclasses.dataclass(frozen=True)
class QAWindows:
    """Window settings (DESIGN §9 defaults)."""

    max_length: int = 384
    """Tokens per window, question and special tokens included."""
    stride: int = 128
    """Tokens of context shared by consecutive windows of one example."""
    max_question_tokens: int = 64
    """Longer questions are cut to this many tokens (BERT's max_query_length)."""

    def __post_init__(self) -> None:
        if self.max_question_tokens < 1 or self.stride < 0:
            raise ValueError(f"bad QA window settings {self}")
        # room for the context: specials (<= 4 in a pair) + question, and more than the overlap
        if self.max_length - self.max_question_tokens - 4 <= self.stride:
            raise ValueError(f"max_length={self.max_length} leaves no more than stride={self.stride} context tokens "
                             f"after a {self.max_question_tokens}-token question; raise max_length or lower "
                             "stride/max_question_tokens")


def _check_tokenizer(tokenizer: Any) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(f"QA features need a fast (Rust) tokenizer for offsets and overflowing windows, "
                        f"got {type(tokenizer).__name__}")


def _cut_questions(questions: Sequence[str], tokenizer: Any, limit: int) -> list[str]:
    """Questions stripped of leading spaces (SQuAD has some) and cut to ``limit`` tokens at a token boundary."""
    out = [q.lstrip() for q in questions]
    enc = tokenizer(out, add_special_tokens=False, return_offsets_mapping=True)
    for i, offsets in enumerate(enc["offset_mapping"]):
        if len(offsets) > limit:
            out[i] = out[i][: offsets[limit - 1][1]]
    return out


def _trim(offset: tuple[int, int], context: str) -> Offset:
    start, end = offset
    while start < end and context[start].isspace():
        start += 1
    while end > start and context[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def build_qa_features(
    examples: Mapping[str, Sequence[Any]],
    tokenizer: Any,
    *,
    windows: QAWindows = QAWindows(),
    out_of_window: Literal["cls", "drop"] = "cls",
) -> dict[str, list[Any]]:
    """Windows of a batch of examples (columns ``id, question, context`` and optionally ``answers``).

    Usable as ``dataset.map(partial(build_qa_features, tokenizer=tok), batched=True,
    remove_columns=dataset.column_names)``. Returns columns, one row per window:
    ``input_ids``, ``attention_mask``, ``example_id``, ``offset_mapping`` (per token: the context
    character span, or None), and with answers ``start_positions``/``end_positions``. No padding:
    the batch builder pads.
    """
    _check_tokenizer(tokenizer)
    for col in ("id", "question", "context"):
        if col not in examples:
            raise KeyError(f"QA examples need a {col!r} column (have {sorted(examples)}); load them with "
                           "biglm.finetune.data.load_squad")
    questions = _cut_questions(list(examples["question"]), tokenizer, windows.max_question_tokens)
    contexts = list(examples["context"])
    enc = tokenizer(
        questions, contexts,
        truncation="only_second", max_length=windows.max_length, stride=windows.stride,
        return_overflowing_tokens=True, return_offsets_mapping=True, padding=False,
        return_token_type_ids=False,
    )
    has_answers = "answers" in examples
    out: dict[str, list[Any]] = {"input_ids": [], "attention_mask": [], "example_id": [], "offset_mapping": []}
    if has_answers:
        out["start_positions"], out["end_positions"] = [], []
    for w, sample in enumerate(enc["overflow_to_sample_mapping"]):
        context = contexts[sample]
        seq_ids = enc.sequence_ids(w)
        offsets: list[Offset] = [
            _trim(tuple(off), context) if sid == 1 else None for off, sid in zip(enc["offset_mapping"][w], seq_ids)
        ]
        if has_answers:
            start_tok, end_tok = _label_window(offsets, examples["answers"][sample])
            if start_tok == 0 and out_of_window == "drop":
                continue
            out["start_positions"].append(start_tok)
            out["end_positions"].append(end_tok)
        out["input_ids"].append(enc["input_ids"][w])
        out["attention_mask"].append(enc["attention_mask"][w])
        out["example_id"].append(str(examples["id"][sample]))
        out["offset_mapping"].append(offsets)
    return out


def _label_window(offsets: Sequence[Offset], answers: Mapping[str, Sequence[Any]]) -> tuple[int, int]:
    """(start, end) token of the first answer in this window, or (0, 0) when the window lacks part of it."""
    if not answers["text"]:
        return 0, 0
    text, start_char = answers["text"][0], int(answers["answer_start"][0])
    stripped = text.lstrip()
    start_char += len(text) - len(stripped)
    end_char = start_char + len(stripped.rstrip())
    ctx = [(i, o) for i, o in enumerate(offsets) if o is not None]
    if not ctx or ctx[0][1][0] > start_char or ctx[-1][1][1] < end_char:
        return 0, 0
    # start: the last token beginning at or before the answer; end: the first token ending at or after it
    start_tok = max(i for i, o in ctx if o[0] <= start_char)
    end_tok = min(i for i, o in ctx if o[1] >= end_char)
    return start_tok, end_tok


@dataclasses.dataclass(frozen=True)
class PredictedAnswer:
    """The best span of one example."""

    text: str
    score: float
    """start logit + end logit (-inf when no valid span was found)."""
    window: int
    """Index of the winning window among the features (-1 when none)."""
    start_char: int
    end_char: int


def postprocess_qa_predictions(
    examples: Mapping[str, Sequence[Any]],
    features: Mapping[str, Sequence[Any]],
    start_logits: Sequence[Sequence[float]] | np.ndarray,
    end_logits: Sequence[Sequence[float]] | np.ndarray,
    *,
    n_best: int = 20,
    max_answer_tokens: int = 30,
) -> dict[str, PredictedAnswer]:
    """The best answer span of each example from its windows' start/end logits.

    ``features`` are ``build_qa_features``' output (``example_id`` and ``offset_mapping`` are read);
    row i of ``start_logits``/``end_logits`` belongs to window i and may be padded past the
    window's length (padding positions have no offset and are never chosen).
    """
    if len(start_logits) != len(features["example_id"]) or len(end_logits) != len(features["example_id"]):
        raise ValueError(f"{len(features['example_id'])} windows but {len(start_logits)} start and "
                         f"{len(end_logits)} end logit rows; pass one row per window, in feature order")
    contexts = dict(zip((str(i) for i in examples["id"]), examples["context"]))
    unknown = sorted({e for e in features["example_id"] if e not in contexts})
    if unknown:
        raise ValueError(f"{len(unknown)} window(s) belong to examples not given, e.g. {unknown[:5]}")
    # best[id] = (sort key, answer); key = (-score, window, start, end): smaller is better
    best: dict[str, tuple[tuple[float, int, int, int], PredictedAnswer]] = {}
    for w, (ex_id, offsets) in enumerate(zip(features["example_id"], features["offset_mapping"])):
        s_logits = np.asarray(start_logits[w], dtype=np.float64)[: len(offsets)]
        e_logits = np.asarray(end_logits[w], dtype=np.float64)[: len(offsets)]
        # stable argsort of -logit: equal logits keep token order (earliest first)
        s_top = np.argsort(-s_logits, kind="stable")[:n_best]
        e_top = np.argsort(-e_logits, kind="stable")[:n_best]
        context = contexts[ex_id]
        for s in s_top.tolist():
            if offsets[s] is None:
                continue
            for e in e_top.tolist():
                if offsets[e] is None or e < s or e - s + 1 > max_answer_tokens:
                    continue
                score = float(s_logits[s] + e_logits[e])
                key = (-score, w, s, e)
                if ex_id not in best or key < best[ex_id][0]:
                    a, b = offsets[s][0], offsets[e][1]
                    best[ex_id] = (key, PredictedAnswer(text=context[a:b], score=score, window=w, start_char=a,
                                                        end_char=b))
    empty = PredictedAnswer(text="", score=float("-inf"), window=-1, start_char=0, end_char=0)
    return {str(i): best[str(i)][1] if str(i) in best else empty for i in examples["id"]}
