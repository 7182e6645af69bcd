"""Extractive QA on SQuAD v1.1 (paper §4.1, Table 3; DESIGN §9): the `squad` fine-tuning task.

A start/end span head on the BiGLM encoder under full bidirectional attention
(`biglm.model.qa.BiGLMForQuestionAnswering`), trained on question+context windows with the BERT loss
(mean of the start and end cross-entropies); predictions come from the n-best span search and are
scored with the official v1.1 EM/F1. The best epoch is picked by F1.

Notable features
- Data through `biglm.finetune.data.load_squad`: the official JSON or a flat hub/local set. Only
  SQuAD's dev set is in the shared data, so ``split_by_article`` holds out a share of the *train*
  source's articles as the validation split (no paragraph of a held-out article is trained on); the
  recipe's defaults read the hub's train and validation splits for real runs.
- Windows, labels and answer search are `biglm.finetune.qa`'s (384 tokens, stride 128, questions cut
  to 64 tokens, answers up to 30 tokens, n-best 20); the window settings are stored in the model's
  config (``task_specific_params["question-answering"]``), so the exported model's pipeline cuts the
  same windows.
- One training item is one *window* (a feature): ``num_items`` counts windows, and the loss is the
  sum over windows of (CE(start) + CE(end)) / 2. A window that lacks (part of) its answer is
  labelled with the first token, as BERT (``out_of_window="cls"``), or dropped (``"drop"``).
- Training windows are kept as int32 arrays, without their offsets (the full SQuAD train set is
  ~88k windows; Python int lists would take ~0.6 GB). Evaluation batches windows sorted by length.
- `QuestionAnsweringPipeline`: transformers 5 removed ``pipeline("question-answering")``; ``import
  biglm`` registers this one under that name. It cuts windows with `build_qa_features` and searches
  spans with `postprocess_qa_predictions`, so it answers exactly as `SquadTask.predict`. It passes no
  ``token_type_ids``: models that need segment ids (BERT) are not its target. ``score`` is the span's
  probability in its window (softmax of start and end logits over the window's context tokens, as
  transformers 4's pipeline); the window is chosen by the largest start + end logit (BERT, run_qa).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import torch
from transformers.pipelines.base import ChunkPipeline

from ..config import ConfigError
from ..model import BiGLMForMaskedLM
from ..model.qa import BiGLMForQuestionAnswering, span_loss
from .data import load_squad, split_by_article
from .metrics import squad_evaluate
from .qa import PredictedAnswer, QAWindows, build_qa_features, postprocess_qa_predictions

__all__ = ["QuestionAnsweringPipeline", "SquadSettings", "SquadTask", "squad_task_from_args"]

TASK_FILE = "biglm_task.json"  # written beside an exported model: the task and its settings
PIPELINE_KEY = "question-answering"  # config.task_specific_params key read by the pipeline
_CHUNK = 1000  # examples tokenised per call while building features


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
        out_dir = Path(out_dir)
        params = dict(getattr(model.config, "task_specific_params", None) or {})
        params[PIPELINE_KEY] = self.pipeline_params()
        model.config.task_specific_params = params
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        (out_dir / TASK_FILE).write_text(json.dumps(self.describe(), indent=2))

    def describe(self) -> dict[str, Any]:
        from ..config import to_dict

        return {"task": self.name, "kind": "squad", "settings": to_dict(self.settings), "metric": self.metric,
                **self._stats}


def squad_task_from_args(**kwargs: Any) -> SquadTask:
    """`SquadTask` from `SquadSettings` fields given as keywords (``name=`` names the task)."""
    name = kwargs.pop("name", "squad")
    return SquadTask(SquadSettings(**kwargs), name=name)


# ---------------------------------------------------------------- pipeline("question-answering")


def _softmax_log_norm(logits: np.ndarray) -> float:
    top = float(logits.max())
    return top + float(np.log(np.exp(logits - top).sum()))


class QuestionAnsweringPipeline(ChunkPipeline):
    """Extractive QA: ``qa(question=..., context=...)`` -> ``{"score", "start", "end", "answer"}``.

    Also ``qa({"question": ..., "context": ...})``, a list of such dicts, or lists for ``question=``/``context=``
    (a list of answers back). Options (defaults from the model config's ``task_specific_params
    ["question-answering"]``, else DESIGN §9's): ``max_seq_len`` 384, ``doc_stride`` 128,
    ``max_question_len`` 64, ``max_answer_len`` 30, ``n_best`` 20. One answer per question (``top_k=1``).
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    _DEFAULTS = {"max_seq_len": 384, "doc_stride": 128, "max_question_len": 64, "max_answer_len": 30, "n_best": 20}

    def _default(self, key: str) -> int:
        params = (getattr(self.model.config, "task_specific_params", None) or {}).get(PIPELINE_KEY, {})
        return int(params.get(key, self._DEFAULTS[key]))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "question" in kwargs or "context" in kwargs:
            question, context = kwargs.pop("question", None), kwargs.pop("context", None)
            if args or question is None or context is None:
                raise ValueError("give question= and context= together (or one {'question', 'context'} dict, or a "
                                 "list of them)")
            if isinstance(question, str) and isinstance(context, str):
                return super().__call__({"question": question, "context": context}, **kwargs)
            if isinstance(question, str) or isinstance(context, str) or len(question) != len(context):
                raise ValueError("question= and context= must both be strings or lists of the same length")
            return super().__call__([{"question": q, "context": c} for q, c in zip(question, context)], **kwargs)
        return super().__call__(*args, **kwargs)

    def _sanitize_parameters(self, max_seq_len: int | None = None, doc_stride: int | None = None,
                             max_question_len: int | None = None, max_answer_len: int | None = None,
                             n_best: int | None = None, top_k: int | None = None,
                             handle_impossible_answer: bool | None = None, **unknown: Any):
        if unknown:
            raise TypeError(f"question-answering pipeline: unknown option(s) {sorted(unknown)}; options: max_seq_len, "
                            "doc_stride, max_question_len, max_answer_len, n_best")
        if top_k not in (None, 1):
            raise ValueError(f"top_k={top_k}: this pipeline returns the best answer only (top_k=1)")
        if handle_impossible_answer:
            raise ValueError("handle_impossible_answer: SQuAD v1.1 models always answer; no null answer is scored")
        pre = {k: v for k, v in (("max_seq_len", max_seq_len), ("doc_stride", doc_stride),
                                 ("max_question_len", max_question_len)) if v is not None}
        post = {k: v for k, v in (("max_answer_len", max_answer_len), ("n_best", n_best)) if v is not None}
        return pre, {}, post

    def preprocess(self, inputs: Any, max_seq_len: int | None = None, doc_stride: int | None = None,
                   max_question_len: int | None = None):
        if not isinstance(inputs, dict) or not isinstance(inputs.get("question"), str) \
                or not isinstance(inputs.get("context"), str):
            raise ValueError(f"question-answering input must be a dict with 'question' and 'context' strings, got "
                             f"{type(inputs).__name__}")
        if not inputs["context"].strip():
            raise ValueError("question-answering: the context is empty")
        windows = QAWindows(max_length=max_seq_len or self._default("max_seq_len"),
                            stride=self._default("doc_stride") if doc_stride is None else doc_stride,
                            max_question_tokens=max_question_len or self._default("max_question_len"))
        feats = build_qa_features({"id": ["0"], "question": [inputs["question"]], "context": [inputs["context"]]},
                                  self.tokenizer, windows=windows)
        n = len(feats["input_ids"])
        for w in range(n):
            yield {"input_ids": torch.tensor([feats["input_ids"][w]], dtype=torch.long),
                   "attention_mask": torch.tensor([feats["attention_mask"][w]], dtype=torch.long),
                   "offsets": feats["offset_mapping"][w], "context": inputs["context"], "is_last": w == n - 1}

    def _forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        out = self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        return {"start_logits": out.start_logits, "end_logits": out.end_logits, "offsets": inputs["offsets"],
                "context": inputs["context"], "is_last": inputs["is_last"]}

    def postprocess(self, outputs: list[dict[str, Any]], max_answer_len: int | None = None,
                    n_best: int | None = None) -> dict[str, Any]:
        offsets = [o["offsets"] for o in outputs]
        start = [o["start_logits"].reshape(-1).float().numpy()[:len(off)] for o, off in zip(outputs, offsets)]
        end = [o["end_logits"].reshape(-1).float().numpy()[:len(off)] for o, off in zip(outputs, offsets)]
        context = outputs[0]["context"]
        best = postprocess_qa_predictions(
            {"id": ["0"], "context": [context]}, {"example_id": ["0"] * len(outputs), "offset_mapping": offsets},
            start, end, n_best=n_best or self._default("n_best"),
            max_answer_tokens=max_answer_len or self._default("max_answer_len"))["0"]
        if best.window < 0:
            return {"score": 0.0, "start": 0, "end": 0, "answer": ""}
        valid = np.array([o is not None for o in offsets[best.window]])
        log_norm = (_softmax_log_norm(start[best.window][valid].astype(np.float64))
                    + _softmax_log_norm(end[best.window][valid].astype(np.float64)))
        return {"score": float(np.exp(best.score - log_norm)), "start": best.start_char, "end": best.end_char,
                "answer": best.text}


# ---------------------------------------------------------------- registry (`biglm tasks`)


def _register() -> None:
    from .tasks import TaskRecipe, register

    register(TaskRecipe(
        "squad", "SQuAD v1.1 extractive QA: start/end head, 384-token windows (stride 128), n-best answers up to 30 "
        "tokens; EM/F1 (best epoch by F1)", SquadSettings, lambda s: SquadTask(s, name="squad"),
        loop={"epochs": 5}))


_register()
