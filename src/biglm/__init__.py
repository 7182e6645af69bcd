"""biglm: pre-train, evaluate, fine-tune and generate with BiGLM bidirectional language models.

Importing `biglm` registers the model with transformers' Auto classes, so
``AutoModelForMaskedLM.from_pretrained(dir)`` and ``pipeline("fill-mask", ...)`` work on a saved BiGLM,
and ``AutoModelForQuestionAnswering``/``pipeline("question-answering", ...)`` on a fine-tuned SQuAD model
(transformers 5 removed that pipeline; biglm's `biglm.integrations.transformers_pipelines.QuestionAnsweringPipeline`
takes the task name back, for extractive QA models without segment ids). ``pipeline("text-generation", ...)``
works on a saved BiGLM too, and a loaded one answers ``model.generate(input_ids, ...)``, both with biglm's own decoding
(`biglm.integrations.transformers_generation`).

`ADAPTERS` names biglm's third-party adapters (the integrations room) by string: the pipeline registered here
and the writers the core calls through `adapter`, so no core module imports ``biglm.integrations``.
"""

from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
                          AutoModelForSeq2SeqLM)

from .model import (BiGLMConfig, BiGLMForConditionalGeneration, BiGLMForMaskedLM, BiGLMForQuestionAnswering, BiGLMModel,
                    PrefixCache)


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, one source), or 0+unknown for a bare source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("biglm")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()

AutoConfig.register("biglm", BiGLMConfig, exist_ok=True)
AutoModel.register(BiGLMConfig, BiGLMModel, exist_ok=True)
AutoModelForMaskedLM.register(BiGLMConfig, BiGLMForMaskedLM, exist_ok=True)
AutoModelForQuestionAnswering.register(BiGLMConfig, BiGLMForQuestionAnswering, exist_ok=True)
AutoModelForSeq2SeqLM.register(BiGLMConfig, BiGLMForConditionalGeneration, exist_ok=True)  # CMLM seq2seq (length head)


# third-party adapters by name, "module:attribute"; a module is imported only when its adapter is first used
ADAPTERS = {
    "question-answering-pipeline": "biglm.integrations.transformers_pipelines:QuestionAnsweringPipeline",
    "sentence-transformers-export": "biglm.integrations.sentence_transformers:export_sentence_transformer",
    "diffusion-generate": "biglm.integrations.transformers_generation:diffusion_generate",
    "text-generation-pipeline": "biglm.integrations.transformers_generation:TextGenerationPipeline",
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


class BiGLMForTextGeneration:
    """What ``pipeline("text-generation")`` loads a saved BiGLM with (after transformers' causal-LM class fails on
    it): the class it was saved as, as biglm's own loader chooses (a CMLM seq2seq fine-tune keeps its length head).
    Any other model is refused (ValueError), so the pipeline tries its next class."""

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        config = kwargs.get("config")
        if not isinstance(config, BiGLMConfig):
            config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        if not isinstance(config, BiGLMConfig):
            raise ValueError(f"{path} holds no BiGLM (model_type {config.model_type!r})")
        archs = config.architectures or []
        seq2seq = BiGLMForConditionalGeneration.__name__ in archs
        model_class = BiGLMForConditionalGeneration if seq2seq else BiGLMForMaskedLM
        return model_class.from_pretrained(path, *args, **kwargs)


def _register_text_generation_pipeline() -> None:
    """Make ``pipeline("text-generation", model=EXPORT)`` load a BiGLM (`BiGLMForTextGeneration`) and build biglm's
    pipeline for it; that pipeline class builds transformers' own for any other model."""
    from transformers import pipelines

    task = pipelines.PIPELINE_REGISTRY.supported_tasks.get("text-generation")
    if task is None:
        return
    task["impl"] = ADAPTERS["text-generation-pipeline"].replace(":", ".")
    if BiGLMForTextGeneration not in task["pt"]:
        task["pt"] = (*task["pt"], BiGLMForTextGeneration)


_register_text_generation_pipeline()

__all__ = ["ADAPTERS", "adapter", "BiGLMConfig", "BiGLMForConditionalGeneration", "BiGLMModel", "BiGLMForMaskedLM", "BiGLMForQuestionAnswering", "PrefixCache", "__version__"]
