"""Mixture sampling: determinism, rank disjointness, weights, exact resume, epochs, document ids, phases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from biglm.data.mixture import Mixture, PhasedSampler, TokenDataset, WindowSampler, iter_windows
from biglm.data.shards import ShardError, write_shard

FP = "ab" * 16
VOCAB = 5000
EOS = 2


def make_dataset(folder: Path, *, n_shards: int, docs_per_shard: int, seed: int) -> TokenDataset:
    """Random documents whose tokens never equal EOS, so separators are recognisable."""
    rng = np.random.default_rng(seed)
    for s in range(n_shards):
        docs = [rng.integers(3, VOCAB, size=rng.integers(1, 120)) for _ in range(docs_per_shard)]
        write_shard(folder / f"train-{s:05d}.bin", docs, vocab_size=VOCAB, tokenizer_fingerprint=FP, eos_id=EOS)
    return TokenDataset(folder, expected_vocab_size=VOCAB, expected_fingerprint=FP)


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory) -> Mixture:
    a = make_dataset(tmp_path_factory.mktemp("a"), n_shards=3, docs_per_shard=200, seed=1)
    b = make_dataset(tmp_path_factory.mktemp("b"), n_shards=1, docs_per_shard=100, seed=2)
    return Mixture({"a": (a, 0.8), "b": (b, 0.2)})


def draw(sampler: WindowSampler, n: int, batch: int = 4) -> list[torch.Tensor]:
    return [sampler.next_batch(batch) for _ in range(n)]


def test_windows_are_stream_chunks(mix: Mixture) -> None:
    s = WindowSampler(mix, window=64, seed=0)
    x = s.next_batch(8)
    assert x.shape == (8, 64) and x.dtype == torch.int64
    for row, (name, chunk) in zip(x, s.last_chunks):
        np.testing.assert_array_equal(row.numpy(), mix.datasets[name].read(chunk * 64, 64))


def test_deterministic_and_seed_dependent(mix: Mixture) -> None:
    one = draw(WindowSampler(mix, window=64, seed=7), 5)
    two = draw(WindowSampler(mix, window=64, seed=7), 5)
    other = draw(WindowSampler(mix, window=64, seed=8), 5)
    assert all(torch.equal(p, q) for p, q in zip(one, two))
    assert not all(torch.equal(p, q) for p, q in zip(one, other))


def test_ranks_are_disjoint_and_agree_on_state(mix: Mixture) -> None:
    r0 = WindowSampler(mix, window=64, seed=3, rank=0, world_size=2)
    r1 = WindowSampler(mix, window=64, seed=3, rank=1, world_size=2)
    seen0: list[tuple[str, int]] = []
    seen1: list[tuple[str, int]] = []
    # stay within the first epoch of the smaller source "b" so "no repeats" must hold exactly
    while r0.counts.get(mix.keys["b"], 0) + 16 < r0.n_chunks[mix.keys["b"]]:
        r0.next_batch(4)
        r1.next_batch(4)
        seen0 += r0.last_chunks
        seen1 += r1.last_chunks
    assert len(seen0) == len(seen1) > 40
    assert not set(seen0) & set(seen1)
    assert len(set(seen0)) == len(seen0) and len(set(seen1)) == len(seen1)
    assert r0.state_dict() == r1.state_dict()


def test_weights_respected(mix: Mixture) -> None:
    s = WindowSampler(mix, window=16, seed=11)
    names = []
    for _ in range(250):
        s.next_batch(16)
        names += [n for n, _ in s.last_chunks]
    frac = names.count("a") / len(names)
    # 4000 draws at p=0.8: sd 0.0063, so 0.03 is more than 4 sd
    assert abs(frac - 0.8) < 0.03


def test_resume_gives_the_same_windows(mix: Mixture) -> None:
    s = WindowSampler(mix, window=64, seed=5, rank=1, world_size=2)
    draw(s, 5)
    state = s.state_dict()
    expected = draw(s, 5)
    fresh = WindowSampler(mix, window=64, seed=5, rank=1, world_size=2)
    fresh.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(expected, draw(fresh, 5)))
    with pytest.raises(ValueError, match="seed"):
        WindowSampler(mix, window=64, seed=6).load_state_dict(state)


def test_epoch_wraps_with_a_new_shuffle(mix: Mixture) -> None:
    b = mix.datasets["b"]
    s = WindowSampler(Mixture.single(b, name="b"), window=256, seed=0)
    n = s.n_chunks[mix.keys["b"]]
    assert n == b.n_tokens // 256 >= 5
    chunks = []
    for _ in range(2 * n):
        s.next_batch(1)
        chunks += [c for _, c in s.last_chunks]
    first, second = chunks[:n], chunks[n:]
    assert sorted(first) == sorted(second) == list(range(n))  # each epoch covers every chunk once
    assert first != second  # and in a different order
    assert s.epochs() == {"b": 2.0}


def test_doc_ids_follow_separators(mix: Mixture) -> None:
    s = WindowSampler(mix, window=128, seed=1)
    x, d = s.next_batch(6, return_doc_ids=True)
    assert d.shape == x.shape
    for row, ids in zip(x, d):
        # a new document starts right after each eos (documents are packed across boundaries)
        starts = torch.zeros_like(row)
        starts[1:] = (row[:-1] == EOS).long()
        assert ids[0] == 0
        assert torch.equal(ids, torch.cumsum(starts, 0))


def test_errors_for_empty_and_short_sources(mix: Mixture, tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="no 'train' shards"):
        TokenDataset(tmp_path)
    with pytest.raises(ValueError, match="longer than source"):
        WindowSampler(mix, window=mix.datasets["b"].n_tokens + 1, seed=0)
    with pytest.raises(ShardError, match="different tokenizer"):
        TokenDataset(mix.datasets["a"].readers[0].path, expected_fingerprint="cd" * 16)
    with pytest.raises(ValueError, match="positive"):
        Mixture({"a": (mix.datasets["a"], 0.0)})


def test_phased_switch_and_resume(mix: Mixture) -> None:
    only_b = Mixture({"b": (mix.datasets["b"], 1.0)})

    def run(sampler: PhasedSampler, steps: range) -> list[tuple[str, int]]:
        out = []
        for step in steps:
            sampler.next_batch(4, step=step)
            out += sampler.sampler.last_chunks
        return out

    p = PhasedSampler([(0, mix), (3, only_b)], window=64, seed=2)
    before = run(p, range(0, 3))
    b_before = [c for n, c in before if n == "b"]
    state = p.state_dict()
    after = run(p, range(3, 6))
    assert {n for n, _ in after} == {"b"}
    # "b" continues its permutation: the annealing phase does not repeat the windows already served
    assert not set(b_before) & {c for _, c in after}
    q = PhasedSampler([(0, mix), (3, only_b)], window=64, seed=2)
    q.load_state_dict(state)
    assert run(q, range(3, 6)) == after


def test_iter_windows_split_across_ranks(mix: Mixture) -> None:
    a = mix.datasets["a"]
    r0 = torch.cat(list(iter_windows(a, window=100, batch_size=8, rank=0, world_size=2)))
    r1 = torch.cat(list(iter_windows(a, window=100, batch_size=8, rank=1, world_size=2)))
    n = a.n_tokens // 100
    assert r0.shape[0] + r1.shape[0] == n
    torch.testing.assert_close(r0[1], torch.from_numpy(a.read(200, 100)))
    torch.testing.assert_close(r1[0], torch.from_numpy(a.read(100, 100)))
