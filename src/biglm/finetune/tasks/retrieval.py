"""Retrieval embeddings (BEIR, nDCG@10): a BiGLM bi-encoder trained contrastively, the `beir-scifact` and
`retrieval` tasks.

The model is `biglm.model.biencoder.BiGLMBiEncoder` (mean of the last hidden states over real tokens,
L2-normalised, so a dot product is a cosine). Training is InfoNCE over query -> document pairs with the
other documents of the batch as negatives (and, optionally, one mined hard negative per pair); evaluation
encodes the corpus and the judged queries, ranks by dot product and scores the top 100 with ``ir-measures``
(`biglm.scoring.metrics.retrieval_scores`).

Notable features
- Data (`load_beir`): GenericDataLoader's layout (``corpus.jsonl`` ``_id/title/text``, ``queries.jsonl``
  ``_id/text``, ``qrels/{split}.tsv`` with header ``query-id corpus-id score``), ids read as strings
  (SciFact's are numeric), queries restricted to those the split judges (as BEIR: 300 of SciFact's 1,109
  for test); qrels naming unknown ids are refused, naming the file and the fix.
- False negatives are masked: a batch's document that is also judged relevant to a query (248 of
  SciFact's training documents are cited by several queries) is not scored as that query's negative.
- Export is a sentence-transformers directory (Transformer -> Pooling(mean) -> Normalize) written by
  sentence-transformers' own ``save`` (`biglm.integrations.sentence_transformers`, reached through
  ``biglm.adapter``: the task needs no import of the integrations room), loadable with
  ``SentenceTransformer(path)`` after ``import biglm`` and so by ``mteb``. The same directory loads with
  `BiGLMBiEncoder.from_pretrained`. Texts are tokenised exactly as sentence-transformers does (the
  tokenizer's ``<s> ... </s>``, truncated to ``max_length``).
- Scores are in percent (like the other tasks' accuracy/EM/F1); BEIR tables print fractions.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ...config import ConfigError
from ...data.tables import TaskDataError, load_table, preview
from ...model.biencoder import BiGLMBiEncoder, mean_pool, pad_batch
from ...scoring.metrics import retrieval_scores
from ..task import TASK_FILE
from . import TaskRecipe

log = logging.getLogger(__name__)

__all__ = [
    "BeirData", "BiGLMBiEncoder", "RetrievalSettings", "RetrievalTask", "doc_text", "info_nce", "load_beir",
    "mean_pool", "pad_batch",
]

TOP_K = 100  # documents kept per query: enough for recall@100, and nDCG@10 only reads the first 10


# ---------------------------------------------------------------- data (BEIR)


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
        raise TaskDataError(f"{path}: field 'text' is null for {len(nulls)} id(s) ({preview(nulls)}); "
                            "give every row a text")
    dupes = [i for i, n in Counter(ids).items() if n > 1]
    if dupes:
        raise TaskDataError(f"{path}: {len(dupes)} _id(s) occur more than once ({preview(dupes)}); ids must be unique")
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
                            f"({preview(unknown_docs)}); qrels and corpus come from different versions: "
                            "use the corpus the qrels were made for")
    unknown_queries = sorted(q for q in qrels if q not in all_queries)
    if unknown_queries:
        raise TaskDataError(f"{paths['qrels']}: {len(unknown_queries)} query-id(s) are not in {paths['queries']} "
                            f"({preview(unknown_queries)}); use the queries file the qrels were made for")
    queries = {q: all_queries[q] for q in qrels}
    return BeirData(corpus=corpus, queries=queries, qrels=qrels, split=split, folder=str(root))


# ---------------------------------------------------------------- the loss


def info_nce(queries: torch.Tensor, docs: torch.Tensor, *, temperature: float,
             exclude: torch.Tensor | None = None) -> torch.Tensor:
    """Summed InfoNCE: query i's positive is ``docs[i]``, every other row of ``docs`` a negative.

    ``queries`` (B, h) and ``docs`` (D, h), D >= B (rows past B are extra negatives, e.g. hard ones),
    both normalised; ``exclude`` (B, D) bool marks pairs that are not negatives (other relevant
    documents), dropped from the softmax. Returns sum_i [log sum_j exp(s_ij / t) - s_ii / t].
    """
    with torch.autocast(queries.device.type, enabled=False):  # cosines / 0.05 in bf16 would be off by ~0.1
        logits = queries.float() @ docs.float().T / temperature  # (B, D)
        if exclude is not None:
            logits = logits.masked_fill(exclude, float("-inf"))
        target = torch.arange(queries.shape[0], device=queries.device)
        return F.cross_entropy(logits, target, reduction="sum")


# ---------------------------------------------------------------- the task


@dataclass
class RetrievalSettings:
    """A BEIR retrieval task: data folder, lengths, contrastive loss, limits for quick CPU runs."""

    data: str = ""
    """a BEIR folder: corpus.jsonl, queries.jsonl, qrels/TRAIN_SPLIT.tsv and qrels/EVAL_SPLIT.tsv"""
    train_split: str = "train"
    """qrels file of the training pairs (every judgement with score > 0 is one query -> document pair)"""
    eval_split: str = "test"
    """qrels file the metric is computed on (SciFact has no dev split: test, so the best epoch is picked on it)"""
    max_length: int = 256
    """tokens per text (queries and documents, <s> and </s> included); longer texts lose their end"""
    temperature: float = 0.05
    """InfoNCE temperature t: logits are cosines / t. 0.05 (sentence-transformers' MultipleNegativesRankingLoss
    scale 20, SimCSE, E5) lets a unit-vector model reach a peaked softmax (cosines span [-1, 1], logits
    [-20, 20]); at t = 1 the positive's probability can never pass e^2 / (e^2 + B - 1), 0.19 for B = 32"""
    hard_negatives: str = ""
    """optional TSV of mined negatives, BEIR's qrels layout (query-id, corpus-id, score ignored): each training
    pair gets its query's first listed negative that is not relevant, as an extra document in the batch"""
    max_train_pairs: int | None = None
    """use only the first N training pairs (a quick CPU run)"""
    max_queries: int | None = None
    """evaluate only the first N judged queries"""
    max_corpus_docs: int | None = None
    """rank among at most N documents: every document the evaluated queries judge relevant, then the corpus in
    file order (a smaller corpus gives higher scores than the full one: only for quick runs)"""


class RetrievalTask:
    """`FinetuneTask` for BEIR retrieval: bi-encoder, InfoNCE with in-batch negatives, nDCG@10."""

    metric = "ndcg@10"
    higher_is_better = True
    batch_coupled_loss = True  # in-batch negatives: the drawn batches are kept (no length grouping)

    def __init__(self, settings: RetrievalSettings, *, name: str = "retrieval") -> None:
        s = settings
        if not s.data:
            raise ConfigError(f"task {name}: give --task.data, a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
        if s.max_length < 4:
            raise ConfigError(f"--task.max_length {s.max_length} is too short: <s>, </s> and some text need >= 4")
        if not s.temperature > 0:
            raise ConfigError(f"--task.temperature must be > 0, got {s.temperature}")
        for key in ("max_train_pairs", "max_queries", "max_corpus_docs"):
            if getattr(s, key) is not None and getattr(s, key) < 1:
                raise ConfigError(f"--task.{key} must be at least 1 (or unset), got {getattr(s, key)}")
        self.settings, self.name = settings, name
        self.tokenizer: Any = None
        self._train: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ data
    def prepare(self, tokenizer: Any) -> None:
        s = self.settings
        if tokenizer.pad_token_id is None:
            raise ConfigError("the tokenizer has no pad token: load it with biglm.data.load_tokenizer, which adds one")
        self.tokenizer = tokenizer
        train = load_beir(s.data, split=s.train_split)
        evalset = load_beir(s.data, split=s.eval_split)
        self._prepare_train(train)
        self._prepare_eval(evalset)

    def _prepare_train(self, data: BeirData) -> None:
        s = self.settings
        pairs = [(q, d) for q, docs in data.qrels.items() for d, grade in docs.items() if grade > 0]
        if not pairs:
            raise TaskDataError(f"{data.folder}/qrels/{s.train_split}.tsv: no judgement with score > 0, so no "
                                "training pair; use a split with relevant documents")
        pairs = pairs[:s.max_train_pairs]
        negatives = self._read_negatives(data) if s.hard_negatives else {}
        doc_index: dict[str, int] = {}  # doc id -> small int, to find in-batch false negatives without strings

        def index(d: str) -> int:
            return doc_index.setdefault(d, len(doc_index))

        q_cache: dict[str, list[int]] = {}
        d_cache: dict[str, list[int]] = {}
        self._train = []
        for q, d in pairs:
            if q not in q_cache:
                q_cache[q] = self._tokenize(data.queries[q].strip())
            positives = [index(p) for p, g in data.qrels[q].items() if g > 0]
            feature = {"query_ids": q_cache[q], "doc": index(d), "positives": positives}
            for role, doc_id in (("doc_ids", d), ("neg_ids", negatives.get(q))):
                if doc_id is None:
                    continue
                if doc_id not in d_cache:
                    d_cache[doc_id] = self._tokenize(doc_text(data.corpus[doc_id]))
                feature[role] = d_cache[doc_id]
                if role == "neg_ids":
                    feature["neg"] = index(doc_id)
            self._train.append(feature)
        self.num_train_queries = len(q_cache)
        self.num_hard_negatives = sum("neg_ids" in f for f in self._train)

    def _read_negatives(self, data: BeirData) -> dict[str, str]:
        """query id -> its first listed negative that is neither relevant nor unknown."""
        path = Path(self.settings.hard_negatives)
        if not path.is_file():
            raise TaskDataError(f"{path}: no such file (--task.hard_negatives); give a TSV with the header "
                                "query-id<TAB>corpus-id[<TAB>score]")
        with path.open(newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))
        if not rows or rows[0][:2] != ["query-id", "corpus-id"]:
            raise TaskDataError(f"{path}: the first line must be the header query-id<TAB>corpus-id[<TAB>score]")
        unknown = sorted({r[1] for r in rows[1:] if len(r) >= 2 and r[1] not in data.corpus})
        if unknown:
            raise TaskDataError(f"{path}: {len(unknown)} corpus-id(s) are not in the corpus (e.g. {unknown[:5]}); "
                                "mine negatives from this dataset's corpus.jsonl")
        chosen: dict[str, str] = {}
        for row in rows[1:]:
            if len(row) < 2:
                continue
            q, d = row[0], row[1]
            if q not in chosen and data.qrels.get(q, {}).get(d, 0) <= 0:
                chosen[q] = d
        return chosen

    def _prepare_eval(self, data: BeirData) -> None:
        s = self.settings
        qids = list(data.qrels)[:s.max_queries]
        self.eval_qrels = {q: data.qrels[q] for q in qids}
        self.eval_queries = [data.queries[q].strip() for q in qids]
        self.eval_query_ids = qids
        doc_ids = list(data.corpus)
        if s.max_corpus_docs is not None and s.max_corpus_docs < len(doc_ids):
            judged = list(dict.fromkeys(d for q in qids for d in data.qrels[q]))
            rest = [d for d in doc_ids if d not in set(judged)]
            doc_ids = judged + rest[:max(0, s.max_corpus_docs - len(judged))]
            if len(judged) > s.max_corpus_docs:
                log.warning("--task.max_corpus_docs %d < the %d documents the evaluated queries judge: keeping those",
                            s.max_corpus_docs, len(judged))
        self.eval_doc_ids = doc_ids
        self.eval_docs = [doc_text(data.corpus[d]) for d in doc_ids]

    def _tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, truncation=True, max_length=self.settings.max_length)["input_ids"])

    def train_features(self) -> Sequence[dict[str, Any]]:
        return self._train

    # ------------------------------------------------------------------ model
    def build_model(self, base: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        encoder = base.model if hasattr(base, "lm_head") else base  # the MLM head is not used
        limit = encoder.config.max_position_embeddings
        if self.settings.max_length > limit:
            raise ConfigError(f"--task.max_length {self.settings.max_length} exceeds the model's "
                              f"max_position_embeddings {limit}: lower --task.max_length to at most {limit}")
        return BiGLMBiEncoder(encoder, tokenizer)

    def collate(self, features: Sequence[dict[str, Any]], *, device: torch.device) -> dict[str, Any]:
        """Queries and their documents (then the hard negatives) as two padded batches, and the (B, D) mask of
        in-batch documents that are relevant to a query other than its own positive."""
        pad = self.tokenizer.pad_token_id
        docs = [f["doc_ids"] for f in features] + [f["neg_ids"] for f in features if "neg_ids" in f]
        doc_keys = [f["doc"] for f in features] + [f["neg"] for f in features if "neg_ids" in f]
        q_ids, q_mask = pad_batch([f["query_ids"] for f in features], pad_id=pad)
        d_ids, d_mask = pad_batch(docs, pad_id=pad)
        exclude = torch.tensor([[key in f["positives"] and j != i for j, key in enumerate(doc_keys)]
                                for i, f in enumerate(features)], dtype=torch.bool)
        return {"input_ids": q_ids.to(device), "attention_mask": q_mask.to(device),
                "doc_input_ids": d_ids.to(device), "doc_attention_mask": d_mask.to(device),
                "exclude": exclude.to(device), "num_items": len(features)}

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        out = model(batch["input_ids"], batch["attention_mask"], batch["doc_input_ids"], batch["doc_attention_mask"])
        return info_nce(out.embeddings, out.doc_embeddings, temperature=self.settings.temperature,
                        exclude=batch["exclude"])

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, *, batch_size: int, device: torch.device) -> dict[str, float]:
        """nDCG@10 and recall@100 (percent) of dot-product retrieval over the corpus for the judged queries."""
        n = self.settings.max_length
        docs = model.encode(self.eval_docs, batch_size=batch_size, max_length=n, tokenizer=self.tokenizer).to(device)
        queries = model.encode(self.eval_queries, batch_size=batch_size, max_length=n, tokenizer=self.tokenizer)
        k = min(TOP_K, len(self.eval_doc_ids))
        run: dict[str, dict[str, float]] = {}
        for start in range(0, len(queries), 256):  # (256, N) score blocks bound the memory for large corpora
            with torch.autocast(device.type, enabled=False):  # fp32 scores: bf16 would create ties
                scores = queries[start:start + 256].to(device) @ docs.T
            top, idx = scores.topk(k, dim=1)
            for qid, row_s, row_i in zip(self.eval_query_ids[start:start + 256], top.tolist(), idx.tolist()):
                run[qid] = {self.eval_doc_ids[j]: s for j, s in zip(row_i, row_s)}
        result = retrieval_scores(self.eval_qrels, run, measures=("nDCG@10", "R@100"))
        return {"ndcg@10": 100.0 * result.scores["nDCG@10"], "recall@100": 100.0 * result.scores["R@100"],
                "queries": float(result.num_queries), "documents": float(len(self.eval_doc_ids))}

    # ------------------------------------------------------------------ output
    def export(self, model: torch.nn.Module, tokenizer: Any, out_dir: Path) -> None:
        from ... import adapter  # the sentence-transformers writer is a third-party adapter (biglm.integrations)

        encoder = model.model if isinstance(model, BiGLMBiEncoder) else model
        adapter("sentence-transformers-export")(encoder, tokenizer, out_dir, max_length=self.settings.max_length)
        (Path(out_dir) / TASK_FILE).write_text(json.dumps(self.describe(), indent=2))

    def describe(self) -> dict[str, Any]:
        from ...config import to_dict

        s = self.settings
        info: dict[str, Any] = {"task": self.name, "kind": "retrieval", "settings": to_dict(s),
                                "pooling": "mean over real tokens, L2-normalised", "similarity": "dot (= cosine)"}
        if self._train:
            info.update(train_pairs=len(self._train), train_queries=self.num_train_queries,
                        hard_negatives=self.num_hard_negatives, eval_queries=len(self.eval_query_ids),
                        eval_documents=len(self.eval_doc_ids))
        notes = []
        if s.eval_split == "test":
            notes.append("the metric is computed on the test qrels (the dataset has no dev split here), so the best "
                         "epoch is selected on test")
        if s.max_corpus_docs is not None or s.max_queries is not None:
            notes.append("a reduced corpus or query set: not comparable with published BEIR numbers")
        info["notes"] = notes
        return info


def doc_text(doc: dict[str, str]) -> str:
    """BEIR's document text: title + " " + text, stripped (as BEIR's own sentence-transformers models)."""
    return f"{doc.get('title') or ''} {doc['text']}".strip()


# ---------------------------------------------------------------- registry (`biglm tasks`)


# Written-down choices (the paper gives none for retrieval): 10 epochs of SciFact's 919 training pairs;
# one micro-batch per step, so all 64 documents of a step are negatives of each query (negatives never
# cross micro-batches or ranks); lr 2e-5 as the other tasks.
_LOOP = {"epochs": 10, "global_batch": 64, "micro_batch": 64, "lr": 2e-5}

RECIPES = (
    TaskRecipe("beir-scifact", "BEIR SciFact retrieval: bi-encoder (mean pooling, normalised), InfoNCE with in-batch "
               "negatives on the train qrels; nDCG@10 and recall@100 on the test qrels; exported as a "
               "sentence-transformers model. Give --task.data DIR (e.g. ../shared/data/finetune/beir_scifact)",
               lambda: RetrievalSettings(max_length=256), lambda s: RetrievalTask(s, name="beir-scifact"), loop=_LOOP),
    TaskRecipe("retrieval", "any BEIR-layout dataset (corpus.jsonl, queries.jsonl, qrels/): give --task.data and the "
               "--task.train_split/--task.eval_split qrels names", RetrievalSettings,
               lambda s: RetrievalTask(s, name="retrieval"), loop=_LOOP),
)
