"""Pre-training's speed levers keep the loss: the fused chunked cross-entropy, host-drawn masks built a step ahead,
the sync-free non-finite check and the time budget, each against the previous path (its config flag off)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_train_config, train_losses

from biglm.objective import IGNORE_INDEX, linear_cross_entropy, token_loss
from biglm.training import NonFiniteLossError, Trainer
from biglm.training.distributed import DistInfo

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
PREVIOUS = dict(loss_chunk=0, host_masks=False, deferred_finite_check=False)


def _problem(M=37, h=16, V=211, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, h, generator=g)
    weight = torch.randn(V, h, generator=g) * 0.3
    targets = torch.randint(0, V, (M,), generator=g)
    targets[::5] = IGNORE_INDEX
    loss_weight = torch.rand(M, generator=g) + 0.5
    return hidden, weight, targets, loss_weight


@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
def test_linear_cross_entropy_equals_token_loss_fp32(chunk):
    hidden, weight, targets, loss_weight = _problem()
    norm = torch.tensor(29.0)
    results = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if fused:
            loss = linear_cross_entropy(h, w, targets, loss_weight=loss_weight, normalizer=norm, chunk=chunk)
        else:
            loss = token_loss(h @ w.t(), targets, weight=loss_weight, normalizer=norm)
        (loss * 3.0).backward()  # a scaled loss, as the loop's world-size factor
        results.append((loss.detach(), h.grad, w.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_linear_cross_entropy_bf16_autocast_and_no_grad():
    hidden, weight, targets, _ = _problem(M=64, h=32, V=500)
    results = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (linear_cross_entropy(h, w, targets, chunk=16) if fused
                    else token_loss(torch.nn.functional.linear(h, w), targets))
        loss.backward()
        results.append((loss.detach().float(), h.grad, w.grad))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-3, rtol=1e-3)  # the same bf16 logits
    for a, b in zip(results[1][1:], results[0][1:]):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-2)
    with torch.no_grad():  # validation: the loss alone
        assert torch.allclose(linear_cross_entropy(hidden, weight, targets, chunk=7),
                              token_loss(hidden @ weight.t(), targets), atol=1e-5)


def test_model_loss_targets_path_equals_logits_path(tiny_config):
    from biglm import BiGLMForMaskedLM

    torch.manual_seed(0)
    model = BiGLMForMaskedLM(tiny_config)
    ids = torch.randint(5, tiny_config.vocab_size, (2, 24))
    positions = torch.tensor([1, 4, 9, 30, 31, 40])
    targets = ids.reshape(-1)[positions]
    grads = []
    for fused in (False, True):
        model.zero_grad()
        if fused:
            loss = model(ids, prefix_len=10, logits_positions=positions, loss_targets=targets,
                         num_items_in_batch=torch.tensor(6), loss_chunk=4).loss
            assert model(ids, logits_positions=positions, loss_targets=targets).logits is None
        else:
            loss = token_loss(model(ids, prefix_len=10, logits_positions=positions).logits, targets, normalizer=6)
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-6, rtol=1e-6)
    for name, g in grads[0][1].items():
        torch.testing.assert_close(grads[1][1][name], g, atol=1e-5, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="loss_targets needs logits_positions"):
        model(ids, loss_targets=targets)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from conftest import synthetic_corpus

    from biglm.data import prepare, train_tokenizer

    root = tmp_path_factory.mktemp("levers")
    docs = synthetic_corpus(300)
    (root / "corpus.txt").write_text("\n\n".join(docs))
    train_tokenizer(texts=docs, vocab_size=384, out_dir=str(root / "tok"))
    prepare(sources=[str(root / "corpus.txt")], tokenizer=str(root / "tok"), out_dir=root / "shards", val_docs=30,
            workers=1, progress=False)
    return root


def _cfg(data, out, **kw):
    return tiny_train_config(out, data={str(data / "shards"): 1.0}, tokenizer=str(data / "tok"), doc_mask=True,
                             **kw)


@pytest.mark.parametrize("dtype, tol", [("fp32", 1e-5), ("bf16", 2e-2)])
def test_new_path_trains_as_the_previous_one(data, tmp_path, dtype, tol):
    """Every lever on (the defaults) against every lever off: the same losses, validation and weights (fp32: up to
    summation order; bf16 autocast on a CPU: within bf16 rounding), the same data position saved."""
    runs = {}
    for name, kw in (("new", {}), ("previous", PREVIOUS)):
        trainer = Trainer(_cfg(data, tmp_path / name, steps=4, dtype=dtype, **kw), info=SINGLE, echo=lambda s: None)
        result = trainer.train()
        runs[name] = (result, trainer.raw_model.state_dict(), trainer.state_dict()["train_sampler"])
    (new, w_new, s_new), (old, w_old, s_old) = runs["new"], runs["previous"]
    assert [s for s, _ in new.losses] == [1, 2, 3, 4]
    for (_, a), (_, b) in zip(new.losses + new.val_losses, old.losses + old.val_losses):
        assert a == pytest.approx(b, rel=tol, abs=tol)
    for k, v in w_old.items():
        torch.testing.assert_close(w_new[k], v, atol=tol, rtol=tol, msg=k)
    assert s_new == s_old  # prefetching ran ahead; the checkpoint records the position after the last step taken


def test_resume_under_prefetch_equals_uninterrupted(data, tmp_path):
    Trainer(_cfg(data, tmp_path / "full", steps=6), info=SINGLE, echo=lambda s: None).train()

    def stop_at_2(loop, step):
        if step == 2:
            import signal

            loop.request_stop(signal.SIGTERM)

    from biglm.training.loop import TrainingInterrupted

    with pytest.raises(TrainingInterrupted):
        Trainer(_cfg(data, tmp_path / "cut", steps=6), info=SINGLE, echo=lambda s: None, after_step=stop_at_2).train()
    Trainer(_cfg(data, tmp_path / "cut", steps=6), info=SINGLE, echo=lambda s: None).train()
    assert train_losses(tmp_path / "cut") == train_losses(tmp_path / "full")


@pytest.mark.parametrize("deferred", [True, False])
def test_non_finite_step_skipped_on_device_and_named(data, tmp_path, deferred):
    trainer = Trainer(_cfg(data, tmp_path, steps=6, save_every=100, log_every=100, eval_every=0,
                           deferred_finite_check=deferred), info=SINGLE, echo=lambda s: None)
    assert (trainer.finite_watch is not None) == deferred
    before = {}

    def nan_output(module, args, output):
        if trainer.step == 2 and not before:
            before.update({n: p.detach().clone() for n, p in trainer.raw_model.named_parameters()})
        return output * float("nan") if trainer.step == 2 else output

    trainer.raw_model.model.layers[0].mlp.register_forward_hook(nan_output)
    with pytest.raises(NonFiniteLossError, match="at step 2 .*untouched"):
        trainer.train()
    # the deferred check noticed it at the last step (no log line or checkpoint before): steps 3-5 were skipped too
    assert trainer.step == (6 if deferred else 2)
    for n, p in trainer.raw_model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert not list((tmp_path / "checkpoints").glob("step_*"))


def test_time_budget_stops_with_a_checkpoint_and_validation(data, tmp_path):
    lines = []
    result = Trainer(_cfg(data, tmp_path, steps=50, max_minutes=1e-9, eval_every=0), info=SINGLE,
                     echo=lines.append).train()
    assert result.step == 1 and [s for s, _ in result.val_losses] == [1]
    assert [p.name for p in (tmp_path / "checkpoints").glob("step_*")] == ["step_0000001"]
    assert any("time budget of 1e-09 min reached after step 1 of 50" in line for line in lines)
