"""CMLM seq2seq fine-tuning (DESIGN §9) on real SQuAD-QG pairs: a tiny model overfits them (ROUGE far above
copying the source, the length head knows their lengths) while a random one does not; the length beam keeps the
best-scoring candidate; cached and uncached decoding agree; bad input is refused before training; a killed run
resumes exactly; the CLI fine-tunes, exports and generates with the length head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import biglm  # noqa: F401  (registers the Auto classes)
from biglm.cli import main as biglm_main
from biglm.finetune.config import FinetuneConfig
from biglm.data.tables import TaskDataError
from biglm.finetune.loop import FineTuner
from biglm.finetune.tasks.seq2seq import Seq2SeqSettings, Seq2SeqTask, decode_with_length_head
from biglm.finetune.templates import TemplateError
from biglm.generation import DecodingConfig, generate, generate_ids
from biglm.model.seq2seq import BiGLMForConditionalGeneration
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
PAIRS = 200  # SQuAD-QG dev pairs overfitted
REPEATS = 64  # the training file holds them this many times: one epoch = 64 passes (200 steps), so few validations
MAX_SOURCE, MAX_TARGET = 12, 20


def _qg_pairs(shared: Path, n: int) -> list[dict]:
    """The first ``n`` SQuAD-QG dev pairs with a question of at most 9 words and a sentence whose first 8 words
    no earlier pick shares (dev repeats a sentence for each of its questions; a cut source must name one pair)."""
    rows, seen = [], set()
    with open(shared / "finetune" / "squad_qg" / "dev.jsonl") as f:
        for line in f:
            r = json.loads(line)
            key = " ".join(r["src"].split()[:8])
            if key in seen or len(r["tgt"].split()) > 9:
                continue
            seen.add(key)
            rows.append(r)
            if len(rows) == n:
                break
    return rows


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def qg(tmp_path_factory):
    """SQuAD-QG pairs (pairs.jsonl; train.jsonl = them REPEATS times), a tokenizer trained on their text and a
    random tiny BiGLM (32-token window) saved as a Hugging Face directory (model/)."""
    from conftest import SHARED_DATA, save_random_model

    from biglm.data import train_tokenizer

    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    root = tmp_path_factory.mktemp("qg")
    rows = _qg_pairs(SHARED_DATA, PAIRS)
    _write(root / "pairs.jsonl", rows)
    _write(root / "train.jsonl", rows * REPEATS)
    tok = train_tokenizer(texts=[r["src"] for r in rows] + [r["tgt"] for r in rows], vocab_size=3000)
    save_random_model(root / "model", tok, hidden_size=128, intermediate_size=256,
                      max_position_embeddings=MAX_SOURCE + MAX_TARGET)
    return root


def _settings(root: Path, **kw) -> Seq2SeqSettings:
    base = dict(train=str(root / "pairs.jsonl"), validation=str(root / "pairs.jsonl"), source_template="{src}",
                target_template="{tgt}", max_source_length=MAX_SOURCE, max_target_length=MAX_TARGET, metrics="qg",
                meteor=False, bleu_lowercase=True, length_beam=3, decode_steps=4)
    base.update(kw)
    return Seq2SeqSettings(**base)


def _cfg(root: Path, out: Path, **kw) -> FinetuneConfig:
    base = dict(model=str(root / "model"), out_dir=str(out), epochs=2, lr=5e-3, global_batch=64, micro_batch=64,
                warmup_ratio=0.05, weight_decay=0.0, log_every=100, eval_batch_size=64)
    base.update(kw)
    return FinetuneConfig(**base)


def copy_source_baseline(rows: list[dict]) -> list[str]:
    """The source cut to the target's length in words: what a model that only copies its input would write."""
    return [" ".join(r["src"].split()[:len(r["tgt"].split())]) for r in rows]


@pytest.fixture(scope="module")
def trained(qg, tmp_path_factory):
    """Fine-tune on the repeated pairs, validating on the pairs themselves: (tuner, result, random-model scores)."""
    out = tmp_path_factory.mktemp("qg_run")
    task = Seq2SeqTask(_settings(qg, train=str(qg / "train.jsonl"), max_eval_examples=PAIRS), name="squad-qg")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~50 s on one free core; two threads on a busy 2-core machine spin far longer
    try:
        tuner = FineTuner(task, _cfg(qg, out), info=SINGLE, echo=lambda s: None)
        before = tuner.evaluate()
        result = tuner.train()
    finally:
        torch.set_num_threads(threads)
    tuner.raw_model.eval()
    return tuner, result, before


def test_a_tiny_model_overfits_squad_qg_pairs_and_their_lengths(qg, trained):
    from biglm.scoring import metrics as genmetrics

    tuner, result, before = trained
    rows = [json.loads(l) for l in (qg / "pairs.jsonl").read_text().splitlines()]
    assert tuner.task.val_references == [r["tgt"] for r in rows]  # validation = the 200 training pairs, in order
    baseline = genmetrics.rouge(predictions=copy_source_baseline(rows), references=[r["tgt"] for r in rows])["rougeL"]
    after = result.evals[-1][1]
    print(f"copy-source rougeL {baseline:.1f}; random model {before}; trained {after}")
    assert 15 < baseline < 35  # questions reuse the sentence's words: copying is not nothing
    assert before["rougeL"] < baseline and before["length_accuracy"] < 30  # a random model is worse than copying
    assert after["rougeL"] > baseline + 30, after  # learnt: far above copying the source
    assert after["bleu4"] > 25 and after["length_accuracy"] >= 90, after
    assert result.best_epoch == max(result.evals, key=lambda e: e[1]["bleu4"])[0]  # best epoch by BLEU-4 (qg)


# --- decoding ----------------------------------------------------------------------------------------------


def test_length_beam_keeps_the_best_scoring_candidate(trained):
    """The length head's top-3 lengths decoded side by side give the candidate that scores best when each length
    is decoded on its own (highest mean log-probability), with the same tokens."""
    tuner = trained[0]
    model = tuner.raw_model
    cfg = DecodingConfig(max_new_tokens=MAX_TARGET, steps=4)
    not_top1 = 0
    for f in tuner.task._val[:8]:
        ids = torch.tensor([f["source_ids"]])
        lengths = model.predict_lengths(ids, None, beam=3)[0].tolist()
        assert len(set(lengths)) == 3 and all(1 <= n <= MAX_TARGET for n in lengths)
        together = generate_ids(model, ids, config=cfg, lengths=[lengths])
        alone = [generate_ids(model, ids, config=cfg, lengths=[[n]]) for n in lengths]
        scores = torch.stack([a.avg_logprob[0] for a in alone])
        best = int(scores.argmax())
        not_top1 += best != 0
        assert int(together.candidate_length[0]) == lengths[best]
        assert together.token_lists() == alone[best].token_lists()
        torch.testing.assert_close(together.avg_logprob[0], scores[best], rtol=1e-4, atol=1e-5)
    # the API picks its candidate lengths with the head by default (a model that has one), as the task does
    prompts = [f["source_ids"] for f in tuner.task._val[:8]]
    answers, _ = decode_with_length_head(model, prompts, beam=3, steps=4)
    from biglm.generation import generate_from_ids

    texts = generate_from_ids(model, tuner.tokenizer, prompts, config=DecodingConfig(max_new_tokens=MAX_TARGET,
                                                                                        steps=4, length_beam=3))
    assert texts == tuner.tokenizer.batch_decode(answers, skip_special_tokens=True)


@pytest.mark.parametrize("which", ["trained", "random"])
def test_cached_and_uncached_seq2seq_decoding_agree_token_for_token(qg, trained, which):
    tuner = trained[0]
    if which == "trained":
        model = tuner.raw_model
    else:
        from biglm.checkpoint import load_model

        torch.manual_seed(1)
        model = BiGLMForConditionalGeneration.from_masked_lm(load_model(qg / "model")[0], max_target_length=MAX_TARGET)
    prompts = [f["source_ids"] for f in tuner.task._val[:48]]  # 12-token sources and shorter: left padding matters
    cached, top_c = decode_with_length_head(model.eval(), prompts, beam=3, steps=4, use_cache=True, batch_size=16)
    plain, top_p = decode_with_length_head(model, prompts, beam=3, steps=4, use_cache=False, batch_size=16)
    assert top_c == top_p
    assert cached == plain
    assert len({len(a) for a in cached}) > 1  # answers of several lengths


# --- bad input ---------------------------------------------------------------------------------------------


def test_bad_input_is_refused_before_training(qg, tmp_path, capsys):
    from biglm.checkpoint import load_model

    rows = [json.loads(l) for l in (qg / "pairs.jsonl").read_text().splitlines()]
    tok = load_model(qg / "model")[1]
    n_long = sum(len(tok(" " + r["tgt"], add_special_tokens=False)["input_ids"]) > 10 for r in rows)
    assert 0 < n_long < len(rows) - 16

    def build(**kw):
        return FineTuner(Seq2SeqTask(_settings(qg, **kw)), _cfg(qg, tmp_path / "out", global_batch=16, micro_batch=16),
                         info=SINGLE, echo=lambda s: None)

    with pytest.raises(TaskDataError, match=rf"{n_long} of {len(rows)} target\(s\) are longer than max_target_length=10"):
        build(max_target_length=10)
    tuner = build(max_target_length=10, long_targets="drop")
    assert tuner.task.dropped_targets == n_long and len(tuner.features) == len(rows) - n_long
    empty = _write(tmp_path / "empty.jsonl", rows[:3] + [{**rows[3], "tgt": "  "}] + rows[4:20])
    with pytest.raises(TaskDataError, match=r"the target is empty in 1 row\(s\) \(row 3\)"):
        build(train=str(empty))
    null = _write(tmp_path / "null.jsonl", rows[:5] + [{**rows[5], "tgt": None}] + rows[6:20])
    with pytest.raises(TaskDataError, match=r"row 5 has no value for \{tgt\}"):
        build(train=str(null))
    with pytest.raises(TemplateError, match=r"names field\(s\) \['sentence'\] that the data lacks \(columns: \['id', 'src', 'tgt'\]\)"):
        build(source_template="{sentence}\nQuestion:")
    assert not (tmp_path / "out").exists()  # nothing written: refused before training
    # a model without a length head asked to use one: refused with what to do, in Python and on the CLI
    mlm = load_model(qg / "model")[0]
    with pytest.raises(ValueError, match="length_head=True but BiGLMForMaskedLM has no length head"):
        generate(mlm, tok, ["a question"], max_new_tokens=4, length_head=True)
    assert biglm_main(["generate", str(qg / "model"), "--prompt", "a question", "--max_new_tokens", "4",
                       "--length_head", "true"]) == 2
    assert "has no length head" in capsys.readouterr().err


def test_a_killed_seq2seq_run_resumes_exactly(qg, tmp_path):
    """Masks come from torch's global RNG, saved and restored with the checkpoint: the resumed losses are the
    uninterrupted run's."""
    def run(out, **kw):
        task = Seq2SeqTask(_settings(qg, max_train_examples=64, max_eval_examples=8, decode_steps=2))
        return FineTuner(task, _cfg(qg, out, epochs=2, global_batch=16, micro_batch=8, log_every=1, lr=3e-3,
                                    save_every=2), info=SINGLE,
                         echo=lambda s: None, **kw)

    whole = run(tmp_path / "whole").train()

    class Killed(Exception):
        pass

    def kill(tuner, step):
        if step == 7:  # mid epoch 2 (4 steps an epoch); the step-6 checkpoint is on disk
            raise Killed

    with pytest.raises(Killed):
        run(tmp_path / "run", after_step=kill).train()
    resumed = run(tmp_path / "run").train()
    assert resumed.losses == [(s, l) for s, l in whole.losses if s > 6]
    assert resumed.evals[-1] == whole.evals[-1]


# --- CLI ---------------------------------------------------------------------------------------------------


def test_cli_finetune_export_and_generate_with_the_length_head(qg, trained, tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForSeq2SeqLM

    out = tmp_path / "run"
    args = ["finetune", "seq2seq", "--model", str(qg / "model"), "--task.train", str(qg / "pairs.jsonl"),
            "--task.validation", str(qg / "pairs.jsonl"), "--task.source_template", "{src}", "--task.target_template",
            "{tgt}", "--task.max_source_length", str(MAX_SOURCE), "--task.max_target_length", str(MAX_TARGET),
            "--task.metrics", "qg", "--task.meteor", "false", "--task.max_eval_examples", "16",
            "--task.decode_steps", "3", "--task.length_beam", "2", "--epochs", "1", "--global_batch", "16",
            "--micro_batch", "16", "--lr", "3e-3", "--out_dir", str(out)]
    assert biglm_main(args) == 0
    assert "epoch 1 | validation: bleu4" in capsys.readouterr().out
    assert biglm_main(["export", str(out), str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    hf = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf")  # after `import biglm`
    assert type(hf) is BiGLMForConditionalGeneration and hf.config.max_target_length == MAX_TARGET
    assert json.loads((tmp_path / "hf" / "biglm_task.json").read_text())["decoding"]["length_beam"] == 2

    # biglm generate on the export: candidate lengths from the head, the saved decoding settings (beam 2, 3 steps)
    import biglm.model.seq2seq as seq2seq_model

    heads: list[int] = []
    real = seq2seq_model.BiGLMForConditionalGeneration.predict_lengths

    def spy(self, *a, beam, **kw):
        heads.append(beam)
        return real(self, *a, beam=beam, **kw)

    monkeypatch.setattr(seq2seq_model.BiGLMForConditionalGeneration, "predict_lengths", spy)
    prompt = "the panthers beat the cardinals"
    assert biglm_main(["generate", str(tmp_path / "hf"), "--prompt", prompt, "--device", "cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert heads == [2]
    tok = trained[0].tokenizer
    expected = generate(hf.eval(), tok, [prompt], max_new_tokens=MAX_TARGET, steps=3, length_beam=2)
    assert printed == [f"### prompt 1: {prompt}", expected[0]]
    heads.clear()
    assert biglm_main(["generate", str(tmp_path / "hf"), "--prompt", prompt, "--length_head", "false",
                       "--max_new_tokens", "5"]) == 0
    assert heads == []  # --length_head false: the length beam over [ceil(N/2), N], the head not asked
    capsys.readouterr()

    # the overfitted run (a fine-tuning run directory is accepted as is): the task's own decoding of its sources;
    # with the head's top-1 length alone (--length_beam 1) the questions themselves come back (the beam's best mean
    # log-probability may prefer a shorter candidate: 'where did super bowl 50 take ?')
    tuner = trained[0]
    rows = [json.loads(l) for l in (qg / "pairs.jsonl").read_text().splitlines()[:6]]
    feats = [f for f in tuner.task._val[:6] if tok(tok.decode(f["source_ids"]), add_special_tokens=False)["input_ids"]
             == f["source_ids"]]  # prompts that survive a text round trip (all of these do)
    assert len(feats) == 6
    texts = [tok.decode(f["source_ids"]) for f in feats]
    argv = ["generate", str(tuner.out)] + [a for t in texts for a in ("--prompt", t)]
    assert biglm_main(argv) == 0
    answers = capsys.readouterr().out.splitlines()[1::2]
    decoded, _ = decode_with_length_head(tuner.raw_model, [f["source_ids"] for f in feats], beam=3, steps=4)
    assert answers == tok.batch_decode(decoded, skip_special_tokens=True)
    assert biglm_main(argv + ["--length_beam", "1"]) == 0
    answers = [a.strip() for a in capsys.readouterr().out.splitlines()[1::2]]
    assert sum(a == r["tgt"] for a, r in zip(answers, rows)) >= 5, list(zip(answers, rows))
