"""Extractive QA on SQuAD v1.1 (paper §4.1, Table 3): the `squad` fine-tuning task, its data and its windows.

A start/end span head on the BiGLM encoder under full bidirectional attention
(`biglm.model.qa.BiGLMForQuestionAnswering`), trained on question+context windows with the BERT loss
(mean of the start and end cross-entropies); predictions come from the n-best span search and are
scored with the official v1.1 EM/F1 (`biglm.scoring.metrics`). The best epoch is picked by F1.

Notable features
- Data (`load_squad`): the official v1.1 JSON (``data[].paragraphs[].qas[]``) or the hub's flat schema,
  both to flat rows ``{id, title, context, question, answers: {text: [...], answer_start: [...]}}``,
  checked before any work (errors name the file, the question and the fix; duplicate ids refused). An
  answer whose text is not at ``answer_start`` in its context is *refused* by default (all 34,726 answers
  of the shared dev file match); ``on_misaligned="drop"`` drops those answers (and questions left with
  none), counted in ``SquadData.dropped_answers``. A question with no answer (SQuAD 2.0) is refused: this
  reader is v1.1.
- Only SQuAD's dev set is in the shared data, so `split_by_article` holds out a share of the *train*
  source's articles (by title) as the validation split: no paragraph of a held-out article is trained on.
  The recipe's defaults read the hub's train and validation splits for real runs.
- Windows (`build_qa_features`) and answer search (`postprocess_qa_predictions`) follow the BERT practice
  as Hugging Face's ``run_qa.py`` writes it, re-implemented here and independent of the model:
  windows of ``max_length=384`` tokens, question first (truncated to ``max_question_tokens=64`` tokens,
  BERT's max_query_length), the context cut with ``stride=128`` tokens of *overlap* between consecutive
  windows (the tokenizers' meaning of stride, as run_qa; BERT's original ``doc_stride`` was the step
  between window starts instead). The window settings are stored in the model's config
  (``task_specific_params["question-answering"]``), so the exported model's pipeline cuts the same windows.
- Training labels: the first gold answer's start/end token; a window that does not hold the whole answer
  is labelled (0, 0), the first token (``<s>``/[CLS]), as BERT and run_qa do (``out_of_window="cls"``), or
  is dropped (``"drop"``). SQuAD v1.1 contexts of ~120-150 words make one window each at 384 tokens;
  longer ones give 2+ windows.
- Context offsets are trimmed of leading/trailing whitespace per token: byte-level BPE tokens carry their
  leading space ("Ġcat" covers " cat"), so an untrimmed span would add a space to the answer.
  Whitespace-only tokens and question/special tokens get no offset (None): no answer starts or ends there.
- n-best search as run_qa: the ``n_best=20`` highest start and end logits of each window, spans with
  start <= end and at most ``max_answer_tokens=30`` tokens, score = start + end logit; the best span over
  all windows of an example wins (ties: earliest window, then earliest start, then shortest); an example
  with no valid span predicts "".
- One training item is one *window* (a feature): ``num_items`` counts windows, and the loss is the
  sum over windows of (CE(start) + CE(end)) / 2.
- Training windows are kept as int32 arrays, without their offsets (Python int lists of the full SQuAD train
  set's windows would take far more memory). Evaluation batches windows sorted by length.
- ``pipeline("question-answering")`` (transformers 5 removed it) is biglm's
  `biglm.integrations.transformers_pipelines.QuestionAnsweringPipeline`, registered by ``import biglm``;
  it cuts windows and searches spans with the functions here, so it answers exactly as `SquadTask.predict`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np
import torch

from ...config import ConfigError
from ...data.tables import TaskDataError, load_table, preview
from ...model import BiGLMForMaskedLM
from ...model.qa import BiGLMForQuestionAnswering, span_loss
from ...scoring.metrics import squad_evaluate
from ..task import save_task_export
from . import TaskRecipe

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

__all__ = ["PredictedAnswer", "QAWindows", "SquadData", "SquadSettings", "SquadTask", "build_qa_features",
           "load_squad", "postprocess_qa_predictions", "split_by_article", "squad_task_from_args"]

PIPELINE_KEY = "question-answering"  # config.task_specific_params key read by the pipeline
_CHUNK = 1000  # examples tokenised per call while building features


# ---------------------------------------------------------------- data (SQuAD v1.1)


@dataclasses.dataclass(frozen=True)
class SquadData:
    """Flat SQuAD examples ``{id, title, context, question, answers: {text, answer_start}}``."""

    dataset: datasets.Dataset
    dropped_answers: int
    """Answers not found at their answer_start, dropped under ``on_misaligned="drop"``."""
    dropped_questions: int
    """Questions left without an answer by those drops."""
    source: str

    def references(self) -> dict[str, list[str]]:
        """Question id -> gold answer texts, for `biglm.scoring.metrics.squad_evaluate`."""
        return {qid: list(ans["text"]) for qid, ans in zip(self.dataset["id"], self.dataset["answers"])}


def _flatten_official(ds: datasets.Dataset, src: str) -> list[dict[str, Any]]:
    if "paragraphs" not in ds.column_names:
        raise TaskDataError(f"{src}: articles have no 'paragraphs' (fields: {ds.column_names}); expected SQuAD v1.1 "
                            "JSON: {version, data: [{title, paragraphs: [{context, qas: [...]}]}]}")
    rows: list[dict[str, Any]] = []
    for a, article in enumerate(ds):
        title = article.get("title") or ""
        for p, para in enumerate(article["paragraphs"] or []):
            where = f"data[{a}].paragraphs[{p}]"
            if para.get("context") is None:
                raise TaskDataError(f"{src}: {where} has no 'context'; every paragraph needs its context text")
            for q, qa in enumerate(para.get("qas") or []):
                for key in ("id", "question", "answers"):
                    if qa.get(key) is None:
                        raise TaskDataError(f"{src}: {where}.qas[{q}] has no {key!r}; a v1.1 question needs "
                                            "id, question and answers [{text, answer_start}]")
                answers = qa["answers"]
                rows.append({
                    "id": str(qa["id"]), "title": title, "context": para["context"], "question": qa["question"],
                    "answers": {"text": [x.get("text") for x in answers],
                                "answer_start": [x.get("answer_start") for x in answers]},
                    "_where": f"{where}.qas[{q}]",
                })
    return rows


def _flatten_flat(ds: datasets.Dataset, src: str) -> list[dict[str, Any]]:
    need = ["id", "context", "question", "answers"]
    missing = [f for f in need if f not in ds.column_names]
    if missing:
        raise TaskDataError(f"{src}: rows have no field(s) {missing} (columns: {ds.column_names}); expected the "
                            "official v1.1 JSON or the flat schema {id, title, context, question, answers}")
    rows = []
    for i, r in enumerate(ds):
        ans = r["answers"] or {}
        rows.append({"id": str(r["id"]), "title": r.get("title") or "", "context": r["context"],
                     "question": r["question"],
                     "answers": {"text": list(ans.get("text") or []), "answer_start": list(ans.get("answer_start") or [])},
                     "_where": f"row {i}"})
    return rows


def load_squad(
    source: str | os.PathLike[str],
    *,
    split: str = "train",
    on_misaligned: Literal["refuse", "drop"] = "refuse",
) -> SquadData:
    """Read SQuAD v1.1 (official JSON file, or a flat hub/local set) into flat, checked examples."""
    import datasets

    src = str(source)
    official = not src.startswith("hf:") and Path(src).suffix.lower() == ".json" and _has_data_field(Path(src))
    ds = load_table(source, split=split, field="data") if official else load_table(source, split=split)
    rows = _flatten_official(ds, src) if official else _flatten_flat(ds, src)
    if not rows:
        raise TaskDataError(f"{src}: holds no questions")

    dupes = [qid for qid, n in Counter(r["id"] for r in rows).items() if n > 1]
    if dupes:
        raise TaskDataError(f"{src}: {len(dupes)} question id(s) occur more than once ({preview(dupes)}); "
                            "ids must be unique (predictions are keyed by id)")
    misaligned: list[str] = []
    dropped_answers = dropped_questions = 0
    kept: list[dict[str, Any]] = []
    for r in rows:
        texts, starts = r["answers"]["text"], r["answers"]["answer_start"]
        if not texts:
            raise TaskDataError(f"{src}: question {r['id']} ({r['_where']}) has no answer: SQuAD 2.0 "
                                "unanswerable questions are not v1.1; remove them or use a v1.1 file")
        if len(texts) != len(starts):
            raise TaskDataError(f"{src}: question {r['id']} ({r['_where']}) has {len(texts)} answer texts but "
                                f"{len(starts)} answer_start values")
        good_t, good_s = [], []
        for t, s in zip(texts, starts):
            ok = isinstance(t, str) and t != "" and isinstance(s, int) and r["context"][s:s + len(t)] == t
            if ok:
                good_t.append(t)
                good_s.append(s)
            else:
                misaligned.append(f"{r['id']} ({r['_where']}: {t!r} at {s})")
        dropped_answers += len(texts) - len(good_t)
        del r["_where"]
        if good_t:
            r["answers"] = {"text": good_t, "answer_start": good_s}
            kept.append(r)
        else:
            dropped_questions += 1
    if misaligned and on_misaligned == "refuse":
        raise TaskDataError(f"{src}: {len(misaligned)} answer(s) are not found at their answer_start in the "
                            f"context: {preview(misaligned)}; fix answer_start (the character offset of the "
                            "text in the context) or pass on_misaligned='drop' to drop them with a count")
    if dropped_answers:
        log.warning("%s: dropped %d answer(s) not found at answer_start (%d question(s) left without answers)",
                    src, dropped_answers, dropped_questions)
    features = datasets.Features({
        "id": datasets.Value("string"), "title": datasets.Value("string"), "context": datasets.Value("string"),
        "question": datasets.Value("string"),
        "answers": {"text": datasets.Sequence(datasets.Value("string")),
                    "answer_start": datasets.Sequence(datasets.Value("int32"))},
    })
    return SquadData(dataset=datasets.Dataset.from_list(kept, features=features), dropped_answers=dropped_answers,
                     dropped_questions=dropped_questions, source=src)


def _has_data_field(path: Path) -> bool:
    """Whether a .json file is the official SQuAD layout: one object whose first key is "data" or "version".

    A flat file (JSON lines of questions) starts with a question's own keys instead.
    """
    if not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.read(256)
    return re.match(rb'\s*\{\s*"(data|version)"\s*:', head) is not None


def split_by_article(
    examples: datasets.Dataset, *, fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train, held_out): ``fraction`` of the articles (by ``title``, at least one, never all) go to held_out.

    Articles are shuffled with ``random.Random(seed)`` from sorted titles, so the split depends
    only on the titles and the seed; rows keep their order within each part.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1), got {fraction}")
    titles = sorted(set(examples["title"]))
    if len(titles) < 2:
        raise TaskDataError(f"cannot split by article: the examples hold {len(titles)} article(s)")
    random.Random(seed).shuffle(titles)
    n_held = min(len(titles) - 1, max(1, round(fraction * len(titles))))
    held = set(titles[:n_held])
    title_col = examples["title"]
    train_idx = [i for i, t in enumerate(title_col) if t not in held]
    held_idx = [i for i, t in enumerate(title_col) if t in held]
    return examples.select(train_idx), examples.select(held_idx)


# ---------------------------------------------------------------- windows and answer search (run_qa)

Offset = tuple[int, int] | None


@dataclasses.dataclass(frozen=True)
class QAWindows:
    """Window settings (BERT's SQuAD defaults, as run_qa)."""

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
                           "biglm.finetune.tasks.squad.load_squad")
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


# ---------------------------------------------------------------- the task


@dataclass
class SquadSettings:
    """SQuAD v1.1 extractive QA: data, windows, answer search."""

    train: str = "hf:rajpurkar/squad@train"
    """training split: the official SQuAD JSON, a flat .jsonl/.json/.parquet file, or hf:OWNER/NAME[:CONFIG][@SPLIT]"""
    validation: str = "hf:rajpurkar/squad@validation"
    """validation split (EM/F1, the best epoch by F1), same forms; not read when split_by_article is set"""
    split_by_article: float = 0.0
    """when > 0: hold out this share of the train source's articles (by title) as the validation split
    (a dev-only setup, e.g. the shared dev file); 0: use `validation`"""
    split_seed: int = 0
    """seed of the article split"""
    max_length: int = 384
    """tokens per window, question and special tokens included"""
    stride: int = 128
    """context tokens shared by consecutive windows of one example"""
    max_question_tokens: int = 64
    """longer questions are cut to this many tokens"""
    max_answer_tokens: int = 30
    """longest answer span searched, in tokens"""
    n_best: int = 20
    """start and end candidates per window in the answer search"""
    out_of_window: Literal["cls", "drop"] = "cls"
    """training windows that lack the answer: labelled with the first token (BERT) or dropped"""
    on_misaligned: Literal["refuse", "drop"] = "refuse"
    """answers not found at their answer_start: refuse the data, or drop them (counted)"""
    max_train_examples: int | None = None
    """use only the first N training questions (a quick CPU run)"""
    max_eval_examples: int | None = None
    """use only the first N validation questions"""

    def windows(self) -> QAWindows:
        return QAWindows(max_length=self.max_length, stride=self.stride, max_question_tokens=self.max_question_tokens)


def _columns(dataset: Any) -> dict[str, list[Any]]:
    return {c: dataset[c] for c in dataset.column_names}


def _limit(dataset: Any, n: int | None) -> Any:
    return dataset if n is None else dataset.select(range(min(n, len(dataset))))


class SquadTask:
    """`FinetuneTask` for SQuAD v1.1 extractive QA (a start/end head; EM/F1)."""

    metric = "f1"
    higher_is_better = True

    def __init__(self, settings: SquadSettings | None = None, *, name: str = "squad") -> None:
        s = settings if settings is not None else SquadSettings()
        if not s.train:
            raise ConfigError(f"task {name}: give --task.train (a SQuAD file or an hf: spec)")
        if not s.split_by_article and not s.validation:
            raise ConfigError(f"task {name}: give --task.validation, or --task.split_by_article F to hold out a share "
                              "of the training articles")
        if not 0.0 <= s.split_by_article < 1.0:
            raise ConfigError(f"--task.split_by_article {s.split_by_article} must lie in [0, 1) (0: off)")
        for field_name in ("max_answer_tokens", "n_best"):
            if getattr(s, field_name) < 1:
                raise ConfigError(f"--task.{field_name} must be at least 1, got {getattr(s, field_name)}")
        for field_name in ("max_train_examples", "max_eval_examples"):
            if getattr(s, field_name) is not None and getattr(s, field_name) < 1:
                raise ConfigError(f"--task.{field_name} must be at least 1 (or unset), got {getattr(s, field_name)}")
        try:
            self.windows = s.windows()
        except ValueError as e:
            raise ConfigError(f"task {name}: {e} (--task.max_length/--task.stride/--task.max_question_tokens)"
                              ) from None
        self.settings, self.name = s, name
        self.tokenizer: Any = None
        self._stats: dict[str, Any] = {}

    # ------------------------------------------------------------------ data
    def prepare(self, tokenizer: Any) -> None:
        s = self.settings
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"task {self.name}: SQuAD windows need a fast (Rust) tokenizer for character offsets, "
                              f"got {type(tokenizer).__name__}; save the tokenizer with its tokenizer.json")
        if tokenizer.pad_token_id is None:
            raise ConfigError(f"task {self.name}: the tokenizer has no pad token; set one (e.g. <pad>) to batch windows")
        self.tokenizer = tokenizer
        train = load_squad(s.train, split="train", on_misaligned=s.on_misaligned)
        if s.split_by_article:
            train_ds, val_ds = split_by_article(train.dataset, fraction=s.split_by_article, seed=s.split_seed)
            val_source = f"{train.source} (held-out {s.split_by_article:g} of the articles, seed {s.split_seed})"
            dropped = train.dropped_answers
        else:
            val = load_squad(s.validation, split="validation", on_misaligned=s.on_misaligned)
            train_ds, val_ds, val_source = train.dataset, val.dataset, val.source
            dropped = train.dropped_answers + val.dropped_answers
        train_ds, val_ds = _limit(train_ds, s.max_train_examples), _limit(val_ds, s.max_eval_examples)
        if len(train_ds) == 0 or len(val_ds) == 0:
            empty = "training" if len(train_ds) == 0 else "validation"
            raise ValueError(f"task {self.name}: the {empty} split is empty")

        self._train = self._train_windows(_columns(train_ds))
        if not self._train:
            raise ValueError(f"task {self.name}: no training window holds its answer (out_of_window='drop' dropped "
                             "them all); raise --task.max_length or use out_of_window='cls'")
        self.eval_examples = _columns(val_ds)
        self.eval_features = self._features(self.eval_examples, with_answers=False)
        self.references = dataclasses.replace(train, dataset=val_ds).references()
        self._stats = {"train_source": train.source, "validation_source": val_source,
                       "train_examples": len(train_ds), "train_windows": len(self._train),
                       "validation_examples": len(val_ds), "validation_windows": len(self.eval_features["input_ids"]),
                       "dropped_answers": dropped}

    def _features(self, columns: dict[str, list[Any]], *, with_answers: bool) -> dict[str, list[Any]]:
        """`build_qa_features` over ``columns`` in chunks of examples (bounded tokeniser memory)."""
        keep = ["id", "question", "context", *(["answers"] if with_answers else [])]
        out: dict[str, list[Any]] = {}
        n = len(columns["id"])
        for a in range(0, n, _CHUNK):
            chunk = {k: columns[k][a:a + _CHUNK] for k in keep}
            feats = build_qa_features(chunk, self.tokenizer, windows=self.windows,
                                      out_of_window=self.settings.out_of_window)
            for k, v in feats.items():
                out.setdefault(k, []).extend(v)
        return out

    def _train_windows(self, columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
        feats = self._features(columns, with_answers=True)
        return [{"input_ids": np.asarray(ids, dtype=np.int32), "start_positions": int(sp), "end_positions": int(ep)}
                for ids, sp, ep in zip(feats["input_ids"], feats["start_positions"], feats["end_positions"])]

    def train_features(self) -> Sequence[dict[str, Any]]:
        return self._train

    # ------------------------------------------------------------------ model
    def build_model(self, base: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        if isinstance(base, BiGLMForQuestionAnswering):
            model = base  # continue fine-tuning a QA model
        elif isinstance(base, BiGLMForMaskedLM):
            model = BiGLMForQuestionAnswering.from_masked_lm(base)
        else:
            raise TypeError(f"task {self.name}: needs a BiGLMForMaskedLM (or BiGLMForQuestionAnswering), got "
                            f"{type(base).__name__}")
        longest = max([len(f["input_ids"]) for f in self._train] + [len(x) for x in self.eval_features["input_ids"]])
        limit = model.config.max_position_embeddings
        if longest > limit:
            raise ConfigError(f"task {self.name}: windows of up to {longest} tokens but the model's "
                              f"max_position_embeddings is {limit}; lower --task.max_length to {limit} or less")
        params = dict(getattr(model.config, "task_specific_params", None) or {})
        params[PIPELINE_KEY] = self.pipeline_params()
        model.config.task_specific_params = params
        return model

    def pipeline_params(self) -> dict[str, int]:
        """The `QuestionAnsweringPipeline` settings that reproduce this task's windows and answer search."""
        s = self.settings
        return {"max_seq_len": s.max_length, "doc_stride": s.stride, "max_question_len": s.max_question_tokens,
                "max_answer_len": s.max_answer_tokens, "n_best": s.n_best}

    def collate(self, features: Sequence[dict[str, Any]], *, device: torch.device) -> dict[str, Any]:
        """Windows right-padded to the longest; ``start_positions``/``end_positions`` when the windows have them."""
        pad = self.tokenizer.pad_token_id
        L = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), L), pad, dtype=torch.long)
        attn = torch.zeros((len(features), L), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.as_tensor(np.asarray(f["input_ids"], dtype=np.int64))
            attn[i, :n] = 1
        batch: dict[str, Any] = {"input_ids": ids.to(device), "attention_mask": attn.to(device),
                                 "num_items": len(features)}
        if "start_positions" in features[0]:
            batch["start_positions"] = torch.tensor([f["start_positions"] for f in features], device=device)
            batch["end_positions"] = torch.tensor([f["end_positions"] for f in features], device=device)
        return batch

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """Sum over the batch's windows of (CE(start) + CE(end)) / 2 (fp32)."""
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return span_loss(out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"],
                         reduction="sum")

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def logits(self, model: torch.nn.Module, *, batch_size: int, device: torch.device
               ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Start and end logits of every validation window (fp32, unpadded), in feature order."""
        ids = self.eval_features["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)  # little padding per batch
        start: list[np.ndarray] = [np.empty(0)] * len(ids)
        end: list[np.ndarray] = [np.empty(0)] * len(ids)
        for a in range(0, len(order), batch_size):
            rows = order[a:a + batch_size]
            batch = self.collate([{"input_ids": ids[i]} for i in rows], device=device)
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            s, e = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
            for j, i in enumerate(rows):
                start[i], end[i] = s[j, :len(ids[i])], e[j, :len(ids[i])]
        return start, end

    @torch.no_grad()
    def predict(self, model: torch.nn.Module, *, batch_size: int, device: torch.device) -> dict[str, PredictedAnswer]:
        """The best answer of every validation question (question id -> `PredictedAnswer`)."""
        start, end = self.logits(model, batch_size=batch_size, device=device)
        s = self.settings
        return postprocess_qa_predictions(self.eval_examples, self.eval_features, start, end, n_best=s.n_best,
                                          max_answer_tokens=s.max_answer_tokens)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, *, batch_size: int, device: torch.device) -> dict[str, float]:
        preds = self.predict(model, batch_size=batch_size, device=device)
        result = squad_evaluate({qid: p.text for qid, p in preds.items()}, self.references)
        return {"exact_match": result.exact_match, "f1": result.f1, "examples": float(result.total)}

    # ------------------------------------------------------------------ output
    def export(self, model: torch.nn.Module, tokenizer: Any, out_dir: Path) -> None:
        """A directory for ``AutoModelForQuestionAnswering`` and ``pipeline("question-answering")`` (after
        ``import biglm``), with the task's settings in biglm_task.json."""
        save_task_export(model, tokenizer, out_dir, record=self.describe(), params_key=PIPELINE_KEY,
                         params=self.pipeline_params())

    def describe(self) -> dict[str, Any]:
        from ...config import to_dict

        return {"task": self.name, "kind": "squad", "settings": to_dict(self.settings), "metric": self.metric,
                **self._stats}


def squad_task_from_args(**kwargs: Any) -> SquadTask:
    """`SquadTask` from `SquadSettings` fields given as keywords (``name=`` names the task)."""
    name = kwargs.pop("name", "squad")
    return SquadTask(SquadSettings(**kwargs), name=name)


# ---------------------------------------------------------------- registry (`biglm tasks`)


RECIPES = (
    TaskRecipe("squad", "SQuAD v1.1 extractive QA: start/end head, 384-token windows (stride 128), n-best answers up "
               "to 30 tokens; EM/F1 (best epoch by F1)", SquadSettings, lambda s: SquadTask(s, name="squad"),
               loop={"epochs": 5}),
)
