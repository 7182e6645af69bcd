"""biglm: pre-train, evaluate, fine-tune and generate with BiGLM bidirectional language models.

Importing `biglm` registers the model with transformers' Auto classes, so
``AutoModelForMaskedLM.from_pretrained(dir)`` and ``pipeline("fill-mask", ...)`` work on a saved BiGLM,
and ``AutoModelForQuestionAnswering``/``pipeline("question-answering", ...)`` on a fine-tuned SQuAD model
(transformers 5 removed that pipeline; biglm's `biglm.finetune.squad_task.QuestionAnsweringPipeline`
takes the task name back, for extractive QA models without segment ids).
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


def _register_qa_pipeline() -> None:
    """Make ``pipeline("question-answering")`` build biglm's QA pipeline where transformers has none (v5 removed
    it); the class is imported only when a pipeline is built."""
    from transformers import pipelines

    if "question-answering" in pipelines.PIPELINE_REGISTRY.supported_tasks:
        return
    getattr(pipelines, "REMOVED_TASKS", {}).pop("question-answering", None)
    pipelines.PIPELINE_REGISTRY.supported_tasks["question-answering"] = {
        "impl": "biglm.finetune.squad_task.QuestionAnsweringPipeline", "pt": (AutoModelForQuestionAnswering,),
        "type": "text"}


_register_qa_pipeline()

__all__ = ["BiGLMConfig", "BiGLMForConditionalGeneration", "BiGLMModel", "BiGLMForMaskedLM", "BiGLMForQuestionAnswering", "PrefixCache", "__version__"]
