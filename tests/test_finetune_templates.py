"""Prompt templates: rendering, checks before work, label words against real tokenizers, YAML/FLAN/promptsource."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from biglm.finetune.templates import (
    MNLI_TEMPLATE,
    PromptTemplate,
    TemplateError,
    flan_template,
    load_template,
    promptsource_template,
)

PREMISE = {"premise": "A man plays a guitar.", "hypothesis": "A person makes music.", "label": 0}


@pytest.fixture(scope="module")
def bpe_tok():
    """Byte-level BPE that has learned " True", " False", " Neither", " yes", " no" as single tokens."""
    from biglm.data import train_tokenizer

    texts = [f"Answer: True. Answer: False. Answer: Neither. Say yes or no. Maybe {i}." for i in range(300)]
    return train_tokenizer(texts=texts, vocab_size=320)


@pytest.fixture(scope="module")
def lower_tok():
    """A lower-casing word-level tokenizer with <unk>: "True" and "true" collide, unknown words map to <unk>."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<pad>": 1, "true": 2, "false": 3, "not": 4, "sure": 5, "answer": 6, ":": 7}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")


def test_mnli_template_renders_prompt_and_label_word():
    prompt, target = MNLI_TEMPLATE.render(PREMISE, 2)
    assert prompt == "A man plays a guitar. Question: A person makes music. True, False or Neither? Answer:"
    assert target == " False"                      # the space before the slot moves into the label word
    assert prompt + target == ("A man plays a guitar. Question: A person makes music. True, False or Neither? "
                               "Answer: False")
    assert MNLI_TEMPLATE.targets == (" True", " Neither", " False")   # GLUE ids 0, 1, 2
    assert MNLI_TEMPLATE.fields == ("premise", "hypothesis")
    with pytest.raises(TemplateError, match="outside"):
        MNLI_TEMPLATE.render(PREMISE, 3)


def test_slot_without_space_keeps_the_word_bare():
    t = PromptTemplate(template="{text}\nAnswer:\n{answer}", label_words=("yes", "no"))
    assert t.render({"text": "Hi"}, 1) == ("Hi\nAnswer:\n", "no")


def test_template_structure_is_checked():
    with pytest.raises(TemplateError, match="exactly once"):
        PromptTemplate(template="{premise} no slot", label_words=("a", "b"))
    with pytest.raises(TemplateError, match="exactly once"):
        PromptTemplate(template="{answer} {premise} {answer}", label_words=("a", "b"))
    with pytest.raises(TemplateError, match="must end the template"):
        PromptTemplate(template="{premise} Answer: {answer}.", label_words=("a", "b"))
    with pytest.raises(TemplateError, match="more than one class"):
        PromptTemplate(template="{premise} {answer}", label_words=("yes", "yes"))
    with pytest.raises(TemplateError, match="at least 2"):
        PromptTemplate(template="{premise} {answer}", label_words=("yes",))
    with pytest.raises(TemplateError, match="quote it"):
        PromptTemplate(template="{premise} {answer}", label_words=(True, False))  # type: ignore[arg-type]


def test_check_fields_names_the_missing_field_and_the_data():
    MNLI_TEMPLATE.check_fields(["premise", "hypothesis", "label", "idx"])
    with pytest.raises(TemplateError) as e:
        MNLI_TEMPLATE.check_fields(["sentence1", "sentence2", "label"], source="data/rte.jsonl")
    msg = str(e.value)
    assert "data/rte.jsonl" in msg and "'premise'" in msg and "'hypothesis'" in msg and "field_map" in msg
    renamed = MNLI_TEMPLATE.with_field_map({"premise": "sentence1", "hypothesis": "sentence2"})
    renamed.check_fields(["sentence1", "sentence2", "label"])
    assert renamed.prompt({"sentence1": "A.", "sentence2": "B."}).startswith("A. Question: B.")


def test_template_naming_the_label_field_is_refused_before_any_work(tmp_path):
    """A prompt that reads the label column holds its own answer: refused in one line naming the field, by the
    template check, the data reader and the fine-tuning task (before reading any data)."""
    import json

    from biglm.finetune.tasks.classification import ClassificationSettings, ClassificationTask, load_classification

    leaky = PromptTemplate(template="{premise} {hypothesis} gold {label} Answer: {answer}", label_words=("a", "b", "c"))
    with pytest.raises(TemplateError, match=r"names the label field \{label\}") as e:
        leaky.check_label_free()
    assert "\n" not in str(e.value)
    MNLI_TEMPLATE.check_label_free("label")
    gold = PromptTemplate(template="{premise} ({gold}) Answer: {answer}", label_words=("a", "b"))
    gold.check_label_free("label")  # a column like any other unless it is the label column
    with pytest.raises(TemplateError, match=r"\{gold\}"):
        gold.check_label_free("gold")  # --task.label_field gold
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(PREMISE) + "\n")
    with pytest.raises(TemplateError, match=r"\{label\}"):
        load_classification(data, template=leaky)
    spec = tmp_path / "leaky.yaml"
    spec.write_text("template: '{premise} Question: {hypothesis} gold {label} Answer: {answer}'\n"
                    "label_words: ['True', 'Neither', 'False']\n")
    missing = str(tmp_path / "not_read.jsonl")  # the refusal comes before any file is opened
    with pytest.raises(TemplateError, match=r"\{label\}"):
        ClassificationTask(ClassificationSettings(train=missing, validation=missing, template=str(spec)))


def test_label_words_single_tokens_pass(bpe_tok):
    ids = MNLI_TEMPLATE.label_token_ids(bpe_tok)
    assert [len(x) for x in ids] == [1, 1, 1]
    assert [bpe_tok.convert_ids_to_tokens(list(x))[0] for x in ids] == ["ĠTrue", "ĠNeither", "ĠFalse"]
    # the ids are those of the label word inside the full text
    prompt, target = MNLI_TEMPLATE.render(PREMISE, 1)
    full = bpe_tok(prompt + target, add_special_tokens=False)["input_ids"]
    assert full[-1] == ids[1][0]


def test_multi_token_label_words_need_the_flag(bpe_tok):
    t = PromptTemplate(template="{premise} Answer: {answer}", label_words=("True", "Perhaps not"), name="rte")
    with pytest.raises(TemplateError, match=r"'Perhaps not' is \d+ tokens.*multi_token"):
        t.label_token_ids(bpe_tok)
    multi = PromptTemplate(template="{premise} Answer: {answer}", label_words=("True", "Perhaps not"),
                           multi_token=True)
    ids = multi.label_token_ids(bpe_tok)
    assert len(ids[0]) == 1 and len(ids[1]) > 1


def test_label_words_unknown_or_colliding_are_refused(lower_tok):
    ok = PromptTemplate(template="{x} answer : {answer}", label_words=("true", "false"))
    assert ok.label_token_ids(lower_tok) == ((2,), (3,))
    with pytest.raises(TemplateError, match="not in the tokenizer's vocabulary"):
        PromptTemplate(template="{x} {answer}", label_words=("true", "maybe")).label_token_ids(lower_tok)
    with pytest.raises(TemplateError, match="'True' and 'true' encode to the same token"):
        PromptTemplate(template="{x} {answer}", label_words=("True", "true")).label_token_ids(lower_tok)
    # multi-token words may share a first token (chain rule) but not the whole sequence
    shared = PromptTemplate(template="{x} {answer}", label_words=("not true", "not false"), multi_token=True)
    assert shared.label_token_ids(lower_tok) == ((4, 2), (4, 3))
    with pytest.raises(TemplateError, match="same token"):
        PromptTemplate(template="{x} {answer}", label_words=("Not sure", "not Sure"),
                       multi_token=True).label_token_ids(lower_tok)


# ---------------------------------------------------------------- YAML specs


def test_yaml_spec_round_trip_and_forms(tmp_path):
    spec = tmp_path / "mnli.yaml"
    spec.write_text(
        'name: mnli\n'
        'template: "{premise} Question: {hypothesis} True, False or Neither? Answer: {answer}"\n'
        'label_words: {0: "True", 1: "Neither", 2: "False"}\n'
        'label_names: [entailment, neutral, contradiction]\n'
    )
    t = load_template(spec)
    assert t.template == MNLI_TEMPLATE.template and t.label_words == MNLI_TEMPLATE.label_words
    assert t.label_names == ("entailment", "neutral", "contradiction") and t.source == str(spec)
    import yaml

    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(t.to_dict()))
    assert load_template(again).render(PREMISE, 0) == MNLI_TEMPLATE.render(PREMISE, 0)


@pytest.mark.parametrize("body, match", [
    ('template: "{p} {answer}"\nlabel_words: [True, False]\n', "quote it"),       # YAML booleans
    ('template: "{p} {answer}"\n', "label_words is missing"),
    ('template: "{p} {answer}"\nlabel_words: {1: a, 2: b}\n', "must be 0..1"),
    ('template: "{p} {answer}"\nlabel_words: [a, b]\nlabels: [x]\n', "unknown key"),
    ('label_words: [a, b]\n', "exactly one of template / flan / promptsource"),
    ('flan: {task: mnli}\nlabel_words: [a, b]\n', "task and index"),
    ('- not a mapping\n', "YAML mapping"),
])
def test_bad_yaml_specs_name_the_file_and_fix(tmp_path, body, match):
    spec = tmp_path / "bad.yaml"
    spec.write_text(body)
    with pytest.raises(TemplateError, match=match) as e:
        load_template(spec)
    assert str(spec) in str(e.value)


# ---------------------------------------------------------------- FLAN v2 and promptsource


def test_flan_v2_pattern_with_options(shared_data, tmp_path):
    flan = shared_data / "finetune" / "flan" / "templates_flan_v2.json"
    words = ("yes", "it is not possible to tell", "no")
    t = flan_template("mnli", 0, label_words=words, path=flan, multi_token=True)
    prompt, target = t.render({"premise": "P.", "hypothesis": "H."}, 1)
    assert prompt == ("Premise: P.\n\nHypothesis: H.\n\nDoes the premise entail the hypothesis?\n\n"
                      "OPTIONS:\n- yes\n- it is not possible to tell\n- no")
    assert target == " it is not possible to tell"
    assert t.fields == ("premise", "hypothesis")
    with pytest.raises(TemplateError, match="generation pattern"):
        flan_template("rte", 9, label_words=("yes", "no"), path=flan)          # "Generate a context and ..."
    with pytest.raises(TemplateError, match="no FLAN task"):
        flan_template("mnly", 0, label_words=("yes", "no"), path=flan)
    # the same through a YAML spec, with the file relative to the spec and a field map
    (tmp_path / "flan.json").write_bytes(flan.read_bytes())
    spec = tmp_path / "boolq.yaml"
    spec.write_text("flan: {task: bool_q, index: 0, file: flan.json}\nlabel_words: [no, yes]\n"
                    "field_map: {text: passage}\n")
    with pytest.raises(TemplateError, match="quote it"):     # YAML reads no/yes as booleans
        load_template(spec)
    spec.write_text('flan: {task: bool_q, index: 0, file: flan.json}\nlabel_words: ["no", "yes"]\n'
                    "field_map: {text: passage}\n")
    t = load_template(spec)
    assert t.fields == ("passage", "question") and t.name == "flan:bool_q:0"


@pytest.fixture(scope="module")
def promptsource_dir(tmp_path_factory):
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"   # beside the repository, as in CI
    tar = shared / "finetune" / "flan" / "promptsource_templates.tar.gz"
    if not tar.is_file():
        pytest.skip(f"{tar} not found")
    out = tmp_path_factory.mktemp("promptsource")
    wanted = ("glue/mnli/templates.yaml", "super_glue/boolq/templates.yaml")
    with tarfile.open(tar) as tf:
        members = [m for m in tf.getmembers() if m.name.endswith(wanted)]
        tf.extractall(out, members=members, filter="data")
    return {w.split("/")[1]: next(Path(out).rglob(w)) for w in wanted}


def test_promptsource_templates_convert(promptsource_dir):
    t = promptsource_template(promptsource_dir["mnli"], "GPT-3 style")
    assert t.template == "{premise}\nQuestion: {hypothesis} True, False, or Neither? {answer}"
    assert t.label_words == ("True", "Neither", "False")
    lit = promptsource_template(promptsource_dir["mnli"], "always/sometimes/never")   # {{"always"}} literals
    assert lit.prompt(PREMISE) == ('Suppose it\'s true that A man plays a guitar. Then, is "A person makes music." '
                                   "always, sometimes, or never true?")
    boolq = promptsource_template(promptsource_dir["boolq"], "GPT-3 Style")          # {% if label != -1 %} target
    assert boolq.render({"passage": "P.", "question": "q"}, 1) == ("P. \nQuestion: q\nAnswer:", " Yes")
    with pytest.raises(TemplateError, match="names:"):
        promptsource_template(promptsource_dir["mnli"], "no such template")


def test_promptsource_logic_is_refused(tmp_path):
    f = tmp_path / "templates.yaml"
    f.write_text(
        "dataset: toy\ntemplates:\n"
        "  a: !Template\n    answer_choices: No ||| Yes\n    id: a\n"
        "    jinja: '{% if x %}{{ p }}{% endif %} ||| {{ answer_choices[label] }}'\n    name: logic\n"
        "  b: !Template\n    answer_choices: No ||| Yes\n    id: b\n"
        "    jinja: '{{ p }} ||| {{ answer_choices[1 - label] }}'\n    name: flipped\n"
    )
    with pytest.raises(TemplateError, match="Jinja logic"):
        promptsource_template(f, "logic")
    with pytest.raises(TemplateError, match="not a classification template"):
        promptsource_template(f, "flipped")
