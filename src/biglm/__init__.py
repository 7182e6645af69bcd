"""biglm: pre-train, evaluate, fine-tune and generate with BiGLM bidirectional language models.

Importing `biglm` registers the model with transformers' Auto classes, so
``AutoModelForMaskedLM.from_pretrained(dir)`` and ``pipeline("fill-mask", ...)`` work on a saved BiGLM.
"""

from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

from .model import BiGLMConfig, BiGLMForMaskedLM, BiGLMModel, PrefixCache

__version__ = "0.1.0"

AutoConfig.register("biglm", BiGLMConfig, exist_ok=True)
AutoModel.register(BiGLMConfig, BiGLMModel, exist_ok=True)
AutoModelForMaskedLM.register(BiGLMConfig, BiGLMForMaskedLM, exist_ok=True)

__all__ = ["BiGLMConfig", "BiGLMModel", "BiGLMForMaskedLM", "PrefixCache", "__version__"]
