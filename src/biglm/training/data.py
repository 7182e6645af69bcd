"""The trainer's view of the data layer: open shard folders as a (phased) mixture, read the manifest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data.mixture import Mixture, PhasedSampler, TokenDataset
from ..data.shards import ShardError
from .config import TrainConfig
from .distributed import DistInfo


@dataclass(frozen=True)
class DataInfo:
    tokenizer_path: str | None
    fingerprint: str | None


def _missing(folder: str, hub_sources: dict[str, str]) -> FileNotFoundError:
    source = hub_sources.get(folder, "SOURCE...")
    return FileNotFoundError(
        f"training data {folder!r} not found or empty: build it with\n"
        f"  biglm data prepare {source} --tokenizer TOKENIZER_DIR --out {folder} --val_docs 1000\n"
        f"or point the recipe at prepared folders with --data DIR[,DIR...]"
    )


def read_data_info(cfg: TrainConfig) -> DataInfo:
    """Tokenizer and fingerprint recorded by `biglm data prepare` in the first data folder."""
    import json

    for folder in cfg.data:
        manifest = Path(folder) / "manifest.json"
        if manifest.is_file():
            m = json.loads(manifest.read_text())
            return DataInfo(tokenizer_path=m.get("tokenizer"), fingerprint=m.get("config", {}).get("tokenizer_fingerprint"))
        if not Path(folder).exists():
            raise _missing(folder, cfg.hub_sources)
    return DataInfo(tokenizer_path=None, fingerprint=None)


def check_data_tokenizer(cfg: TrainConfig, *, fingerprint: str, source: str, tokenizer_dir: str | Path) -> None:
    """Refuse, in one line and before any step, data folders prepared with another tokenizer than ``source``'s
    (the model that --init_from starts from): its token ids would mean other words to the model."""
    import json

    folders = [*cfg.data, *(cfg.anneal_data or {}), *(cfg.val_data or [])]
    for folder in dict.fromkeys(folders):
        manifest = Path(folder) / "manifest.json"
        if not manifest.is_file():
            continue  # a missing folder is reported where it is opened
        found = json.loads(manifest.read_text()).get("config", {}).get("tokenizer_fingerprint")
        if found != fingerprint:
            raise ValueError(f"--init_from {source}: the data in {folder} was prepared with another tokenizer "
                             f"(fingerprint {found} vs the model's {fingerprint}); prepare it with the model's: "
                             f"biglm data prepare SOURCE --tokenizer {tokenizer_dir} --out DIR")


def _datasets(folders: dict[str, float], *, split: str, vocab_size: int, fingerprint: str | None,
              hub_sources: dict[str, str]) -> dict[str, tuple[TokenDataset, float]]:
    out = {}
    for folder, weight in folders.items():
        if not Path(folder).exists():
            raise _missing(folder, hub_sources)
        try:
            ds = TokenDataset(folder, split=split, expected_vocab_size=vocab_size, expected_fingerprint=fingerprint)
        except ShardError as e:
            if split == "val" and "no 'val' shards" in str(e):
                raise FileNotFoundError(str(e)) from e
            raise
        if ds.n_tokens == 0:
            raise _missing(folder, hub_sources)
        out[folder] = (ds, weight)
    return out


def open_train_sampler(cfg: TrainConfig, *, info: DistInfo, vocab_size: int, fingerprint: str | None) -> PhasedSampler:
    """The training windows: `data` from step 0 and, with WSD annealing, `anneal_data` from its first step."""
    kw = dict(split="train", vocab_size=vocab_size, fingerprint=fingerprint, hub_sources=cfg.hub_sources)
    phases = [(0, Mixture(_datasets(cfg.data, **kw)))]
    if cfg.anneal_data and cfg.anneal_steps > 0:
        phases.append((cfg.steps - cfg.anneal_steps, Mixture(_datasets(cfg.anneal_data, **kw))))
    return PhasedSampler(phases, window=cfg.seq_len, seed=cfg.seed, rank=info.rank, world_size=info.world_size)


def validation_windows(cfg: TrainConfig, *, info: DistInfo, vocab_size: int, fingerprint: str | None
                       ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """This rank's share of the fixed held-out windows, as ``(global index, windows)`` micro-batches,
    and the number of windows over all ranks.

    ``cfg.eval_windows`` windows in all (split evenly over the validation sources, the first windows of
    each val split), numbered globally; rank r takes every world_size-th. The set of windows, and with
    masks drawn by global index (`Trainer.val_batches`) the loss, do not depend on the micro-batch size
    or the number of ranks.
    """
    folders = {f: 1.0 for f in (cfg.val_data or list(cfg.data))}
    per_source = max(1, cfg.eval_windows // len(folders))
    windows: list[np.ndarray] = []
    for ds, _ in _datasets(folders, split="val", vocab_size=vocab_size, fingerprint=fingerprint,
                           hub_sources=cfg.hub_sources).values():
        n = min(per_source, ds.n_tokens // cfg.seq_len)
        if n == 0:
            raise ValueError(f"the validation split of {ds.name} has {ds.n_tokens} tokens, fewer than one window of "
                             f"{cfg.seq_len}: prepare more --val_docs or lower --seq_len")
        windows += [ds.read(k * cfg.seq_len, cfg.seq_len) for k in range(n)]
    mine = list(range(info.rank, len(windows), info.world_size))
    batches = []
    for b in range(0, len(mine), cfg.micro_batch):
        index = mine[b:b + cfg.micro_batch]
        batches.append((torch.tensor(index), torch.from_numpy(np.stack([windows[k] for k in index]))))
    return batches, len(windows)


def unigram_log_probs(cfg: TrainConfig, *, vocab_size: int, fingerprint: str | None,
                      max_tokens: int = 50_000_000) -> torch.Tensor:
    """(V,) log-probabilities of the training unigram distribution (add-one smoothed): a model that ignores
    context (the first ``max_tokens`` tokens of each source counted)."""
    counts = np.ones(vocab_size, dtype=np.float64)
    for ds, _ in _datasets(cfg.data, split="train", vocab_size=vocab_size, fingerprint=fingerprint,
                           hub_sources=cfg.hub_sources).values():
        n = min(ds.n_tokens, max_tokens)
        counts += np.bincount(ds.read(0, n), minlength=vocab_size)[:vocab_size]
    return torch.from_numpy(np.log(counts / counts.sum()))


def unigram_loss(cfg: TrainConfig, *, vocab_size: int, fingerprint: str | None, targets: list,
                 max_tokens: int = 50_000_000, logp: torch.Tensor | None = None) -> float:
    """Cross-entropy of the validation masked tokens (``targets``: one label tensor per batch, -100 =
    unmasked) under the training unigram distribution (`unigram_log_probs`, or ``logp`` when given): the loss
    of a model that ignores context, the bar a trained model must clear."""
    if logp is None:
        logp = unigram_log_probs(cfg, vocab_size=vocab_size, fingerprint=fingerprint, max_tokens=max_tokens)
    total, n = 0.0, 0
    for labels in targets:
        masked = labels[labels != -100].cpu()
        total += float(-logp[masked].sum())
        n += masked.numel()
    return total / max(n, 1)
