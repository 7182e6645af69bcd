"""Task data readers: classification sets, SQuAD v1.1, BEIR — shared data read right, bad input refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from biglm.data.tables import TaskDataError, load_table
from biglm.finetune.tasks.classification import load_classification
from biglm.finetune.tasks.retrieval import load_beir
from biglm.finetune.tasks.squad import load_squad, split_by_article
from biglm.finetune.templates import MNLI_TEMPLATE, PromptTemplate, TemplateError


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- classification


def test_mnli_shared_train_subset(shared_data):
    data = load_classification(shared_data / "finetune" / "mnli" / "train_subset_300.jsonl", template=MNLI_TEMPLATE)
    assert len(data.dataset) == 300 and data.num_classes == 3 and data.dropped_unlabeled == 0
    assert data.text_fields == ("premise", "hypothesis")
    assert [data.dataset["label"].count(c) for c in range(3)] == [100, 100, 100]


def test_unlabelled_rows_are_dropped_and_counted(tmp_path):
    rows = [{"premise": f"p{i}", "hypothesis": f"h{i}", "label": [0, 1, 2, -1][i % 4], "idx": i} for i in range(10)]
    data = load_classification(write_jsonl(tmp_path / "d.jsonl", rows), template=MNLI_TEMPLATE)
    assert data.dropped_unlabeled == 2 and len(data.dataset) == 8
    assert data.dataset["idx"] == [0, 1, 2, 4, 5, 6, 8, 9]


def test_any_glue_style_set_with_a_template_and_string_labels(tmp_path):
    rows = [{"sentence1": "A.", "sentence2": "B.", "gold": "not_entailment"},
            {"sentence1": "C.", "sentence2": "D.", "gold": "entailment"}]
    rte = PromptTemplate(template="{sentence1} Question: {sentence2} True or False? Answer: {answer}",
                         label_words=("True", "False"), name="rte")
    data = load_classification(write_jsonl(tmp_path / "rte.jsonl", rows), template=rte, label_field="gold",
                               label_names=["entailment", "not_entailment"])
    assert data.dataset["label"] == [1, 0] and "gold" not in data.dataset.column_names
    assert rte.render(data.dataset[0], data.dataset[0]["label"]) == ("A. Question: B. True or False? Answer:", " False")


@pytest.mark.parametrize("rows, kwargs, error, parts", [
    ([{"premise": "p", "label": 0}], {}, TemplateError, ["'hypothesis'", "d.jsonl", "columns"]),
    ([{"premise": "p", "hypothesis": "h", "gold": 0}], {}, TaskDataError, ["'label'", "d.jsonl", "label_field"]),
    ([{"premise": "p", "hypothesis": "h", "label": 3}], {}, TaskDataError, ["[3]", "[0, 3)", "'label'"]),
    ([{"premise": "p", "hypothesis": "h", "label": "neutral"}], {}, TaskDataError, ["label_names", "'neutral'"]),
    ([{"premise": "p", "hypothesis": None, "label": 0}, {"premise": "p", "hypothesis": "h", "label": 0}], {},
     TaskDataError, ["'hypothesis' is null", "rows 0"]),
    ([{"premise": "p", "hypothesis": "h", "label": 0}], {"num_classes": 2}, TaskDataError, ["3 label words", "2 classes"]),
])
def test_bad_classification_data_is_refused_by_file_and_field(tmp_path, rows, kwargs, error, parts):
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(error) as e:
        load_classification(path, template=MNLI_TEMPLATE, **kwargs)
    for part in parts:
        assert part in str(e.value), (part, str(e.value))


def test_hub_specs_take_the_same_loader_call(monkeypatch):
    import datasets

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or "DS")
    assert load_table("hf:nyu-mll/glue:mnli@validation_matched") == "DS"
    assert load_table("hf:nyu-mll/glue:rte", split="validation") == "DS"
    assert calls == [(("nyu-mll/glue", "mnli"), {"split": "validation_matched"}),
                     (("nyu-mll/glue", "rte"), {"split": "validation"})]
    with pytest.raises(TaskDataError, match="no such file"):
        load_table("data/missing.jsonl")


# ---------------------------------------------------------------- SQuAD


def squad_json(path: Path, paragraphs: list[dict], title: str = "T") -> Path:
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": title, "paragraphs": paragraphs}]}))
    return path


def test_squad_shared_dev_flattens_and_splits_by_article(shared_data):
    sq = load_squad(shared_data / "finetune" / "squad_v1.1" / "dev-v1.1.reconstructed.json")
    ds = sq.dataset
    assert len(ds) == 10570 and len(set(ds["title"])) == 48 and sq.dropped_answers == 0
    row = ds[0]
    assert row["id"] == "5725b33f6a3fe71400b8952d" and row["title"] == "1973_oil_crisis"
    assert row["answers"]["text"][0] == "October 1973" and row["answers"]["answer_start"][0] == 29
    assert sq.references()["5725b33f6a3fe71400b8952d"] == ["October 1973"] * 3 + ["October", "1973"]

    train, held = split_by_article(ds, fraction=0.25, seed=0)
    assert len(train) + len(held) == len(ds)
    assert not set(train["title"]) & set(held["title"])
    assert len(set(held["title"])) == 12                           # round(0.25 * 48)
    again, _ = split_by_article(ds, fraction=0.25, seed=0)
    assert again["id"] == train["id"]                              # same seed, same split
    other, _ = split_by_article(ds, fraction=0.25, seed=1)
    assert set(other["title"]) != set(train["title"])


def test_squad_flat_schema_reads_the_same(tmp_path):
    rows = [{"id": "a", "title": "T", "context": "Paris is in France.", "question": "Where is Paris?",
             "answers": {"text": ["France"], "answer_start": [12]}}]
    sq = load_squad(write_jsonl(tmp_path / "flat.jsonl", rows))
    assert sq.dataset[0] == rows[0]


def test_squad_misaligned_answers_refused_or_dropped(tmp_path):
    ctx = "Paris is in France. It is big."
    path = squad_json(tmp_path / "s.json", [{"context": ctx, "qas": [
        {"id": "q1", "question": "Where?", "answers": [{"text": "France", "answer_start": 12},
                                                       {"text": "France", "answer_start": 3}]},
        {"id": "q2", "question": "Size?", "answers": [{"text": "huge", "answer_start": 26}]},
    ]}])
    with pytest.raises(TaskDataError) as e:
        load_squad(path)
    msg = str(e.value)
    assert "2 answer(s) are not found" in msg and "q1" in msg and "q2" in msg and "on_misaligned='drop'" in msg
    assert "data[0].paragraphs[0].qas[1]" in msg
    sq = load_squad(path, on_misaligned="drop")
    assert sq.dropped_answers == 2 and sq.dropped_questions == 1 and sq.dataset["id"] == ["q1"]
    assert sq.dataset[0]["answers"] == {"text": ["France"], "answer_start": [12]}


@pytest.mark.parametrize("qas, match", [
    ([{"id": "q1", "question": "Where?", "answers": []}], "SQuAD 2.0"),
    ([{"id": "q1", "answers": [{"text": "a", "answer_start": 0}]}], "has no 'question'"),
    ([{"id": "q1", "question": "?", "answers": [{"text": "a", "answer_start": 0}]},
      {"id": "q1", "question": "?", "answers": [{"text": "a", "answer_start": 0}]}], "more than once"),
])
def test_bad_squad_files_are_refused(tmp_path, qas, match):
    path = squad_json(tmp_path / "s.json", [{"context": "a b c", "qas": qas}])
    with pytest.raises(TaskDataError, match=match) as e:
        load_squad(path)
    assert str(path) in str(e.value)


# ---------------------------------------------------------------- BEIR


def test_beir_scifact_test_split(shared_data):
    b = load_beir(shared_data / "finetune" / "beir_scifact", split="test")
    assert len(b.corpus) == 5183 and len(b.queries) == 300 and sum(len(v) for v in b.qrels.values()) == 339
    assert b.qrels["1"] == {"31715818": 1}                        # ids stay strings
    assert b.corpus["4983"]["title"].startswith("Microstructural development")
    assert set(b.queries) == set(b.qrels)


def make_beir(root: Path, qrels_lines: list[str], header: str = "query-id\tcorpus-id\tscore") -> Path:
    (root / "qrels").mkdir(parents=True)
    write_jsonl(root / "corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": f"doc {i}"} for i in range(3)])
    write_jsonl(root / "queries.jsonl", [{"_id": f"q{i}", "text": f"query {i}"} for i in range(2)])
    (root / "qrels" / "test.tsv").write_text("\n".join([header, *qrels_lines]) + "\n")
    return root


def test_beir_qrels_naming_unknown_ids_are_refused(tmp_path):
    good = load_beir(make_beir(tmp_path / "ok", ["q0\td1\t1", "q1\td2\t2"]))
    assert good.qrels == {"q0": {"d1": 1}, "q1": {"d2": 2}}
    lines = ["q0\td1\t1"] + [f"q1\tx{i}\t1" for i in range(7)]
    with pytest.raises(TaskDataError) as e:
        load_beir(make_beir(tmp_path / "docs", lines))
    msg = str(e.value)
    assert "7 corpus-id(s) are not in" in msg and "'x0'" in msg and "..." in msg and "corpus.jsonl" in msg
    with pytest.raises(TaskDataError, match=r"1 query-id\(s\) are not in .*'q9'"):
        load_beir(make_beir(tmp_path / "queries", ["q9\td1\t1"]))
    with pytest.raises(TaskDataError, match="expected the header"):
        load_beir(make_beir(tmp_path / "header", ["q0\td1\t1"], header="q0\td0\t1"))
    with pytest.raises(TaskDataError, match="missing"):
        load_beir(tmp_path / "ok", split="dev")


def test_task_side_modules_do_not_import_training():
    import subprocess
    import sys

    code = ("import sys, biglm.scoring.metrics, biglm.finetune.templates, biglm.data.tables, biglm.finetune.tasks; "
            "bad = sorted(m for m in sys.modules if m.startswith('biglm.training')); print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
