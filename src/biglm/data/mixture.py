"""The token stream the trainer consumes: packed windows drawn from a weighted mixture of shard sets.

Notable features
- Packing: each source's shards read as one stream ``doc </s> doc </s> ...``; it is cut into
  non-overlapping ``window``-token chunks (the tail shorter than a window is dropped: under
  one window per source), so documents are packed back to back across boundaries and no
  token is padding.
- Determinism keyed on the *global window index* g (0, 1, 2, ... over all ranks): the
  source of window g is a weighted draw from ``rng(seed, block of g)``; the k-th window
  taken from source s is chunk ``perm(seed, s, epoch)[k mod n_chunks]`` with
  ``epoch = k // n_chunks``, so an exhausted source wraps round with a fresh shuffle.
- Sources are identified by their content (`TokenDataset.content_id`, from the shards' checksums),
  never by their path: the same data gives the same windows wherever it lies, and a run directory
  (with its data) moved elsewhere resumes exactly.
- Ranks: one ``next_batch(B)`` call advances g by ``B * world_size``; rank r takes windows
  ``g0 + r, g0 + r + world_size, ...``. Every rank makes the same draws, so the ranks never
  see the same chunk within an epoch, and the state (g and per-source counters) is the
  same on every rank: save it from rank 0 only.
- Resume: ``state_dict()`` stores counters, never data; a sampler loaded from it draws
  exactly the windows the original would have drawn next.
- Annealing with another mixture: ``PhasedSampler`` switches mixtures at given optimizer
  steps; counters are kept per source, so a source used in both phases continues its
  permutation instead of repeating the windows it already served.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biglm.data.shards import ShardError, ShardReader

log = logging.getLogger(__name__)

_BLOCK = 4096  # source draws are made in blocks of this many global windows
_SALT_SOURCE, _SALT_PERM = 0x50C, 0x9E4


class TokenDataset:
    """The shards of one split of one prepared folder (or an explicit list), as one token stream.

    ``shards`` is a folder written by ``biglm data prepare`` (its ``manifest.json`` gives the
    shard order; without one, ``{split}-*.bin`` sorted) or a list of shard paths. All shards
    must share vocabulary size, tokenizer fingerprint and eos id; ``expected_*`` make a
    mismatch with the model's tokenizer an error (``ShardError``) instead of silent garbage.
    """

    def __init__(
        self,
        shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        split: str = "train",
        expected_vocab_size: int | None = None,
        expected_fingerprint: str | None = None,
        verify: bool = True,
    ) -> None:
        paths = _shard_paths(shards, split=split)
        self.name = str(shards) if isinstance(shards, (str, os.PathLike)) else f"{len(paths)} shards"
        self.readers = [ShardReader(p, expected_vocab_size=expected_vocab_size,
                                    expected_fingerprint=expected_fingerprint, verify=verify) for p in paths]
        first = self.readers[0]
        for r in self.readers[1:]:
            if (r.vocab_size, r.fingerprint, r.eos_id) != (first.vocab_size, first.fingerprint, first.eos_id):
                raise ShardError(f"{r.path}: built with a different tokenizer than {first.path} (fingerprint "
                                 f"{r.fingerprint} vs {first.fingerprint}); re-run `biglm data prepare` so that "
                                 "all shards of a dataset share one tokenizer")
        self.vocab_size, self.fingerprint, self.eos_id = first.vocab_size, first.fingerprint, first.eos_id
        sizes = np.array([r.n_tokens for r in self.readers], dtype=np.int64)
        self._shard_starts = np.concatenate([[0], np.cumsum(sizes)])  # global offset of each shard
        self.n_tokens = int(self._shard_starts[-1])
        self.n_docs = sum(r.n_docs for r in self.readers)
        # global start of every document, for per-token document ids
        self._doc_starts = np.concatenate([r.doc_offsets + s for r, s in zip(self.readers, self._shard_starts)])

    @property
    def content_id(self) -> str:
        """A key of the dataset's content (its shards' checksums and sizes), the same wherever it lies."""
        crc = 0
        for r in self.readers:
            crc = zlib.crc32(f"{r.checksum}:{r.n_tokens};".encode(), crc)
        return f"{crc:08x}"

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` of the stream as int64 (may span shards)."""
        if start < 0 or start + length > self.n_tokens:
            raise IndexError(f"range [{start}, {start + length}) outside the {self.n_tokens} tokens of {self.name}")
        out = np.empty(length, dtype=np.int64)
        pos = start
        i = int(np.searchsorted(self._shard_starts, start, side="right")) - 1
        while pos < start + length:
            s0 = int(self._shard_starts[i])
            take = min(start + length, int(self._shard_starts[i + 1])) - pos
            out[pos - start:pos - start + take] = self.readers[i].tokens[pos - s0:pos - s0 + take]
            pos += take
            i += 1
        return out

    def doc_ids(self, start: int, length: int) -> np.ndarray:
        """Per-token document index for ``[start, start + length)``, counted from 0 at ``start``."""
        d = np.searchsorted(self._doc_starts, np.arange(start, start + length), side="right") - 1
        return (d - d[0]).astype(np.int64)

    def __repr__(self) -> str:
        return f"TokenDataset({self.name!r}, n_tokens={self.n_tokens}, shards={len(self.readers)})"


def _shard_paths(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, split: str) -> list[Path]:
    if isinstance(shards, (str, os.PathLike)):
        folder = Path(shards)
        if folder.is_file():
            return [folder]
        if not folder.is_dir():
            raise ShardError(f"{folder}: no such shard folder; run `biglm data prepare SOURCE... --out {folder}`")
        manifest = folder / "manifest.json"
        if manifest.is_file():
            with open(manifest, encoding="utf-8") as f:
                m = json.load(f)
            if not m.get("complete", False):
                log.warning("%s: preparation is not complete; using the %d shards written so far",
                            folder, len(m.get("shards", [])))
            paths = [folder / s["file"] for s in m.get("shards", []) if s["split"] == split]
        else:
            paths = sorted(folder.glob(f"{split}-*.bin"))
        if not paths:
            raise ShardError(f"{folder}: no {split!r} shards; run `biglm data prepare` (with --val_docs N "
                             "for a val split) into this folder")
        return paths
    paths = [Path(p) for p in shards]
    if not paths:
        raise ShardError("empty list of shard paths; pass at least one shard")
    return paths


class Mixture:
    """Named datasets with sampling weights: ``Mixture({"fineweb": (ds, 0.7), "cosmo": (ds2, 0.3)})``.

    Weights need not sum to 1; they are normalised. Sources are ordered by content (then name), so
    the draws depend neither on the order of the dict nor on where the data lies.
    """

    def __init__(self, sources: Mapping[str, tuple[TokenDataset, float]]) -> None:
        if not sources:
            raise ValueError("a mixture needs at least one source")
        self.names = sorted(sources, key=lambda n: (sources[n][0].content_id, n))
        self.datasets = {n: sources[n][0] for n in self.names}
        self.keys = {n: self.datasets[n].content_id for n in self.names}  # name -> content key
        weights = np.array([float(sources[n][1]) for n in self.names])
        if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
            raise ValueError(f"mixture weights must be positive and finite, got {dict(zip(self.names, weights))}")
        self.weights = weights / weights.sum()
        ref = self.datasets[self.names[0]]
        for n in self.names[1:]:
            d = self.datasets[n]
            if (d.vocab_size, d.fingerprint) != (ref.vocab_size, ref.fingerprint):
                raise ShardError(f"mixture source {n!r} ({d.name}) was built with a different tokenizer than "
                                 f"{self.names[0]!r} ({ref.name}); re-prepare it with the same tokenizer")
        self.vocab_size, self.fingerprint = ref.vocab_size, ref.fingerprint

    @classmethod
    def single(cls, dataset: TokenDataset, name: str = "data") -> Mixture:
        """A mixture of one dataset."""
        return cls({name: (dataset, 1.0)})

    def describe(self) -> dict[str, float]:
        """Name -> normalised weight."""
        return {n: float(w) for n, w in zip(self.names, self.weights)}


class WindowSampler:
    """Seeded, rank-disjoint, resumable packed windows from a ``Mixture`` (see the module docstring)."""

    def __init__(self, mixture: Mixture, *, window: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if window < 1:
            raise ValueError(f"window must be positive, got {window}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.window, self.seed, self.rank, self.world_size = window, seed, rank, world_size
        self.g = 0  # next global window index
        self.counts: dict[str, int] = {}  # windows served so far per source (content key), all ranks together
        self._perm_cache: dict[tuple[str, int], np.ndarray] = {}
        self._block: tuple[int, np.ndarray] | None = None
        self.last_chunks: list[tuple[str, int]] = []  # (source, chunk) of each window of the last batch
        self.set_mixture(mixture)

    def set_mixture(self, mixture: Mixture) -> None:
        """Draw from ``mixture`` from now on, keeping the position and the per-source counters."""
        n_chunks = {mixture.keys[n]: mixture.datasets[n].n_tokens // self.window for n in mixture.names}
        short = {n: mixture.datasets[n].n_tokens for n in mixture.names if n_chunks[mixture.keys[n]] == 0}
        if short:
            raise ValueError(f"window of {self.window} tokens is longer than source(s) "
                             + ", ".join(f"{n!r} ({k} tokens)" for n, k in short.items())
                             + "; use a shorter window or prepare more data")
        self.mixture = mixture
        self.n_chunks = n_chunks
        self._cum = np.cumsum(mixture.weights)
        self._cum[-1] = 1.0  # guard against rounding: every u < 1 maps to a source
        for n in mixture.names:
            self.counts.setdefault(mixture.keys[n], 0)

    # -- deterministic building blocks ------------------------------------------------------
    def _sources(self, g0: int, n: int) -> np.ndarray:
        """Index into ``mixture.names`` of the source of global windows ``g0 .. g0+n-1``."""
        u = np.empty(n)
        for j in range(n):  # blocks are cached: this loop touches a new block every 4096 windows
            b, off = divmod(g0 + j, _BLOCK)
            if self._block is None or self._block[0] != b:
                self._block = (b, np.random.default_rng([self.seed, _SALT_SOURCE, b]).random(_BLOCK))
            u[j] = self._block[1][off]
        return np.searchsorted(self._cum, u, side="right")

    def _perm(self, source: str, epoch: int) -> np.ndarray:
        key = (source, epoch)
        if key not in self._perm_cache:
            if len(self._perm_cache) > 2 * len(self.counts):  # keep memory flat over many epochs
                self._perm_cache.clear()
            rng = np.random.default_rng([self.seed, _SALT_PERM, int(source, 16), epoch])
            self._perm_cache[key] = rng.permutation(self.n_chunks[source])
        return self._perm_cache[key]

    # -- the trainer's interface --------------------------------------------------------------
    def next_batch(self, batch_size: int, *, return_doc_ids: bool = False
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """This rank's next ``batch_size`` windows as a LongTensor ``[B, window]``.

        With ``return_doc_ids`` also a LongTensor ``[B, window]`` of per-token document ids
        (0 for the document the window starts in, +1 at every document start), for
        attention masks that keep packed documents apart.
        """
        total = batch_size * self.world_size
        src = self._sources(self.g, total)
        tokens = np.empty((batch_size, self.window), dtype=np.int64)
        docs = np.empty((batch_size, self.window), dtype=np.int64) if return_doc_ids else None
        chunks: list[tuple[str, int]] = []
        for j in range(total):
            name = self.mixture.names[src[j]]
            key = self.mixture.keys[name]
            k = self.counts[key]
            self.counts[key] = k + 1
            if j % self.world_size != self.rank:
                continue  # another rank's window: counted, not read
            epoch, i = divmod(k, self.n_chunks[key])
            chunk = int(self._perm(key, epoch)[i])
            ds = self.mixture.datasets[name]
            row = j // self.world_size
            tokens[row] = ds.read(chunk * self.window, self.window)
            if docs is not None:
                docs[row] = ds.doc_ids(chunk * self.window, self.window)
            chunks.append((name, chunk))
        self.g += total
        self.last_chunks = chunks
        out = torch.from_numpy(tokens)
        return (out, torch.from_numpy(docs)) if docs is not None else out

    def epochs(self) -> dict[str, float]:
        """Passes made over each source so far (all ranks together), e.g. for logging."""
        return {n: self.counts.get(self.mixture.keys[n], 0) / self.n_chunks[self.mixture.keys[n]]
                for n in self.mixture.names}

    def state_dict(self) -> dict[str, Any]:
        """Counters that fix every future window (identical on all ranks)."""
        return {"version": 2, "g": self.g, "counts": dict(self.counts), "seed": self.seed, "window": self.window,
                "n_chunks": dict(self.n_chunks), "weights": self.mixture.describe()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; the seed, window and the sizes of the sources must match."""
        if state.get("version") != 2:
            raise ValueError(f"unknown sampler state version {state.get('version')!r}")
        if state["seed"] != self.seed or state["window"] != self.window:
            raise ValueError(f"sampler state is for seed={state['seed']} window={state['window']}, this sampler "
                             f"has seed={self.seed} window={self.window}; resuming would change the data order")
        for n, c in state["n_chunks"].items():
            if n in self.n_chunks and self.n_chunks[n] != c:
                raise ValueError(f"source {n} has {self.n_chunks[n]} windows now but {c} when the state was "
                                 "saved: the data changed, so the run cannot resume its data order")
        if state["g"] % self.world_size:
            log.warning("resuming at global window %d, not a multiple of world_size %d", state["g"], self.world_size)
        self.g = int(state["g"])
        self.counts = {**{self.mixture.keys[n]: 0 for n in self.mixture.names},
                       **{n: int(c) for n, c in state["counts"].items()}}


class PhasedSampler:
    """A ``WindowSampler`` whose mixture changes at given optimizer steps (e.g. WSD annealing).

    ``phases`` is ``[(0, pretrain_mix), (anneal_start, anneal_mix), ...]`` with increasing
    start steps, the first 0. The trainer passes the optimizer step it is drawing for to
    every ``next_batch`` (all micro-batches of a step pass the same step), so the switch
    happens at the same window on every rank and after a resume.
    """

    def __init__(self, phases: Sequence[tuple[int, Mixture]], *, window: int, seed: int, rank: int = 0,
                 world_size: int = 1) -> None:
        starts = [s for s, _ in phases]
        if not phases or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"phases must start at step 0 with strictly increasing steps, got {starts}")
        self.phases = list(phases)
        self.phase = 0
        self.sampler = WindowSampler(phases[0][1], window=window, seed=seed, rank=rank, world_size=world_size)

    def _phase_at(self, step: int) -> int:
        return max(i for i, (s, _) in enumerate(self.phases) if s <= step)

    def next_batch(self, batch_size: int, *, step: int, return_doc_ids: bool = False
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Like ``WindowSampler.next_batch``, drawing from the mixture of the phase holding ``step``."""
        phase = self._phase_at(step)
        if phase != self.phase:
            self.sampler.set_mixture(self.phases[phase][1])
            self.phase = phase
        return self.sampler.next_batch(batch_size, return_doc_ids=return_doc_ids)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's counters plus the current phase."""
        return {"phase": self.phase, "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (saved by ``state_dict``)."""
        self.phase = int(state["phase"])
        self.sampler.set_mixture(self.phases[self.phase][1])
        self.sampler.load_state_dict(state["sampler"])


def iter_windows(dataset: TokenDataset, *, window: int, batch_size: int, rank: int = 0, world_size: int = 1,
                 max_windows: int | None = None) -> Iterator[torch.Tensor]:
    """Fixed evaluation batches: consecutive windows in stream order, rank r taking every world_size-th.

    The same windows every time (no shuffling), for validation loss; the last batch may be
    smaller. ``max_windows`` caps the windows over all ranks.
    """
    n = dataset.n_tokens // window
    if n == 0:
        raise ValueError(f"window of {window} tokens is longer than {dataset.name} ({dataset.n_tokens} tokens)")
    if max_windows is not None:
        n = min(n, max_windows)
    mine = list(range(rank, n, world_size))
    for b in range(0, len(mine), batch_size):
        rows = [dataset.read(k * window, window) for k in mine[b:b + batch_size]]
        yield torch.from_numpy(np.stack(rows))

