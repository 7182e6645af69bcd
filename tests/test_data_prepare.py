"""prepare: shards hold exactly the tokenised documents, runs resume byte-identically, workers agree."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from biglm.data import cli as data_cli
from biglm.data.prepare import PrepareError, per_source, prepare, read_manifest
from biglm.data.shards import ShardReader
from biglm.data.sources import iter_documents
from biglm.data.tokenizer import tokenizer_fingerprint, train_tokenizer

_SYL = "ka lo mi ne su ta ri po de fa gu bi ve zo ch th ing er an qu ly st".split()


def _text(rng: random.Random) -> str:
    words = ["".join(rng.choice(_SYL) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(3, 60))]
    return " ".join(words).capitalize() + "."


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], object]:
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    (root / "books").mkdir()
    for i in range(3):
        docs = [_text(rng) for _ in range(60)]
        if i == 1:
            docs[4] = "A literal </s> and <mask> in the text stay text."
        (root / "books" / f"b{i}.txt").write_text("\n\n".join(docs), encoding="utf-8")
    (root / "web.jsonl").write_text("".join(json.dumps({"text": _text(rng)}) + "\n" for _ in range(90)))
    tok = train_tokenizer(texts=[_text(rng) for _ in range(1500)], vocab_size=600)
    return [str(root / "books"), str(root / "web.jsonl")], tok


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_shards_hold_the_documents(tmp_path: Path, corpus: tuple[list[str], object]) -> None:
    sources, tok = corpus
    m = prepare(sources=sources, tokenizer=tok, out_dir=tmp_path, shard_tokens=1500, workers=1, val_docs=3,
                progress=False)
    assert m["complete"] and m["config"]["tokenizer_fingerprint"] == tokenizer_fingerprint(tok)
    expected: dict[str, list[list[int]]] = {"train": [], "val": []}
    for spec in sources:
        for d, text in enumerate(iter_documents(spec)):
            ids = tok(text, add_special_tokens=False, split_special_tokens=True).input_ids
            expected["val" if d < 3 else "train"].append(ids + [tok.eos_token_id])
    for split in ("train", "val"):
        entries = [s for s in m["shards"] if s["split"] == split]
        readers = [ShardReader(tmp_path / s["file"], expected_fingerprint=tokenizer_fingerprint(tok)) for s in entries]
        got = [r.doc(i).tolist() for r in readers for i in range(r.n_docs)]
        assert got == expected[split]
        assert all(r.n_tokens <= 1500 for r in readers)
        assert m["progress"][split]["tokens"] == sum(r.n_tokens for r in readers)
    assert len([s for s in m["shards"] if s["split"] == "train"]) >= 3
    assert m["progress"]["val"]["docs"] == 3 * len(sources)  # the first 3 documents of each source
    # the literal "</s>" in a document is text, so the only eos tokens are the separators
    all_train = np.concatenate([ShardReader(tmp_path / s["file"]).tokens for s in m["shards"] if s["split"] == "train"])
    assert int((all_train == tok.eos_token_id).sum()) == m["progress"]["train"]["docs"]


def test_interrupted_run_resumes_byte_identical(tmp_path: Path, corpus: tuple[list[str], object]) -> None:
    sources, tok = corpus
    kw = dict(sources=sources, tokenizer=tok, shard_tokens=1200, workers=1, val_docs=2, progress=False)
    ref = tmp_path / "ref"
    prepare(out_dir=ref, **kw)

    class Interrupt(Exception):
        pass

    run = tmp_path / "run"
    written: list[str] = []

    def crash_after(n: int):
        def hook(entry: dict) -> None:
            written.append(entry["file"])
            if len(written) == n:
                raise Interrupt
        return hook

    with pytest.raises(Interrupt):
        prepare(out_dir=run, on_shard_written=crash_after(1), **kw)
    assert not read_manifest(run)["complete"] and len(read_manifest(run)["shards"]) == 1
    with pytest.raises(Interrupt):  # a second interruption, later on
        prepare(out_dir=run, on_shard_written=crash_after(4), **kw)
    resumed_files: list[str] = []
    m = prepare(out_dir=run, on_shard_written=lambda e: resumed_files.append(e["file"]), **kw)
    assert m["complete"]
    assert _files(run) == _files(ref)  # every shard and the manifest, byte for byte
    assert written[0] not in resumed_files  # completed shards were not rewritten
    # a complete folder is left alone
    assert prepare(out_dir=run, on_shard_written=lambda e: pytest.fail("rewrote a shard"), **kw)["complete"]


def test_workers_do_not_change_the_shards(tmp_path: Path, corpus: tuple[list[str], object]) -> None:
    sources, tok = corpus
    kw = dict(sources=sources, tokenizer=tok, shard_tokens=2000, val_docs=1, progress=False, batch_docs=7)
    prepare(out_dir=tmp_path / "one", workers=1, **kw)
    prepare(out_dir=tmp_path / "two", workers=2, **kw)
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


def test_other_configuration_refused(tmp_path: Path, corpus: tuple[list[str], object]) -> None:
    sources, tok = corpus
    prepare(sources=sources[1:], tokenizer=tok, out_dir=tmp_path, shard_tokens=5000, workers=1, progress=False)
    with pytest.raises(PrepareError, match="different configuration.*shard_tokens"):
        prepare(sources=sources[1:], tokenizer=tok, out_dir=tmp_path, shard_tokens=4000, workers=1, progress=False)


def test_cli_prepare_and_info(tmp_path: Path, corpus: tuple[list[str], object],
                              capsys: pytest.CaptureFixture[str]) -> None:
    sources, tok = corpus
    tok.save_pretrained(str(tmp_path / "tok"))
    out = tmp_path / "shards"
    rc = data_cli.main(["prepare", *sources, "--tokenizer", str(tmp_path / "tok"), "--out", str(out),
                        "--workers", "1", "--shard-tokens", "3000", "--val-docs", "2", "--progress", "false"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "train:" in printed and "val:" in printed and "tokens/s" in printed
    assert read_manifest(out)["config"]["tokenizer_fingerprint"] == tokenizer_fingerprint(tok)
    assert data_cli.main(["info", str(out)]) == 0
    assert "checksum ok" in capsys.readouterr().out
    assert data_cli.main(["prepare", str(tmp_path / "nope"), "--tokenizer", str(tmp_path / "tok"),
                          "--out", str(out)]) == 2
    assert "nope: no such file or folder" in capsys.readouterr().err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_cli_prepare_bad_input_one_line_each(tmp_path: Path, corpus: tuple[list[str], object],
                                             capsys: pytest.CaptureFixture[str],
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Bytes that are not UTF-8 are replaced and counted (the shards are written); an --out that is a file and a
    --tokenizer folder without a tokenizer are refused in one line, before any output folder is made."""
    sources, tok = corpus
    tok.save_pretrained(str(tmp_path / "tok"))
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"A caf\xe9 in Paris.\n\nNothing wrong here.\n")
    out = tmp_path / "shards"
    flags = ["--workers", "1", "--progress", "false"]
    assert data_cli.main(["prepare", str(latin), "--tokenizer", str(tmp_path / "tok"), "--out", str(out), *flags]) == 0
    assert f"1 line(s) hold bytes that are not UTF-8: 1 byte(s) replaced by U+FFFD, the rest of each line kept " \
           f"(first at {latin}:1)" in caplog.text
    capsys.readouterr()
    assert ShardReader(out / "train-00000.bin").n_docs == 2

    existing = tmp_path / "existing.bin"
    existing.write_bytes(b"keep me")
    assert data_cli.main(["prepare", str(latin), "--tokenizer", str(tmp_path / "tok"), "--out", str(existing),
                          *flags]) == 2
    assert f"--out {existing} is a file" in _one_error_line(capsys.readouterr().err)
    assert existing.read_bytes() == b"keep me"

    (tmp_path / "empty").mkdir()
    assert data_cli.main(["prepare", str(latin), "--tokenizer", str(tmp_path / "empty"), "--out",
                          str(tmp_path / "new"), *flags]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"--tokenizer {tmp_path / 'empty'}: the folder holds no tokenizer" in line
    assert not (tmp_path / "new").exists()


def test_a_source_warning_gets_its_own_line_above_the_progress_bar(tmp_path: Path, corpus: tuple[list[str], object],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import logging
    import sys

    _, tok = corpus
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"Document number {i} is here."}) + "\n" for i in range(5))
                    + '{"text": null}\n')
    handler = logging.StreamHandler(sys.stderr)  # as the CLI's logging.basicConfig: a console handler
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        prepare(sources=[str(rows)], tokenizer=tok, out_dir=tmp_path / "out", workers=1, progress=True)
    finally:
        logging.getLogger().removeHandler(handler)
    err = capsys.readouterr().err
    assert "tokenising" in err  # the bar ran
    line = next(line for line in err.split("\n") if "1 of 6 row(s) dropped" in line)
    before, _, after = line.rpartition("\r")
    assert after.startswith("WARNING biglm.data.sources:") and not before.split("\r")[-1].strip(), repr(line)


def test_a_val_split_taken_by_one_huge_document_is_warned_about(tmp_path: Path, corpus: tuple[list[str], object],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    _, tok = corpus
    rng = random.Random(1)
    web = tmp_path / "web.jsonl"
    web.write_text("".join(json.dumps({"text": _text(rng)}) + "\n" for _ in range(20)))
    book = tmp_path / "book.txt"  # one paragraph: one document, longer than the rest together
    book.write_text(" ".join(_text(rng) for _ in range(80)))
    with caplog.at_level("WARNING", logger="biglm.data.prepare"):
        m = prepare(sources=[str(web), str(book)], tokenizer=tok, out_dir=tmp_path / "out", workers=1, val_docs=2,
                    progress=False)
    counts = per_source(m)
    assert counts[1]["train"] == [0, 0] and counts[1]["val"][0] == 1
    assert counts[0]["val"][0] == 2 and counts[0]["train"][0] == 18
    assert counts[0]["train"][1] + counts[1]["train"][1] == m["progress"]["train"]["tokens"]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"{book}: all its 1 documents" in w and "none to train" in w for w in warned), warned
    assert any(w.startswith("val holds") and f"number 1 of {book}, has {counts[1]['val'][1]:,} tokens" in w
               for w in warned), warned
    caplog.clear()
    with caplog.at_level("WARNING", logger="biglm.data.prepare"):  # a val split of a small share: no warning
        prepare(sources=[str(web)], tokenizer=tok, out_dir=tmp_path / "out2", workers=1, val_docs=2, progress=False)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
