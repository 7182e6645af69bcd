"""Task data readers for fine-tuning (DESIGN §9): classification sets, SQuAD v1.1, BEIR.

Every reader goes through ``datasets.load_dataset``: a local file with the packaged loaders
(``json``/``csv``/``parquet``), a hub dataset as ``hf:OWNER/NAME[:CONFIG][@SPLIT]`` (the spec of
``biglm.data.sources``) through the same call, so local tests exercise the hub path.

Notable features
- Input is checked before any work, and errors name the file, the field and the fix
  (``TaskDataError``): missing fields, null texts, labels outside the template's classes,
  duplicate ids, SQuAD answers not found at ``answer_start``, qrels naming unknown ids.
- Classification: rows labelled -1 (GLUE's unlabelled test rows) are dropped and counted
  (``ClassificationData.dropped_unlabeled``); string labels map through ``label_names``.
- SQuAD: the official v1.1 JSON (``data[].paragraphs[].qas[]``) or the hub's flat schema, both to
  flat rows ``{id, title, context, question, answers: {text: [...], answer_start: [...]}}``.
  An answer whose text is not at ``answer_start`` in its context is *refused* by default (all
  34,726 answers of the shared dev file match); ``on_misaligned="drop"`` drops those answers
  (and questions left with none), counted in ``SquadData.dropped_answers``. A question with no
  answer (SQuAD 2.0) is refused: this reader is v1.1.
- ``split_by_article`` splits by title, so no paragraph of a held-out article leaks into training.
- BEIR: GenericDataLoader's layout (``corpus.jsonl`` ``_id/title/text``, ``queries.jsonl``
  ``_id/text``, ``qrels/{split}.tsv`` with header ``query-id corpus-id score``), ids read as
  strings (SciFact's are numeric), queries restricted to those the split judges (as BEIR: 300 of
  SciFact's 1,109 for test).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from biglm.data.sources import parse_hub_spec

if TYPE_CHECKING:
    import datasets

    from biglm.finetune.templates import PromptTemplate

log = logging.getLogger(__name__)

__all__ = [
    "BeirData", "ClassificationData", "SquadData", "TaskDataError", "load_beir", "load_classification",
    "load_squad", "load_table", "split_by_article",
]

_LOADERS: dict[str, str] = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
_SHOW = 5  # ids listed in an error message


class TaskDataError(ValueError):
    """Task data that cannot be used; the message names the file, the field and the fix."""


def _preview(items: Sequence[Any]) -> str:
    shown = ", ".join(repr(x) for x in items[:_SHOW])
    return f"{shown}{', ...' if len(items) > _SHOW else ''}"


def load_table(source: str | os.PathLike[str], *, split: str = "train", **loader_kwargs: Any) -> datasets.Dataset:
    """One split of a local data file or a hub dataset (``hf:OWNER/NAME[:CONFIG][@SPLIT]``) as a ``Dataset``.

    A local file has a single split (``datasets`` calls it "train"), so ``split`` applies to hub
    datasets only; an ``@SPLIT`` in the hub spec wins over ``split``.
    """
    import datasets  # deferred: ~1 s to import

    spec = str(source)
    try:
        if spec.startswith("hf:"):
            hub = parse_hub_spec(spec)
            hub_split = hub.split if "@" in spec else split
            return datasets.load_dataset(hub.name, hub.config, split=hub_split, **loader_kwargs)
        path = Path(spec)
        if not path.is_file():
            raise TaskDataError(f"{path}: no such file; pass a .jsonl/.json/.csv/.tsv/.parquet file or "
                                "hf:OWNER/NAME[:CONFIG][@SPLIT] for a hub dataset")
        loader = _LOADERS.get(path.suffix.lower())
        if loader is None:
            raise TaskDataError(f"{path}: unsupported file type {path.suffix!r}; supported: {sorted(_LOADERS)}")
        if path.suffix.lower() == ".tsv":
            loader_kwargs.setdefault("delimiter", "\t")
        return datasets.load_dataset(loader, data_files=str(path), split="train", **loader_kwargs)
    except TaskDataError:
        raise
    except Exception as e:  # datasets wraps parse errors in several types; name the file
        raise TaskDataError(f"{spec}: could not be read as a dataset ({type(e).__name__}: {e})") from e


# ---------------------------------------------------------------- classification (GLUE/SuperGLUE style)


@dataclasses.dataclass(frozen=True)
class ClassificationData:
    """A labelled classification split: ``dataset`` has the text fields and an int ``label`` in [0, num_classes)."""

    dataset: datasets.Dataset
    text_fields: tuple[str, ...]
    num_classes: int
    dropped_unlabeled: int
    source: str


def load_classification(
    source: str | os.PathLike[str],
    *,
    split: str = "train",
    template: PromptTemplate | None = None,
    text_fields: Sequence[str] = (),
    label_field: str = "label",
    num_classes: int | None = None,
    label_names: Sequence[str] | None = None,
) -> ClassificationData:
    """Read a classification split whose rows hold text fields and a label, and check it.

    The text fields are ``text_fields`` plus those ``template`` reads; ``num_classes`` defaults to
    the template's label words (or ``label_names``). Labels are ints (or strings listed in
    ``label_names``); -1 rows are dropped and counted. The label column is renamed ``label``.
    """
    if template is not None:
        template.check_label_free(label_field)  # before reading: a prompt holding the answer is never wanted
    ds = load_table(source, split=split)
    src = str(source)
    fields = tuple(dict.fromkeys([*text_fields, *(template.fields if template else ())]))
    if not fields:
        raise TaskDataError(f"{src}: no text fields to read; pass a template or text_fields")
    if template is not None:
        template.check_fields(ds.column_names, source=src)
    missing = [f for f in (*fields, label_field) if f not in ds.column_names]
    if missing:
        raise TaskDataError(f"{src}: rows have no field(s) {missing} (columns: {ds.column_names}); "
                            "pass text_fields=/label_field= naming the right columns")
    feature_names = getattr(ds.features.get(label_field), "names", None)  # a hub ClassLabel
    if label_names is None and feature_names:
        label_names = list(feature_names)
    if num_classes is None:
        num_classes = (template.num_classes if template is not None
                       else len(label_names) if label_names is not None else None)
    if num_classes is None:
        raise TaskDataError(f"{src}: the number of classes is unknown; pass a template, num_classes or label_names")
    if template is not None and template.num_classes != num_classes:
        raise TaskDataError(f"{src}: template {template.name!r} has {template.num_classes} label words but the task "
                            f"has {num_classes} classes; give one label word per class")

    for f in fields:
        nulls = [i for i, v in enumerate(ds[f]) if v is None]
        if nulls:
            raise TaskDataError(f"{src}: field {f!r} is null in {len(nulls)} row(s) (rows {_preview(nulls)}); "
                                "fill or drop those rows")

    raw = ds[label_field]
    names = list(label_names) if label_names is not None else None
    labels: list[int] = []
    bad: list[int] = []
    for i, v in enumerate(raw):
        if isinstance(v, bool) or v is None:
            bad.append(i)
        elif isinstance(v, int):
            labels.append(v)
        elif isinstance(v, str) and names is not None and v in names:
            labels.append(names.index(v))
        else:
            bad.append(i)
    if bad:
        example = raw[bad[0]]
        hint = (f"string labels must be one of label_names {names}" if names is not None
                else "pass label_names to map string labels to ids")
        raise TaskDataError(f"{src}: field {label_field!r} holds {len(bad)} value(s) that are not label ids "
                            f"(rows {_preview(bad)}, e.g. {example!r}); {hint}")
    out_of_range = sorted({v for v in labels if v != -1 and not 0 <= v < num_classes})
    if out_of_range:
        raise TaskDataError(f"{src}: field {label_field!r} holds label(s) {out_of_range} outside "
                            f"[0, {num_classes}) (and -1 for unlabelled); the template/task has {num_classes} "
                            "classes: fix the label words or the data")

    keep = [i for i, v in enumerate(labels) if v != -1]
    dropped = len(labels) - len(keep)
    if dropped:
        log.warning("%s: dropped %d unlabelled row(s) (label -1) of %d", src, dropped, len(labels))
    if label_field != "label" and "label" in ds.column_names:
        ds = ds.remove_columns("label")
    ds = ds.remove_columns(label_field).add_column("label", labels)
    if dropped:
        ds = ds.select(keep)
    if len(ds) == 0:
        raise TaskDataError(f"{src}: no labelled rows left (all {len(labels)} are -1); use a labelled split")
    return ClassificationData(dataset=ds, text_fields=fields, num_classes=num_classes, dropped_unlabeled=dropped,
                              source=src)


# ---------------------------------------------------------------- SQuAD v1.1


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
        """Question id -> gold answer texts, for ``biglm.finetune.metrics.squad_evaluate``."""
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
        raise TaskDataError(f"{src}: {len(dupes)} question id(s) occur more than once ({_preview(dupes)}); "
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
                            f"context: {_preview(misaligned)}; fix answer_start (the character offset of the "
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


# ---------------------------------------------------------------- BEIR


@dataclasses.dataclass(frozen=True)
class BeirData:
    """BEIR's (corpus, queries, qrels) for one split, as GenericDataLoader returns them."""

    corpus: dict[str, dict[str, str]]
    """doc id -> {"title", "text"}"""
    queries: dict[str, str]
    """query id -> text, only the queries the split judges"""
    qrels: dict[str, dict[str, int]]
    """query id -> doc id -> relevance grade"""
    split: str
    folder: str


def _read_id_text(path: Path, *, with_title: bool) -> dict[str, dict[str, str]]:
    ds = load_table(path)
    need = ["_id", "text"]
    missing = [f for f in need if f not in ds.column_names]
    if missing:
        raise TaskDataError(f"{path}: rows have no field(s) {missing} (columns: {ds.column_names}); BEIR rows are "
                            '{"_id": ..., "text": ...}' + (', "title" optional' if with_title else ""))
    ids = [str(x) for x in ds["_id"]]
    texts = ds["text"]
    titles = ds["title"] if with_title and "title" in ds.column_names else [""] * len(ids)
    nulls = [ids[i] for i, t in enumerate(texts) if t is None]
    if nulls:
        raise TaskDataError(f"{path}: field 'text' is null for {len(nulls)} id(s) ({_preview(nulls)}); "
                            "give every row a text")
    dupes = [i for i, n in Counter(ids).items() if n > 1]
    if dupes:
        raise TaskDataError(f"{path}: {len(dupes)} _id(s) occur more than once ({_preview(dupes)}); ids must be unique")
    return {i: {"title": ti or "", "text": te} for i, ti, te in zip(ids, titles, texts)}


def load_beir(folder: str | os.PathLike[str], *, split: str = "test") -> BeirData:
    """Read a BEIR dataset folder (corpus.jsonl, queries.jsonl, qrels/{split}.tsv) and check its qrels."""
    import datasets

    root = Path(folder)
    paths = {"corpus": root / "corpus.jsonl", "queries": root / "queries.jsonl", "qrels": root / "qrels" / f"{split}.tsv"}
    absent = [str(p) for p in paths.values() if not p.is_file()]
    if absent:
        raise TaskDataError(f"{root}: not a BEIR folder, missing {absent}; expected corpus.jsonl, queries.jsonl "
                            f"and qrels/{split}.tsv")
    with paths["qrels"].open() as f:
        header = f.readline().rstrip("\n").split("\t")
    if header != ["query-id", "corpus-id", "score"]:
        raise TaskDataError(f"{paths['qrels']}: the first line is {header}, expected the header "
                            "'query-id<TAB>corpus-id<TAB>score' (BEIR skips the first line, so a headerless "
                            "file would lose a judgement): add the header")
    corpus = _read_id_text(paths["corpus"], with_title=True)
    all_queries = {k: v["text"] for k, v in _read_id_text(paths["queries"], with_title=False).items()}
    features = datasets.Features({"query-id": datasets.Value("string"), "corpus-id": datasets.Value("string"),
                                  "score": datasets.Value("int64")})
    qrels_ds = load_table(paths["qrels"], features=features)
    qrels: dict[str, dict[str, int]] = {}
    for q, d, s in zip(qrels_ds["query-id"], qrels_ds["corpus-id"], qrels_ds["score"]):
        if q is None or d is None or s is None:
            raise TaskDataError(f"{paths['qrels']}: a row has an empty query-id, corpus-id or score; every row "
                                "needs all three")
        qrels.setdefault(q, {})[d] = int(s)
    if not qrels:
        raise TaskDataError(f"{paths['qrels']}: holds no judgements")
    unknown_docs = sorted({d for docs in qrels.values() for d in docs if d not in corpus})
    if unknown_docs:
        raise TaskDataError(f"{paths['qrels']}: {len(unknown_docs)} corpus-id(s) are not in {paths['corpus']} "
                            f"({_preview(unknown_docs)}); qrels and corpus come from different versions: "
                            "use the corpus the qrels were made for")
    unknown_queries = sorted(q for q in qrels if q not in all_queries)
    if unknown_queries:
        raise TaskDataError(f"{paths['qrels']}: {len(unknown_queries)} query-id(s) are not in {paths['queries']} "
                            f"({_preview(unknown_queries)}); use the queries file the qrels were made for")
    queries = {q: all_queries[q] for q in qrels}
    return BeirData(corpus=corpus, queries=queries, qrels=qrels, split=split, folder=str(root))

