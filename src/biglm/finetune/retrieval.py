"""Retrieval embeddings (DESIGN §9; BEIR, nDCG@10): a BiGLM bi-encoder trained contrastively.

A text's embedding is the mean of the encoder's last hidden states over its real tokens under full
bidirectional attention (no prefix), L2-normalised, so a dot product is a cosine. Training is InfoNCE
over query -> document pairs with the other documents of the batch as negatives (and, optionally, one
mined hard negative per pair); evaluation encodes the corpus and the judged queries, ranks by dot
product and scores the top 100 with ``ir-measures`` (`biglm.finetune.metrics.retrieval_scores`).

Notable features
- `BiGLMBiEncoder.encode` batches by length: texts are sorted by token count, each batch is padded
  to its own longest text and the rows go back to their original order. SciFact's documents range
  from ~10 to ~1,000 words, so padding every batch to the longest text would waste most of the work.
- One forward for queries and documents (`BiGLMBiEncoder.forward` takes both, as CLIP's does), so
  DDP and FSDP see one forward per backward; each side is padded to its own length.
- False negatives are masked: a batch's document that is also judged relevant to a query (248 of
  SciFact's training documents are cited by several queries) is not scored as that query's negative.
- Export is a sentence-transformers directory written by sentence-transformers' own ``save``
  (Transformer -> Pooling(mean) -> Normalize), loadable with ``SentenceTransformer(path)`` after
  ``import biglm`` (which registers BiGLM with ``AutoConfig``/``AutoModel``) and so by ``mteb``.
  The same directory loads with `BiGLMBiEncoder.from_pretrained`. Texts are tokenised exactly as
  sentence-transformers does (the tokenizer's ``<s> ... </s>``, truncated to ``max_length``).
- Scores are in percent (like the other tasks' accuracy/EM/F1); BEIR tables print fractions.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.utils import ModelOutput

from ..config import ConfigError
from ..model import BiGLMModel
from .data import BeirData, TaskDataError, load_beir
from .metrics import retrieval_scores

log = logging.getLogger(__name__)

__all__ = [
    "BiEncoderOutput", "BiGLMBiEncoder", "RetrievalSettings", "RetrievalTask", "doc_text", "export_sentence_transformer",
    "info_nce", "mean_pool", "pad_batch",
]

TASK_FILE = "biglm_task.json"  # written beside the exported model: the task's settings
TOP_K = 100  # documents kept per query: enough for recall@100, and nDCG@10 only reads the first 10


# ---------------------------------------------------------------- the model


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L, h) hidden states -> (B, h) fp32 mean over real tokens, L2-normalised.

    The same arithmetic as sentence-transformers' ``Pooling(mean)`` then ``Normalize``, so the exported
    model gives the same vectors.
    """
    mask = attention_mask.unsqueeze(-1).to(torch.float32)  # (B, L, 1)
    summed = (hidden.float() * mask).sum(dim=1)
    mean = summed / mask.sum(dim=1).clamp(min=1e-9)
    return F.normalize(mean, p=2, dim=-1)


@dataclass
class BiEncoderOutput(ModelOutput):
    embeddings: torch.Tensor | None = None
    """(B, h) normalised embeddings of ``input_ids``"""
    doc_embeddings: torch.Tensor | None = None
    """(D, h) normalised embeddings of ``doc_input_ids``, when given"""


class BiGLMBiEncoder(nn.Module):
    """A `BiGLMModel` (``.model``, so `parallelize` finds its blocks) read out as one vector per text."""

    def __init__(self, encoder: BiGLMModel, tokenizer: Any = None) -> None:
        super().__init__()
        self.model = encoder
        self.tokenizer = tokenizer  # for `encode`; not a module, not in the state dict

    @property
    def config(self):
        return self.model.config

    @classmethod
    def from_pretrained(cls, path: str | Path) -> BiGLMBiEncoder:
        """Load an exported bi-encoder (or any BiGLM directory: a masked-LM's encoder is taken) and its tokenizer."""
        from transformers import AutoTokenizer

        return cls(BiGLMModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)).eval()

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) padded ids -> (B, h) fp32 normalised embeddings (full attention, padding masked out)."""
        hidden = self.model(input_ids, attention_mask=attention_mask).last_hidden_state
        return mean_pool(hidden, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                doc_input_ids: torch.Tensor | None = None, doc_attention_mask: torch.Tensor | None = None,
                ) -> BiEncoderOutput:
        """Embeddings of a batch of texts and, in the same call, of a second batch (the documents)."""
        docs = None if doc_input_ids is None else self.embed(doc_input_ids, doc_attention_mask)
        return BiEncoderOutput(embeddings=self.embed(input_ids, attention_mask), doc_embeddings=docs)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], *, batch_size: int = 32, max_length: int = 256,
               tokenizer: Any = None) -> torch.Tensor:
        """(N, h) fp32 CPU embeddings of ``texts`` in their order, batched by length.

        Each text is tokenised as sentence-transformers does (``<s> ... </s>``, cut to ``max_length``
        tokens); batches of ``batch_size`` texts of similar length are padded to their own longest.
        The model runs in eval mode (restored afterwards) on the device its weights are on.
        """
        tok = tokenizer if tokenizer is not None else self.tokenizer
        if tok is None:
            raise ValueError("no tokenizer: pass tokenizer= or build the BiGLMBiEncoder with one")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if not texts:
            return torch.empty(0, self.config.hidden_size)
        device = self.model.embed_tokens.weight.device
        ids = tok(list(texts), truncation=True, max_length=max_length)["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first: a too-large batch fails at once
        out = torch.empty(len(ids), self.config.hidden_size, dtype=torch.float32)
        was_training = self.training
        self.eval()
        try:
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                input_ids, mask = pad_batch([ids[i] for i in rows], pad_id=tok.pad_token_id)
                out[rows] = self.embed(input_ids.to(device), mask.to(device)).cpu()
        finally:
            self.train(was_training)
        return out


def pad_batch(seqs: Sequence[Sequence[int]], *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists to the longest: (ids, attention_mask), both (B, L) long."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
    return ids, mask


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


def export_sentence_transformer(encoder: BiGLMModel, tokenizer: Any, out_dir: str | Path, *,
                                max_length: int) -> Path:
    """Write ``out_dir`` as a sentence-transformers model: Transformer (BiGLM) -> Pooling(mean) -> Normalize.

    The encoder and tokenizer are saved with ``save_pretrained``, loaded back through
    sentence-transformers' ``Transformer`` module (``AutoModel``, hence BiGLM's registration) and the
    pipeline saved by ``SentenceTransformer.save`` (modules.json, sentence_bert_config.json, 1_Pooling/,
    2_Normalize/). The saved config names the ``sdpa`` attention backend, which runs anywhere.
    """
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:  # pragma: no cover - part of the finetune extra
        raise ImportError("exporting a retrieval model needs sentence-transformers: pip install 'biglm[finetune]'") from e
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:  # 3.x-5.x
        from sentence_transformers.models import Normalize, Pooling, Transformer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = encoder.config.attn_backend
    encoder.config.attn_backend = "sdpa"  # flex needs torch.compile to be fast; eager is slow
    try:
        encoder.save_pretrained(out)
    finally:
        encoder.config.attn_backend = backend
    tokenizer.save_pretrained(out)
    transformer = Transformer(str(out), max_seq_length=max_length)
    modules = [transformer, Pooling(encoder.config.hidden_size, pooling_mode="mean"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu", similarity_fn_name="cosine").save(str(out))
    return out


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
        encoder = model.model if isinstance(model, BiGLMBiEncoder) else model
        export_sentence_transformer(encoder, tokenizer, out_dir, max_length=self.settings.max_length)
        (Path(out_dir) / TASK_FILE).write_text(json.dumps(self.describe(), indent=2))

    def describe(self) -> dict[str, Any]:
        from ..config import to_dict

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


def _register() -> None:
    from .tasks import TaskRecipe, register

    # Written-down choices (the paper gives none for retrieval): 10 epochs of SciFact's 919 training pairs;
    # one micro-batch per step, so all 64 documents of a step are negatives of each query (negatives never
    # cross micro-batches or ranks); lr 2e-5 as the other tasks.
    loop = {"epochs": 10, "global_batch": 64, "micro_batch": 64, "lr": 2e-5}
    register(TaskRecipe(
        "beir-scifact", "BEIR SciFact retrieval: bi-encoder (mean pooling, normalised), InfoNCE with in-batch "
        "negatives on the train qrels; nDCG@10 and recall@100 on the test qrels; exported as a sentence-transformers "
        "model. Give --task.data DIR (e.g. ../shared/data/finetune/beir_scifact)",
        lambda: RetrievalSettings(max_length=256), lambda s: RetrievalTask(s, name="beir-scifact"), loop=loop))
    register(TaskRecipe(
        "retrieval", "any BEIR-layout dataset (corpus.jsonl, queries.jsonl, qrels/): give --task.data and the "
        "--task.train_split/--task.eval_split qrels names", RetrievalSettings,
        lambda s: RetrievalTask(s, name="retrieval"), loop=loop))


_register()
