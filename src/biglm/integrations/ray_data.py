"""`biglm generate --input --output --replicas N` on Ray Data: the batches of a batch-generation job answered by an
actor pool of N model holders, as a `biglm.generation.batch.Backend`.

Why this shape: reading and checking the input, the lock, resuming and writing stay on the driver
(`generate_file`), so the output file is the local one: the same rows in the same plan order, written and flushed
batch by batch, resumable after a kill. Only the answering moves: each planned batch is one item of a Ray dataset
(its prepared rows, pickled), ``map_batches`` hands one item at a time to one of N actors, each holding a model and a
`BatchAnswerer` (the object `local_backend` uses), and the driver reads the answers back in plan order
(``preserve_order``) as they finish. A batch is answered by the same code on the same rows as locally, so the rows
are equal (tested row by row).

The actors load the model from the path given to the command: on a multi-node cluster it must be readable at the
same path on every node (a shared file system), and biglm installed there.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..generation.batch import Backend, BatchAnswerer, BatchRow
from .ray_cluster import limit_threads, replica_device


class _ModelHolder:
    """One actor of the pool: a model, its tokenizer and a `BatchAnswerer`; one planned batch per call."""

    def __init__(self, checkpoint: str, dtype: str | None, cpus: int, gpus: float, compile: bool = False) -> None:
        from ..checkpoint import load_model
        from ..generation.cli import _DTYPES

        limit_threads(cpus)
        model, tokenizer = load_model(checkpoint, device=replica_device(gpus),
                                      dtype=_DTYPES.get(dtype) if dtype else None, pack=True, compile=compile)
        self.model, self.tokenizer, self.answerer = model, tokenizer, None

    def __call__(self, item: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        answers = []
        for blob, budget in zip(item["rows"], item["budget"]):
            rows: list[BatchRow] = pickle.loads(blob)
            if self.answerer is None or self.answerer.engine.max_batch_rows != int(budget):
                self.answerer = BatchAnswerer(self.model, self.tokenizer, max_batch_rows=int(budget))
            answers.append(json.dumps(self.answerer(rows), ensure_ascii=False))
        return {"batch": item["batch"], "answers": np.array(answers, dtype=object)}


def ray_data_backend(checkpoint: str, *, replicas: int, cpus: int = 1, gpus: float = 0.0,
                     dtype: str | None = None, compile: bool = False) -> Backend:
    """A `Backend` answering batches on the connected Ray instance with ``replicas`` model holders (each ``cpus``
    CPUs and torch threads, ``gpus`` GPUs; a model on cuda when ``gpus`` > 0; ``compile``: `load_model`'s)."""

    def run(batches: Sequence[Sequence[BatchRow]]) -> Iterator[list[dict[str, Any]]]:
        import ray.data

        if not batches:
            return
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # the driver writes in plan order
        context.enable_progress_bars = False  # (generate_file shows its own)
        # the engine's row budget as `generate_file` gives `local_backend`: every row of a batch admitted at once
        budget = max(len(b) * max(r.config.length_beam for r in b) for b in batches)
        items = [{"batch": i, "rows": pickle.dumps(list(b)), "budget": budget} for i, b in enumerate(batches)]
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        answered = ds.map_batches(_ModelHolder, batch_size=1, batch_format="numpy",
                                  compute=ray.data.ActorPoolStrategy(size=replicas),
                                  num_cpus=cpus, num_gpus=gpus,
                                  fn_constructor_kwargs=dict(checkpoint=checkpoint, dtype=dtype, cpus=cpus, gpus=gpus,
                                                             compile=compile))
        expected = 0
        for row in answered.iter_rows():
            if int(row["batch"]) != expected:
                raise RuntimeError(f"Ray Data returned batch {int(row['batch'])} where batch {expected} was due")
            expected += 1
            yield json.loads(row["answers"])

    return run
