"""Text sources through the datasets loaders (txt/jsonl/parquet/folders), errors, the built-in corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from biglm.data.builtin import _collect, builtin_corpus
from biglm.data.sources import SourceError, iter_documents, iter_sources, parse_hub_spec

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def test_txt_paragraph_document_line_modes(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("First para\nline two.\n\n\n  Second para.  \n\n\n\nThird.\n", encoding="utf-8")
    assert list(iter_documents(str(f))) == ["First para\nline two.", "Second para.", "Third."]
    assert list(iter_documents(str(f), txt_mode="document")) == [f.read_text().strip()]
    assert list(iter_documents(str(f), txt_mode="line")) == ["First para", "line two.", "Second para.", "Third."]


def test_jsonl_field_and_missing_field(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_text("".join(json.dumps({"id": i, "body": f"doc {i}", "text": "x"}) + "\n" for i in range(5)))
    assert list(iter_documents(str(f), text_field="body")) == [f"doc {i}" for i in range(5)]
    with pytest.raises(SourceError, match="no field 'content'"):
        list(iter_documents(str(f), text_field="content"))


def test_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["alpha", "  ", "beta gamma"], "n": [1, 2, 3]}), f)
    assert list(iter_documents(str(f))) == ["alpha", "beta gamma"]  # blank rows are skipped


def test_folder_recursive_sorted_mixed(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "b" / "z.txt").write_text("from b/z")
    (tmp_path / "a.txt").write_text("from a\n\nsecond of a")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "from c"}) + "\n")
    (tmp_path / "d.txt").write_text("from d")
    (tmp_path / ".hidden" / "x.txt").write_text("hidden")
    (tmp_path / "notes.md").write_text("ignored")
    assert list(iter_documents(str(tmp_path))) == ["from a", "second of a", "from b/z", "from c", "from d"]
    assert list(iter_sources([str(tmp_path / "d.txt"), str(tmp_path / "c.jsonl")])) == ["from d", "from c"]


def test_missing_and_empty_sources_explained(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file or folder") as e:
        iter_documents(str(tmp_path / "missing.txt"))  # raised at the call, not at the first next()
    assert "missing.txt" in str(e.value)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(SourceError, match="holds no text documents") as e:
        list(iter_documents(str(empty)))
    assert "empty.txt" in str(e.value)
    (tmp_path / "sub").mkdir()
    with pytest.raises(SourceError, match="no .txt/.jsonl"):
        iter_documents(str(tmp_path / "sub"))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(SourceError, match="unsupported file type"):
        iter_documents(str(tmp_path / "x.csv"))
    # several sources: the last one is checked at the call, before the first is read (a reader that stops
    # early, as `biglm tokenizer train --limit_bytes` does, would otherwise never see it)
    good = tmp_path / "good.txt"
    good.write_text("one paragraph\n\nanother\n")
    with pytest.raises(SourceError, match="unsupported file type"):
        iter_sources([str(good), str(tmp_path / "x.csv")])
    # WikiText's .raw files are plain text
    (tmp_path / "wiki.test.raw").write_text(" = Title = \n\n Body text .\n")
    assert list(iter_sources([str(good), str(tmp_path / "wiki.test.raw")])) == [
        "one paragraph", "another", "= Title =", "Body text ."]


def test_hub_spec_parsing() -> None:
    s = parse_hub_spec("hf:HuggingFaceFW/fineweb-edu:sample-10BT@train")
    assert (s.name, s.config, s.split) == ("HuggingFaceFW/fineweb-edu", "sample-10BT", "train")
    s = parse_hub_spec("hf:HuggingFaceTB/smollm-corpus@validation")
    assert (s.name, s.config, s.split) == ("HuggingFaceTB/smollm-corpus", None, "validation")
    with pytest.raises(SourceError, match="missing dataset name"):
        parse_hub_spec("hf:")


def test_real_tinystories_blocks() -> None:
    f = SHARED / "pretrain" / "tinystories" / "TinyStories-valid.head.txt"
    if not f.is_file():
        pytest.skip(f"shared data not found at {SHARED} (the repo's sibling folder shared/data)")
    docs = list(iter_documents(str(f)))
    # "One story per block, blocks separated by a blank line" (shared/data/README.md): ~4,300 stories
    assert 4000 <= len(docs) <= 4600
    assert all(d == d.strip() and d for d in docs)


def test_builtin_corpus_nonempty_and_deterministic() -> None:
    docs = builtin_corpus()
    n_chars = sum(map(len, docs))
    assert len(docs) > 200 and n_chars > 1_000_000
    assert any("if_stmt" in d for d in docs)  # a pydoc topic (the grammar of the `if` statement)
    assert any(d.startswith("Functional tools for creating and using iterators.") for d in docs)  # itertools
    assert len(set(docs)) == len(docs)
    docs[0] = "mutating the returned list does not touch the cache"
    assert builtin_corpus()[0] != docs[0]
    # a second, independent collection in a fresh child interpreter gives the same corpus
    assert sorted(_collect.__wrapped__()) == sorted(builtin_corpus())  # same documents, in a fixed shuffled order


def test_bytes_that_are_not_utf8_are_replaced_counted_and_located(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "latin.txt"
    f.write_bytes(b"Plain first.\n\nA caf\xe9 line,\nand \xff\xfe two bad bytes.\n\nClean last.\n")
    with caplog.at_level("WARNING", logger="biglm.data.sources"):
        docs = list(iter_documents(str(f)))
    assert docs == ["Plain first.", "A caf\ufffd line,\nand \ufffd\ufffd two bad bytes.", "Clean last."]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1
    assert "2 line(s)" in warned[0] and "3 byte(s) replaced" in warned[0] and f"{f}:3" in warned[0]


def test_text_files_split_as_the_datasets_text_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`.txt` files are read by biglm (to survive bytes that are not UTF-8): per line and per file the documents are
    those the `datasets` text loader gives, for CRLF and lone CR line ends, a BOM, and chunk edges anywhere (a
    leading BOM is dropped, which that loader keeps); per paragraph they are the blocks between lines of whitespace
    only, or each line where a file has no such line (that loader splits at "\n\n" alone)."""
    import random
    import re

    import datasets

    import biglm.data.sources as sources

    rng = random.Random(0)
    pieces = ["a", "b c", "\n", "\n\n", "\r\n", "\r", "  ", "\n\n\n", "\u00e9", "\ufeff", "word ", "\t", "x\r\n\r\ny"]
    for chunk in (1 << 22, 5):
        monkeypatch.setattr(sources, "_CHUNK", chunk)
        for k in range(8):
            f = tmp_path / f"f{k}.txt"
            f.write_bytes("".join(rng.choice(pieces) for _ in range(rng.randint(0, 300))).encode())
            whole = f.read_text(encoding="utf-8-sig")  # universal newlines, a leading BOM dropped
            for mode in ("paragraph", "line", "document"):
                if mode == "paragraph":
                    blocks = re.split(r"\n[^\S\n]*\n", whole)
                    want = [b.strip() for b in (blocks if len(blocks) > 1 else whole.split("\n"))]
                else:
                    ds = datasets.load_dataset("text", data_files=[str(f)], split="train", streaming=True,
                                               sample_by=mode)
                    want = [r["text"] for r in ds]
                    if want and f.read_bytes().startswith("\ufeff".encode()):
                        want[0] = want[0][1:]
                    want = [w.strip() for w in want]
                mine = [d.strip() for d in sources._text_documents(f, txt_mode=mode, bad=sources.Undecodable())]
                assert [d for d in mine if d] == [w for w in want if w], (f.read_bytes(), mode, chunk)


def test_json_that_is_not_utf8_or_damaged_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(SourceError, match=rf"{bad}:2: not UTF-8"):
        list(iter_documents(str(bad)))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"abcd")
    with pytest.raises(SourceError, match="broken.parquet: cannot be read as parquet"):
        list(iter_documents(str(broken)))


def test_rows_without_text_are_counted_by_reason_and_located(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "rows.jsonl"
    f.write_text('{"text": "first good"}\n{"text": null}\n{"id": 3}\n{"text": 42}\n{"text": "  "}\n{"text": "ok"}\n')
    with caplog.at_level("WARNING", logger="biglm.data.sources"):
        assert list(iter_documents(str(f))) == ["first good", "ok"]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1, warned
    assert "4 of 6 row(s) dropped" in warned[0] and "2 missing or null" in warned[0]
    assert "1 a number" in warned[0] and "1 empty" in warned[0] and f"{f}:2" in warned[0]
    numbers = tmp_path / "ids.jsonl"
    numbers.write_text('{"text": 1}\n{"text": 2.5}\n')
    with pytest.raises(SourceError, match=r"holds no text documents: 2 of 2 row\(s\) dropped.*2 a number"):
        list(iter_documents(str(numbers)))


def test_utf16_and_utf32_text_is_decoded_by_its_byte_order_mark(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    text = "Caf\u00e9 first.\r\nsame one.\r\n\r\nSecond \U0001f600.\r\n"
    want = ["Caf\u00e9 first.\nsame one.", "Second \U0001f600."]
    for enc in ("utf-16", "utf-16-be", "utf-32", "utf-32-be", "utf-8-sig"):
        f = tmp_path / f"{enc}.txt"
        data = text.encode(enc)
        if enc.endswith("-be"):
            data = (b"\xfe\xff" if enc == "utf-16-be" else b"\x00\x00\xfe\xff") + data
        f.write_bytes(data)
        with caplog.at_level("WARNING", logger="biglm.data.sources"):
            assert list(iter_documents(str(f))) == want, enc
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    broken = tmp_path / "broken16.txt"  # a lone surrogate: each of its bytes replaced, located, the rest kept
    broken.write_bytes("ok\nfine\n\n".encode("utf-16") + b"\x00\xd8x\x00\n\x00")
    with caplog.at_level("WARNING", logger="biglm.data.sources"):
        assert list(iter_documents(str(broken))) == ["ok\nfine", "\ufffd\ufffdx"]
    message = caplog.records[-1].getMessage()
    assert f"{broken}:4" in message and "not UTF-16" in message and "LATIN1" not in message


def test_json_in_utf16_is_refused_naming_the_encoding_and_the_fix(tmp_path: Path) -> None:
    f = tmp_path / "wide.jsonl"
    f.write_bytes('{"text": "hello"}\n'.encode("utf-16"))
    with pytest.raises(SourceError, match=rf"{f}: is UTF-16 .*iconv -f UTF-16 -t UTF-8"):
        list(iter_documents(str(f)))


def test_a_text_file_with_no_blank_line_is_one_document_per_line(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "wiki.raw"  # WikiText's raw layout: headings and paragraphs, one per line, no blank line
    f.write_bytes(b" = Title = \r\n Body one .\r\n = = Part = = \r\n Body two .\r\n")
    with caplog.at_level("INFO", logger="biglm.data.sources"):
        assert list(iter_documents(str(f))) == ["= Title =", "Body one .", "= = Part = =", "Body two ."]
    assert any(f"{f}: it has no blank line, so each line is a document" in r.getMessage() for r in caplog.records)
    spaced = tmp_path / "spaced.txt"  # a line of spaces is a blank line
    spaced.write_text(" = Title = \n \n Body one .\n line two .\n \n")
    assert list(iter_documents(str(spaced))) == ["= Title =", "Body one .\n line two ."]
    assert list(iter_documents(str(f), txt_mode="document")) == [f.read_text().strip()]
