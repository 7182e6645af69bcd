"""The single-device BiGLM network: config, attention backends, modeling classes."""

from .attention import BACKENDS, AttentionMask
from .config import PRESETS, BiGLMConfig, count_parameters, resolve_attn_backend
from .modeling import (
    BiGLMForMaskedLM,
    BiGLMModel,
    BiGLMPreTrainedModel,
    PrefixCache,
)
from .qa import BiGLMForQuestionAnswering
from .seq2seq import BiGLMForConditionalGeneration

__all__ = [
    "BACKENDS", "AttentionMask", "PRESETS", "BiGLMConfig", "count_parameters",
    "BiGLMForConditionalGeneration", "BiGLMForMaskedLM", "BiGLMForQuestionAnswering", "BiGLMModel",
    "BiGLMPreTrainedModel", "PrefixCache", "resolve_attn_backend",
]
