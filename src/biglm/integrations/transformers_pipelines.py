"""transformers pipelines for BiGLM models: ``pipeline("question-answering")``.

transformers 5 removed the question-answering pipeline; ``import biglm`` registers `QuestionAnsweringPipeline`
under that name (by the string path of this module, so nothing is imported until a pipeline is built). It
cuts windows with `build_qa_features` and searches spans with `postprocess_qa_predictions` (the SQuAD task's,
`biglm.finetune.tasks.squad`), so it answers exactly as `SquadTask.predict`. It passes no ``token_type_ids``:
models that need segment ids (BERT) are not its target. ``score`` is the span's probability in its window
(softmax of start and end logits over the window's context tokens, as transformers 4's pipeline); the window is
chosen by the largest start + end logit (BERT, run_qa).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.pipelines.base import ChunkPipeline

from ..finetune.tasks.squad import PIPELINE_KEY, QAWindows, build_qa_features, postprocess_qa_predictions

__all__ = ["QuestionAnsweringPipeline"]


def _softmax_log_norm(logits: np.ndarray) -> float:
    top = float(logits.max())
    return top + float(np.log(np.exp(logits - top).sum()))


class QuestionAnsweringPipeline(ChunkPipeline):
    """Extractive QA: ``qa(question=..., context=...)`` -> ``{"score", "start", "end", "answer"}``.

    Also ``qa({"question": ..., "context": ...})``, a list of such dicts, or lists for ``question=``/``context=``
    (a list of answers back). Options (defaults from the model config's ``task_specific_params
    ["question-answering"]``, else BERT's SQuAD settings): ``max_seq_len`` 384, ``doc_stride`` 128,
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
