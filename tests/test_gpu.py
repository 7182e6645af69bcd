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
