"""Instruction tuning (DESIGN §10) on real Flan v2 CoT rows: responses padded with EOS to the answer length and
trained, so a fixed answer length cut at the first EOS gives back the unpadded text; the chat template saved with the model drives
`biglm chat`, whose answers equal `generate` on the rendered conversation; bad Flan input and evaluation sets in a
mixture are refused before training."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import biglm  # noqa: F401
from biglm.cli import main as biglm_main
from biglm.finetune.config import FinetuneConfig
from biglm.data.tables import TaskDataError
from biglm.finetune.tasks.instruct import InstructSettings, InstructTask, pad_with_eos
from biglm.finetune.loop import FineTuner
from biglm.finetune.templates import TemplateError
from biglm.generation import DecodingConfig, generate, generate_ids, left_pad
from biglm.generation.chat import render_chat
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
MAX_SOURCE, MAX_TARGET = 32, 32
PAIRS = 8
REPEATS = 125  # the training file holds the pairs this many times: 8 epochs x 31 steps of 32


def _flan_rows(shared: Path) -> list[dict]:
    """The first PAIRS Flan CoT rows with a response of at most 10 words whose instructions end differently
    (sources keep their end when cut)."""
    rows, seen = [], set()
    with open(shared / "finetune" / "flan" / "flan_cot_tiny.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if len(r["targets"].split()) > 10 or r["inputs"][-60:] in seen:
                continue
            seen.add(r["inputs"][-60:])
            rows.append(r)
    return rows[:PAIRS]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def flan(tmp_path_factory):
    from conftest import SHARED_DATA, save_random_model

    from biglm.data import train_tokenizer

    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    root = tmp_path_factory.mktemp("flan")
    rows = _flan_rows(SHARED_DATA)
    assert len(rows) == PAIRS
    _write(root / "pairs.jsonl", rows)
    _write(root / "train.jsonl", rows * REPEATS)
    tok = train_tokenizer(texts=[r["inputs"] for r in rows] + [r["targets"] for r in rows] + ["User: Assistant:"] * 4,
                          vocab_size=1000)
    save_random_model(root / "model", tok, hidden_size=128, intermediate_size=256,
                      max_position_embeddings=MAX_SOURCE + MAX_TARGET)
    return root


def _settings(root: Path, **kw) -> InstructSettings:
    base = dict(train=str(root / "pairs.jsonl"), validation=str(root / "pairs.jsonl"), validation_fraction=0.0,
                max_source_length=MAX_SOURCE, max_target_length=MAX_TARGET, decode_steps=8)
    base.update(kw)
    return InstructSettings(**base)


def _cfg(root: Path, out: Path, **kw) -> FinetuneConfig:
    base = dict(model=str(root / "model"), out_dir=str(out), epochs=8, lr=5e-3, global_batch=32, micro_batch=32,
                warmup_ratio=0.05, weight_decay=0.0, log_every=100, eval_batch_size=32)
    base.update(kw)
    return FinetuneConfig(**base)


@pytest.fixture(scope="module")
def tuned(flan, tmp_path_factory):
    """Overfit the pairs (train = them REPEATS times, validation = the pairs): (tuner, result, random scores)."""
    task = InstructTask(_settings(flan, train=str(flan / "train.jsonl")), name="flan")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~40 s on one free core; two threads on a busy 2-core machine spin far longer
    try:
        tuner = FineTuner(task, _cfg(flan, tmp_path_factory.mktemp("flan_run")), info=SINGLE, echo=lambda s: None)
        before = tuner.evaluate()
        result = tuner.train()
    finally:
        torch.set_num_threads(threads)
    tuner.raw_model.eval()
    return tuner, result, before


def test_pad_with_eos_fills_to_the_answer_length_with_at_least_one_eos():
    assert pad_with_eos([7, 8, 9], eos_id=2, length=4) == [7, 8, 9, 2]
    assert pad_with_eos([7, 8], eos_id=2, length=5) == [7, 8, 2, 2, 2]
    assert pad_with_eos([7, 8, 9, 5], eos_id=2, length=4) == [7, 8, 9, 5, 2]  # too long: refused by the task


def test_eos_padded_responses_decode_to_the_unpadded_text(flan, tuned):
    tuner, result, before = tuned
    task, tok, model = tuner.task, tuner.tokenizer, tuner.raw_model
    rows = [json.loads(l) for l in (flan / "pairs.jsonl").read_text().splitlines()]
    assert {len(f["target_ids"]) for f in task._val} == {MAX_TARGET}  # trained with EOS up to the answer length
    after = result.evals[-1][1]
    print(f"random model {before}; trained {after}")
    assert before["exact_match"] == 0 and before["rougeL"] < 20
    assert after["exact_match"] >= 75 and after["rougeL"] >= 90, after
    # the fixed answer length (32 slots) is cut at the first EOS: the unpadded response, EOS excluded
    ids, mask = left_pad([f["source_ids"] for f in task._val], pad_id=tok.pad_token_id)
    out = generate_ids(model, ids, mask, config=DecodingConfig(max_new_tokens=MAX_TARGET, steps=8))
    assert out.candidate_length.tolist() == [MAX_TARGET] * len(rows)
    exact = 0
    for row, f, answer, raw in zip(rows, task._val, out.token_lists(), out.tokens.tolist()):
        unpadded = f["target_ids"][:f["target_ids"].index(tok.eos_token_id)]
        if answer == unpadded:
            exact += 1
            assert raw[len(unpadded)] == tok.eos_token_id  # the EOS that ends it was written by the model
            assert tok.decode(answer, skip_special_tokens=True).strip() == row["targets"].strip()
    assert exact >= 0.75 * len(rows)
    best = tuner.out / "best"
    from transformers import AutoTokenizer

    assert "User:" in AutoTokenizer.from_pretrained(best).chat_template  # saved with the model
    info = json.loads((best / "biglm_task.json").read_text())
    assert info["kind"] == "instruct" and info["decoding"]["max_new_tokens"] == MAX_TARGET


def test_chat_keeps_the_conversation_and_answers_as_generate(flan, tuned, monkeypatch, capsys):
    import biglm.generation.cli_chat as cli_chat

    tuner = tuned[0]
    rows = [json.loads(l) for l in (flan / "pairs.jsonl").read_text().splitlines()]
    prompts: list[str] = []
    real = cli_chat.generate

    def spy(model, tok, texts, **kw):
        prompts.extend(texts)
        return real(model, tok, texts, **kw)

    monkeypatch.setattr(cli_chat, "generate", spy)
    turns = [r["inputs"].replace("\n", "\\\n") for r in rows[:2]]  # one turn, several lines
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{turns[0]}\n\n{turns[1]}\n"))
    # the run directory (its best epoch); answer length and steps come from what the model was saved with
    assert biglm_main(["chat", str(tuner.out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    model, tok = tuner.raw_model, tuner.tokenizer
    cfg = DecodingConfig(max_new_tokens=MAX_TARGET, steps=8)
    first = [{"role": "user", "content": rows[0]["inputs"]}]
    a1 = generate(model, tok, [render_chat(tok, first)], config=cfg)[0].strip()
    second = first + [{"role": "assistant", "content": a1}, {"role": "user", "content": rows[1]["inputs"]}]
    a2 = generate(model, tok, [render_chat(tok, second)], config=cfg)[0].strip()
    assert printed == f"{a1}\n{a2}\n"
    assert len(prompts) == 2 and prompts[1] == render_chat(tok, second)
    assert rows[0]["inputs"] in prompts[1] and a1 in prompts[1]  # the second prompt holds the first turn
    assert a1 == rows[0]["targets"].strip()  # the overfitted response
    # on a terminal the answer is redrawn on one line per model call (masked slots as _), then printed
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{turns[0]}\n/exit\n{turns[1]}\n"))
    assert biglm_main(["chat", str(tuner.out), "--show_steps", "true", "--strategy", "confidence", "--steps", "4"]) == 0
    printed = capsys.readouterr().out
    frames = printed.split("\r\x1b[2K")[1:]
    assert [f[:6] for f in frames[:4]] == ["[1/4] ", "[2/4] ", "[3/4] ", "[4/4] "] and "_" in frames[0]
    assert frames[4] == generate(model, tok, [render_chat(tok, first)], config=cfg.override(strategy="confidence",
                                                                                            steps=4))[0].strip() + "\n"
    assert len(prompts) == 3  # /exit ended the session


def test_bad_flan_input_is_refused_before_training(flan, tmp_path, capsys):
    def build(**kw):
        return FineTuner(InstructTask(_settings(flan, **kw)), _cfg(flan, tmp_path / "out"), info=SINGLE,
                         echo=lambda s: None)

    qa = _write(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}] * 20)
    with pytest.raises(TaskDataError, match=r"qa.jsonl: not in the Flan-collection schema: field\(s\) \['inputs', "
                                            r"'targets'\] missing"):
        build(train=str(qa))
    with pytest.raises(TemplateError, match=r"names field\(s\) \['question'\] that the data lacks"):
        build(source_template="{question}")
    assert biglm_main(["finetune", "flan", "--model", str(flan / "model"), "--task.length_mode", "words"]) == 2
    assert "length_mode" in capsys.readouterr().err  # choices are checked by the typed parser, before any work
    assert biglm_main(["finetune", "flan", "--model", str(flan / "model"), "--task.mixture",
                       str(tmp_path / "missing.yaml")]) == 2
    assert "--task.mixture" in capsys.readouterr().err and not (tmp_path / "out").exists()
    rows = [json.loads(l) for l in (flan / "pairs.jsonl").read_text().splitlines()]
    long = _write(tmp_path / "long.jsonl", rows + [{"inputs": "x", "targets": " ".join(["word"] * 40)}])
    with pytest.raises(TaskDataError, match=r"1 of \d+ target\(s\) are longer than max_target_length=32"):
        build(train=str(long))
    assert not (tmp_path / "out").exists()


def test_a_mixture_with_an_evaluation_set_is_refused(flan, tmp_path):
    from conftest import SHARED_DATA

    boolq = SHARED_DATA / "eval" / "aps__super_glue" / "boolq" / "validation.jsonl"
    shutil.copy(boolq, tmp_path / "boolq_train.jsonl")  # the same rows under another name
    spec = tmp_path / "mix.yaml"
    spec.write_text("per_task: 20\ntasks:\n  - {name: bool_q, source: boolq_train.jsonl, field_map: {text: passage}, "
                    "label_words: ['no', 'yes'], template_indices: [0, 1]}\n")
    with pytest.raises(TaskDataError, match=r"has the same content as .*boolq/validation.jsonl of .*aps__super_glue/boolq"):
        FineTuner(InstructTask(InstructSettings(train="", mixture=str(spec), validation_fraction=0.2)),
                  _cfg(flan, tmp_path / "out"), info=SINGLE, echo=lambda s: None)
    # other rows (not an evaluation set), but the family's {text} field is neither a column nor mapped
    rows = [json.loads(l) for l in boolq.read_text().splitlines()[:40]]
    _write(tmp_path / "boolq_train.jsonl", [{**r, "question": r["question"] + " really"} for r in rows])
    spec.write_text("tasks:\n  - {name: bool_q, source: boolq_train.jsonl, label_words: ['no', 'yes'], "
                    "template_indices: [0, 1]}\n")
    with pytest.raises(TemplateError, match=r"template field 'text' \(pattern 0 of FLAN family 'bool_q'.* is missing "
                                            r"from the data"):
        FineTuner(InstructTask(InstructSettings(train="", mixture=str(spec), validation_fraction=0.2)),
                  _cfg(flan, tmp_path / "out"), info=SINGLE, echo=lambda s: None)
    assert not (tmp_path / "out").exists()


def test_eos_mode_started_from_a_seq2seq_model_drops_its_length_head(flan):
    """EOS padding decodes at one fixed length: a seq2seq start becomes the plain masked LM (same weights), so no
    decoding (validation, export, generate) asks its untrained-for-this head for lengths."""
    from biglm import BiGLMForMaskedLM
    from biglm.checkpoint import load_model
    from biglm.model.seq2seq import BiGLMForConditionalGeneration

    mlm, tok = load_model(flan / "model")
    s2s = BiGLMForConditionalGeneration.from_masked_lm(mlm, max_target_length=MAX_TARGET)
    built = InstructTask(_settings(flan)).build_model(s2s, tok)
    assert type(built) is BiGLMForMaskedLM and built.model is s2s.model and "length_head" not in built.state_dict()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(built(ids).logits, s2s(ids).logits)
    head = InstructTask(_settings(flan, length_mode="head")).build_model(mlm, tok)
    assert type(head) is BiGLMForConditionalGeneration and head.config.max_target_length == MAX_TARGET


def test_run_finetune_is_the_python_entry_point(flan, tmp_path):
    """`biglm.finetune.run_finetune`: the loop from Python without building a DistInfo; it returns the per-epoch
    validation, exports the best epoch (with the chat template) and leaves no process group behind."""
    import torch.distributed as dist

    import biglm.finetune as public
    from biglm.checkpoint import load_model
    from biglm.config import ConfigError
    from biglm.finetune import run_finetune

    assert (public.InstructTask, public.InstructSettings, public.FinetuneConfig) == (InstructTask, InstructSettings,
                                                                                     FinetuneConfig)
    task = InstructTask(_settings(flan, train=str(flan / "train.jsonl"), max_train_examples=64), name="flan")
    lines: list[str] = []
    result = run_finetune(task, _cfg(flan, tmp_path / "out", epochs=1), echo=lines.append)
    assert [e for e, _ in result.evals] == [1] and result.best_epoch == 1 and not result.interrupted
    assert result.best == result.evals[0][1]["rougeL"]
    assert any(line.startswith("[biglm] best epoch 1") for line in lines)
    model, tok = load_model(tmp_path / "out" / "best")
    assert tok.chat_template and type(model).__name__ == "BiGLMForMaskedLM"  # eos mode: the plain masked LM
    assert not (dist.is_available() and dist.is_initialized())
    with pytest.raises(ConfigError, match="global_batch"):  # bad settings fail before any work
        run_finetune(task, _cfg(flan, tmp_path / "bad", global_batch=0))


def test_instruct_options_are_used_or_refused_before_training(flan, tmp_path, capsys, monkeypatch):
    """Options a length mode used to accept and ignore (or crash on after an epoch) are used or refused up front:
    --task.metrics is scored in both modes (head + qg trained an epoch, then failed with KeyError 'bleu4'; eos
    ignored it), --task.length_beam in eos mode is refused before any work, and qg without METEOR needs no WordNet."""
    from biglm.config import ConfigError
    from biglm.scoring import metrics as genmetrics

    out = tmp_path / "refused"
    assert biglm_main(["finetune", "flan", "--model", str(flan / "model"), "--task.length_beam", "3",
                       "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--task.length_beam 3" in err and "--task.length_mode head" in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert InstructTask(_settings(flan, length_beam=1)).settings.length_beam == 1  # what eos decodes: accepted
    assert InstructTask(_settings(flan, length_mode="head")).settings.length_beam == 3  # head: the usual top-3

    def no_wordnet():
        raise RuntimeError("WordNet (needed by METEOR) is not on nltk's data path")

    monkeypatch.setattr(genmetrics, "load_wordnet", no_wordnet)
    for mode in ("eos", "head"):
        with pytest.raises(ConfigError, match="--task.meteor false"):  # METEOR on: WordNet checked when built
            InstructTask(_settings(flan, metrics="qg", length_mode=mode))
        task = InstructTask(_settings(flan, metrics="qg", meteor=False, length_mode=mode, max_eval_examples=2,
                                      decode_steps=2))
        scores = FineTuner(task, _cfg(flan, tmp_path / mode, global_batch=8, micro_batch=8), info=SINGLE,
                           echo=lambda s: None).evaluate()
        assert task.metric == "bleu4" and {"bleu4", "rougeL", "exact_match"} <= set(scores), (mode, scores)
        assert "meteor" not in scores


@pytest.mark.parametrize("flags, given, needs", [
    (["--task.length_loss_weight", "0.5"], "--task.length_loss_weight 0.5", "--task.length_mode head"),
    (["--task.meteor", "false"], "--task.meteor false", "--task.metrics qg"),
    (["--task.bleu_lowercase", "true"], "--task.bleu_lowercase true", "--task.metrics qg"),
])
def test_options_the_settings_leave_unused_are_refused_in_one_line(flan, tmp_path, capsys, flags, given, needs):
    """The flan recipe (eos mode, metrics rouge) trains no length head and scores no BLEU or METEOR: an option for
    those is refused before any work, naming the option and the setting that would use it."""
    out = tmp_path / "refused"
    assert biglm_main(["finetune", "flan", "--model", str(flan / "model"), *flags, "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert given in err and needs in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_options_are_used_where_their_setting_uses_them(flan, monkeypatch):
    """What each length mode and metric trains and scores with: the length head's weight in head mode (unset: 0.1),
    none in eos mode; BLEU's casing and METEOR under qg (unset: METEOR on, BLEU cased)."""
    from biglm.scoring import metrics as genmetrics

    assert InstructTask(_settings(flan)).settings.length_loss_weight == 0.0
    assert InstructTask(_settings(flan, length_loss_weight=0)).settings.length_loss_weight == 0.0  # what eos does
    assert InstructTask(_settings(flan, length_mode="head")).settings.length_loss_weight == 0.1
    assert InstructTask(_settings(flan, length_mode="head", length_loss_weight=0.5)).settings.length_loss_weight == 0.5
    monkeypatch.setattr(genmetrics, "load_wordnet", lambda: None)
    qg = InstructTask(_settings(flan, metrics="qg")).settings
    assert (qg.meteor, qg.bleu_lowercase) == (True, False)
    qg = InstructTask(_settings(flan, metrics="qg", meteor=False, bleu_lowercase=True)).settings
    assert (qg.meteor, qg.bleu_lowercase) == (False, True)
