"""Tokenizer: special-token ids, round trips, the mask token inside text, adding a missing mask."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from biglm.data import cli_tokenizer
from biglm.data.tokenizer import (
    SPECIAL_TOKENS,
    document_end_id,
    load_tokenizer,
    tokenizer_fingerprint,
    tokenizer_vocab_size,
    train_tokenizer,
)

_SYLLABLES = "ka lo mi ne su ta ri po de fa gu bi ve zo ch th ing er an qu ly st pr".split()
# common words plus ~600 pseudo-words: enough distinct pairs for a few hundred merges
WORDS = ("the cat sat on a mat while dogs ran over green hills and children sang songs of old".split()
         + ["".join(random.Random(i).choice(_SYLLABLES) for _ in range(1 + i % 4)) for i in range(600)])


def synthetic_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))).capitalize() + "." for _ in range(n)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    train_tokenizer(texts=synthetic_texts(2000), vocab_size=512, out_dir=out)
    return out


def test_special_token_ids_and_vocab(tok_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.mask_token_id] == [0, 1, 2, 3, 4]
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == list(SPECIAL_TOKENS)
    assert len(tok) == tokenizer_vocab_size(tok) == 512
    assert (tok_dir / "tokenizer.json").is_file() and (tok_dir / "tokenizer_config.json").is_file()
    assert document_end_id(tok) == 2


@pytest.mark.parametrize("text", ["The cat sat on the mat.", "  leading and  double  spaces\n\nnew para\t tab",
                                  "ünïcödé — “quotes” 😀 漢字", "kings123 with 4.5 numbers!?"])
def test_round_trip_is_lossless(tok_dir: Path, text: str) -> None:
    tok = load_tokenizer(tok_dir)
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.unk_token_id not in ids  # byte-level: every string is representable
    assert tok.decode(ids) == text
    wrapped = tok(text).input_ids
    assert wrapped[0] == tok.bos_token_id and wrapped[-1] == tok.eos_token_id and wrapped[1:-1] == ids


def test_mask_token_inside_text_is_one_token(tok_dir: Path) -> None:
    tok = load_tokenizer(tok_dir)
    ids = tok("The <mask> sat", add_special_tokens=False).input_ids
    assert ids.count(tok.mask_token_id) == 1
    plain = tok("The", add_special_tokens=False).input_ids
    after = tok(" sat", add_special_tokens=False).input_ids
    # the space before <mask> is absorbed (lstrip), so no stray "Ġ" token sits before it
    assert ids == plain + [tok.mask_token_id] + after
    assert tok("<mask>", add_special_tokens=False).input_ids == [tok.mask_token_id]


def test_fingerprint_stable_across_save_load_and_sensitive_to_vocab(tok_dir: Path, tmp_path: Path) -> None:
    a = load_tokenizer(tok_dir)
    b = AutoTokenizer.from_pretrained(str(tok_dir))
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
    other = train_tokenizer(texts=synthetic_texts(500, seed=1), vocab_size=400)
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(a)


def test_load_adds_mask_and_pad_when_missing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(synthetic_texts(300), trainer=trainer)
    bare = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    bare.save_pretrained(str(tmp_path))
    before = len(AutoTokenizer.from_pretrained(str(tmp_path)))
    assert AutoTokenizer.from_pretrained(str(tmp_path)).mask_token is None

    with caplog.at_level(logging.WARNING):
        tok = load_tokenizer(tmp_path)
    assert tok.mask_token == "<mask>" and tok.pad_token == "<pad>"
    assert tokenizer_vocab_size(tok) == before + 2
    assert {tok.mask_token_id, tok.pad_token_id} == {before, before + 1}
    assert tok.pad_token_id != tok.eos_token_id
    assert "resize the model's embeddings" in caplog.text and str(before + 2) in caplog.text
    ids = tok("The <mask> sat", add_special_tokens=False).input_ids
    assert ids.count(tok.mask_token_id) == 1


def test_tiny_vocab_refused() -> None:
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(texts=["abc"], vocab_size=100)


def test_cli_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.txt").write_text("\n\n".join(synthetic_texts(400)), encoding="utf-8")
    (src / "b.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in synthetic_texts(50, seed=3)),
                                 encoding="utf-8")
    out = tmp_path / "tok"
    rc = cli_tokenizer.main(["train", "--input", str(src), "--vocab-size", "400", "--out", str(out),
                             "--limit-bytes", "20000"])
    assert rc == 0
    tok = load_tokenizer(out)
    assert len(tok) == 400 and tok.mask_token_id == 4
    assert "saved to" in capsys.readouterr().out
    assert cli_tokenizer.main(["train", "--input", str(tmp_path / "missing"), "--vocab-size", "400",
                               "--out", str(out)]) == 2


def test_cli_train_on_bytes_that_are_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              caplog: pytest.LogCaptureFixture) -> None:
    """The same reader as `biglm data prepare`: the bad bytes are replaced and counted, the tokenizer is trained;
    an --out that is a file is refused in one line."""
    src = tmp_path / "latin.txt"
    src.write_bytes("\n\n".join(synthetic_texts(200)).encode() + b"\n\nUne ann\xe9e \xe0 Paris.\n")
    out = tmp_path / "tok"
    assert cli_tokenizer.main(["train", "--input", str(src), "--vocab-size", "300", "--out", str(out)]) == 0
    assert "1 line(s) hold bytes that are not UTF-8: 2 byte(s) replaced by U+FFFD" in caplog.text
    assert f"(first at {src}:401)" in caplog.text and len(load_tokenizer(out)) == 300
    capsys.readouterr()
    (tmp_path / "file").write_text("x")
    assert cli_tokenizer.main(["train", "--input", str(src), "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "is a file" in err and len(err.strip().splitlines()) == 1
