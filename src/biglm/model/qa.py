"""`BiGLMForQuestionAnswering`: the BiGLM encoder with a start/end span head (extractive QA).

The BERT practice: every token's final hidden state gives a start and an end logit; the answer is the
best span (found outside the model, `biglm.finetune.tasks.squad.postprocess_qa_predictions`). The encoder runs
with full bidirectional attention (no prefix length): question and context see each other.

Notable features
- Padding positions get the lowest finite logit, so they take no probability: a window's loss and
  logits do not depend on how far its batch was padded (BERT leaves them in the softmax).
- The head has no bias, as the rest of BiGLM: a constant added to every position's start (or end)
  logit cancels in the softmax over positions, so it could change neither the loss nor a prediction.
- `from_masked_lm` builds the model from a pre-trained `BiGLMForMaskedLM`, copying its encoder; only
  the 2×hidden head is new. Saved checkpoints use the encoder's parameter names (``model.*``), so
  ``BiGLMForQuestionAnswering.from_pretrained`` also loads a masked-LM directory (the head then
  starts random and transformers says so).
- ``token_type_ids`` (which tokenizers and pipelines pass) is accepted and ignored: BiGLM has no
  segment embeddings; question and context are told apart by the separator tokens.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.modeling_outputs import QuestionAnsweringModelOutput

from .config import BiGLMConfig
from .modeling import BiGLMForMaskedLM, BiGLMModel, BiGLMPreTrainedModel

__all__ = ["BiGLMForQuestionAnswering", "span_loss"]


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
              end_positions: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """(CE(start) + CE(end)) / 2 over a batch of windows, in fp32, as BERT's QA loss.

    Positions outside the window (e.g. a truncated answer passed as L or beyond) are clamped to L and
    ignored, as transformers' QA heads do. ``reduction="sum"`` sums the per-window losses.
    """
    length = start_logits.shape[1]
    start_positions = start_positions.clamp(0, length)
    end_positions = end_positions.clamp(0, length)
    start = F.cross_entropy(start_logits.float(), start_positions, ignore_index=length, reduction=reduction)
    end = F.cross_entropy(end_logits.float(), end_positions, ignore_index=length, reduction=reduction)
    return (start + end) / 2


class BiGLMForQuestionAnswering(BiGLMPreTrainedModel):
    """BiGLM with a start/end span head over its final hidden states (SQuAD-style extractive QA)."""

    def __init__(self, config: BiGLMConfig) -> None:
        super().__init__(config)
        self.model = BiGLMModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    @classmethod
    def from_masked_lm(cls, mlm: BiGLMForMaskedLM) -> "BiGLMForQuestionAnswering":
        """A QA model whose encoder is a copy of ``mlm``'s (same config, device and dtype); the head is new.

        The MLM head is not used (a span head replaces it). ``mlm`` is left unchanged.
        """
        if not isinstance(mlm, BiGLMForMaskedLM):
            raise TypeError(f"from_masked_lm needs a BiGLMForMaskedLM, got {type(mlm).__name__}")
        param = next(mlm.parameters())
        config = copy.deepcopy(mlm.config)
        config.architectures = [cls.__name__]
        qa = cls(config)
        qa.model.load_state_dict(mlm.model.state_dict(), strict=True)
        qa.model.validate_inputs = mlm.model.validate_inputs
        return qa.to(device=param.device, dtype=param.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        """Start/end logits (B, L) in fp32 for every token; padding positions (``attention_mask`` 0) get the
        lowest finite fp32 value. With ``start_positions``/``end_positions`` (B,), also the mean span loss.

        ``token_type_ids`` and other tokenizer/pipeline keywords are ignored.
        """
        hidden = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        logits = self.qa_outputs(hidden).float()  # (B, L, 2)
        if attention_mask is not None:
            logits = logits.masked_fill(~attention_mask.bool().unsqueeze(-1), torch.finfo(logits.dtype).min)
        start_logits, end_logits = logits.unbind(dim=-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions.reshape(-1), end_positions.reshape(-1))
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits.contiguous(),
                                            end_logits=end_logits.contiguous())
