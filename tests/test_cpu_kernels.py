"""biglm's bfloat16 CPU kernel (`biglm.model.cpu_kernels`) and the packed layers that use it (`packed.Prepacked`):
bfloat16 weights read as bfloat16, the products of float32 weights of the same values."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.generation import generate_ids, left_pad
from biglm.model import cpu_kernels
from biglm.model.packed import FusedPackedLinear, KernelRMSNorm, PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(cpu_kernels.unavailable_reason() is not None or not torch.backends.mkldnn.is_available(),
                                reason=f"the kernel does not run here: {cpu_kernels.unavailable_reason()}")


def _bf16_values(*shape, generator) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).to(torch.bfloat16).float()


@pytest.fixture(autouse=True)
def _kernel_cache_restored():
    yield
    cpu_kernels.load_kernels.cache_clear()  # (a test that turned it off leaves the next one a fresh lookup)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_gives_float32_products_of_the_same_weights(threads, bias):
    """Every row count (0, one tile, the in-register limit and past it: the widened-buffer path, uneven tiles, more than
    one block of rows), outputs not a multiple
    of the panel (padded) and inner sizes past one chunk: the float32 product of the same values, to summation order
    (float32: 1e-5 of the summed magnitudes)."""
    assert cpu_kernels.bf16_linear_kernel() is not None
    g = torch.Generator().manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (0, 1, 5, 6, 7, 8, 12, 13, 40, 130):
            for out_features, in_features in ((16, 1), (48, 17), (50, 300), (96, 600)):
                w = _bf16_values(out_features, in_features, generator=g)
                b = torch.randn(out_features, generator=g) if bias else None
                x = torch.randn(2, rows, in_features, generator=g)  # (leading dims kept)
                panels = cpu_kernels.bf16_panels(w)
                assert panels.dtype == torch.bfloat16 and panels.shape == (-(-out_features // 16), in_features, 16)
                padded = None if b is None else F.pad(b, (0, panels.shape[0] * 16 - out_features))
                y = cpu_kernels.bf16_linear(x, panels, padded, out_features)
                want = F.linear(x.double(), w.double(), None if b is None else b.double())
                scale = (x.abs().double() @ w.abs().double().T) + (0 if b is None else b.abs().double())
                assert y.shape == want.shape and y.dtype == torch.float32 and y.is_contiguous()
                assert ((y.double() - want).abs() <= 1e-5 * scale + 1e-6).all(), (rows, out_features, in_features)
    finally:
        torch.set_num_threads(before)


def test_the_rms_norm_kernel_gives_llamas_formula():
    """The one-call RMSNorm: Llama's formula in float32 to summation order (every row count, widths with and without a
    tail past the 32 lanes), leading dimensions kept."""
    g = torch.Generator().manual_seed(5)
    for rows in (0, 1, 7):
        for dim in (3, 40, 576):
            x, w = torch.randn(2, rows, dim, generator=g) * 3, torch.randn(dim, generator=g)
            y = cpu_kernels.rms_norm(x, w, 1e-5)
            want = w.double() * (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5))
            assert y.shape == x.shape and y.dtype == torch.float32
            torch.testing.assert_close(y.double(), want, atol=1e-6, rtol=1e-5)


def test_panels_refuse_weights_that_are_not_bfloat16_values():
    w = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="not bfloat16 values"):
        cpu_kernels.bf16_panels(w)
    panels = cpu_kernels.bf16_panels(w.to(torch.bfloat16))  # bfloat16 itself: as held
    assert torch.equal(panels.transpose(1, 2).reshape(16, 8), w.to(torch.bfloat16))


def _model(bf16_values: bool = True, **overrides) -> BiGLMForMaskedLM:
    torch.manual_seed(0)
    config = BiGLMConfig.from_preset("tiny", initializer_range=0.2, prefix_attention="blocks",
                                     prefix_block_lengths=[1, 4, 8], **overrides)
    model = BiGLMForMaskedLM(config).eval()
    if bf16_values:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    return model


def test_a_bfloat16_valued_model_packs_for_the_kernel_with_the_same_logits_and_answers():
    """`pack_linears(bf16_weights=True)`: every linear layer (fused q/k/v and gate/up, o, down, the tied head) read by
    the kernel; the logits those of the unpacked model (float32, 1e-4) and the greedy answers the same."""
    plain, packed = _model(), _model()
    pack_linears(packed, bf16_weights=True)
    products = [m.packed for m in packed.modules() if isinstance(m, (PackedLinear, FusedPackedLinear))
                and m.packed is not None]
    assert products and all(p.bf16 for p in products)
    norms = [m for m in packed.modules() if isinstance(m, KernelRMSNorm)]  # every norm: one C call
    assert len(norms) == 2 * packed.config.num_hidden_layers + 1 and packed.model.norm in norms
    assert isinstance(packed.model.layers[0].self_attn.qkv_proj, FusedPackedLinear)
    assert packed.lm_head.weight is packed.model.embed_tokens.weight and \
        packed.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(5, plain.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids, prefix_len=8).logits, plain(ids, prefix_len=8).logits,
                                   atol=1e-4, rtol=1e-4)
    prompts, mask = left_pad([[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]], pad_id=plain.config.pad_token_id)
    for kw in (dict(strategy="confidence", block_length=1), dict(strategy="confidence", steps=8, block_length=4)):
        want = generate_ids(plain, prompts, mask, max_new_tokens=16, **kw).token_lists()
        assert generate_ids(packed, prompts, mask, max_new_tokens=16, **kw).token_lists() == want


def test_layers_of_other_values_and_machines_without_the_kernel_keep_onednn(monkeypatch):
    """A float32 layer whose values are not bfloat16 stays oneDNN's (rounding would change the model); with the kernel
    off (``BIGLM_CPU_KERNELS=0``) every layer does, and with a compiler that fails the build it is off with a warning
    naming the failure."""
    model = _model()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.add_(1e-3)  # (no longer bfloat16 values)
    pack_linears(model, bf16_weights=True)
    assert not model.model.layers[0].mlp.down_proj.packed.bf16 and model.model.layers[1].mlp.down_proj.packed.bf16

    monkeypatch.setenv("BIGLM_CPU_KERNELS", "0")
    cpu_kernels.load_kernels.cache_clear()
    off = _model()
    pack_linears(off, bf16_weights=True)
    assert not any(m.packed.bf16 for m in off.modules() if isinstance(m, (PackedLinear, FusedPackedLinear))
                   and m.packed is not None)


def test_a_failed_build_turns_the_kernel_off_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("BIGLM_KERNEL_CACHE", str(tmp_path))  # (nothing built there yet)
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    cpu_kernels.load_kernels.cache_clear()
    with pytest.warns(UserWarning, match="kernel is off: its build failed"):
        assert cpu_kernels.bf16_linear_kernel() is None
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pack_linears(model, bf16_weights=True)
    assert all(not m.packed.bf16 for m in model.modules() if isinstance(m, PackedLinear) and m.packed is not None)
    assert not list(tmp_path.glob("*.so"))  # (no half-built library left)


def test_the_kernel_is_built_once_into_its_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("BIGLM_KERNEL_CACHE", str(tmp_path))
    cpu_kernels.load_kernels.cache_clear()
    assert cpu_kernels.bf16_linear_kernel() is not None
    built = list(tmp_path.glob("bf16_linear-*.so"))
    assert len(built) == 1 and not [p for p in tmp_path.iterdir() if p not in built]
    stamp = built[0].stat().st_mtime_ns
    cpu_kernels.load_kernels.cache_clear()
    assert cpu_kernels.bf16_linear_kernel() is not None and built[0].stat().st_mtime_ns == stamp


def test_calls_of_many_rows_go_to_the_float32_weights(monkeypatch):
    """Past `BF16_KERNEL_MAX_ROWS` rows (a long prompt, a scoring batch) a packed layer multiplies the float32 weights
    with `F.linear` instead of the kernel (faster there), the same logits (float32, 1e-4); up to it, the kernel."""
    import biglm.model.packed as packed

    plain, model = _model(), _model()
    pack_linears(model, bf16_weights=True)
    calls = []
    real = cpu_kernels.bf16_linear
    monkeypatch.setattr(cpu_kernels, "bf16_linear", lambda x, *a, **k: calls.append(x.numel() // x.shape[-1])
                        or real(x, *a, **k))
    monkeypatch.setattr(packed, "BF16_KERNEL_MAX_ROWS", 12)
    with torch.inference_mode():
        for length, kernel in ((12, True), (13, False)):
            ids = torch.randint(5, plain.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(4))
            calls.clear()
            torch.testing.assert_close(model(ids, prefix_len=4).logits, plain(ids, prefix_len=4).logits,
                                       atol=1e-4, rtol=1e-4)
            assert bool(calls) == kernel and all(rows <= 12 for rows in calls)


def _adapted_model() -> BiGLMForMaskedLM:
    """`_model` with gated mask adapters of random bfloat16 values (a fresh adapter's zero ``up`` would test nothing)."""
    model = _model(mask_adapter_rank=4)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adapter" in name:
                p.copy_(0.3 * _bf16_values(*p.shape, generator=g))
    return model


def _layer_switch(model):
    from biglm.model.modeling import BiGLMBlock

    blocks = [(b, b.kernel_forward) for b in model.modules() if isinstance(b, BiGLMBlock)]
    taken = []

    def counted(layer):
        def call(*args):
            out = layer(*args)
            taken.append(out is not None)
            return out
        return call

    def use(on: bool) -> None:
        for block, layer in blocks:
            block.kernel_forward = counted(layer) if on else None
    return blocks, taken, use


def test_the_layer_kernel_gives_the_blocks_own_forward():
    """`KernelLayer`: each decoder layer of a kernel-packed model in one C call gives the logits of the same packed
    model's PyTorch layers (float32, 1e-4) on a call of the blocks rule with left padding and mask tokens (the gated
    adapters on), on a suffix call after a prefix cache (the call's keys after the cache's), with and without the
    adapters; the kernel really takes every layer."""
    from biglm.generation import left_pad

    for model in (_model(), _adapted_model()):
        pack_linears(model, bf16_weights=True)
        blocks, taken, use = _layer_switch(model)
        assert blocks and all(layer is not None for _, layer in blocks)
        mask_id = model.config.mask_token_id
        ids, pad = left_pad([[5, 6, 7, 8, 9, 10, mask_id, mask_id], [11, 12, mask_id], [13, 14, 15, 16, 17, mask_id,
                                                                                     18, mask_id, mask_id]],
                            pad_id=model.config.pad_token_id)
        with torch.inference_mode():
            out = {}
            for on in (True, False):
                use(on)
                full = model(ids, prefix_len=4, attention_mask=pad).logits
                cache = model.encode_prefix(ids[:, :5], attention_mask=pad[:, :5])
                suffix = model(ids[:, 5:], prefix_cache=cache, attention_mask=pad[:, 5:]).logits
                out[on] = (full, suffix, cache.keys[1])
        assert taken and all(taken) and len(taken) == 3 * len(blocks)  # (3 passes, every layer by the kernel)
        for got, want in zip(out[True], out[False]):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_layer_kernel_serves_the_engines_pooled_calls_with_the_same_answers():
    """In the server engine (pooled rows, the call's keys written into each row's room, `PrefixCache.room`) the
    kernel layers give the answers the PyTorch layers give, request by request (greedy: blocks, drafts and the
    default decoding of the adapted model)."""
    from biglm.generation import DecodingConfig
    from biglm.generation.config import model_decoding
    from biglm.generation.engine import DecodeEngine

    model = _adapted_model()
    pack_linears(model, bf16_weights=True)
    _, taken, use = _layer_switch(model)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [14, 15, 16, 17], [30, 31, 32, 33, 34, 35, 36, 37]]
    configs = [DecodingConfig(max_new_tokens=10, strategy="confidence", block_length=1, steps=10),
               DecodingConfig(max_new_tokens=12, strategy="confidence", block_length=4, steps=6),
               model_decoding(model.config, {"max_new_tokens": 12}),
               DecodingConfig(max_new_tokens=9, strategy="confidence", block_length=1, draft_length=3)]
    answers, rooms = {}, []
    for on in (True, False):
        use(on)
        engine = DecodeEngine(model, max_batch_rows=8)
        batch = engine._pool.batch

        def seen(reqs, call, batch=batch, **kw):
            cache = batch(reqs, call, **kw)
            rooms.append(cache is not None and cache.room is not None)
            return cache

        engine._pool.batch = seen
        for i, (p, c) in enumerate(zip(prompts, configs)):
            engine.submit(f"r{i}", p, c)
        done = {}
        while engine.num_running or engine.num_waiting:
            for e in engine.step():
                if e.finished:
                    done[e.request_id] = e.token_ids
        answers[on] = done
    assert any(rooms) and taken and all(taken)
    assert answers[True] == answers[False] and len(answers[True]) == len(prompts)


def test_the_layer_kernel_declines_calls_it_does_not_take(monkeypatch):
    """A gradient asked for, more rows than `BF16_KERNEL_MAX_ROWS` or the batch-invariant mode: `KernelLayer` returns
    None and the block's own forward runs (the same logits, float32 1e-4)."""
    import biglm.model.packed as packed
    from biglm.model.attention import AttentionMask

    plain, model = _model(), _model()
    pack_linears(model, bf16_weights=True)
    layer = model.model.layers[0].kernel_forward
    x = torch.randn(1, 3, model.config.hidden_size)
    rope = model.model.rotary_emb(torch.arange(3)[None], torch.float32)
    full = AttentionMask(batch=1, q_len=3, k_len=3)
    with torch.inference_mode():
        assert layer(x, rope, full, None, None, None) is not None
        assert layer(x, rope, AttentionMask(batch=1, q_len=3, k_len=3, batch_invariant=True), None, None, None) is None
        monkeypatch.setattr(packed, "BF16_KERNEL_MAX_ROWS", 2)
        assert layer(x, rope, full, None, None, None) is None
        ids = torch.randint(5, plain.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(model(ids).logits, plain(ids).logits, atol=1e-4, rtol=1e-4)
    assert layer(x.requires_grad_(), rope, full, None, None, None) is None
