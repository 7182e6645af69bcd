"""sentence-transformers: a BiGLM encoder written as a ``SentenceTransformer`` directory.

`export_sentence_transformer` writes Transformer (BiGLM) -> Pooling(mean) -> Normalize through
sentence-transformers' own ``save``, so ``SentenceTransformer(path)`` (after ``import biglm``, which registers
BiGLM with ``AutoConfig``/``AutoModel``) and so ``mteb`` load it, and it gives the vectors of
`biglm.model.biencoder.BiGLMBiEncoder` (the same mean pooling and normalisation). The retrieval task's export
(`biglm.finetune.tasks.retrieval`) calls it through ``biglm.adapter("sentence-transformers-export")``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model import BiGLMModel

__all__ = ["export_sentence_transformer"]


def export_sentence_transformer(encoder: BiGLMModel, tokenizer: Any, out_dir: str | Path, *,
                                max_length: int) -> Path:
    """Write ``out_dir`` as a sentence-transformers model: Transformer (BiGLM) -> Pooling(mean) -> Normalize.

    The encoder and tokenizer are saved with ``save_pretrained``, loaded back through
    sentence-transformers' ``Transformer`` module (``AutoModel``, hence BiGLM's registration) and the
    pipeline saved by ``SentenceTransformer.save`` (modules.json, sentence_bert_config.json, 1_Pooling/,
    2_Normalize/). The saved config names the ``sdpa`` attention backend, which runs anywhere.
    """
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:  # pragma: no cover - part of the finetune extra
        raise ImportError("exporting a retrieval model needs sentence-transformers: pip install 'biglm[finetune]'") from e
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:  # 3.x-5.x
        from sentence_transformers.models import Normalize, Pooling, Transformer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = encoder.config.attn_backend
    encoder.config.attn_backend = "sdpa"  # flex needs torch.compile to be fast; eager is slow
    try:
        encoder.save_pretrained(out)
    finally:
        encoder.config.attn_backend = backend
    tokenizer.save_pretrained(out)
    transformer = Transformer(str(out), max_seq_length=max_length)
    modules = [transformer, Pooling(encoder.config.hidden_size, pooling_mode="mean"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu", similarity_fn_name="cosine").save(str(out))
    return out
