"""Token shards: exact round trips, and refusal of foreign, truncated, corrupt or mismatched files."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from biglm.data.shards import HEADER_SIZE, MAGIC, ShardError, ShardReader, dtype_for_vocab, write_shard

FP = "0123456789abcdef0123456789abcdef"


def random_docs(n: int, vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=rng.integers(0, 50)) for _ in range(n)]


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "train-00000.bin"
    write_shard(path, random_docs(40, 1000), vocab_size=1000, tokenizer_fingerprint=FP, eos_id=2)
    return path


@pytest.mark.parametrize("vocab", [1000, 65536, 70000])
def test_round_trip_exact(tmp_path: Path, vocab: int) -> None:
    docs = random_docs(30, vocab, seed=vocab)
    docs[3] = np.array([], dtype=np.int64)  # an empty document still gets its eos
    docs[5] = np.array([vocab - 1, 0])  # the extreme ids survive the narrow dtype
    path = tmp_path / "s.bin"
    info = write_shard(path, docs, vocab_size=vocab, tokenizer_fingerprint=FP, eos_id=1)
    r = ShardReader(path, expected_vocab_size=vocab, expected_fingerprint=FP)
    assert r.dtype == (np.uint16 if vocab <= 65536 else np.uint32) == dtype_for_vocab(vocab)
    expected = np.concatenate([np.append(d, 1) for d in docs])
    assert r.n_tokens == info["n_tokens"] == expected.size and r.n_docs == len(docs) == info["n_docs"]
    np.testing.assert_array_equal(np.asarray(r.tokens, dtype=np.int64), expected)
    np.testing.assert_array_equal(r.doc_offsets, np.cumsum([0] + [d.size + 1 for d in docs[:-1]]))
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(r.doc(i), np.append(d, 1))
    assert (r.vocab_size, r.eos_id, r.fingerprint) == (vocab, 1, FP)
    assert path.read_bytes()[: len(MAGIC)] == MAGIC
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]  # no temp file left behind


def test_foreign_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.bin"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a shard" * 10)
    with pytest.raises(ShardError, match="not a biglm token shard") as e:
        ShardReader(path)
    assert str(path) in str(e.value)


def test_truncated_refused(shard: Path) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[:-9])
    with pytest.raises(ShardError, match="truncated") as e:
        ShardReader(shard, verify=False)  # the size check runs even without verify
    assert str(shard) in str(e.value) and "biglm data prepare" in str(e.value)
    shard.write_bytes(data[:HEADER_SIZE // 2])
    with pytest.raises(ShardError, match="truncated"):
        ShardReader(shard)


def test_corrupt_token_refused_by_checksum(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[HEADER_SIZE + 10] ^= 0x01  # one flipped bit in the tokens
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="checksum mismatch") as e:
        ShardReader(shard)
    assert str(shard) in str(e.value)
    ShardReader(shard, verify=False)  # opening unverified is the caller's explicit choice


def test_corrupt_header_field_refused(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    # eos_id sits at byte 32 (after magic 8, four u32 and vocab u64): change it, keep the size
    struct.pack_into("<q", data, 32, 7)
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="checksum mismatch"):
        ShardReader(shard)


def test_unknown_version_refused(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    struct.pack_into("<I", data, 8, 99)
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="version 99 is not supported") as e:
        ShardReader(shard)
    assert str(shard) in str(e.value)


def test_other_tokenizer_refused(shard: Path) -> None:
    with pytest.raises(ShardError, match="different tokenizer.*re-run `biglm data prepare`") as e:
        ShardReader(shard, expected_vocab_size=1001)
    assert str(shard) in str(e.value)
    with pytest.raises(ShardError, match="different tokenizer") as e:
        ShardReader(shard, expected_fingerprint="f" * 32)
    assert str(shard) in str(e.value)
    ShardReader(shard, expected_vocab_size=1000, expected_fingerprint=FP)


def test_missing_file_named(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="no such shard file") as e:
        ShardReader(tmp_path / "nope.bin")
    assert "nope.bin" in str(e.value)


def test_bad_input_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    with pytest.raises(ValueError, match="outside"):
        write_shard(path, [np.array([1, 2, 5000])], vocab_size=1000, tokenizer_fingerprint=FP, eos_id=2)
    with pytest.raises(ValueError, match="no documents"):
        write_shard(path, [], vocab_size=1000, tokenizer_fingerprint=FP, eos_id=2)
    assert list(tmp_path.iterdir()) == []


def test_rewrite_replaces_atomically(shard: Path) -> None:
    write_shard(shard, [[5, 6, 7]], vocab_size=1000, tokenizer_fingerprint=FP, eos_id=2)
    r = ShardReader(shard)
    assert r.tokens.tolist() == [5, 6, 7, 2] and r.doc_offsets.tolist() == [0]
