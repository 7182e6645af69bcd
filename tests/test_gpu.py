"""GPU-only checks (skipped without CUDA): FlexAttention training path in bf16, compile, bf16 training step."""

from __future__ import annotations

import pytest
import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM

pytestmark = pytest.mark.gpu


def test_flex_forward_backward_matches_sdpa_bf16():
    torch.manual_seed(0)
    config = BiGLMConfig.from_preset("tiny", vocab_size=1024, hidden_size=256, num_attention_heads=8,
                                     num_key_value_heads=2, max_position_embeddings=1024)
    ids = torch.randint(5, 1024, (4, 512), device="cuda")
    p = torch.tensor([100, 200, 300, 400], device="cuda")
    labels = torch.where(torch.rand(4, 512, device="cuda") < 0.3, ids, -100)
    results = {}
    for backend in ("sdpa", "flex"):
        torch.manual_seed(0)
        model = BiGLMForMaskedLM(BiGLMConfig(**{**config.to_dict(), "attn_backend": backend})).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, prefix_len=p, labels=labels).loss
        loss.backward()
        results[backend] = (loss.detach().float(), {n: q.grad.float() for n, q in model.named_parameters()})
    torch.testing.assert_close(results["flex"][0], results["sdpa"][0], atol=2e-2, rtol=2e-2)
    for name, g in results["sdpa"][1].items():
        torch.testing.assert_close(results["flex"][1][name], g, atol=5e-2, rtol=5e-2, msg=name)


def test_prefix_blind_under_flex_bf16():
    config = BiGLMConfig.from_preset("tiny", attn_backend="flex")
    model = BiGLMForMaskedLM(config).cuda().eval()
    ids = torch.randint(5, 512, (2, 128), device="cuda")
    p = torch.tensor([40, 90], device="cuda")
    changed = ids.clone()
    changed[:, 100:] = (changed[:, 100:] + 1) % 512
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a = model.model(ids, prefix_len=p).last_hidden_state
        b = model.model(changed, prefix_len=p).last_hidden_state
    assert torch.equal(a[0, :40], b[0, :40]) and torch.equal(a[1, :90], b[1, :90])


def _levers_trainer(tmp_path, **kw):
    """A tiny pre-training run on CUDA (bf16, flex, compiled blocks) over synthetic shards."""
    from conftest import synthetic_corpus, tiny_train_config

    from biglm.data import prepare, train_tokenizer
    from biglm.training import Trainer
    from biglm.training.distributed import DistInfo

    docs = synthetic_corpus(300)
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs))
    train_tokenizer(texts=docs, vocab_size=384, out_dir=str(tmp_path / "tok"))
    prepare(sources=[str(tmp_path / "corpus.txt")], tokenizer=str(tmp_path / "tok"), out_dir=tmp_path / "shards",
            val_docs=30, workers=1, progress=False)
    cfg = tiny_train_config(tmp_path / "run", data={str(tmp_path / "shards"): 1.0}, tokenizer=str(tmp_path / "tok"),
                            doc_mask=True, device="cuda", steps=20, **kw)
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cuda"))
    return Trainer(cfg, info=info, echo=lambda s: None)


def test_training_step_has_no_host_sync(tmp_path):
    """Issue 40's levers on (the defaults): after the first steps (compile, the input checks), a step queues its whole
    work without waiting for the GPU."""
    trainer = _levers_trainer(tmp_path)
    for _ in range(3):
        trainer.train_step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            trainer.train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        trainer.stop_prefetch()


def test_fused_loss_matches_logits_path_bf16_cuda():
    from biglm.objective import linear_cross_entropy, token_loss

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(3000, 576, device="cuda", generator=g)
    weight = torch.randn(49152, 576, device="cuda", generator=g) * 0.05
    targets = torch.randint(0, 49152, (3000,), device="cuda", generator=g)
    out = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = (linear_cross_entropy(h, w, targets, chunk=1024) if fused
                    else token_loss(torch.nn.functional.linear(h, w), targets))
        loss.backward()
        out.append((loss.detach().float(), h.grad, w.grad))
    torch.testing.assert_close(out[1][0], out[0][0], atol=1e-3, rtol=1e-3)
    for a, b in zip(out[1][1:], out[0][1:]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=2e-2)
