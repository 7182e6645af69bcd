"""The multitask suite (Table 5, biglm.scoring.multitask) on a random tiny model: the layout, the tasks the
SuperGLUE average covers (a task folder added in a temporary data dir joins it, an unknown one is skipped),
MMLU zero- and 5-shot, Genset's seeded instances and its BLEU-2 / Distinct-2, and bad input."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is the `eval` extra")

from biglm.integrations.lm_eval import run_multitask  # noqa: E402
from biglm.scoring.metrics import bleu2, distinct_n  # noqa: E402
from biglm.scoring.multitask import (  # noqa: E402
    SUPERGLUE_TASKS, GensetSpec, discover_superglue, genset_prompt, load_genset, multitask_table, parse_genset,
    run_genset, select_instances)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
WIKIAUTO = SHARED / "finetune" / "wikiauto" / "valid.jsonl"
SUBJECTS = ("anatomy", "astronomy")

# CommitmentBank rows in the hub schema of aps/super_glue "cb" (made up: CB is held out of the shared data)
CB_ROWS = [{"premise": f"Mary said that the {x} was on the table.", "hypothesis": f"the {x} was on the table",
            "idx": i, "label": i % 3} for i, x in enumerate(["cup", "book", "key", "pen", "hat", "box"])]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> SimpleNamespace:
    """Shared MMLU (two subjects) and every shared SuperGLUE folder, linked into a temporary hub-layout dir,
    plus an added `cb` folder, an unknown `axq` folder, and a small generation set of our own."""
    if not (SHARED / "eval" / "aps__super_glue").is_dir() or not WIKIAUTO.is_file():
        pytest.skip(f"shared data not found under {SHARED}")
    root = tmp_path_factory.mktemp("data")
    ev = root / "eval"
    for s in SUBJECTS:
        shutil.copytree(SHARED / "eval" / "cais__mmlu" / s, ev / "cais__mmlu" / s, copy_function=os.symlink)
    shutil.copytree(SHARED / "eval" / "aps__super_glue", ev / "aps__super_glue", copy_function=os.symlink)
    for name, rows in (("cb", CB_ROWS), ("axq", CB_ROWS[:2])):
        (ev / "aps__super_glue" / name).mkdir()
        (ev / "aps__super_glue" / name / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    para = root / "para.jsonl"
    para.write_text("".join(json.dumps({"q": f"how do I {v} a {o}?", "p": f"what is the way to {v} a {o}?"}) + "\n"
                            for v in ("fix", "paint", "sell") for o in ("bike", "door", "car")))
    return SimpleNamespace(eval=ev, para=para)


@pytest.fixture(scope="module")
def run(checkpoint, data, tmp_path_factory) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("out")
    sets = [GensetSpec(name="wikiauto", path=str(WIKIAUTO), source="source", target="references"),
            GensetSpec(name="para", path=str(data.para), source="q", target="p", prompt="Rephrase: {source}")]
    summary = run_multitask(checkpoint, data_dir=data.eval, gensets=sets, genset_n=3, genset_seed=7, limit=4,
                            decoding={"max_new_tokens": 8, "steps": 4}, output_path=out)
    return SimpleNamespace(summary=summary, out=out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_table_has_table5_layout_and_names_what_the_average_covers(run, checkpoint):
    s = run.summary
    lines = s["table"].splitlines()
    assert _cells(lines[0]) == ["Model", "MMLU ZS / FS", "SuperGLUE AVG ACC.", "Genset B-2 / D-2"]
    row = _cells(lines[2])
    assert row[0] == checkpoint.name
    zs, fs = (float(x) for x in row[1].split(" / "))
    assert (zs, fs) == (round(100 * s["mmlu"]["zero_shot"], 2), round(100 * s["mmlu"]["few_shot"], 2))
    assert float(row[2]) == round(100 * s["superglue"]["average"], 2)
    # the added cb folder joins the average; ReCoRD and RTE are absent and named as such
    assert ("- SuperGLUE average over 6 of 8 tasks: BoolQ, CB, COPA, MultiRC, WiC, WSC (absent: ReCoRD, RTE)."
            in lines)
    assert "- limit=4 documents per lm-eval task: a quick check, not a reportable number." in lines
    assert (run.out / "multitask.md").read_text() == s["table"] + "\n"


def test_table_of_selected_columns_says_what_did_not_run(run):
    """--suite_tasks Genset: the table does not call the unselected SuperGLUE tasks "absent" nor MMLU "0 subjects"."""
    s = {**run.summary, "parts": ["Genset"], "mmlu": {"zero_shot": None, "few_shot": None, "fewshot": 5, "subjects": []},
         "superglue": {"average": None, "covered": [], "tasks": {}, "metrics": {}}}
    lines = multitask_table(s).splitlines()
    assert _cells(lines[2])[1:3] == ["— / —", "—"]
    assert not any(line.startswith(("- MMLU", "- SuperGLUE")) for line in lines)
    assert "- not run (not among the selected columns): MMLU, SuperGLUE." in lines
    assert any(line.startswith("- Genset: wikiauto (3), para (3), seed 7") for line in lines)


def test_superglue_average_is_the_mean_over_the_tasks_found(run):
    sg = run.summary["superglue"]
    assert sg["covered"] == ["boolq", "cb", "copa", "multirc", "wic", "wsc.fixed"]
    values = [sg["tasks"][c] for c in sg["covered"]]
    assert all(v in (0.0, 0.25, 0.5, 0.75, 1.0) for v in values)  # limit=4 documents each
    assert sg["average"] == pytest.approx(sum(values) / len(values))
    zero = run.summary["lm_eval"]["zero_shot"]
    assert zero["results"]["cb_local"]["acc,none"] == sg["tasks"]["cb"]
    skipped = run.summary["skipped"]
    assert "unknown SuperGLUE config" in skipped["SuperGLUE axq"]
    assert "wsc.fixed" in skipped["SuperGLUE wsc"]  # the unfixed copy is not scored twice


def test_mmlu_runs_zero_and_five_shot_near_chance(run):
    mm, lm = run.summary["mmlu"], run.summary["lm_eval"]
    assert mm["subjects"] == list(SUBJECTS)
    subjects = {f"mmlu_{s}_local" for s in SUBJECTS}  # lm-eval also lists the group (mmlu_local) in n-shot
    assert {k: v for k, v in lm["zero_shot"]["n-shot"].items() if k in subjects} == dict.fromkeys(subjects, 0)
    assert {k: v for k, v in lm["few_shot"]["n-shot"].items() if k in subjects} == dict.fromkeys(subjects, 5)
    # a random model: 8 four-way questions, chance 0.25 (a 0.75 would be 6 of 8 right by luck)
    assert 0.0 <= mm["zero_shot"] <= 0.625 and 0.0 <= mm["few_shot"] <= 0.625


def test_genset_instances_and_scores(run, data):
    gs = run.summary["genset"]
    assert [s["name"] for s in gs["sets"]] == ["wikiauto", "para"]
    wiki, para = gs["sets"]
    assert wiki["rows"] == 2000 and para["rows"] == 9
    assert wiki["indices"] == select_instances(2000, n=3, seed=7)
    assert para["indices"] == select_instances(9, n=3, seed=7)
    rows = [json.loads(line) for line in data.para.read_text().splitlines()]
    for inst in para["instances"]:
        assert inst["prompt"] == "Rephrase: " + rows[inst["index"]]["q"]  # no chat template: the plain prompt
        assert inst["references"] == [rows[inst["index"]]["p"]]
    outputs = [i["output"] for s in gs["sets"] for i in s["instances"]]
    refs = [i["references"] for s in gs["sets"] for i in s["instances"]]
    assert gs["bleu2"] == bleu2(predictions=outputs, references=refs)
    try:
        expected = distinct_n(outputs=outputs, n=2) / 100
    except ValueError:
        expected = None
    assert gs["distinct2"] == expected
    saved = json.loads((run.out / "multitask.json").read_text())
    assert saved["genset"]["sets"][0]["indices"] == wiki["indices"] and saved["superglue"]["covered"] == \
        run.summary["superglue"]["covered"]


def test_the_same_100_instances_for_a_seed():
    first = select_instances(2000, n=100, seed=0)
    assert first == select_instances(2000, n=100, seed=0)
    assert len(set(first)) == 100 and first == sorted(first) and 0 <= first[0] and first[-1] < 2000
    assert first != select_instances(2000, n=100, seed=1)
    assert select_instances(5, n=100, seed=0) == [0, 1, 2, 3, 4]  # a small set is taken whole
    if WIKIAUTO.is_file():
        spec = GensetSpec(name="wikiauto", path=str(WIKIAUTO), source="source", target="references")
        a, b = load_genset(spec, n=100, seed=0), load_genset(spec, n=100, seed=0)
        assert a.indices == b.indices == first and a.sources == b.sources and len(a.references[0]) == 8


def test_prompt_goes_through_the_chat_template_when_the_model_has_one(checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    spec = GensetSpec(name="wikiauto", path="unused.jsonl", source="s", target="t")
    assert genset_prompt(tok, spec, "A b.") == "Simplify the following sentence:\n\nA b."
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<answer>{% endif %}")
    assert genset_prompt(tok, spec, "A b.") == "<user>Simplify the following sentence:\n\nA b.<answer>"


def test_genset_specs_parse_and_bad_ones_are_named(tmp_path):
    (s,) = parse_genset("qqp:hf:glue:qqp@validation:question1:question2")
    assert (s.name, s.path, s.source, s.target) == ("qqp", "hf:glue:qqp@validation", "question1", "question2")
    assert s.prompt == "Paraphrase the following question:\n\n{source}"
    spec_file = tmp_path / "sets.yaml"
    spec_file.write_text("- {name: chat, path: c.jsonl, source: history, target: reply, prompt: 'Reply: {source}'}\n")
    (c,) = parse_genset(str(spec_file))
    assert (c.name, c.prompt) == ("chat", "Reply: {source}")
    with pytest.raises(ValueError, match="NAME:PATH:SOURCE:TARGET"):
        parse_genset("wikiauto:valid.jsonl")
    with pytest.raises(ValueError, match="has no {source}"):
        GensetSpec(name="x", path="x.jsonl", source="a", target="b", prompt="Simplify:")
    table = tmp_path / "t.jsonl"
    table.write_text(json.dumps({"src": "a b c", "tgt": "a b"}) + "\n" + json.dumps({"src": "d e", "tgt": ""}) + "\n")
    with pytest.raises(ValueError, match="no field 'target'.*fields: src, tgt"):
        load_genset(GensetSpec(name="x", path=str(table), source="src", target="target"), n=2, seed=0)
    with pytest.raises(ValueError, match="row 1 .* empty 'tgt'"):
        load_genset(GensetSpec(name="x", path=str(table), source="src", target="tgt"), n=2, seed=0)


# PersonaChat's hub schema (bavard/personachat_truecased): personality and history are lists, the gold reply is
# the last candidate
PERSONA_ROWS = [{"personality": [f"i have {k} cats.", "i like to ski."],
                 "history": [f"hi there {k}", "hello! how are you?"], "candidates": ["i am a robot.", f"great, my {k} cats are asleep."], "conv_id": k} for k in range(5)]


@pytest.mark.parametrize("form", ["yaml", "colon"])
def test_genset_templates_read_dialogue_rows_with_list_fields(tmp_path, form):
    """Issue 19: a Genset source/target may be a template over the row's fields, a list field's items joined by
    newlines, given in a YAML file or in the NAME:PATH:SOURCE:TARGET form (\\n a newline, \\: a colon)."""
    table = tmp_path / "personachat.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in PERSONA_ROWS))
    if form == "yaml":
        spec_file = tmp_path / "sets.yaml"
        spec_file.write_text(f"- name: personachat\n  path: {table}\n"
                             '  source: "Persona: {personality}\\nDialogue: {history}"\n'
                             '  target: "{candidates[-1]}"\n')
        (spec,) = parse_genset(str(spec_file))
    else:
        (spec,) = parse_genset(f"personachat:{table}:Persona\\: {{personality}}\\nDialogue\\: {{history}}:"
                               "{candidates[-1]}")
    assert spec.source == "Persona: {personality}\nDialogue: {history}" and spec.target == "{candidates[-1]}"
    sample = load_genset(spec, n=2, seed=0)
    k = sample.indices[0]
    assert sample.sources[0] == (f"Persona: i have {k} cats.\ni like to ski.\n"
                                 f"Dialogue: hi there {k}\nhello! how are you?")
    assert sample.references[0] == [f"great, my {k} cats are asleep."]
    assert spec.prompt.replace("{source}", sample.sources[0]).startswith("Continue the conversation:\n\nPersona: ")
    # a plain field name keeps working, a list field as the source joined by newlines
    (plain,) = parse_genset(f"chat:{table}:history:candidates")
    plain_sample = load_genset(plain, n=1, seed=0)
    i = plain_sample.indices[0]
    assert plain_sample.sources == [f"hi there {i}\nhello! how are you?"]
    assert plain_sample.references == [["i am a robot.", f"great, my {i} cats are asleep."]]


def test_genset_template_with_an_unknown_field_is_refused_before_reading_rows(tmp_path):
    table = tmp_path / "personachat.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in PERSONA_ROWS))
    (spec,) = parse_genset(f"pc:{table}:{{persona}}\\n{{history}}:{{candidates[-1]}}")
    with pytest.raises(ValueError, match=r"no field 'persona' \(named by its source template .*fields: personality, "
                                         r"history, candidates, conv_id"):
        load_genset(spec, n=2, seed=0)
    with pytest.raises(ValueError, match=r"conv_id.* is not a list with an item 0"):
        load_genset(GensetSpec(name="pc", path=str(table), source="history", target="{conv_id[0]}"), n=1, seed=0)
    with pytest.raises(ValueError, match="has a '{' without '}'"):
        GensetSpec(name="pc", path=str(table), source="{history", target="candidates")
    with pytest.raises(ValueError, match=r"unknown escape \\x"):
        parse_genset(f"pc:{table}:{{history}}\\x:candidates")


def test_discovery_skips_what_it_cannot_score(tmp_path):
    sg = tmp_path / "aps__super_glue"
    for name in ("wsc", "axb", "rte", "newtask"):
        (sg / name).mkdir(parents=True)
    (sg / "wsc" / "validation.jsonl").write_text("{}\n")
    (sg / "newtask" / "validation.jsonl").write_text("{}\n")
    found, skipped = discover_superglue(tmp_path)
    # the unfixed wsc copy stands in for wsc.fixed when that is absent; rte has no validation file
    assert [(t.config, folder.name) for t, folder in found] == [("wsc.fixed", "wsc")]
    assert set(skipped) == {"axb", "rte", "newtask"} and "validation.jsonl" in skipped["rte"]
    assert "diagnostic" in skipped["axb"] and "unknown SuperGLUE config" in skipped["newtask"]
    assert len(SUPERGLUE_TASKS) == 8


@pytest.mark.parametrize("extra, needle", [
    (["--num_fewshot", "5"], "drop --num_fewshot"),
    (["--suite_tasks", "MMLU,Genst"], "unknown multitask part(s) Genst"),
    (["--genset", "w:/no/such.jsonl:source:references"], "no file /no/such.jsonl"),
    (["--genset_n", "0"], "--genset_n=0 must be >= 1"),
])
def test_cli_refuses_bad_multitask_options_before_loading(checkpoint, capsys, extra, needle):
    from biglm.scoring.cli import main

    assert main(["--suite", "multitask", "--model_args", f"pretrained={checkpoint}", *extra]) == 2
    assert needle in capsys.readouterr().err


def test_cli_refuses_multitask_options_elsewhere(checkpoint, capsys):
    from biglm.scoring.cli import main

    assert main(["--suite", "paper", "--model_args", f"pretrained={checkpoint}", "--genset_decoding.steps", "4"]) == 2
    assert "--genset_decoding only applies with --suite multitask" in capsys.readouterr().err


@pytest.fixture
def saved_decoding_model(checkpoint, tmp_path) -> Path:
    """The tiny model saved as a fine-tuning export records its decoding: 5 answer slots, 2 steps (not the
    defaults' 64 and the strategy's)."""
    model = tmp_path / "ft"
    shutil.copytree(checkpoint, model)
    config = json.loads((model / "config.json").read_text())
    config["task_specific_params"] = {"seq2seq": {"max_new_tokens": 5, "steps": 2, "length_beam": 1}}
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_genset_decodes_with_the_models_saved_decoding(saved_decoding_model, tmp_path, monkeypatch, capsys):
    """A fine-tuned model is decoded at the length and steps it was saved with (FLAN models train 192 EOS-padded
    slots), in the Python API and from `biglm eval`; an option given explicitly still wins over the saved one."""
    import biglm.generation
    from biglm.checkpoint import load_model
    from biglm.scoring.cli import main

    para = tmp_path / "para.jsonl"
    para.write_text("".join(json.dumps({"q": f"how do I fix a {o}?", "p": f"what fixes a {o}?"}) + "\n"
                            for o in ("bike", "door", "car")))
    spec = GensetSpec(name="para", path=str(para), source="q", target="p")
    calls = []
    generate = biglm.generation.generate
    monkeypatch.setattr(biglm.generation, "generate", lambda *a, config, **k: calls.append(config) or
                        generate(*a, config=config, **k))
    model, tok = load_model(str(saved_decoding_model))
    result = run_genset(model, tok, load_genset(spec, n=3, seed=0))
    assert calls and all((c.max_new_tokens, c.steps, c.length_beam) == (5, 2, 1) for c in calls)
    assert (result["decoding"]["max_new_tokens"], result["decoding"]["steps"]) == (5, 2)

    out = tmp_path / "out"
    assert main(["--suite", "multitask", "--suite_tasks", "Genset", "--genset", f"para:{para}:q:p", "--genset_n", "3",
                 "--model_args", f"pretrained={saved_decoding_model}", "--genset_decoding.steps", "3",
                 "--output_path", str(out)]) == 0
    decoding = json.loads((out / "multitask.json").read_text())["genset"]["decoding"]
    assert (decoding["max_new_tokens"], decoding["steps"]) == (5, 3)  # saved length, the given steps
    assert "- Genset decoding: mask-predict, 5 answer slots, steps 3" in (out / "multitask.md").read_text()
    capsys.readouterr()
    assert main(["--suite", "multitask", "--suite_tasks", "Genset", "--genset", f"para:{para}:q:p",
                 "--model_args", f"pretrained={saved_decoding_model}", "--genset_decoding.strategy", "confidence",
                 "--genset_decoding.draft_length", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "steps=2" in err and "--genset_decoding.steps none" in err, err
