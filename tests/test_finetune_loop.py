"""The fine-tuning loop with classification by prompt: it learns, the metric can tell, the best epoch is
kept, a killed run resumes exactly, bad input is refused before training, and the CLI runs end to end."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from biglm.cli import main as biglm_main
from biglm.config import ConfigError
from biglm.finetune.tasks.classification import ClassificationSettings, ClassificationTask
from biglm.finetune.config import FinetuneConfig
from biglm.finetune.loop import FineTuner
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
COLOURS = ["red", "blue", "green"]  # hypothesis word -> label 0 / 1 / 2


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    things = ["The house", "A small car", "The old door", "My coat", "The garden wall", "Her bicycle", "The boat"]
    rows = []
    for i in range(n):
        label = i % 3
        rows.append({"premise": f"{rng.choice(things)} stands by the road.", "hypothesis": f"It is {COLOURS[label]}.",
                     "label": label, "idx": i})
    return rows


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A random tiny BiGLM saved as a Hugging Face directory, with a tokenizer that knows the label words."""
    from biglm import BiGLMConfig, BiGLMForMaskedLM
    from biglm.data import train_tokenizer

    root = tmp_path_factory.mktemp("ft")
    texts = [f"{r['premise']} Question: {r['hypothesis']} True, False or Neither? Answer: {w}"
             for r in _rows(300, 1) for w in ("True", "False", "Neither")]
    tok = train_tokenizer(texts=texts, vocab_size=300, out_dir=str(root / "tok"))
    torch.manual_seed(0)
    config = BiGLMConfig.from_preset("tiny", vocab_size=len(tok), max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                                     mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                                     bos_token_id=tok.bos_token_id)
    model = BiGLMForMaskedLM(config)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    for name, n, seed in (("train", 96, 2), ("valid", 48, 3)):
        (root / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(n, seed)) + "\n")
    return root


def _task(root: Path, **kw) -> ClassificationTask:
    kw.setdefault("template", "mnli")
    s = ClassificationSettings(train=str(root / "train.jsonl"), validation=str(root / kw.pop("validation", "valid.jsonl")),
                               max_length=64, **kw)
    return ClassificationTask(s, name="toy")


def _cfg(root: Path, out: Path, **kw) -> FinetuneConfig:
    base = dict(model=str(root / "model"), out_dir=str(out), epochs=6, lr=3e-3, global_batch=16, micro_batch=8,
                warmup_ratio=0.1, log_every=1, eval_batch_size=16)
    base.update(kw)
    return FinetuneConfig(**base)


def test_classification_learns_while_a_random_model_is_at_chance(pretrained, tmp_path):
    tuner = FineTuner(_task(pretrained), _cfg(pretrained, tmp_path), info=SINGLE, echo=lambda s: None)
    before = tuner.evaluate()["accuracy"]
    result = tuner.train()
    assert before < 60  # three balanced classes: a random model is near 33%
    assert result.best >= 95, result.evals  # the colour word decides the label: learnable
    assert (tmp_path / "best" / "config.json").is_file() and (tmp_path / "best" / "biglm_task.json").is_file()
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "eval"] == [1, 2, 3, 4, 5, 6]


def test_prompt_classification_equals_scoring_label_words_by_hand(pretrained, tmp_path):
    from biglm.checkpoint import load_model

    task = _task(pretrained)
    model, tok = load_model(pretrained / "model")
    task.prepare(tok)
    batch = task.collate(task._val[:5], device=torch.device("cpu"))
    with torch.no_grad():
        got = task.label_scores(model, batch)
    words = [tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in ("True", "Neither", "False")]
    for i, row in enumerate(_rows(48, 3)[:5]):
        prompt = f"{row['premise']} Question: {row['hypothesis']} True, False or Neither? Answer:"
        ids = tok(prompt, add_special_tokens=False)["input_ids"] + [tok.mask_token_id]
        with torch.no_grad():
            logits = model(torch.tensor([ids]), prefix_len=len(ids) - 1).logits[0, -1]
        torch.testing.assert_close(got[i], logits[words], rtol=1e-4, atol=1e-4)


def test_best_epoch_is_the_one_with_the_best_metric(pretrained, tmp_path):
    scripted = iter([40.0, 70.0, 55.0])
    snapshots = {}

    class Scripted(ClassificationTask):
        def evaluate(self, model, *, batch_size, device):
            return {"accuracy": next(scripted)}

    tuner = FineTuner(Scripted(_task(pretrained).settings, name="toy"), _cfg(pretrained, tmp_path, epochs=3),
                      info=SINGLE, echo=lambda s: None,
                      after_step=lambda t, step: snapshots.__setitem__(step, {k: v.clone() for k, v in
                                                                              t.raw_model.state_dict().items()}))
    result = tuner.train()
    assert (result.best_epoch, result.best) == (2, 70.0)
    from transformers import AutoModelForMaskedLM

    best = AutoModelForMaskedLM.from_pretrained(tmp_path / "best")
    at_epoch_2 = snapshots[2 * tuner.steps_per_epoch]
    for k, v in best.state_dict().items():
        torch.testing.assert_close(v, at_epoch_2[k])
    assert not torch.equal(at_epoch_2["model.embed_tokens.weight"], snapshots[3 * tuner.steps_per_epoch]["model.embed_tokens.weight"])


def test_a_killed_run_resumes_exactly(pretrained, tmp_path):
    whole = FineTuner(_task(pretrained), _cfg(pretrained, tmp_path / "whole", epochs=2), info=SINGLE,
                      echo=lambda s: None).train()

    class Killed(Exception):
        pass

    def kill(tuner, step):
        if step == 9:  # mid epoch 2; the step-8 checkpoint (save_every 4) is on disk
            raise Killed

    with pytest.raises(Killed):
        FineTuner(_task(pretrained), _cfg(pretrained, tmp_path / "run", epochs=2, save_every=4), info=SINGLE,
                  echo=lambda s: None, after_step=kill).train()
    resumed = FineTuner(_task(pretrained), _cfg(pretrained, tmp_path / "run", epochs=2, save_every=4), info=SINGLE,
                        echo=lambda s: None).train()
    assert resumed.losses == [(s, l) for s, l in whole.losses if s > 8]
    assert resumed.evals[-1] == whole.evals[-1] and resumed.best_epoch == whole.best_epoch


def test_a_resume_with_another_schedule_is_refused_naming_the_fields(pretrained, tmp_path):
    """A killed fine-tuning run resumed with other --epochs or --lr is refused before any run file is rewritten
    (the steps taken followed the saved schedule); the same command resumes."""
    from biglm.checkpoint.layout import CheckpointError

    class Killed(Exception):
        pass

    def kill(tuner, step):
        if step == 5:  # the step-4 checkpoint (save_every 4) is on disk
            raise Killed

    run = tmp_path / "run"
    with pytest.raises(Killed):
        FineTuner(_task(pretrained), _cfg(pretrained, run, epochs=2, save_every=4), info=SINGLE,
                  echo=lambda s: None, after_step=kill).train()
    saved = (run / "finetune_config.json").read_text()
    with pytest.raises(CheckpointError, match=r"epochs 2 -> 3.*lr") as e:
        FineTuner(_task(pretrained), _cfg(pretrained, run, epochs=3, save_every=4, lr=1e-3), info=SINGLE,
                  echo=lambda s: None).train()
    assert "\n" not in str(e.value) and (run / "finetune_config.json").read_text() == saved
    FineTuner(_task(pretrained), _cfg(pretrained, run, epochs=2, save_every=4), info=SINGLE,
              echo=lambda s: None).train()


def test_a_damaged_newest_checkpoint_is_skipped_and_the_resume_is_exact(pretrained, tmp_path, capsys):
    whole = FineTuner(_task(pretrained), _cfg(pretrained, tmp_path / "whole", epochs=2), info=SINGLE,
                      echo=lambda s: None).train()

    class Killed(Exception):
        pass

    def kill(tuner, step):
        if step == 9:  # checkpoints of steps 6 (epoch end) and 8 (save_every 4) are on disk
            raise Killed

    run = tmp_path / "run"
    with pytest.raises(Killed):
        FineTuner(_task(pretrained), _cfg(pretrained, run, epochs=2, save_every=4), info=SINGLE,
                  echo=lambda s: None, after_step=kill).train()
    shard = next((run / "checkpoints" / "step_0000008").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    capsys.readouterr()
    resumed = FineTuner(_task(pretrained), _cfg(pretrained, run, epochs=2, save_every=4), info=SINGLE,
                        echo=lambda s: None).train()
    err = capsys.readouterr().err
    assert "step_0000008 is damaged" in err and "resuming from step_0000006" in err
    assert resumed.losses == [(s, l) for s, l in whole.losses if s > 6]
    assert resumed.evals[-1] == whole.evals[-1] and resumed.best_epoch == whole.best_epoch


def test_a_second_finetune_in_the_same_directory_is_refused(pretrained, tmp_path, capsys):
    import fcntl
    import os

    out = tmp_path / "run"
    out.mkdir()
    # the first run's lock, held through another open file description as another process would hold it
    fd = os.open(out / "run.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, json.dumps({"pid": 31337, "host": "gpu-node-2", "started": "2026-11-25 09:00:00 UTC",
                              "command": "biglm finetune classification"}).encode(), 0)
    args = ["finetune", "classification", "--model", str(pretrained / "model"), "--task.train",
            str(pretrained / "train.jsonl"), "--task.validation", str(pretrained / "valid.jsonl"), "--epochs", "1",
            "--global_batch", "16", "--micro_batch", "8", "--out_dir", str(out)]
    try:
        capsys.readouterr()
        assert biglm_main(args) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "in use by another run (pid 31337 on gpu-node-2, started 2026-11-25 09:00:00" in err
        assert not (out / "checkpoints").exists() and not (out / "task.json").exists()
    finally:
        os.close(fd)  # the first run ends (or dies): its lock is free, its record stays
    assert biglm_main(args) == 0
    assert "taking over the lock" in capsys.readouterr().err


def test_bad_input_is_refused_before_training(pretrained, tmp_path):
    from biglm.finetune.templates import TemplateError

    (tmp_path / "nohyp.jsonl").write_text(json.dumps({"premise": "x", "label": 0}) + "\n")
    with pytest.raises(TemplateError, match="hypothesis"):
        FineTuner(_task(pretrained, validation=str(tmp_path / "nohyp.jsonl")), _cfg(pretrained, tmp_path / "a"),
                  info=SINGLE, echo=lambda s: None)
    spec = tmp_path / "collide.yaml"
    spec.write_text("template: '{premise} {hypothesis} Answer: {answer}'\nlabel_words: [True, True, False]\n")
    with pytest.raises(TemplateError):
        FineTuner(_task(pretrained, template=str(spec)), _cfg(pretrained, tmp_path / "b"), info=SINGLE, echo=lambda s: None)
    with pytest.raises(ConfigError, match="fewer than --global_batch"):
        FineTuner(_task(pretrained, max_train_examples=10), _cfg(pretrained, tmp_path / "c"), info=SINGLE,
                  echo=lambda s: None)
    assert not (tmp_path / "a" / "checkpoints").exists()
    from transformers import AutoTokenizer

    from biglm import BiGLMConfig, BiGLMForMaskedLM

    small = tmp_path / "small_vocab"  # a checkpoint saved with a tokenizer it does not match
    BiGLMForMaskedLM(BiGLMConfig.from_preset("tiny", vocab_size=100)).save_pretrained(small)
    AutoTokenizer.from_pretrained(pretrained / "model").save_pretrained(small)
    from biglm.data.tokenizer import TokenizerError

    # the loader's own check (every model load reads its tokenizer through it), before the fine-tuner's
    with pytest.raises(TokenizerError, match="300 tokens but the model's embedding has 100 rows"):
        FineTuner(_task(pretrained), _cfg(pretrained, tmp_path / "d", model=str(small)), info=SINGLE, echo=lambda s: None)


def test_cli_finetune_tasks_and_export(pretrained, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["finetune", "classification", "--model", str(pretrained / "model"), "--task.train",
            str(pretrained / "train.jsonl"), "--task.validation", str(pretrained / "valid.jsonl"), "--epochs", "1",
            "--global_batch", "16", "--micro_batch", "8", "--lr", "1e-3", "--out_dir", str(out)]
    assert biglm_main(args) == 0
    assert "epoch 1 | validation: accuracy" in capsys.readouterr().out  # the split named by --task.validation_name
    assert biglm_main(["export", str(out), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "biglm_task.json").read_text())["template"]["label_words"]
    assert (tmp_path / "hf" / "model.safetensors").stat().st_mode & 0o044  # shareable
    assert biglm_main(["tasks"]) == 0 and "mnli" in capsys.readouterr().out
    assert biglm_main(["finetune", "classification", "--model", str(pretrained / "model"), "--task.trian", "x"]) == 2
    assert "did you mean --task.train" in capsys.readouterr().err
    assert biglm_main(["finetune", "mnlii", "--model", "x"]) == 2
    assert "did you mean 'mnli'?" in capsys.readouterr().err


@pytest.mark.parametrize("parallel, port", [("ddp", 29531), ("fsdp", 29532)])
def test_torchrun_two_processes_match_one(pretrained, tmp_path, parallel, port):
    """DDP and FSDP2 fine-tuning under a real 2-process torchrun (gloo) give the 1-process loss curve, evaluation
    and best-epoch export."""
    import os
    import subprocess
    import sys

    common = ["classification", "--model", str(pretrained / "model"), "--task.train", str(pretrained / "train.jsonl"),
              "--task.validation", str(pretrained / "valid.jsonl"), "--task.max_length", "64", "--epochs", "2",
              "--global_batch", "16", "--micro_batch", "4", "--lr", "3e-3", "--log_every", "1", "--device", "cpu"]
    one = FineTuner(_task(pretrained), _cfg(pretrained, tmp_path / "one", epochs=2, micro_batch=4, lr=3e-3), info=SINGLE,
                    echo=lambda s: None).train()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", "biglm", "finetune", *common, "--parallel", parallel, "--out_dir", str(tmp_path / "two")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(l) for l in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    two = {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}
    assert sorted(two) == [s for s, _ in one.losses]
    for s, loss in one.losses:
        assert two[s] == pytest.approx(loss, rel=1e-4, abs=1e-5), (s, loss, two[s])
    evals = [r["accuracy"] for r in rows if r["kind"] == "eval"]
    assert evals == pytest.approx([m["accuracy"] for _, m in one.evals], abs=1e-6)
    assert (tmp_path / "two" / "best" / "model.safetensors").is_file()
    # the exported best epoch holds the same weights as the 1-process run's
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "one" / "best" / "model.safetensors"), load_file(tmp_path / "two" / "best" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_group_by_length_same_items_less_padding(pretrained, tmp_path):
    """Length grouping sorts each global batch: the same items per step (a permutation), micro-batches of similar
    length (fewer padded tokens), and the same loss as the ungrouped step up to float rounding."""
    seen: dict[bool, list] = {}
    losses: dict[bool, float] = {}
    for group in (False, True):
        tuner = FineTuner(_task(pretrained), _cfg(pretrained, tmp_path / f"g{group}", micro_batch=4, group_by_length=group,
                                                  lr=1e-12), info=SINGLE, echo=lambda s: None)
        batches = []
        collate = tuner.task.collate

        def spy(features, *, device, collate=collate, batches=batches):
            batches.append([len(f["prompt_ids"]) for f in features])
            return collate(features, device=device)

        tuner.task.collate = spy
        torch.manual_seed(0)
        losses[group] = float(tuner.train_step()[0])
        seen[group] = batches
    flat = {g: sorted(x for b in seen[g] for x in b) for g in seen}
    assert flat[True] == flat[False]  # the same items
    padded = {g: sum(max(b) * len(b) for b in seen[g]) for g in seen}
    assert padded[True] < padded[False]
    assert [x for b in seen[True] for x in b] == flat[True]  # sorted across micro-batches
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


# ---------------------------------------------------------------- label words of several tokens (chain rule)


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """The toy data with a tokenizer that never saw True/False/Neither: the built-in `mnli` words are several
    tokens each (5, 6 and 6 here), as " Neither" is in README's default model."""
    from biglm.data import train_tokenizer

    from conftest import save_random_model

    root = tmp_path_factory.mktemp("ft_multi")
    texts = [f"{r['premise']} Question: {r['hypothesis']} Yes, No or Maybe? Answer:" for r in _rows(300, 1)]
    tok = train_tokenizer(texts=texts, vocab_size=300, out_dir=str(root / "tok"))
    save_random_model(root / "model", tok, max_position_embeddings=128)
    for name, n, seed in (("train", 96, 2), ("valid", 48, 3)):
        (root / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(n, seed)) + "\n")
    return root


def _prompt_ids(tok, row) -> list[int]:
    return tok(f"{row['premise']} Question: {row['hypothesis']} True, False or Neither? Answer:",
               add_special_tokens=False)["input_ids"]


def _chain_by_hand(model, prompt: list[int], word: list[int], mask_id: int, *, text_only: bool = False) -> torch.Tensor:
    """log p(word | prompt) by the chain rule, one forward per token: token t scored with word[:t] revealed and
    word[t:] masked, the prompt the prefix; ``text_only``: over the tokens a model writes (no mask token), as the
    scorer reads a distribution."""
    total = torch.zeros((), dtype=torch.float64)
    for t in range(len(word)):
        ids = prompt + word[:t] + [mask_id] * (len(word) - t)
        logits = model(torch.tensor([ids]), prefix_len=len(prompt)).logits[0, len(prompt) + t].float()
        if text_only:
            logits[mask_id] = float("-inf")
        total = total + torch.log_softmax(logits, dim=-1)[word[t]].double()
    return total


def test_multi_token_label_words_chain_rule_loss_equals_hand_computation(multi):
    from biglm.checkpoint import load_model

    model, tok = load_model(multi / "model")
    model.eval()
    task = _task(multi)  # the built-in mnli template: refused before (label word is N tokens)
    task.prepare(tok)
    words = [tok(" " + w, add_special_tokens=False)["input_ids"] for w in ("True", "Neither", "False")]
    assert task.chain and [len(w) for w in task.word_ids] == [len(w) for w in words] and min(map(len, words)) > 1
    rows = _rows(96, 2)[:6]  # labels 0, 1, 2, 0, 1, 2: prompts of different lengths and words of different lengths
    batch = task.collate(task._train[:6], device=torch.device("cpu"))
    assert batch["num_items"] == 6 and batch["input_ids"].shape[0] == sum(len(words[r["label"]]) for r in rows)
    with torch.no_grad():
        loss = task.loss(model, batch)
        hand = -sum(_chain_by_hand(model, _prompt_ids(tok, r), words[r["label"]], tok.mask_token_id) for r in rows)
    torch.testing.assert_close(loss.double(), hand, rtol=1e-5, atol=1e-4)
    # the loop trains on it: a step lowers the loss of the same batch
    tuner = FineTuner(_task(multi), _cfg(multi, multi / "run", epochs=1, lr=3e-3), info=SINGLE, echo=lambda s: None)
    with torch.no_grad():
        before = float(tuner.task.loss(tuner.raw_model, batch))
    for _ in range(3):
        tuner.train_step()
    with torch.no_grad():
        assert float(tuner.task.loss(tuner.raw_model, batch)) < before
    assert set(tuner.evaluate()) >= {"accuracy", "examples"}


def test_prediction_is_the_highest_chain_logprob_or_per_token_with_length_normalize(multi):
    from biglm.checkpoint import load_model

    model, tok = load_model(multi / "model")
    model.eval()
    words = [tok(" " + w, add_special_tokens=False)["input_ids"] for w in ("True", "Neither", "False")]
    rows = _rows(48, 3)[:24]
    with torch.no_grad():
        hand = torch.stack([torch.stack([_chain_by_hand(model, _prompt_ids(tok, r), w, tok.mask_token_id, text_only=True)
                                         for w in words]) for r in rows]).numpy()
    per_token = hand / np.array([len(w) for w in words])
    picks = {}
    for norm, expected in ((False, hand), (True, per_token)):
        task = _task(multi, length_normalize=norm, max_eval_examples=24)
        task.prepare(tok)
        got = task.word_scores(model, task._val, batch_size=5)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        picks[norm] = got.argmax(1)
        assert (picks[norm] == expected.argmax(1)).all()
        y = np.array([r["label"] for r in rows])
        assert task.evaluate(model, batch_size=5, device=torch.device("cpu"))["accuracy"] == pytest.approx(
            100.0 * (expected.argmax(1) == y).mean())
    # " True" is a token shorter than the others: the sum favours it, the per-token mean need not
    assert (picks[False] != picks[True]).any()


def test_one_token_label_words_keep_the_single_pass_numbers(pretrained):
    """One-token words: one forward, the slot's logits over the C words, the same loss bit for bit; and that
    single-pass softmax over the words is the chain rule's (a one-token word's chain is its slot's log-prob)."""
    import torch.nn.functional as F

    from biglm.checkpoint import load_model

    model, tok = load_model(pretrained / "model")
    model.eval()
    task = _task(pretrained)
    task.prepare(tok)
    assert not task.chain
    batch = task.collate(task._val[:8], device=torch.device("cpu"))
    assert "slots" not in batch and batch["input_ids"][:, -1].eq(tok.mask_token_id).all()
    with torch.no_grad():
        ids = batch["input_ids"]
        B, L = ids.shape
        out = model(ids, prefix_len=L - 1, attention_mask=batch["attention_mask"],
                    logits_positions=torch.arange(B) * L + (L - 1))
        single = out.logits.float()[:, task.label_ids]
        assert torch.equal(task.loss(model, batch), F.cross_entropy(single, batch["labels"], reduction="sum"))
        chain = torch.from_numpy(task.word_scores(model, task._val[:8], batch_size=3)).float()
    torch.testing.assert_close(torch.log_softmax(chain, -1), torch.log_softmax(single, -1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["empty", "missing", "unfinished-finetune"])
def test_a_model_folder_that_holds_no_model_leaves_no_locked_output(tmp_path, capsys, kind):
    """`biglm finetune mnli --model DIR` where DIR holds no model: one line, and no output folder holding a lock."""
    model = tmp_path / "model"
    if kind != "missing":
        model.mkdir()
    if kind == "unfinished-finetune":
        (model / "task.json").write_text("{}")
    out = tmp_path / "out"
    assert biglm_main(["finetune", "mnli", "--model", str(model), "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(model) in err[0] and "Traceback" not in err[0]
    assert not out.exists()
