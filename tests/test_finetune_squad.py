"""SQuAD extractive QA: the span head's loss is the hand-computed BERT loss, a random model scores low while the
fine-tuning loop overfits ~100 questions, and the exported model answers through AutoModelForQuestionAnswering and
pipeline("question-answering") exactly as the task's own prediction does. The data is written by the tests
(SQuAD's official JSON layout), so none of them needs ../shared."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import biglm  # noqa: F401  (registers the Auto classes and the question-answering pipeline)
from biglm.cli import main as biglm_main
from biglm.config import ConfigError
from biglm.finetune.config import FinetuneConfig
from biglm.finetune.loop import FineTuner
from biglm.finetune.tasks.squad import SquadSettings, SquadTask
from biglm.model import BiGLMConfig, BiGLMForMaskedLM, BiGLMForQuestionAnswering
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
CPU = torch.device("cpu")
PLACES = ["Elmsworth", "Harrowgate", "Kingsmere", "Lowden", "Marbury", "Northwick", "Oakhurst", "Redcliff",
          "Stonebridge", "Thornbury", "Westmoor", "Yarrow", "Ashby", "Brackley", "Coldwater", "Dunmere", "Eastleigh",
          "Fernhill", "Glenmoor", "Hawkridge", "Ivybridge", "Juniper", "Kestrel", "Larkspur", "Millbrook", "Norland"]
FIRST = ["Aldric", "Brenna", "Cedric", "Dalia", "Edmund", "Freya", "Gideon", "Helga", "Ivor", "Jora", "Kendrick",
         "Liora", "Magnus", "Nadia", "Osric", "Petra"]
LAST = ["Ashford", "Blackwood", "Carrow", "Dunmore", "Everly", "Fairholm", "Greystone", "Hollis"]
RIVERS = ["Avon", "Severn", "Tamar", "Wye", "Usk", "Exe", "Tees", "Ouse"]
TOPICS = ["old maps", "medieval armour", "local pottery", "glass and silver", "rare clocks", "painted ships"]


def _article(place: str, rng: random.Random) -> dict:
    """One SQuAD article: a paragraph about a castle and six questions, two of each answer kind (year, person)."""
    y1, y2 = rng.randint(1100, 1499), rng.randint(1600, 1899)
    builder, restorer = (f"{rng.choice(FIRST)} {rng.choice(LAST)}" for _ in range(2))
    river, topic, side = rng.choice(RIVERS), rng.choice(TOPICS), rng.choice(["north", "south", "east", "west"])
    context = (f"{place} Castle stands on the {side} bank of the River {river}. It was built in {y1} by {builder} "
               f"and was restored in {y2} by {restorer}. Today the castle houses a museum of {topic}.")
    qas = [(f"When was {place} Castle built?", str(y1), 0),
           (f"In which year was {place} Castle restored?", str(y2), 0),
           (f"Who built {place} Castle?", builder, context.index("built in")),
           (f"Who restored {place} Castle?", restorer, context.index("restored in")),
           (f"Which river flows past {place} Castle?", river, context.index("River")),
           (f"What does {place} Castle house today?", f"a museum of {topic}", 0)]
    out = [{"id": f"{place.lower()}-{i}", "question": question,
            "answers": [{"text": answer, "answer_start": context.index(answer, after)}]}
           for i, (question, answer, after) in enumerate(qas)]
    return {"title": f"{place} Castle", "paragraphs": [{"context": context, "qas": out}]}


def _squad(places: list[str], seed: int) -> dict:
    rng = random.Random(seed)
    return {"version": "1.1", "data": [_article(p, rng) for p in places]}


@pytest.fixture(scope="module")
def squad(tmp_path_factory):
    """train.json (18 articles, 108 questions), dev.json (8 other articles, 48 questions), a tokenizer trained on
    them and a random tiny BiGLM saved with it (root/model)."""
    from conftest import save_random_model

    from biglm.data import train_tokenizer

    root = tmp_path_factory.mktemp("squad")
    train, dev = _squad(PLACES[:18], seed=1), _squad(PLACES[18:], seed=2)
    (root / "train.json").write_text(json.dumps(train))
    (root / "dev.json").write_text(json.dumps(dev))
    texts = [p["context"] + " " + " ".join(q["question"] for q in p["qas"])
             for d in (train, dev) for a in d["data"] for p in a["paragraphs"]]
    tok = train_tokenizer(texts=texts * 3, vocab_size=700)
    save_random_model(root / "model", tok, max_position_embeddings=256)
    return root


def _task(root: Path, **kw) -> SquadTask:
    kw.setdefault("validation", str(root / "dev.json"))
    return SquadTask(SquadSettings(train=str(root / "train.json"), max_length=128, stride=32, max_question_tokens=24,
                                   **kw), name="toy-squad")


def _prepared(root: Path, **kw) -> tuple[SquadTask, BiGLMForQuestionAnswering, object]:
    from biglm.checkpoint import load_model

    task = _task(root, **kw)
    base, tok = load_model(root / "model")
    task.prepare(tok)
    torch.manual_seed(0)
    return task, task.build_model(base, tok).eval(), tok


@pytest.fixture(scope="module")
def trained(squad, tmp_path_factory):
    """The fine-tuning loop on the 108 training questions, validated on those same questions; OUT/best exported."""
    out = tmp_path_factory.mktemp("run")
    task = _task(squad, validation=str(squad / "train.json"))
    cfg = FinetuneConfig(model=str(squad / "model"), out_dir=str(out), epochs=20, lr=3e-3, global_batch=6,
                         micro_batch=6, warmup_ratio=0.05, weight_decay=0.0, log_every=1000, eval_batch_size=64)
    tuner = FineTuner(task, cfg, info=SINGLE, echo=lambda s: None)
    before = tuner.evaluate()
    result = tuner.train()
    return task, tuner, before, result, out


# ---------------------------------------------------------------- the model and its loss


def test_loss_is_the_mean_of_start_and_end_cross_entropy_summed_over_windows(squad):
    task, model, _ = _prepared(squad)
    feats = [task.train_features()[i] for i in (0, 7, 13)]
    assert len({len(f["input_ids"]) for f in feats}) > 1  # padding is exercised
    batch = task.collate(feats, device=CPU)
    assert batch["num_items"] == 3 and batch["input_ids"].shape == (3, max(len(f["input_ids"]) for f in feats))
    with torch.no_grad():
        got = task.loss(model, batch)
        by_hand = 0.0
        for f in feats:  # each window alone, unpadded: log-softmax over its own positions
            h = model.model(torch.as_tensor(f["input_ids"], dtype=torch.long)[None]).last_hidden_state[0]
            logits = h @ model.qa_outputs.weight.T  # (L, 2)
            by_hand += -(F.log_softmax(logits[:, 0], 0)[f["start_positions"]]
                         + F.log_softmax(logits[:, 1], 0)[f["end_positions"]]) / 2
        mean = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "start_positions", "end_positions")}).loss
    torch.testing.assert_close(got, by_hand, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, by_hand / 3, rtol=1e-5, atol=1e-5)
    assert any(f["start_positions"] > 0 for f in feats)  # real answer positions, not only the (0, 0) label


def test_padding_takes_no_probability_and_token_type_ids_are_ignored(squad):
    task, model, _ = _prepared(squad)
    f = task.train_features()[0]
    ids = torch.tensor([list(f["input_ids"]) + [0] * 5])
    mask = torch.tensor([[1] * len(f["input_ids"]) + [0] * 5])
    with torch.no_grad():
        alone = model(torch.as_tensor(f["input_ids"], dtype=torch.long)[None])
        padded = model(ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
    n = len(f["input_ids"])
    torch.testing.assert_close(padded.start_logits[0, :n], alone.start_logits[0], rtol=1e-5, atol=1e-5)
    assert torch.softmax(padded.end_logits, -1)[0, n:].sum() == 0


def test_from_masked_lm_reuses_the_encoder_and_adds_only_the_head(squad):
    from biglm.checkpoint import load_model

    mlm, _ = load_model(squad / "model")
    qa = BiGLMForQuestionAnswering.from_masked_lm(mlm)
    enc = mlm.model.state_dict()
    assert set(qa.state_dict()) == {f"model.{k}" for k in enc} | {"qa_outputs.weight"}
    for k, v in enc.items():
        assert torch.equal(qa.state_dict()[f"model.{k}"], v)
    assert qa.model.embed_tokens.weight.data_ptr() != mlm.model.embed_tokens.weight.data_ptr()  # a copy
    assert qa.config.architectures == ["BiGLMForQuestionAnswering"] != mlm.config.architectures


def test_windows_longer_than_the_model_are_refused_before_training(squad):
    from biglm.checkpoint import load_model

    task = _task(squad)
    base, tok = load_model(squad / "model")
    task.prepare(tok)
    base.config.max_position_embeddings = 32
    with pytest.raises(ConfigError, match="max_position_embeddings is 32"):
        task.build_model(base, tok)


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="split_by_article"):
        SquadTask(SquadSettings(train="x.json", split_by_article=1.5))
    with pytest.raises(ConfigError, match="max_length"):
        SquadTask(SquadSettings(train="x.json", max_length=100, stride=64))
    with pytest.raises(ConfigError, match="validation"):
        SquadTask(SquadSettings(train="x.json", validation=""))


def test_split_by_article_holds_out_whole_articles(squad):
    task, _, _ = _prepared(squad, validation="", split_by_article=0.25)
    val_titles = {i.split("-")[0] for i in task.eval_examples["id"]}
    assert len(val_titles) == round(0.25 * 18) and task.describe()["train_examples"] == 108 - 6 * len(val_titles)
    assert task.describe()["validation_examples"] == 6 * len(val_titles)
    train_contexts = {tuple(f["input_ids"][-40:]) for f in task.train_features()}
    val_contexts = {tuple(ids[-40:]) for ids in task.eval_features["input_ids"]}
    assert not train_contexts & val_contexts


# ---------------------------------------------------------------- the task learns, and the metric can tell


def test_a_random_model_scores_low_while_the_loop_overfits_the_training_questions(squad, trained):
    task, model, _ = _prepared(squad)  # validation = the 48 dev questions
    random_dev = task.evaluate(model, batch_size=16, device=CPU)
    _, _, before, result, out = trained
    assert random_dev["examples"] == 48 and random_dev["exact_match"] < 15, random_dev
    assert before["examples"] == 108 and before["exact_match"] < 15, before
    assert result.best >= 90 and dict(result.evals)[result.best_epoch]["exact_match"] >= 90, result.evals
    assert (out / "best" / "config.json").is_file() and (out / "best" / "biglm_task.json").is_file()


# ---------------------------------------------------------------- export: Auto class and pipeline


def test_exported_best_epoch_loads_with_the_auto_class_and_scores_as_in_training(trained):
    from transformers import AutoModelForQuestionAnswering

    task, _, _, result, out = trained
    loaded = AutoModelForQuestionAnswering.from_pretrained(out / "best").eval()
    assert isinstance(loaded, BiGLMForQuestionAnswering)
    assert loaded.config.task_specific_params["question-answering"] == task.pipeline_params()
    scores = task.evaluate(loaded, batch_size=32, device=CPU)
    assert scores == pytest.approx(dict(result.evals)[result.best_epoch])  # the best epoch's model, exported


def test_pipeline_answers_exactly_as_the_task_predicts(trained):
    from transformers import pipeline

    task, _, _, _, out = trained
    qa = pipeline("question-answering", model=str(out / "best"), tokenizer=str(out / "best"))
    model = qa.model
    preds = task.predict(model, batch_size=32, device=CPU)
    ex = task.eval_examples
    picks = list(range(0, len(ex["id"]), 9))
    for i in picks:
        got = qa(question=ex["question"][i], context=ex["context"][i])
        want = preds[ex["id"][i]]
        assert (got["answer"], got["start"], got["end"]) == (want.text, want.start_char, want.end_char)
        assert 0.0 < got["score"] <= 1.0
    # the list form, batched windows
    many = qa([{"question": ex["question"][i], "context": ex["context"][i]} for i in picks], batch_size=4)
    assert [m["answer"] for m in many] == [preds[ex["id"][i]].text for i in picks]
    assert sum(m["answer"] in ex["answers"][i]["text"] for m, i in zip(many, picks)) >= len(picks) - 1
    with pytest.raises(ValueError, match="top_k"):
        qa(question=ex["question"][0], context=ex["context"][0], top_k=3)


def test_pipeline_with_several_windows_per_question_matches_the_task(squad, trained):
    """Short windows (2+ per context): the pipeline's search over windows is the task's postprocessing."""
    from transformers import pipeline

    _, _, _, _, out = trained
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out / "best")
    task = SquadTask(SquadSettings(train=str(squad / "train.json"), validation=str(squad / "dev.json"), max_length=40,
                                   stride=12, max_question_tokens=16, max_answer_tokens=8, n_best=5))
    task.prepare(tok)
    ex = task.eval_examples
    assert len(task.eval_features["input_ids"]) >= 2 * len(ex["id"])
    qa = pipeline("question-answering", model=str(out / "best"), tokenizer=str(out / "best"))
    preds = task.predict(qa.model, batch_size=64, device=CPU)
    picks = list(range(0, len(ex["id"]), 7))
    got = qa(question=[ex["question"][i] for i in picks], context=[ex["context"][i] for i in picks], max_seq_len=40,
             doc_stride=12, max_question_len=16, max_answer_len=8, n_best=5, batch_size=3)
    assert [g["answer"] for g in got] == [preds[ex["id"][i]].text for i in picks]
    first = {}
    for w, ex_id in enumerate(task.eval_features["example_id"]):
        first.setdefault(ex_id, w)
    assert any(preds[ex["id"][i]].window > first[ex["id"][i]] for i in picks)  # found past a question's first window


def test_cli_finetunes_squad_split_by_article_and_exports_a_pipeline_model(squad, tmp_path, capsys):
    from transformers import pipeline

    assert biglm_main(["tasks"]) == 0 and "squad" in capsys.readouterr().out
    out = tmp_path / "run"
    args = ["finetune", "squad", "--model", str(squad / "model"), "--task.train", str(squad / "train.json"),
            "--task.split_by_article", "0.25", "--task.max_length", "96", "--task.stride", "32",
            "--task.max_question_tokens", "24", "--epochs", "1", "--global_batch", "6", "--micro_batch", "3", "--lr",
            "1e-3", "--out_dir", str(out)]
    assert biglm_main(args) == 0
    printed = capsys.readouterr().out
    assert "epoch 1 | validation: exact_match" in printed and "best epoch by f1" in printed
    described = json.loads((out / "task.json").read_text())
    assert described["kind"] == "squad" and described["validation_examples"] == 6 * round(0.25 * 18)
    assert biglm_main(["export", str(out), str(tmp_path / "hf")]) == 0
    qa = pipeline("question-answering", model=str(tmp_path / "hf"))
    answer = qa(question="Who built Norland Castle?", context=json.loads((squad / "dev.json").read_text())
                ["data"][-1]["paragraphs"][0]["context"])
    assert set(answer) == {"score", "start", "end", "answer"}
    assert biglm_main(["finetune", "squad", "--model", str(squad / "model"), "--task.split_by_artcle", "0.2"]) == 2
    assert "split_by_article" in capsys.readouterr().err


def test_shared_dev_file_loads_and_a_random_model_scores_near_zero(shared_data, tmp_path):
    from biglm.data import train_tokenizer

    path = shared_data / "finetune" / "squad_v1.1" / "dev-v1.1.reconstructed.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    data = json.loads(path.read_text())["data"]
    texts = [p["context"] for a in data[:3] for p in a["paragraphs"]]
    tok = train_tokenizer(texts=texts, vocab_size=600)
    torch.manual_seed(0)
    config = BiGLMConfig.from_preset("tiny", vocab_size=len(tok), max_position_embeddings=512)
    task = SquadTask(SquadSettings(train=str(path), split_by_article=0.1, max_eval_examples=40, max_train_examples=40))
    task.prepare(tok)
    model = task.build_model(BiGLMForMaskedLM(config), tok).eval()
    scores = task.evaluate(model, batch_size=8, device=CPU)
    assert scores["examples"] == 40 and scores["exact_match"] < 15 and scores["f1"] < 30
    assert np.isfinite(scores["f1"])
