"""Task fine-tuning (DESIGN §9): the task-side pieces the fine-tuning loop plugs in.

- ``metrics``: SQuAD v1.1 EM/F1 (official normalisation), accuracy with a stated tie rule,
  retrieval nDCG@10/recall@100 through ``ir-measures`` (the ``finetune`` extra).
- ``templates``: prompt templates for classification by prompt (built-in MNLI, YAML specs,
  FLAN v2 patterns, plain promptsource templates) with label-word checks against a tokenizer.
- ``data``: checked readers for classification sets, SQuAD v1.1 and BEIR, through ``datasets``.
- ``qa``: SQuAD windows (384 tokens, stride 128) and n-best answer search from start/end logits.
- ``loop``: the one fine-tuning loop (`FineTuner`); `run_finetune(task, cfg)` is the Python entry point that
  ``biglm finetune`` also uses (single process or one torchrun rank). Tasks: ``classification``, ``squad_task``,
  ``retrieval``, ``seq2seq`` (CMLM), ``instruct`` (FLAN).

Names are imported lazily (PEP 562): ``biglm.finetune.metrics`` alone does not import ``datasets``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # metrics
    "normalize_answer": "metrics", "squad_exact_match": "metrics", "squad_f1": "metrics",
    "squad_max_over_ground_truths": "metrics", "squad_evaluate": "metrics", "SquadResult": "metrics",
    "predict_labels": "metrics", "accuracy": "metrics", "retrieval_scores": "metrics", "RetrievalResult": "metrics",
    # templates
    "PromptTemplate": "templates", "TemplateError": "templates", "MNLI_TEMPLATE": "templates",
    "load_template": "templates", "flan_template": "templates", "promptsource_template": "templates",
    # data
    "TaskDataError": "data", "load_table": "data", "load_classification": "data", "ClassificationData": "data",
    "load_squad": "data", "SquadData": "data", "split_by_article": "data", "load_beir": "data", "BeirData": "data",
    # qa
    "QAWindows": "qa", "build_qa_features": "qa", "postprocess_qa_predictions": "qa", "PredictedAnswer": "qa",
    # the loop, and the tasks of conditional generation / instruction tuning (Python entry: run_finetune)
    "run_finetune": "loop", "FineTuner": "loop", "FinetuneResult": "loop", "FinetuneConfig": "config",
    "Seq2SeqSettings": "seq2seq", "Seq2SeqTask": "seq2seq", "InstructSettings": "instruct", "InstructTask": "instruct",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"biglm.finetune.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'biglm.finetune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from biglm.finetune.config import FinetuneConfig
    from biglm.finetune.instruct import InstructSettings, InstructTask
    from biglm.finetune.loop import FineTuner, FinetuneResult, run_finetune
    from biglm.finetune.seq2seq import Seq2SeqSettings, Seq2SeqTask
    from biglm.finetune.data import (
        BeirData,
        ClassificationData,
        SquadData,
        TaskDataError,
        load_beir,
        load_classification,
        load_squad,
        load_table,
        split_by_article,
    )
    from biglm.finetune.metrics import (
        RetrievalResult,
        SquadResult,
        accuracy,
        normalize_answer,
        predict_labels,
        retrieval_scores,
        squad_evaluate,
        squad_exact_match,
        squad_f1,
        squad_max_over_ground_truths,
    )
    from biglm.finetune.qa import PredictedAnswer, QAWindows, build_qa_features, postprocess_qa_predictions
    from biglm.finetune.templates import (
        MNLI_TEMPLATE,
        PromptTemplate,
        TemplateError,
        flan_template,
        load_template,
        promptsource_template,
    )
