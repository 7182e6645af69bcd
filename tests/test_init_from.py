"""Continued pre-training (`biglm pretrain --init_from DIR`), the recipes that need it, and model cards (`biglm export`).

Issue 23: --init_from starts from the source's weights (step 0 equals the source), resumes exactly after a kill
from its own checkpoint, refuses data of another tokenizer in one line; blocks-adapt turns a paper model into a
"blocks" model (and the paper objective turns it back); the exported README.md is a Hugging Face model card whose
front matter parses as YAML and names the base model, the objective and the data.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_config, train_losses
import yaml

from biglm.checkpoint import checkpoint_dirs, export_checkpoint, load_model
from biglm.config import ConfigError
from biglm.objective import OBJECTIVES
from biglm.training import Trainer, TrainConfig
from biglm.training.cli import main as pretrain_main, resolve_config
from biglm.training.config import ModelArgs
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
QUIET = dict(echo=lambda s: None)


def _cfg(data: Path, out: Path, **kw) -> TrainConfig:
    """A tiny run on the synthetic shards (the tokenizer comes from the manifest, or from --init_from)."""
    return tiny_train_config(out, **{"data": {str(data / "shards"): 1.0}, "lr": 1e-3, "min_lr": 1e-4, **kw})


_losses = train_losses


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n"), card[:80]
    return yaml.safe_load(card.split("---\n")[1])


@pytest.fixture(scope="module")
def source(synthetic_data, tmp_path_factory):
    """A paper-objective BiGLM trained 3 steps on the synthetic data: its run directory and its export."""
    root = tmp_path_factory.mktemp("source")
    run = root / "run"
    Trainer(_cfg(synthetic_data, run, steps=3, lr=3e-3), info=SINGLE, **QUIET).train()
    export = export_checkpoint(run, root / "export")
    return run, export


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("kind", ["export", "run"])
def test_init_from_starts_from_the_source_weights(synthetic_data, source, tmp_path, kind):
    run, export = source
    src = export if kind == "export" else run
    trainer = Trainer(_cfg(synthetic_data, tmp_path, init_from=str(src), steps=2, model=ModelArgs()), info=SINGLE,
                      **QUIET)
    original, _ = load_model(src)
    assert _same_weights(trainer.raw_model, original)  # step 0 is the source model
    assert trainer.model_config.num_hidden_layers == original.config.num_hidden_layers
    assert trainer.model_config.max_position_embeddings == original.config.max_position_embeddings  # the source's
    result = trainer.train()
    assert result.step == 2 and not _same_weights(trainer.raw_model, original)  # it trained
    saved = json.loads((tmp_path / "train_config.json").read_text())
    assert saved["init_from"] == str(src)  # the start is recorded in the run
    # started again with another --init_from, the run resumes from its own checkpoints and keeps its record
    again = _cfg(synthetic_data, tmp_path, init_from=str(tmp_path / "elsewhere"), steps=2, model=ModelArgs())
    assert Trainer(again, info=SINGLE, **QUIET).init_source is None and again.init_from == str(src)


def _run_cli(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "biglm", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **env})


def test_init_from_resumes_exactly_after_a_kill(synthetic_data, source, tmp_path):
    _, export = source
    moved = tmp_path / "source-copy"
    shutil.copytree(export, moved)
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    Trainer(_cfg(synthetic_data, full, init_from=str(moved), model=ModelArgs()), info=SINGLE, **QUIET).train()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_cfg(synthetic_data, crashed, init_from=str(moved), model=ModelArgs()).to_dict()))
    # a hard kill (os._exit) after step 4: the checkpoint of step 3 is the newest
    proc = _run_cli(["pretrain", str(recipe)], BIGLM_FAULT_AFTER_STEP="4")
    assert proc.returncode == 17, proc.stderr
    assert [d.name for d in checkpoint_dirs(crashed)] == ["step_0000003"]
    assert json.loads((crashed / "train_config.json").read_text())["init_from"] == str(moved)
    shutil.rmtree(moved)  # the resume reads the run's own checkpoint, config and tokenizer, never the source
    proc = _run_cli(["pretrain", str(recipe)])
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout and "starting from" not in proc.stdout
    a, b = _losses(full), _losses(crashed)
    for step in range(1, 7):
        assert a[step] == b[step], (step, a[step], b[step])  # exact, step for step


def test_tokenizer_mismatch_is_refused_in_one_line(synthetic_data, tmp_path, capsys):
    from conftest import save_random_model, synthetic_corpus

    from biglm.data import train_tokenizer

    other = train_tokenizer(texts=synthetic_corpus(seed=1), vocab_size=300)  # not the tokenizer of the shards
    src = save_random_model(tmp_path / "other", other, max_position_embeddings=64)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(_cfg(synthetic_data, tmp_path / "run", init_from=str(src), model=ModelArgs()).to_dict()))
    capsys.readouterr()
    assert pretrain_main([str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another tokenizer" in err and "--init_from" in err, err
    assert not checkpoint_dirs(tmp_path / "run")


def test_recipes_that_continue_training_need_init_from_and_give_way_to_its_shape(tmp_path):
    for name in ("blocks-adapt", "biglm-136m-from-smollm", "biglm-360m-from-smollm"):
        with pytest.raises(ConfigError, match="--init_from"):
            resolve_config([name]).validate()
    cfg = resolve_config(["table1-micro-biglm", "--init_from", str(tmp_path), "--model.hidden_dropout", "0.1"])
    assert cfg.model == ModelArgs(hidden_dropout=0.1) and cfg.tokenizer is None  # the recipe's shape gives way
    with pytest.raises(ConfigError, match="--preset"):
        resolve_config(["--init_from", str(tmp_path), "--preset", "tiny"])
    with pytest.raises(ConfigError, match="--model.hidden_size"):
        resolve_config(["table1-micro-biglm", "--init_from", str(tmp_path), "--model.hidden_size", "64"]).validate()
    smol = resolve_config(["biglm-136m-from-smollm", "--init_from", str(tmp_path)])
    assert smol.objective == OBJECTIVES["biglm"] and smol.lr < resolve_config(["biglm-136m"]).lr
    smol.validate(world_size=8)


def test_blocks_adapt_turns_a_paper_model_into_a_blocks_model_and_back(synthetic_data, source, tmp_path):
    _, export = source
    assert load_model(export)[0].config.prefix_attention == "bidirectional"
    small = ["--data", str(synthetic_data / "shards"), "--seq_len", "32", "--micro_batch", "4", "--global_batch", "8",
             "--steps", "2", "--warmup_steps", "1", "--eval_every", "0", "--eval_windows", "8", "--save_every", "2"]
    cfg = resolve_config(["blocks-adapt", "--init_from", str(export), "--out_dir", str(tmp_path / "blocks"), *small])
    trainer = Trainer(cfg, info=SINGLE, **QUIET)
    blocks = [1, *sorted(OBJECTIVES["biglm-blocks"].prefix_blocks)]  # the recipe adds blocks of 1 (one token per call)
    assert (trainer.model_config.prefix_attention, trainer.model_config.prefix_block_lengths) == ("blocks", blocks)
    trainer.train()
    adapted, _ = load_model(tmp_path / "blocks")
    assert adapted.config.prefix_attention == "blocks" and adapted.config.prefix_block_lengths == blocks
    # trained further with the paper objective, it is a paper model again
    back = resolve_config(["--init_from", str(tmp_path / "blocks"), "--out_dir", str(tmp_path / "back"), *small])
    back.data = {str(synthetic_data / "shards"): 1.0}
    trainer = Trainer(back, info=SINGLE, **QUIET)
    assert (trainer.model_config.prefix_attention, trainer.model_config.prefix_block_lengths) == ("bidirectional", [])


def test_model_card_front_matter_names_base_model_objective_and_data(synthetic_data, source, tmp_path):
    _, export = source
    run = tmp_path / "run"
    Trainer(_cfg(synthetic_data, run, init_from=str(export), steps=3, model=ModelArgs(),
                 objective=OBJECTIVES["biglm-blocks"]), info=SINGLE, **QUIET).train()
    (run / "eval").mkdir()  # what `biglm eval --suite heldout --output_path RUN/eval` leaves (lm-eval's layout)
    (run / "eval" / "heldout.json").write_text(json.dumps(
        {"results": {"heldout": {"alias": "heldout", "masked_loss,none": 5.25, "masked_loss_stderr,none": 0.1}}}))
    out = export_checkpoint(run, tmp_path / "hf", license="mit")
    card = (out / "README.md").read_text()
    front = _front_matter(card)
    assert (front["library_name"], front["license"], front["pipeline_tag"]) == ("biglm", "mit", "fill-mask")
    # a card names no local path: the start (a model trained here from scratch) and the data are named in the text
    assert "base_model" not in front and "datasets" not in front and str(tmp_path) not in card
    assert "continued from a local model (`export`)" in card and "- data: `corpus.txt`" in card
    assert front["tags"] == ["biglm", "masked-lm", "biglm-blocks"]  # each once
    assert "prefix attention: `blocks`" in card and "steps: 3 of 3" in card and f"tokens: {3 * 8 * 32:,}" in card
    assert "validation masked-token loss at step 3" in card and "| heldout | masked_loss | 5.25 |" in card
    assert "load_model(" in card and "generate(" in card
    # trained from scratch: no base model; the default license
    scratch = _front_matter((export / "README.md").read_text())
    assert "base_model" not in scratch and scratch["license"] == "apache-2.0"
    assert scratch["tags"] == ["biglm", "masked-lm"]  # the objective `biglm` is not repeated
    # a model descending from a hub model (`biglm convert ORG/NAME` records it): base_model is that hub id, and the
    # export keeps the record, so a card made from the export later still names it (here the start is given as
    # export's --base_model, a local folder, which is followed back the same way)
    converted = shutil.copytree(export, tmp_path / "converted")
    (converted / "biglm_source.json").write_text(json.dumps({"kind": "hub", "name": "Org/Base-1B", "sha256": None}))
    hub = _front_matter((export_checkpoint(run, tmp_path / "hf2", base_model=str(converted)) / "README.md").read_text())
    assert hub["base_model"] == "Org/Base-1B"
    assert json.loads((tmp_path / "hf2" / "biglm_source.json").read_text())["name"] == "Org/Base-1B"


def test_fine_tuned_model_card_says_task_and_metric(source, tmp_path):
    _, export = source
    run = tmp_path / "ft"
    shutil.copytree(export, run / "best")  # the layout `biglm finetune` leaves: the best epoch's export, task.json
    (run / "task.json").write_text(json.dumps({"task": "sst2", "kind": "classification", "settings": {}}))
    (run / "finetune_config.json").write_text(json.dumps({"model": "runs/base", "epochs": 2, "lr": 2e-5,
                                                          "global_batch": 32}))
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"kind": "eval", "step": 5, "epoch": 1, "split": "validation", "accuracy": 0.61},
        {"kind": "eval", "step": 10, "epoch": 2, "split": "validation", "accuracy": 0.7}]) + "\n")
    card = (export_checkpoint(run, tmp_path / "hf") / "README.md").read_text()
    front = _front_matter(card)
    assert "base_model" not in front and "continued" not in card and "from a local model (`base`)" in card
    assert front["tags"] == ["biglm", "masked-lm", "fine-tuned", "sst2"]
    assert front["pipeline_tag"] == "text-classification"
    (run / "task.json").write_text(json.dumps({"task": "alpaca", "kind": "instruct", "settings": {}}))
    instruct = _front_matter((export_checkpoint(run, tmp_path / "hf-instruct") / "README.md").read_text())
    assert instruct["pipeline_tag"] == "text-generation"  # an instruction-tuned model writes answers
    assert "metric: `accuracy`" in card and "best epoch: 2 (validation accuracy 0.7)" in card
