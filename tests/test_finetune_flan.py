"""FLAN data: the Flan-collection reader and the FLAN-style mixture renderer (DESIGN §10)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from biglm.data.tables import TaskDataError
from biglm.finetune.tasks import flan as flan_module
from biglm.finetune.tasks.flan import MixtureTask, read_flan_collection, render_mixture
from biglm.finetune.templates import TemplateError

NLI_OPTIONS = ("yes", "it is not possible to tell", "no")  # FLAN's MNLI/ANLI option strings

# a miniature FLAN v2 template file: the real file's schema, patterns in FLAN's style
PATTERNS = {
    "mnli": [
        ["Premise: {premise}\n\nHypothesis: {hypothesis}\n\nDoes the premise entail the hypothesis?\n\n{options_}",
         "{answer}"],
        ["{premise}\n\nBased on that paragraph can we conclude that this sentence is true?\n{hypothesis}\n\n{options_}",
         "{answer}"],
        ["Generate a context and a hypothesis.", "Context: {premise}\n\nHypothesis: {hypothesis}"],
    ],
    "anli": [["{context}\n\nCan we conclude that \"{hypothesis}\"?\n\n{options_}", "{answer}"]],
    "bool_q": [["{title}\n\n{text}\n\nCan we conclude that {question}?\n\n{options_}", "{answer}"]],
    "xsum": [["Summarize:\n\n{text}\n\nSummary:", "{summary}"], ["Summarize this article:\n\n{text}", "{summary}"]],
}
HEADERS = ["", "OPTIONS:", "Possible answers:", "Choose from:"]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def flan_dir(tmp_path: Path) -> Path:
    (tmp_path / "templates_flan_v2.json").write_text(json.dumps(
        {"patterns": PATTERNS, "aliases": {}, "other_constants": {"OPT_START_STRING_CANDIDATES": HEADERS}}))
    _write_jsonl(tmp_path / "train" / "mnli.jsonl",
                 [{"premise": f"The cat sat on mat {i}.", "hypothesis": f"A cat sits {i}.", "label": i % 3}
                  for i in range(30)] + [{"premise": "p", "hypothesis": "h", "label": -1}])
    _write_jsonl(tmp_path / "train" / "anli.jsonl",
                 [{"context": f"Context {i}.", "hypothesis": f"Claim {i}.", "label": i % 3} for i in range(12)])
    _write_jsonl(tmp_path / "train" / "boolq.jsonl",
                 [{"title": f"T{i}", "passage": f"Passage {i}.", "question": f"is it {i}", "label": i % 2}
                  for i in range(12)])
    _write_jsonl(tmp_path / "train" / "xsum.jsonl",
                 [{"document": f"A long article number {i}.", "summary": f"Summary {i}."} for i in range(10)])
    return tmp_path


def _tasks(d: Path) -> list[MixtureTask]:
    return [
        MixtureTask("mnli", str(d / "train" / "mnli.jsonl"), label_words=NLI_OPTIONS),
        MixtureTask("anli_r1", str(d / "train" / "anli.jsonl"), label_words=NLI_OPTIONS),
        MixtureTask("bool_q", str(d / "train" / "boolq.jsonl"), field_map={"text": "passage"},
                    label_words=("no", "yes")),
        MixtureTask("xsum", str(d / "train" / "xsum.jsonl"), field_map={"text": "document"}),
    ]


def test_every_template_field_is_filled(flan_dir):
    mix = render_mixture(_tasks(flan_dir), templates_file=flan_dir / "templates_flan_v2.json", seed=0,
                         exclude_eval=[])
    assert mix.column_names == ["inputs", "targets", "task_name", "template_idx"]
    assert sorted(set(mix["task_name"])) == ["anli_r1", "bool_q", "mnli", "xsum"]
    assert len(mix) == 30 + 12 + 12 + 10  # the label -1 row is dropped
    for row in mix:
        assert "{" not in row["inputs"] and "}" not in row["inputs"], row
        assert "{" not in row["targets"] and row["targets"].strip(), row
    used = {(r["task_name"], r["template_idx"]) for r in mix}
    assert {("mnli", 0), ("mnli", 1), ("mnli", 2)} <= used  # random templates of the family, the inverted one too
    xsum = [r for r in mix if r["task_name"] == "xsum"]
    assert all(r["targets"].startswith("Summary ") and "A long article" in r["inputs"] for r in xsum)


def test_options_rendered_as_flan_2021(flan_dir):
    mix = render_mixture(_tasks(flan_dir)[:1], templates_file=flan_dir / "templates_flan_v2.json", seed=1,
                         exclude_eval=[])
    cls = [r for r in mix if r["template_idx"] in (0, 1)]
    assert cls
    for r in cls:
        # FLAN 2021: "OPTIONS:\n- " + "\n- ".join(options); the target is the option string of the label
        assert "OPTIONS:\n- yes\n- it is not possible to tell\n- no" in r["inputs"]
        assert r["targets"] in NLI_OPTIONS
    labels = {json.loads(line)["premise"]: json.loads(line)["label"]
              for line in (flan_dir / "train" / "mnli.jsonl").read_text().splitlines()}
    for r in cls:
        premise = next(p for p in labels if p in r["inputs"])
        assert r["targets"] == NLI_OPTIONS[labels[premise]]


def test_options_flan_v2_headers(flan_dir):
    mix = render_mixture(_tasks(flan_dir)[:1], templates_file=flan_dir / "templates_flan_v2.json", seed=0,
                         exclude_eval=[], options_style="flan_v2")
    seen = set()
    for r in mix:
        if r["template_idx"] == 2:
            continue
        block = "\n- yes\n- it is not possible to tell\n- no"
        assert block in r["inputs"]
        head = r["inputs"].split(block)[0].rsplit("\n", 1)[-1]
        assert head in HEADERS
        seen.add(head)
    assert len(seen) > 1  # the header is drawn per example


def test_deterministic_by_seed(flan_dir):
    file = flan_dir / "templates_flan_v2.json"
    a = render_mixture(_tasks(flan_dir), templates_file=file, seed=3, per_task=5, exclude_eval=[])
    b = render_mixture(_tasks(flan_dir), templates_file=file, seed=3, per_task=5, exclude_eval=[])
    c = render_mixture(_tasks(flan_dir), templates_file=file, seed=4, per_task=5, exclude_eval=[])
    assert a.to_list() == b.to_list()
    assert a.to_list() != c.to_list()
    assert len(a) == 20 and all(a["task_name"].count(t.name) == 5 for t in _tasks(flan_dir))


def test_eval_set_in_mixture_is_refused(flan_dir, tmp_path):
    eval_dir = tmp_path / "eval" / "aps__super_glue" / "boolq"
    eval_file = eval_dir / "validation.jsonl"
    shutil.copy(flan_dir / "train" / "boolq.jsonl", eval_dir.mkdir(parents=True) or eval_file)
    file = flan_dir / "templates_flan_v2.json"
    boolq = _tasks(flan_dir)[2]
    # the eval file itself, through a path that is not literally the same
    direct = MixtureTask("bool_q", str(eval_dir / ".." / "boolq" / "validation.jsonl"),
                         field_map={"text": "passage"}, label_words=("no", "yes"))
    with pytest.raises(TaskDataError, match="evaluation set .*boolq"):
        render_mixture([direct], templates_file=file, exclude_eval=[tmp_path / "eval"])
    # a copy elsewhere (same bytes), with the eval file given directly
    with pytest.raises(TaskDataError, match=f"evaluation set {eval_file}"):
        render_mixture([boolq], templates_file=file, exclude_eval=[eval_file])
    # an excluded task name, and a hub dataset in the eval folder's OWNER__NAME layout
    with pytest.raises(TaskDataError, match="evaluation set 'bool_q'"):
        render_mixture([boolq], templates_file=file, exclude_eval=["bool_q"])
    hub = MixtureTask("bool_q", "hf:aps/super_glue:boolq", split="validation", label_words=("no", "yes"))
    with pytest.raises(TaskDataError, match="aps__super_glue"):
        render_mixture([hub], templates_file=file, exclude_eval=[tmp_path / "eval"])
    # other tasks pass
    render_mixture(_tasks(flan_dir)[:2], templates_file=file, exclude_eval=[tmp_path / "eval"])


def test_a_partial_copy_of_an_evaluation_file_is_refused_row_by_row(flan_dir, shared_data, tmp_path):
    """Issue 19: the first 50 rows of BoolQ's validation file under another name (the whole-file check passes it)
    are refused, naming the set and the overlap count; so are rows copied with renamed columns and their text
    re-cased and re-punctuated among clean ones."""
    boolq = shared_data / "eval" / "aps__super_glue" / "boolq" / "validation.jsonl"
    rows = [json.loads(line) for line in boolq.read_text().splitlines()[:50]]
    part = _write_jsonl(tmp_path / "my_boolq_train.jsonl", rows)
    file = flan_dir / "templates_flan_v2.json"
    task = MixtureTask("bool_q", str(part), field_map={"text": "passage", "title": "question"},
                       label_words=("no", "yes"))
    with pytest.raises(TaskDataError, match=r"50 of its 50 rows overlap the evaluation set .*aps__super_glue/boolq "
                                            r"\(first: row 0\)"):
        render_mixture([task], templates_file=file, exclude_eval=[shared_data / "eval"])
    clean = [{"title": f"T{i}", "text": f"Passage number {i} about nothing.", "question": f"is it {i}", "label": i % 2}
             for i in range(20)]
    edited = [{"title": "", "text": r["passage"].upper().replace(",", " ,"), "question": r["question"] + "?",
               "label": int(r["label"])} for r in rows[10:15]]
    mixed = _write_jsonl(tmp_path / "mixed.jsonl", clean[:10] + edited + clean[10:])
    task = MixtureTask("bool_q", str(mixed), label_words=("no", "yes"))
    with pytest.raises(TaskDataError, match=r"5 of its 25 rows overlap the evaluation set .*boolq \(first: row 10\)"):
        render_mixture([task], templates_file=file, exclude_eval=[shared_data / "eval"])
    # the clean rows alone pass
    _write_jsonl(mixed, clean)
    assert len(render_mixture([task], templates_file=file, exclude_eval=[shared_data / "eval"])) == 20


def test_a_split_qualified_hub_name_of_an_evaluation_set_is_refused_under_any_owner(flan_dir, tmp_path):
    """Issue 19: hub sources are matched by dataset name and split, not by OWNER/NAME: @validation of an excluded
    set under another owner (or the benchmark's config published on its own) is refused, its train split is not."""
    _write_jsonl(tmp_path / "eval" / "aps__super_glue" / "boolq" / "validation.jsonl",
                 [{"question": "is it so", "passage": "It is so, said the passage.", "idx": 0, "label": 1}])
    file = flan_dir / "templates_flan_v2.json"
    for source, split in (("hf:someone/super_glue:boolq@validation", "train"), ("hf:super_glue:boolq", "validation"),
                          ("hf:google/boolq@validation", "train")):
        task = MixtureTask("bool_q", source, split=split, field_map={"text": "passage"}, label_words=("no", "yes"))
        with pytest.raises(TaskDataError, match=r"'validation' split of .*, whatever its owner, which is the "
                                                r"evaluation set .*aps__super_glue/boolq/validation.jsonl"):
            render_mixture([task], templates_file=file, exclude_eval=[tmp_path / "eval"])
    index = flan_module._EvalIndex.build([tmp_path / "eval", "hf:aps/super_glue:copa"])
    index.check(MixtureTask("bool_q", "hf:someone/super_glue:boolq@train"))  # a training split: allowed
    index.check(MixtureTask("cb", "hf:someone/super_glue:cb@validation"))  # not excluded
    with pytest.raises(TaskDataError, match="'train' split of x/super_glue:copa"):
        index.check(MixtureTask("copa", "hf:x/super_glue:copa"))  # an hf: entry without @SPLIT: every split
    with pytest.raises(TaskDataError, match="'validation' split of x/super_glue:boolq"):  # the OWNER__NAME folder
        flan_module._EvalIndex.build([tmp_path / "eval" / "aps__super_glue"]).check(
            MixtureTask("bool_q", "hf:x/super_glue:boolq@validation"))


def test_missing_evaluation_data_is_refused_saying_how_to_point_at_it(flan_dir, tmp_path, monkeypatch):
    """Issue 19: fail closed: no evaluation data to exclude is a refusal naming BIGLM_EVAL_DATA and exclude_eval,
    never a silently empty exclusion."""
    file = flan_dir / "templates_flan_v2.json"
    task = _tasks(flan_dir)[3]
    monkeypatch.setattr(flan_module, "_shared_eval_dir", lambda: tmp_path / "nowhere" / "eval")
    monkeypatch.delenv("BIGLM_EVAL_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./data/eval either
    with pytest.raises(TaskDataError, match=r"no evaluation data found .*nowhere/eval.*set BIGLM_EVAL_DATA=.*"
                                            r"exclude_eval: \[PATH"):
        render_mixture([task], templates_file=file)
    monkeypatch.setenv("BIGLM_EVAL_DATA", str(tmp_path / "moved"))
    with pytest.raises(TaskDataError, match=r"\$BIGLM_EVAL_DATA=.*moved is not a folder"):
        render_mixture([task], templates_file=file)
    with pytest.raises(TaskDataError, match=r"exclude_eval entry .*gone/eval: no such file or folder"):
        render_mixture([task], templates_file=file, exclude_eval=[str(tmp_path / "gone" / "eval")])
    # pointed at a folder that exists, the mixture renders
    _write_jsonl(tmp_path / "moved" / "baber__piqa" / "validation.jsonl", [{"goal": "g", "sol1": "a", "sol2": "b"}])
    assert len(render_mixture([task], templates_file=file)) == 10


def test_missing_template_field_is_refused(flan_dir):
    file = flan_dir / "templates_flan_v2.json"
    no_map = MixtureTask("bool_q", str(flan_dir / "train" / "boolq.jsonl"), label_words=("no", "yes"))
    with pytest.raises(TemplateError, match="template field 'text'.*bool_q"):
        render_mixture([no_map], templates_file=file, exclude_eval=[])
    no_options = MixtureTask("mnli", str(flan_dir / "train" / "mnli.jsonl"))
    with pytest.raises(TemplateError, match="label_words"):
        render_mixture([no_options], templates_file=file, exclude_eval=[])
    with pytest.raises(TemplateError, match="no FLAN template family 'nope'"):
        render_mixture([MixtureTask("nope", str(flan_dir / "train" / "mnli.jsonl"))], templates_file=file,
                       exclude_eval=[])


def test_flan_file_without_targets_is_refused(tmp_path):
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"inputs": "Q?", "answer": "A"}])
    with pytest.raises(TaskDataError, match=r"bad\.jsonl.*\['targets'\]"):
        read_flan_collection(bad)


def test_empty_targets_counted(tmp_path):
    f = _write_jsonl(tmp_path / "f.jsonl", [{"inputs": "a", "targets": "b", "task_name": "t"},
                                            {"inputs": "c", "targets": "  ", "task_name": "t"},
                                            {"inputs": "d", "targets": None, "task_name": "t"}])
    data = read_flan_collection(f)
    assert data.dropped_empty == 2 and data.dataset["inputs"] == ["a"]


def test_default_exclusion_covers_genset(shared_data):
    """With no exclude_eval, the default Genset file (WikiAuto, which --suite multitask generates on) is an
    evaluation set too: a mixture task reading it is refused, naming the file."""
    wikiauto = shared_data / "finetune" / "wikiauto" / "valid.jsonl"
    task = MixtureTask("wiki_auto", str(wikiauto), field_map={"text": "source"})
    with pytest.raises(TaskDataError, match="evaluation set .*wikiauto/valid.jsonl"):
        render_mixture([task], templates_file=shared_data / "finetune" / "flan" / "templates_flan_v2.json")


def test_read_flan_cot_tiny(shared_data):
    data = read_flan_collection(shared_data / "finetune" / "flan" / "flan_cot_tiny.jsonl")
    assert len(data.dataset) + data.dropped_empty == 2100
    assert {"inputs", "targets", "task_name"} <= set(data.dataset.column_names)
    names = set(data.dataset["task_name"])
    assert len(names) == 7 and "cot_gsm8k" in names and "stream_aqua" in names


def test_real_flan_v2_templates_render(shared_data, flan_dir):
    """The shared FLAN v2 file: every MNLI/ANLI/BoolQ pattern fills from our field maps."""
    mix = render_mixture(_tasks(flan_dir), templates_file=shared_data / "finetune" / "flan" / "templates_flan_v2.json",
                         seed=0, exclude_eval=[shared_data / "eval"])
    assert all("{" not in r["inputs"] for r in mix)
    assert len(set(mix["template_idx"])) > 3


@pytest.mark.parametrize("line, words", [
    ("per_task: lots", "spec.yaml: per_task expects int or none, got 'lots'"),
    ("seed: abc", "spec.yaml: seed expects int, got 'abc'"),
    ("options_style: flan3", "spec.yaml: options_style expects {flan2021|flan_v2}, got 'flan3'"),
    ("per_task: 0", "spec.yaml: per_task must be at least 1"),
    ("label_words: 3", "mixture task 'mnli': label_words expects a list of strings or null, got 3"),
    ("label_words: [yes, no]", "label_words expects a list of strings or null, got [True, False] (YAML reads yes/no"),
    ("field_map: {text: [a, b]}", "mixture task 'mnli': field_map expects a mapping of string to string"),
    ("template_indices: [first]", "template_indices expects a list of whole numbers or null, got ['first']"),
])
def test_mixture_spec_with_wrong_types_is_refused_in_one_line(flan_dir, tmp_path, monkeypatch, capsys, line, words):
    """A FLAN mixture spec's values are typed where the spec is read: one line naming the key, the value and the
    type wanted, before any run directory is made (not a TypeError from inside the run)."""
    from biglm.cli import main

    task_keys = line.startswith(("label_words", "field_map", "template_indices"))
    top, task = ("", f", {line}") if task_keys else (line + "\n", "")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"{top}exclude_eval: []\ntasks:\n  - {{name: mnli, source: train/mnli.jsonl{task}}}\n")
    work = tmp_path / "work"
    (work / "model").mkdir(parents=True)
    monkeypatch.chdir(work)
    assert main(["finetune", "flan", "--model", "model", "--task.mixture", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert words in err
    assert sorted(p.name for p in work.iterdir()) == ["model"]  # no runs/ folder holding a lock


def test_mixture_types_checked_from_python_too(flan_dir):
    from biglm.config import ConfigError

    with pytest.raises(ConfigError, match="mixture task 'mnli': label_words expects a list of strings or null, got 3"):
        MixtureTask("mnli", "x.jsonl", label_words=3)
    task = MixtureTask("mnli", "x.jsonl", label_words=NLI_OPTIONS, template_indices=["1"])
    assert task.label_words == NLI_OPTIONS and task.template_indices == [1]
    with pytest.raises(ConfigError, match="render_mixture: per_task expects int or none, got 'lots'"):
        render_mixture(_tasks(flan_dir), templates_file=flan_dir / "templates_flan_v2.json", per_task="lots",
                       exclude_eval=[])
