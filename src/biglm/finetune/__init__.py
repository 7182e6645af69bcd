"""Task fine-tuning: the fine-tuning loop and the tasks it trains (`biglm finetune`, `biglm tasks`).

It sits above training, whose one loop and parts it reuses, and below the entry points; generation, scoring and
serving never import it. The guide: docs/guides/finetune.md.

- ``task``: the contract between the loop and a task (`FinetuneTask`) and the export every task shares.
- ``tasks``: the tasks wing, one module per family (``classification``, ``squad``, ``retrieval``,
  ``seq2seq`` (CMLM), ``instruct`` with ``flan``), each with its data reader, and the registry
  (`biglm tasks`) that lists the families explicitly.
- ``templates``: prompt templates for classification by prompt (built-in MNLI, YAML specs, FLAN v2 patterns,
  plain promptsource templates) with label-word checks against a tokenizer.
- ``loop``: the one fine-tuning loop (`FineTuner`); `run_finetune(task, cfg)` is the Python entry point that
  ``biglm finetune`` also uses (single process or one torchrun rank).

Shared pieces live below this room, where evaluation uses them too: metrics in `biglm.scoring.metrics`, table
loading in `biglm.data.tables`, the bi-encoder in `biglm.model.biencoder`.

Names are imported lazily (PEP 562): ``biglm.finetune.templates`` alone does not import ``datasets``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # metrics (biglm.scoring.metrics, re-exported)
    **{name: "biglm.scoring.metrics" for name in (
        "normalize_answer", "squad_exact_match", "squad_f1", "squad_max_over_ground_truths", "squad_evaluate",
        "SquadResult", "predict_labels", "accuracy", "retrieval_scores", "RetrievalResult")},
    # templates
    "PromptTemplate": "biglm.finetune.templates", "TemplateError": "biglm.finetune.templates",
    "MNLI_TEMPLATE": "biglm.finetune.templates", "load_template": "biglm.finetune.templates",
    "flan_template": "biglm.finetune.templates", "promptsource_template": "biglm.finetune.templates",
    # the tasks' data readers (and the shared table loader)
    "TaskDataError": "biglm.data.tables", "load_table": "biglm.data.tables",
    "load_classification": "biglm.finetune.tasks.classification",
    "ClassificationData": "biglm.finetune.tasks.classification",
    "load_squad": "biglm.finetune.tasks.squad", "SquadData": "biglm.finetune.tasks.squad",
    "split_by_article": "biglm.finetune.tasks.squad",
    "load_beir": "biglm.finetune.tasks.retrieval", "BeirData": "biglm.finetune.tasks.retrieval",
    # SQuAD windows and answer search
    "QAWindows": "biglm.finetune.tasks.squad", "build_qa_features": "biglm.finetune.tasks.squad",
    "postprocess_qa_predictions": "biglm.finetune.tasks.squad", "PredictedAnswer": "biglm.finetune.tasks.squad",
    # the loop, and the tasks of conditional generation / instruction tuning (Python entry: run_finetune)
    "run_finetune": "biglm.finetune.loop", "FineTuner": "biglm.finetune.loop",
    "FinetuneResult": "biglm.finetune.loop", "FinetuneConfig": "biglm.finetune.config",
    "Seq2SeqSettings": "biglm.finetune.tasks.seq2seq", "Seq2SeqTask": "biglm.finetune.tasks.seq2seq",
    "InstructSettings": "biglm.finetune.tasks.instruct", "InstructTask": "biglm.finetune.tasks.instruct",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'biglm.finetune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from biglm.data.tables import TaskDataError, load_table
    from biglm.finetune.config import FinetuneConfig
    from biglm.finetune.loop import FineTuner, FinetuneResult, run_finetune
    from biglm.finetune.tasks.classification import ClassificationData, load_classification
    from biglm.finetune.tasks.instruct import InstructSettings, InstructTask
    from biglm.finetune.tasks.retrieval import BeirData, load_beir
    from biglm.finetune.tasks.seq2seq import Seq2SeqSettings, Seq2SeqTask
    from biglm.finetune.tasks.squad import (
        PredictedAnswer,
        QAWindows,
        SquadData,
        build_qa_features,
        postprocess_qa_predictions,
        split_by_article,
    )
    from biglm.scoring.metrics import (
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
    from biglm.finetune.templates import (
        MNLI_TEMPLATE,
        PromptTemplate,
        TemplateError,
        flan_template,
        load_template,
        promptsource_template,
    )
