"""The data room: tokenizers, text sources, token shards and the mixtures pre-training reads, plus task tables.

It sits below training (the trainer samples windows from its mixtures), fine-tuning and scoring (which read task
and evaluation tables through `biglm.data.tables`) and checkpoint loading (`biglm.data.tokenizer`); of biglm it
imports only `biglm.config`. `biglm tokenizer` and `biglm data` are its commands.

Pipeline: ``train_tokenizer`` (or ``load_tokenizer``) → ``prepare`` text ``sources`` into
headered token shards (``write_shard`` / ``ShardReader``) → ``TokenDataset`` per prepared
folder → ``Mixture`` of datasets with weights → ``WindowSampler`` (or ``PhasedSampler`` for
an annealing mixture) yields packed ``[B, window]`` batches to the trainer.

Names are imported lazily (PEP 562), so importing one submodule (say ``biglm.data.shards``)
does not pay for the ``transformers``/``datasets`` imports of the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # tokenizer
    "train_tokenizer": "tokenizer", "load_tokenizer": "tokenizer", "save_tokenizer": "tokenizer",
    "tokenizer_vocab_size": "tokenizer", "tokenizer_fingerprint": "tokenizer", "document_end_id": "tokenizer",
    "SPECIAL_TOKENS": "tokenizer", "TokenizerError": "tokenizer", "check_tokenizer_source": "tokenizer",
    # sources
    "iter_documents": "sources", "iter_sources": "sources", "parse_hub_spec": "sources", "SourceError": "sources",
    "builtin_corpus": "builtin",
    # shards
    "write_shard": "shards", "ShardReader": "shards", "ShardError": "shards", "dtype_for_vocab": "shards",
    # prepare
    "prepare": "prepare", "read_manifest": "prepare", "PrepareError": "prepare",
    # mixture
    "TokenDataset": "mixture", "Mixture": "mixture", "WindowSampler": "mixture", "PhasedSampler": "mixture",
    "iter_windows": "mixture",
}

__all__ = sorted(_EXPORTS)


# `prepare` is both a submodule and a function: bind the function now, or the first import of the
# submodule (e.g. by a tokenising worker or a test) would leave the module object under that name.
from biglm.data.prepare import PrepareError, prepare, read_manifest  # noqa: E402

def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"biglm.data.{_EXPORTS[name]}"), name)
        globals()[name] = value  # cache: the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'biglm.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from biglm.data.builtin import builtin_corpus
    from biglm.data.mixture import Mixture, PhasedSampler, TokenDataset, WindowSampler, iter_windows
    from biglm.data.prepare import PrepareError, prepare, read_manifest
    from biglm.data.shards import ShardError, ShardReader, dtype_for_vocab, write_shard
    from biglm.data.sources import SourceError, iter_documents, iter_sources, parse_hub_spec
    from biglm.data.tokenizer import (
        SPECIAL_TOKENS,
        TokenizerError,
        check_tokenizer_source,
        document_end_id,
        load_tokenizer,
        save_tokenizer,
        tokenizer_fingerprint,
        tokenizer_vocab_size,
        train_tokenizer,
    )
