"""`BiGLMForConditionalGeneration`: a BiGLM masked LM plus a CMLM length head (Mask-Predict, Ghazvininejad et al. 2019).

Seq2seq with one encoder: the source is the prefix (never masked), the target the suffix, written by
Mask-Predict. The decoder needs the target length before it starts; CMLM predicts it from the source.
Under the BiGLM mask the prefix never sees the suffix, so the mean of the prefix's final hidden states
depends on the source alone, and a linear layer over it (``length_head``) gives logits over lengths
0..``config.max_target_length``. Training adds ``length_loss_weight`` × its cross-entropy (fairseq's 0.1)
to the token loss (`biglm.finetune.tasks.seq2seq`).

Notable features
- Everything of `BiGLMForMaskedLM` is inherited (MLM head, ``encode_prefix``, the exact prefix cache,
  sparse logits), so `biglm.generation` decodes with it unchanged; ``predict_lengths`` adds the
  top-``beam`` lengths (>= 1) per prompt for the length beam.
- ``predict_lengths`` encodes the prompt once and keeps that encoding's keys/values for the
  ``encode_prefix`` call that follows on the *same* prompt tensor (what the decoding loop does next),
  so the length head costs no second pass over the prompt. The kept cache is exactly what
  ``encode_prefix`` would compute (same call), and it is used once.
- Saved with ``architectures = ["BiGLMForConditionalGeneration"]`` and ``max_target_length`` in its
  config; parameter names are the masked LM's plus ``length_head.*``, so a masked-LM directory loads
  too (the length head then starts random and transformers says so). ``import biglm`` registers it
  with ``AutoModelForSeq2SeqLM``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.utils import ModelOutput

from .config import BiGLMConfig
from .modeling import BiGLMForMaskedLM, BiGLMModel, BiGLMPreTrainedModel, PrefixCache

__all__ = ["BiGLMForConditionalGeneration", "Seq2SeqLMOutput", "length_loss", "mean_pool"]

DEFAULT_MAX_TARGET_LENGTH = 64


def mean_pool(hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, L, h) hidden states averaged over the positions where ``valid`` (B, L) is true -> (B, h), in fp32."""
    w = valid.to(torch.float32).unsqueeze(-1)
    return (hidden.float() * w).sum(1) / w.sum(1).clamp(min=1.0)


def length_loss(length_logits: torch.Tensor, lengths: torch.Tensor, *, reduction: str = "sum") -> torch.Tensor:
    """Cross-entropy of the length head against the true target lengths (B,), in fp32 (summed by default)."""
    return F.cross_entropy(length_logits.float(), lengths, reduction=reduction)


@dataclass
class Seq2SeqLMOutput(ModelOutput):
    """Token logits (at the selected positions, as `BiGLMForMaskedLM`) and length logits (B, max_target_length+1)."""

    logits: torch.Tensor | None = None
    length_logits: torch.Tensor | None = None


class BiGLMForConditionalGeneration(BiGLMForMaskedLM):
    """BiGLM masked LM with a CMLM length head over the mean-pooled prefix states."""

    def __init__(self, config: BiGLMConfig) -> None:
        BiGLMPreTrainedModel.__init__(self, config)  # the parent's __init__ would run post_init before the head exists
        if getattr(config, "max_target_length", None) is None:
            config.max_target_length = DEFAULT_MAX_TARGET_LENGTH
        if int(config.max_target_length) < 1:
            raise ValueError(f"max_target_length={config.max_target_length} must be >= 1")
        self.model = BiGLMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.length_head = nn.Linear(config.hidden_size, int(config.max_target_length) + 1, bias=False)
        self._kept: tuple[torch.Tensor, PrefixCache] | None = None
        self.post_init()

    @classmethod
    def from_masked_lm(cls, mlm: BiGLMForMaskedLM, *, max_target_length: int) -> "BiGLMForConditionalGeneration":
        """A seq2seq model whose encoder and MLM head are copies of ``mlm``'s; only the length head is new."""
        if not isinstance(mlm, BiGLMForMaskedLM):
            raise TypeError(f"from_masked_lm needs a BiGLMForMaskedLM, got {type(mlm).__name__}")
        param = next(mlm.parameters())
        config = copy.deepcopy(mlm.config)
        config.architectures = [cls.__name__]
        config.max_target_length = int(max_target_length)
        model = cls(config)
        model.model.load_state_dict(mlm.model.state_dict(), strict=True)
        model.lm_head.load_state_dict(mlm.lm_head.state_dict())  # the same tensor as the embedding when tied
        model.model.validate_inputs = mlm.model.validate_inputs
        return model.to(device=param.device, dtype=param.dtype)

    def to_masked_lm(self) -> BiGLMForMaskedLM:
        """The masked LM alone (encoder and MLM head shared with this model, no length head): for a use that
        must not decode with the head (instruction tuning with EOS padding started from a seq2seq model)."""
        config = copy.deepcopy(self.config)
        config.architectures = [BiGLMForMaskedLM.__name__]
        del config.max_target_length
        param = next(self.parameters())
        mlm = BiGLMForMaskedLM(config).to(device=param.device, dtype=param.dtype)
        mlm.model, mlm.lm_head = self.model, self.lm_head
        return mlm

    # ------------------------------------------------------------------ length head
    def length_logits(self, hidden: torch.Tensor, prefix_valid: torch.Tensor) -> torch.Tensor:
        """Length logits (B, max_target_length+1) from final hidden states (B, L, h) and the prefix positions."""
        pooled = mean_pool(hidden, prefix_valid)
        return self.length_head(pooled.to(self.length_head.weight.dtype)).float()

    @torch.no_grad()
    def predict_lengths(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None, *,
                        beam: int) -> torch.LongTensor:
        """The ``beam`` most likely target lengths (>= 1) of each prompt, most likely first: (B, beam).

        ``prompt_ids`` (B, P) are left-padded as the decoding loop pads them; ``prompt_mask`` marks real tokens.
        """
        if beam < 1 or beam > int(self.config.max_target_length):
            raise ValueError(f"beam={beam} must lie in [1, max_target_length={self.config.max_target_length}]")
        valid = torch.ones_like(prompt_ids, dtype=torch.bool) if prompt_mask is None else prompt_mask.bool()
        out = self.model(prompt_ids, attention_mask=prompt_mask, return_cache=True)
        self._kept = (prompt_ids, out["cache"])  # the decoding loop encodes this same prompt next
        logits = self.length_logits(out.last_hidden_state, valid)
        logits[:, 0] = float("-inf")  # an empty answer is never a candidate
        return logits.topk(beam, dim=-1).indices

    def encode_prefix(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                      past: PrefixCache | None = None, position_ids: torch.Tensor | None = None) -> PrefixCache:
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] is input_ids and past is None and position_ids is None:
            return kept[1]  # computed by predict_lengths on this very tensor: the same call, done once
        return super().encode_prefix(input_ids, attention_mask, past=past, position_ids=position_ids)

    # ------------------------------------------------------------------ training forward
    def forward(self, input_ids: torch.Tensor, prefix_len: torch.Tensor | int | None = None, *args,
                return_length_logits: bool = False, **kwargs):
        """As `BiGLMForMaskedLM.forward`; with ``return_length_logits`` (needs ``prefix_len``, no cache) the output
        is a `Seq2SeqLMOutput` that also holds the length logits of each row's prefix."""
        if not return_length_logits:
            return super().forward(input_ids, prefix_len, *args, **kwargs)
        if args:
            raise TypeError("return_length_logits=True takes the other arguments by name")
        attention_mask, prefix_cache = kwargs.pop("attention_mask", None), kwargs.pop("prefix_cache", None)
        doc_ids, position_ids = kwargs.pop("doc_ids", None), kwargs.pop("position_ids", None)
        logits_positions = kwargs.pop("logits_positions", None)
        if kwargs.pop("labels", None) is not None or kwargs.pop("num_items_in_batch", None) is not None:
            raise ValueError("return_length_logits computes no loss: the task's loss takes the logits (no labels)")
        if prefix_len is None or prefix_cache is not None:
            raise ValueError("return_length_logits needs prefix_len (the source length per row) and no prefix_cache")
        B, L = input_ids.shape
        if isinstance(prefix_len, int):
            prefix_len = torch.full((B,), prefix_len, dtype=torch.long, device=input_ids.device)
        hidden = self.model(input_ids, prefix_len=prefix_len, attention_mask=attention_mask, doc_ids=doc_ids,
                            position_ids=position_ids, **kwargs).last_hidden_state
        prefix_valid = torch.arange(L, device=input_ids.device)[None, :] < prefix_len[:, None]
        if attention_mask is not None:
            prefix_valid = prefix_valid & attention_mask.bool()
        length = self.length_logits(hidden, prefix_valid)
        if self.config.shift_logits:  # the token logits as the masked-LM forward computes them (the length head pools)
            hidden = self._shifted(hidden, None)
        flat = hidden.reshape(-1, hidden.shape[-1])
        if logits_positions is not None:
            flat = flat.index_select(0, logits_positions) if logits_positions.dtype != torch.bool \
                else flat[logits_positions.reshape(-1)]
        return Seq2SeqLMOutput(logits=self.lm_head(flat), length_logits=length)
