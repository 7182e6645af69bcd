"""Recipes run on the backend they get on a GPU; activation checkpointing with dropout; the training hot path
(one loss, no per-step input checks); exported files readable by others (issue 7 items 4, 7, 9)."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.model import resolve_attn_backend
from biglm.model.modeling import BiGLMModel
from biglm.objective import IGNORE_INDEX
from biglm.objective import mask_batch, masked_lm_loss
from biglm.training import RECIPES, Trainer, TrainConfig
from biglm.training.config import ModelArgs
from biglm.training.distributed import DistInfo, parallelize

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=512, max_position_embeddings=64)


# ---------------------------------------------------------------- item 4: every recipe on its GPU backend
def _dropouts(cfg: TrainConfig) -> tuple[float, float]:
    return cfg.model.attention_dropout or 0.0, cfg.model.hidden_dropout or 0.0


def test_the_dropout_recipes_are_covered():
    """The recipes this file is about: the paper's Table 1 and Table 8 ablations train with attention dropout."""
    with_dropout = {name for name, make in RECIPES.items() if _dropouts(make())[0] > 0}
    assert {"table1-biglm", "table1-no-attn", "table1-mlm", "table8-alpha-0.1"} <= with_dropout


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_runs_on_its_gpu_backend(name):
    """Shrink each recipe (its own dropout and objective) and run a training-mode forward on CPU with the
    backend `auto` gives it on a GPU. Flex has no CPU backward (torch 2.13): forward only there."""
    cfg = RECIPES[name]()
    attn_p, hidden_p = _dropouts(cfg)
    backend = resolve_attn_backend(getattr(cfg, "attn_backend", "auto"), device_type="cuda", attention_dropout=attn_p)
    config = BiGLMConfig.from_preset(cfg.preset, **TINY, attention_dropout=attn_p, hidden_dropout=hidden_p,
                                     attn_backend=backend)
    torch.manual_seed(0)
    model = BiGLMForMaskedLM(config).train()
    windows = torch.randint(5, config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    batch = mask_batch(windows, cfg.objective, mask_token_id=4, vocab_size=config.vocab_size, seed=0)
    with torch.set_grad_enabled(backend != "flex"):
        out = model(batch.input_ids, prefix_len=batch.prefix_len, logits_positions=batch.labels != IGNORE_INDEX)
        loss = masked_lm_loss(out.logits, batch)
    assert torch.isfinite(loss)
    if backend != "flex":
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_backend_resolution():
    assert resolve_attn_backend("auto", device_type="cuda", attention_dropout=0.0) == "flex"
    assert resolve_attn_backend("auto", device_type="cuda", attention_dropout=0.1) == "sdpa"
    assert resolve_attn_backend("auto", device_type="cpu", attention_dropout=0.0) == "sdpa"
    assert resolve_attn_backend("eager", device_type="cuda", attention_dropout=0.1) == "eager"
    assert resolve_attn_backend("flex", device_type="cuda", attention_dropout=0.0) == "flex"
    with pytest.raises(ValueError, match="attn_backend='flex' has no attention dropout.*attention_dropout=0.1"):
        resolve_attn_backend("flex", device_type="cuda", attention_dropout=0.1)
    with pytest.raises(ValueError, match="attn_backend='flash'"):
        resolve_attn_backend("flash", device_type="cuda", attention_dropout=0.0)


def test_flex_with_dropout_is_refused_before_training(synthetic_data, tmp_path):
    cfg = _cfg(synthetic_data, tmp_path, attn_backend="flex",
               model=ModelArgs(max_position_embeddings=64, attention_dropout=0.1))
    with pytest.raises(ValueError, match="has no attention dropout"):
        Trainer(cfg, info=SINGLE, echo=lambda s: None)


# ---------------------------------------------------------------- item 4: activation checkpointing with dropout
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_activation_checkpointing_with_dropout_gives_the_same_gradients(backend):
    config = BiGLMConfig.from_preset("tiny", attn_backend=backend, hidden_dropout=0.1, attention_dropout=0.1)
    windows = torch.randint(5, config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(1))
    batch = mask_batch(windows, RECIPES["table1-biglm"]().objective, mask_token_id=4, seed=0)
    grads = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = BiGLMForMaskedLM(config).train()
        model = parallelize(model, info=SINGLE, activation_checkpointing=checkpointing)
        torch.manual_seed(123)  # the same dropout masks in the forward pass of both runs
        out = model(batch.input_ids, prefix_len=batch.prefix_len, logits_positions=batch.labels != IGNORE_INDEX)
        masked_lm_loss(out.logits, batch).backward()
        grads[checkpointing] = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}
    assert grads[True].keys() == grads[False].keys()
    for name, g in grads[False].items():
        torch.testing.assert_close(grads[True][name], g, atol=1e-6, rtol=1e-5, msg=name)


# ---------------------------------------------------------------- item 7: the training hot path
def _cfg(data_root: Path, out: Path, **kw) -> TrainConfig:
    base = dict(name="t", out_dir=str(out), preset="tiny", model=ModelArgs(max_position_embeddings=64),
                data={str(data_root / "shards"): 1.0}, tokenizer=str(data_root / "tok"), seq_len=32, micro_batch=2,
                global_batch=4, steps=3, lr=3e-3, min_lr=3e-4, warmup_steps=1, log_every=1, eval_every=0,
                eval_windows=8, save_every=0, keep_last=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("loss_chunk", [0, 1024])
def test_training_computes_one_loss_per_micro_batch(synthetic_data, tmp_path, monkeypatch, loss_chunk):
    """One loss per micro-batch and nothing discarded kept alive through backward. The previous path
    (``loss_chunk`` 0): the forward returns sparse logits only (no internal loss), and `masked_lm_loss` is the one
    cross-entropy. The fused loss (the default): the model computes it chunk by chunk from the hidden states and
    returns no logits at all (no masked x vocab tensor exists)."""
    trainer = Trainer(_cfg(synthetic_data, tmp_path, loss_chunk=loss_chunk), info=SINGLE, echo=lambda s: None)
    outputs = []
    trainer.raw_model.register_forward_hook(lambda module, args, out: outputs.append(out))
    calls = []
    real = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(2):
        trainer.train_step()
    micro_batches = 2 * trainer.accum
    assert len(outputs) == micro_batches
    if loss_chunk:
        assert all(o.loss is not None and o.logits is None for o in outputs)
    else:
        assert all(o.loss is None for o in outputs)
        assert all(o.logits.dim() == 2 for o in outputs)  # sparse: (masked tokens, vocab)
        assert len(calls) == micro_batches


def test_training_checks_inputs_on_the_first_micro_batch_only(synthetic_data, tmp_path, monkeypatch):
    calls = []
    real = BiGLMModel._check_inputs
    monkeypatch.setattr(BiGLMModel, "_check_inputs", lambda self, *a: calls.append(1) or real(self, *a))
    trainer = Trainer(_cfg(synthetic_data, tmp_path / "a"), info=SINGLE, echo=lambda s: None)
    for _ in range(3):
        trainer.train_step()
    assert trainer.accum == 2 and len(calls) == 1  # 6 micro-batches, one check (four host syncs in one)
    # with the checks off from the start, training never runs them
    calls.clear()
    trainer = Trainer(_cfg(synthetic_data, tmp_path / "b"), info=SINGLE, echo=lambda s: None)
    trainer.raw_model.model.validate_inputs = False
    for _ in range(2):
        trainer.train_step()
    assert calls == []


def test_training_loss_is_unchanged(synthetic_data, tmp_path):
    """The one loss equals what the double computation gave (model forward with labels, then `masked_lm_loss`),
    and so does the model's own loss with the global normaliser; gradients are unchanged too."""
    trainer = Trainer(_cfg(synthetic_data, tmp_path), info=SINGLE, echo=lambda s: None)
    reference = copy.deepcopy(trainer.raw_model)
    vocab = trainer.model_config.vocab_size
    windows = torch.randint(5, vocab, (2, 32), generator=torch.Generator().manual_seed(3))
    batch = mask_batch(windows, trainer.objective, mask_token_id=trainer.mask_id, vocab_size=vocab, seed=5)
    normalizer = batch.normalizer.float() * 2  # as if a second micro-batch held as many masked tokens
    loss = trainer.forward_backward(batch, windows, normalizer, sync=True)
    old = reference(batch.input_ids, prefix_len=batch.prefix_len, labels=batch.labels)
    old_loss = masked_lm_loss(old.logits, batch, normalizer=normalizer)
    old_loss.backward()
    internal = reference(batch.input_ids, prefix_len=batch.prefix_len, labels=batch.labels,
                         num_items_in_batch=normalizer).loss
    assert abs(float(loss) - float(old_loss.detach())) <= 1e-6
    assert abs(float(loss) - float(internal.detach())) <= 1e-6
    for (name, p), q in zip(trainer.raw_model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-7, rtol=1e-6, msg=name)


# ---------------------------------------------------------------- item 9: exported files are readable
def test_export_writes_files_with_the_usual_mode(synthetic_data, tmp_path):
    from biglm.checkpoint import export_checkpoint

    trainer = Trainer(_cfg(synthetic_data, tmp_path / "run", steps=1), info=SINGLE, echo=lambda s: None)
    trainer.train()
    old = os.umask(0o022)
    try:
        out = export_checkpoint(tmp_path / "run", tmp_path / "hf")
    finally:
        os.umask(old)
    files = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir() if f.is_file()}
    assert files["model.safetensors"] == 0o644
    assert files["config.json"] == 0o644
    assert set(files.values()) == {0o644}, files
