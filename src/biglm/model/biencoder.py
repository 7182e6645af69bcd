"""`BiGLMBiEncoder`: the BiGLM encoder read out as one vector per text (retrieval embeddings).

A text's embedding is the mean of the encoder's last hidden states over its real tokens under full
bidirectional attention (no prefix), L2-normalised, so a dot product is a cosine. The retrieval task
(`biglm.finetune.tasks.retrieval`) trains it contrastively; the sentence-transformers export lives with the
other third-party adapters (`biglm.integrations.sentence_transformers`).

Notable features
- `BiGLMBiEncoder.encode` batches by length: texts are sorted by token count, each batch is padded
  to its own longest text and the rows go back to their original order. SciFact's documents range
  from ~10 to ~1,000 words, so padding every batch to the longest text would waste most of the work.
- One forward for queries and documents (`BiGLMBiEncoder.forward` takes both, as CLIP's does), so
  DDP and FSDP see one forward per backward; each side is padded to its own length.
- `mean_pool` is the arithmetic of sentence-transformers' ``Pooling(mean)`` then ``Normalize``, so an
  exported model gives the same vectors; `BiGLMBiEncoder.from_pretrained` loads such a directory back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.utils import ModelOutput

from .modeling import BiGLMModel

__all__ = ["BiEncoderOutput", "BiGLMBiEncoder", "mean_pool", "pad_batch"]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L, h) hidden states -> (B, h) fp32 mean over real tokens, L2-normalised.

    The same arithmetic as sentence-transformers' ``Pooling(mean)`` then ``Normalize``, so the exported
    model gives the same vectors.
    """
    mask = attention_mask.unsqueeze(-1).to(torch.float32)  # (B, L, 1)
    summed = (hidden.float() * mask).sum(dim=1)
    mean = summed / mask.sum(dim=1).clamp(min=1e-9)
    return F.normalize(mean, p=2, dim=-1)


@dataclass
class BiEncoderOutput(ModelOutput):
    embeddings: torch.Tensor | None = None
    """(B, h) normalised embeddings of ``input_ids``"""
    doc_embeddings: torch.Tensor | None = None
    """(D, h) normalised embeddings of ``doc_input_ids``, when given"""


class BiGLMBiEncoder(nn.Module):
    """A `BiGLMModel` (``.model``, so `parallelize` finds its blocks) read out as one vector per text."""

    def __init__(self, encoder: BiGLMModel, tokenizer: Any = None) -> None:
        super().__init__()
        self.model = encoder
        self.tokenizer = tokenizer  # for `encode`; not a module, not in the state dict

    @property
    def config(self):
        return self.model.config

    @classmethod
    def from_pretrained(cls, path: str | Path) -> BiGLMBiEncoder:
        """Load an exported bi-encoder (or any BiGLM directory: a masked-LM's encoder is taken) and its tokenizer."""
        from transformers import AutoTokenizer

        return cls(BiGLMModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)).eval()

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) padded ids -> (B, h) fp32 normalised embeddings (full attention, padding masked out)."""
        hidden = self.model(input_ids, attention_mask=attention_mask).last_hidden_state
        return mean_pool(hidden, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                doc_input_ids: torch.Tensor | None = None, doc_attention_mask: torch.Tensor | None = None,
                ) -> BiEncoderOutput:
        """Embeddings of a batch of texts and, in the same call, of a second batch (the documents)."""
        docs = None if doc_input_ids is None else self.embed(doc_input_ids, doc_attention_mask)
        return BiEncoderOutput(embeddings=self.embed(input_ids, attention_mask), doc_embeddings=docs)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], *, batch_size: int = 32, max_length: int = 256,
               tokenizer: Any = None) -> torch.Tensor:
        """(N, h) fp32 CPU embeddings of ``texts`` in their order, batched by length.

        Each text is tokenised as sentence-transformers does (``<s> ... </s>``, cut to ``max_length``
        tokens); batches of ``batch_size`` texts of similar length are padded to their own longest.
        The model runs in eval mode (restored afterwards) on the device its weights are on.
        """
        tok = tokenizer if tokenizer is not None else self.tokenizer
        if tok is None:
            raise ValueError("no tokenizer: pass tokenizer= or build the BiGLMBiEncoder with one")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if not texts:
            return torch.empty(0, self.config.hidden_size)
        device = self.model.embed_tokens.weight.device
        ids = tok(list(texts), truncation=True, max_length=max_length)["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first: a too-large batch fails at once
        out = torch.empty(len(ids), self.config.hidden_size, dtype=torch.float32)
        was_training = self.training
        self.eval()
        try:
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                input_ids, mask = pad_batch([ids[i] for i in rows], pad_id=tok.pad_token_id)
                out[rows] = self.embed(input_ids.to(device), mask.to(device)).cpu()
        finally:
            self.train(was_training)
        return out


def pad_batch(seqs: Sequence[Sequence[int]], *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists to the longest: (ids, attention_mask), both (B, L) long."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
    return ids, mask
