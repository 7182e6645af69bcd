"""biglm: pre-train, evaluate, fine-tune and generate with BiGLM bidirectional language models.

Importing `biglm` registers the model with transformers' Auto classes, so
``AutoModelForMaskedLM.from_pretrained(dir)`` and ``pipeline("fill-mask", ...)`` work on a saved BiGLM,
and ``AutoModelForQuestionAnswering``/``pipeline("question-answering", ...)`` on a fine-tuned SQuAD model
(transformers 5 removed that pipeline; biglm's `biglm.integrations.transformers_pipelines.QuestionAnsweringPipeline`
takes the task name back, for extractive QA models without segment ids).

`ADAPTERS` names biglm's third-party adapters (the integrations room) by string: the pipeline registered here
and the writers the core calls through `adapter`, so no core module imports ``biglm.integrations``.
"""

from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
                          AutoModelForSeq2SeqLM)

from .model import (BiGLMConfig, BiGLMForConditionalGeneration, BiGLMForMaskedLM, BiGLMForQuestionAnswering, BiGLMModel,
                    PrefixCache)

__version__ = "0.1.0"

AutoConfig.register("biglm", BiGLMConfig, exist_ok=True)
AutoModel.register(BiGLMConfig, BiGLMModel, exist_ok=True)
AutoModelForMaskedLM.register(BiGLMConfig, BiGLMForMaskedLM, exist_ok=True)
AutoModelForQuestionAnswering.register(BiGLMConfig, BiGLMForQuestionAnswering, exist_ok=True)
AutoModelForSeq2SeqLM.register(BiGLMConfig, BiGLMForConditionalGeneration, exist_ok=True)  # CMLM seq2seq (length head)


# third-party adapters by name, "module:attribute"; a module is imported only when its adapter is first used
ADAPTERS = {
    "question-answering-pipeline": "biglm.integrations.transformers_pipelines:QuestionAnsweringPipeline",
    "sentence-transformers-export": "biglm.integrations.sentence_transformers:export_sentence_transformer",
}


def adapter(name: str):
    """The adapter registered as ``name`` in `ADAPTERS` (its module imported now)."""
    import importlib

    module, _, attribute = ADAPTERS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def _register_qa_pipeline() -> None:
    """Make ``pipeline("question-answering")`` build biglm's QA pipeline where transformers has none (v5 removed
    it); the class is imported only when a pipeline is built."""
    from transformers import pipelines

    if "question-answering" in pipelines.PIPELINE_REGISTRY.supported_tasks:
        return
    getattr(pipelines, "REMOVED_TASKS", {}).pop("question-answering", None)
    pipelines.PIPELINE_REGISTRY.supported_tasks["question-answering"] = {
        "impl": ADAPTERS["question-answering-pipeline"].replace(":", "."), "pt": (AutoModelForQuestionAnswering,),
        "type": "text"}


_register_qa_pipeline()

__all__ = ["ADAPTERS", "adapter", "BiGLMConfig", "BiGLMForConditionalGeneration", "BiGLMModel", "BiGLMForMaskedLM", "BiGLMForQuestionAnswering", "PrefixCache", "__version__"]
