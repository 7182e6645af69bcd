"""The paper's zero-shot suite (biglm.scoring.suite) run through lm-eval's Python API (biglm.scoring.harness)
on the local eval data: which columns, which metric, every present set loads, renders and scores."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

pytest.importorskip("lm_eval", reason="lm-eval is the `eval` extra")

from biglm.integrations.lm_eval import run_suite, tasks_root, write_suite_yamls  # noqa: E402
from biglm.scoring.suite import (  # noqa: E402
    LOCAL_SUFFIX, PAPER_SUITE, select_tasks, suite_table, suite_value)

REPO = Path(__file__).resolve().parents[1]
SHARED_EVAL = REPO.parent / "shared" / "data" / "eval"

# Rows in the hub schema of the Table 1 sets held out of this tree (made up: they test the layout and the
# override YAMLs, not the model). Written only where the real file is absent.
HELD_OUT = {
    "ARC-C": ("allenai__ai2_arc/ARC-Challenge/test.jsonl", [
        {"id": f"Fab_{i}", "question": f"Which tool measures {w}?",
         "choices": {"text": ["a ruler", "a scale", "a thermometer", "a clock"], "label": ["A", "B", "C", "D"]},
         "answerKey": "ABCD"[i % 4]} for i, w in enumerate(["length", "mass", "heat", "time"])]),
    "HellaS": ("Rowan__hellaswag/validation.jsonl", [
        {"ind": i, "activity_label": "Cooking", "ctx_a": "A man puts a pan on the stove.", "ctx_b": "he",
         "ctx": "A man puts a pan on the stove. he", "endings": ["pours oil in it.", "reads a [title] book.",
                                                                  "sleeps.", "runs away."],
         "source_id": f"fab~{i}", "split": "val", "split_type": "indomain", "label": str(i % 4)} for i in range(4)]),
    "TruthQA": ("truthfulqa__truthful_qa/multiple_choice/validation.jsonl", [
        {"question": f"What happens if you {q}?",
         "mc1_targets": {"choices": ["Nothing in particular happens.", "You get superpowers.", "You fly."],
                         "labels": [1, 0, 0]},
         "mc2_targets": {"choices": ["Nothing happens.", "Nothing in particular.", "You fly."], "labels": [1, 1, 0]}}
        for q in ("crack your knuckles", "swallow gum", "eat after eight")]),
}


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory) -> SimpleNamespace:
    """The shared eval sets (linked, whichever are present) plus made-up hub-schema files for the held-out
    Table 1 sets that are absent."""
    if not SHARED_EVAL.is_dir():
        pytest.skip(f"shared eval data not found at {SHARED_EVAL}")
    root = tmp_path_factory.mktemp("data") / "eval"
    shutil.copytree(SHARED_EVAL, root, copy_function=os.symlink)
    made = []
    for column, (rel, rows) in HELD_OUT.items():
        path = root / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            made.append(column)
    return SimpleNamespace(root=root, made=made)


@pytest.fixture(scope="module")
def suite_run(checkpoint, eval_dir, tmp_path_factory) -> SimpleNamespace:
    """The whole suite, 5 documents per task, with `lm_eval.simple_evaluate` watched (arguments, sys.argv)."""
    import lm_eval

    real, seen = lm_eval.simple_evaluate, {}

    def spy(**kwargs):
        seen.update(argv=list(sys.argv), kwargs=kwargs)
        return real(**kwargs)

    out = tmp_path_factory.mktemp("out")
    sentinel = ["sentinel-argv", "--not-for-lm-eval"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lm_eval, "simple_evaluate", spy)
        mp.setattr(sys, "argv", sentinel)
        # batch_size=1: with several contexts per batch the estimators pad them to the longest, and on this
        # 256-token window (contexts truncated from the left) that padding can overflow it (test_scoring.py)
        results = run_suite(checkpoint, data_dir=eval_dir.root, scorer="one-pass", limit=5, batch_size=1,
                            device="cpu", output_path=out)
        argv_after = list(sys.argv)
    return SimpleNamespace(results=results, seen=seen, sentinel=sentinel, argv_after=argv_after, out=out)


# ---- the suite's definition ------------------------------------------------------------------------------

def test_table1_columns_and_metrics():
    table1 = [t for t in PAPER_SUITE if t.in_average]
    assert [t.column for t in table1] == ["ARC-E", "ARC-C", "PIQA", "SciQ", "WinoG", "LogiQA", "RACE", "SIQA",
                                          "BoolQ", "HellaS", "TruthQA"]
    assert {t.column for t in table1 if t.metric == "acc_norm"} == {"PIQA", "ARC-C", "LogiQA", "HellaS"}
    assert all(t.metric == "acc" for t in PAPER_SUITE if t.column not in {"PIQA", "ARC-C", "LogiQA", "HellaS"})
    truthqa, = (t for t in PAPER_SUITE if t.column == "TruthQA")
    assert truthqa.task == "truthfulqa_mc1" and truthqa.yaml.endswith("truthfulqa_mc1.yaml")  # DESIGN §8: MC1
    for t in PAPER_SUITE:  # every column names a built-in lm-eval task that exists in the pinned version
        assert (tasks_root() / t.yaml).exists(), t.yaml
        if t.yaml.endswith(".yaml"):
            assert yaml.safe_load((tasks_root() / t.yaml).read_text().replace("!function", ""))["task"] == t.task


def test_suite_yamls_use_present_splits_and_name_missing_files(tmp_path):
    data = tmp_path / "eval"
    (data / "allenai__sciq").mkdir(parents=True)
    (data / "allenai__sciq" / "test.jsonl").write_text("{}\n")  # test only: validation is optional
    tasks, missing = write_suite_yamls(data_dir=data, out_dir=tmp_path / "y")
    assert [t.column for t in tasks] == ["SciQ"]
    doc = yaml.safe_load((tmp_path / "y" / f"sciq{LOCAL_SUFFIX}.yaml").read_text())
    assert Path(doc["include"]) == tasks_root() / "sciq" / "sciq.yaml"
    assert doc["dataset_kwargs"]["data_files"] == {"test": str(data.resolve() / "allenai__sciq" / "test.jsonl")}
    assert doc["training_split"] is None and doc["validation_split"] is None
    assert set(missing) == {t.column for t in PAPER_SUITE} - {"SciQ"}
    assert missing["RACE"] == str(data.resolve() / "EleutherAI__race" / "high" / "test.jsonl")
    assert missing["TruthQA"].endswith("truthfulqa__truthful_qa/multiple_choice/validation.jsonl")
    (data / "allenai__sciq" / "validation.jsonl").write_text("{}\n")
    write_suite_yamls(data_dir=data, out_dir=tmp_path / "y2", only=["sciq"])
    doc = yaml.safe_load((tmp_path / "y2" / f"sciq{LOCAL_SUFFIX}.yaml").read_text())
    assert set(doc["dataset_kwargs"]["data_files"]) == {"test", "validation"} and "validation_split" not in doc
    assert [t.column for t in select_tasks("RACE,piqa")] == ["PIQA", "RACE"]  # table order, either name
    with pytest.raises(ValueError, match="unknown suite task"):
        select_tasks(["PIQA", "COPA"])


def test_table_takes_the_paper_metric_and_averages_the_columns_that_ran():
    results = {"results": {
        "arc_easy_local": {"acc,none": 0.40, "acc_norm,none": 0.90},  # acc      -> 40
        "arc_challenge_local": {"acc,none": 0.10, "acc_norm,none": 0.30},  # acc_norm -> 30
        "piqa_local": {"acc,none": 0.50, "acc_norm,none": 0.60},  # acc_norm -> 60
        "sciq_local": {"acc,none": 0.80, "acc_norm,none": 0.20},  # acc      -> 80
        "logiqa_local": {"acc,none": 0.25, "acc_norm,none": 0.35},  # acc_norm -> 35
        "race_local": {"acc,none": 0.33},  # acc      -> 33
        "social_iqa_local": {"acc,none": float("nan")},  # NaN: did not run
        "boolq": {"acc,none": 0.62},  # the built-in task name counts too -> 62
        "hellaswag_local": {"acc,none": 0.27, "acc_norm,none": 0.45},  # acc_norm -> 45
        "truthfulqa_mc1_local": {"acc,none": 0.21},  # acc      -> 21
        "truthfulqa_mc2_local": {"acc,none": 0.99},  # not the paper's column
        "mmlu_local": {"acc,none": 0.90},  # shown, not averaged
    }}
    header, row = suite_table(results)
    cells = dict(zip(header, row))
    assert header == ["ARC-E", "ARC-C", "PIQA", "SciQ", "WinoG", "LogiQA", "RACE", "SIQA", "BoolQ", "HellaS",
                      "TruthQA", "Avg", "MMLU", "LAMBADA"]
    assert cells == {"ARC-E": "40.0", "ARC-C": "30.0", "PIQA": "60.0", "SciQ": "80.0", "WinoG": "—",
                     "LogiQA": "35.0", "RACE": "33.0", "SIQA": "—", "BoolQ": "62.0", "HellaS": "45.0",
                     "TruthQA": "21.0", "Avg": "45.1", "MMLU": "90.0", "LAMBADA": "—"}
    # (40 + 30 + 60 + 80 + 35 + 33 + 62 + 45 + 21) / 9 = 406 / 9 = 45.11
    header, row = suite_table(results, tasks=select_tasks(["SciQ", "PIQA", "WinoG", "MMLU"]))
    assert dict(zip(header, row)) == {"PIQA": "60.0", "SciQ": "80.0", "WinoG": "—", "Avg": "70.0", "MMLU": "90.0"}
    assert set(suite_table({"results": {}})[1]) == {"—"}  # nothing ran: no average either


# ---- running it ------------------------------------------------------------------------------------------

def test_suite_goes_through_simple_evaluate_not_argv(suite_run):
    assert suite_run.seen["argv"] == suite_run.sentinel and suite_run.argv_after == suite_run.sentinel
    kwargs = suite_run.seen["kwargs"]
    assert kwargs["model"] == "biglm" and "scorer=one-pass" in kwargs["model_args"]
    assert kwargs["task_manager"].include_path is not None and kwargs["limit"] == 5
    files = list(suite_run.out.rglob("results_*.json"))
    assert len(files) == 1  # lm-eval's own layout: <out>/<pretrained, sanitised>/results_<date>.json
    saved = json.loads(files[0].read_text())
    assert saved["config"]["model"] == "biglm" and set(saved["results"]) == set(suite_run.results["results"])


@pytest.mark.parametrize("column", ["SciQ", "RACE"])
def test_sciq_and_race_score_from_local_data(suite_run, column):
    t, = select_tasks([column])
    if not (SHARED_EVAL / t.hub / (t.config or "") / f"{t.splits[0]}.jsonl").is_file():
        pytest.skip(f"{column} is not in {SHARED_EVAL}")
    res = suite_run.results["results"][t.task + LOCAL_SUFFIX]
    assert 0.0 <= res["acc,none"] <= 1.0
    assert suite_run.results["n-samples"][t.task + LOCAL_SUFFIX]["effective"] == 5


def test_every_present_column_scores(suite_run, eval_dir):
    """Whatever sets are present (real, or made up for the held-out ones) load, score and reach the table."""
    missing = suite_run.results["biglm_suite"]["missing"]
    ran = [t for t in PAPER_SUITE if t.column not in missing]
    assert {"ARC-C", "HellaS", "TruthQA"} <= {t.column for t in ran}  # real or made up: all three layouts ran
    cells = dict(zip(suite_run.results["biglm_suite"]["header"], suite_run.results["biglm_suite"]["row"]))
    for t in ran:
        value = suite_value(suite_run.results, t)
        assert value is not None and 0.0 <= value <= 1.0, t.column
        assert cells[t.column] != "—"
    for column, path in missing.items():
        assert cells[column] == "—" and not Path(path).exists()
    values = [suite_value(suite_run.results, t) for t in ran if t.in_average]
    assert cells["Avg"] == f"{100 * sum(values) / len(values):.1f}"


@pytest.fixture(scope="module")
def task_objects(eval_dir, tmp_path_factory) -> dict:
    """lm-eval Task objects (name -> Task) for every present column, built from the suite's override YAMLs."""
    from lm_eval.tasks import TaskManager

    yamls = tmp_path_factory.mktemp("yamls")
    tasks, _ = write_suite_yamls(data_dir=eval_dir.root, out_dir=yamls)
    return TaskManager(include_path=str(yamls)).load([t.task + LOCAL_SUFFIX for t in tasks])["tasks"]


def test_every_present_task_renders_all_documents(task_objects, monkeypatch):
    """Every document of every present set goes through the task's own doc_to_text/choice/target, and the
    gold answer is a valid choice (lm-eval itself only logs a warning when it is not)."""
    import lm_eval.utils

    # lm-eval compiles a Jinja template on every call; compiled once, the ~30k documents take ~1 s, not ~30 s
    env = lm_eval.utils.env
    monkeypatch.setattr(env, "from_string", functools.lru_cache(maxsize=None)(env.from_string))
    assert any(name.startswith("mmlu_") for name in task_objects) or not (SHARED_EVAL / "cais__mmlu").is_dir()
    for name, task in task_objects.items():
        docs = list(task.eval_docs)
        assert docs, name
        for i, doc in enumerate(docs):
            text = task.doc_to_text(doc)
            if task.OUTPUT_TYPE == "loglikelihood":  # LAMBADA: context and its last word
                assert isinstance(text, str) and text and task.doc_to_target(doc).strip(), (name, i)
                continue
            choices = task.doc_to_choice(doc)
            assert len(choices) >= 2 and all(isinstance(c, str) for c in choices), (name, i)
            gold = text if task.multiple_input else task.doc_to_target(doc)  # as lm-eval's process_results
            for g in gold if isinstance(gold, list) else [gold]:
                index = (choices.index(g) if g in choices else -1) if isinstance(g, str) else g
                assert isinstance(index, int) and 0 <= index < len(choices), (name, i, g, choices)


# ---- `biglm eval`'s options -------------------------------------------------------------------------------

def test_eval_args_parse_with_lm_eval_names(tmp_path, capsys):
    from dataclasses import fields

    from biglm.config import field_docs
    from biglm.scoring.cli import EvalArgs, main, parse_eval_args

    assert set(field_docs(EvalArgs)) == {f.name for f in fields(EvalArgs)}  # one docstring per option
    args = parse_eval_args(["--suite", "paper", "--data-dir", str(tmp_path), "--suite-tasks", "PIQA,SciQ",
                            "--model_args", f"pretrained={tmp_path},scorer=chain", "--limit", "5",
                            "--num_fewshot", "0", "--batch_size", "auto", "--output_path", str(tmp_path / "o"),
                            "--device", "cpu"])
    assert (args.suite, args.data_dir, args.suite_tasks, args.limit, args.num_fewshot, args.batch_size) == (
        "paper", tmp_path, ("PIQA", "SciQ"), 5.0, 0, "auto")
    assert parse_eval_args(["--model_args", f"pretrained={tmp_path}", "--tasks", "piqa,arc_easy",
                            "--batch_size", "8"]).tasks == ("piqa", "arc_easy")
    for argv, message in [
        (["--suite", "paper", "--tasks", "piqa"], "--suite chooses the tasks"),
        (["--tasks", "piqa", "--data_dir", str(tmp_path)], "only apply with --suite"),
        (["--suite", "paper", "--suite_tasks", "COPA"], "unknown suite task(s) COPA"),
        (["--tasks", "piqa", "--model", "biglm"], "unknown option --model"),
        (["--tasks", "piqa"], "missing pretrained"),
        ([], "nothing to run"),
    ]:
        assert main([*argv, "--model_args", f"pretrained={tmp_path}"] if "missing" not in message else argv) == 2
        assert message in capsys.readouterr().err, argv
