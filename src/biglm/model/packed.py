"""Linear layers for CPU inference: prepacked kernels, and the row-by-row fallback batch invariance needs.

A decoding call multiplies a few rows (the masks of one block, 1-64 per request) by every weight matrix, so on a CPU
it is bound by reading the weights. `F.linear` repacks the weight into the kernels' blocked layout on every call for
small row counts; `pack_linears` packs it once (``torch.ops.mkldnn._linear_pointwise``, what inductor's freezing emits
on CPU), which `load_model(..., pack=True)` applies. The results equal `F.linear`'s in bfloat16 and differ by summation
order in float32. Only for inference: the packed copy does not follow later changes to the weight. Where oneDNN is
missing or refuses the layout, the model stays as it is.

A bfloat16 model on a CPU without bfloat16 matrix kernels computes in float32 (`reduced_precision_kernels`); its
weights, bfloat16 values, are then packed for biglm's own kernel (`cpu_kernels`, ``pack_linears(bf16_weights=True)``)
instead of oneDNN's float32 layout: half the bytes a call reads, the same products summed in float32; its RMSNorms
then run the same library's one-call norm (`KernelRMSNorm`).

Batch invariance (`BiGLMModel.batch_invariant`, bfloat16 only: float32 kernels change with the row count) needs a
row's result not to depend on the rows beside it, which a kernel need not give with real activations even where it
does with random rows. So `load_model(..., batch_invariant=True)` does not prepack: `make_rows_invariant` measures
every linear layer at load, on the machine it runs on, with the model's own activations (a row alone against the same
row among 2, 3 and 17 rows), and a layer of a shape found row-count dependent computes its rows one at a time
(`RowByRowLinear`). The kernel measurements behind this: docs/LOG.md.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .modeling import BiGLMBlock, BiGLMMaskAdapter, BiGLMRMSNorm

ROWS_HINT = 16  # the row count oneDNN tunes the layout for (any row count runs)
BF16_KERNEL_MAX_ROWS = 256
"""The most rows a call gives biglm's bfloat16 kernel (`cpu_kernels`); more (a long prompt, a scoring batch) go to
`F.linear` on the float32 weights, faster there (SmolLM2-135M's products, one thread, AMD EPYC: about even at 160
rows, 1.1-1.5x slower from 512; `benchmarks/bench_bf16_kernel.py`, docs/LOG.md)."""


class Prepacked:
    """A weight (N, K) and bias held for one inference kernel: oneDNN's blocked layout of the weight as it is, or, with
    ``bf16`` (float32 weights of bfloat16 values), bfloat16 panels for `cpu_kernels.bf16_linear`. Called on rows of
    ``dtype`` (the kernel's input dtype)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, rows_hint: int = ROWS_HINT,
                 bf16: bool = False) -> None:
        self.bf16, self.out_features = bf16, weight.shape[0]
        self.dtype = torch.float32 if bf16 else weight.dtype
        if bf16:
            from .cpu_kernels import PANEL, bf16_linear_kernel, bf16_panels

            self.kernel = bf16_linear_kernel()  # (held: the call needs no lookup, and a later setting cannot unset it)
            if self.kernel is None:
                raise RuntimeError("biglm's bfloat16 CPU kernel does not run on this machine (`cpu_kernels`)")
            self.weight = bf16_panels(weight)
            self.bias = None if bias is None else F.pad(bias.detach().float(), (0, self.weight.shape[0] * PANEL
                                                                                 - weight.shape[0]))
        else:
            self.weight, self.bias = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows_hint), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bf16:
            from .cpu_kernels import bf16_linear

            return bf16_linear(x, self.weight, self.bias, self.out_features, self.kernel)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def _prepack(weight: torch.Tensor, bias: torch.Tensor | None, rows_hint: int, bf16: bool) -> Prepacked:
    """``Prepacked(weight, bias)`` for biglm's bfloat16 kernel where ``bf16`` is asked for and the float32 weight holds
    bfloat16 values (`cpu_kernels.bf16_panels` checks, once), else for oneDNN."""
    if bf16 and weight.dtype == torch.float32:
        try:
            return Prepacked(weight, bias, rows_hint=rows_hint, bf16=True)
        except ValueError:  # (values that are not bfloat16: the kernel would round them)
            pass
    return Prepacked(weight, bias, rows_hint=rows_hint)


class PackedLinear(nn.Module):
    """An `nn.Linear` whose weight is also held prepacked (`Prepacked`: for oneDNN, or bfloat16 panels with ``bf16``
    where its values are bfloat16); ``weight`` and ``bias`` stay the original parameters (state_dict, dtype and device
    queries see them unchanged). ``pack=False``: nothing prepacked (a part of a `FusedPackedLinear`)."""

    def __init__(self, linear: nn.Linear, *, rows_hint: int = ROWS_HINT, bf16: bool = False, pack: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed: Prepacked | None = _prepack(linear.weight, linear.bias, rows_hint, bf16) if pack else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.packed is None or x.dtype != self.packed.dtype
                or torch.is_grad_enabled() and self.weight.requires_grad
                or self.packed.bf16 and x.numel() > BF16_KERNEL_MAX_ROWS * self.in_features):
            return F.linear(x, self.weight, self.bias)  # autocast, a gradient asked for, part of a fused product, or
        return self.packed(x)                           # too many rows for the bfloat16 kernel


class FusedPackedLinear(nn.Module):
    """Several linear layers reading the same input as one prepacked product, outputs side by side (q, k and v; gate
    and up): one call instead of three or two, with a wider matrix the kernels use better (SmolLM2-135M, bfloat16, one
    thread, AMD EPYC: q/k/v 63 -> 34 us at 1 row, 209 -> 177 us at 32; gate/up 90 -> 70, 546 -> 526 us). Each output
    column is the same dot product, bitwise (measured in float32 and bfloat16 for 1-100 rows). The parts keep their
    parameters; their own packed copies are dropped (they run `F.linear` where called alone, e.g. a long prompt's
    encoding by layers). ``bf16``: as `PackedLinear`'s, for the side-by-side weight."""

    def __init__(self, parts: list[PackedLinear], *, rows_hint: int = ROWS_HINT, bf16: bool = False) -> None:
        super().__init__()
        weight = torch.cat([p.weight.detach() for p in parts])
        biases = [p.bias for p in parts]
        self.bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else weight.new_zeros(p.out_features) for b, p in zip(biases, parts)])
        self.packed = _prepack(weight, self.bias, rows_hint, bf16)
        self._parts = tuple(parts)  # (a tuple: not registered as submodules twice)
        for p in parts:
            p.packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype != self.packed.dtype or torch.is_grad_enabled() and self._parts[0].weight.requires_grad
                or self.packed.bf16 and x.numel() > BF16_KERNEL_MAX_ROWS * x.shape[-1]):
            return torch.cat([p(x) for p in self._parts], dim=-1)  # autocast, a gradient asked for, or too many
        return self.packed(x)                                       # rows for the bfloat16 kernel: the parts'


class KernelRMSNorm(nn.Module):
    """A `BiGLMRMSNorm` computed by biglm's CPU kernel (`cpu_kernels.rms_norm`: one C call) for float32 inference;
    ``weight`` stays the original parameter. Other dtypes, or a gradient asked for, take the module's own forward."""

    def __init__(self, norm: BiGLMRMSNorm, kernel) -> None:
        super().__init__()
        self.weight, self.eps, self._norm, self._kernel = norm.weight, norm.eps, (norm,), kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype != torch.float32 or self.weight.dtype != torch.float32 or x.device.type != "cpu"
                or torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return self._norm[0](x)
        from .cpu_kernels import rms_norm

        return rms_norm(x, self.weight, self.eps, self._kernel)


class KernelLayer:
    """A decoder layer (`BiGLMBlock`) whose products are all on biglm's bfloat16 kernel and whose norms are
    `KernelRMSNorm`s, computed whole in one C call (`cpu_kernels.decoder_layer_kernel`, kernels/decoder_layer.c): the
    norms, the four products, RoPE, the cache's write or the call's keys after it, attention under the call's mask,
    SwiGLU, the gated adapters and the residuals, in float32, where PyTorch dispatches some forty small ops per layer
    (a batch-1 decoding call's overhead once the products read bfloat16; docs/LOG.md). The same formulas in another
    summation order (float32: to about 1e-5 of the logits). Set as the block's ``kernel_forward`` by `pack_linears`;
    `__call__` returns None for a call it does not take (a gradient asked for, not float32 on a CPU, more rows than the
    kernel's `BF16_KERNEL_MAX_ROWS`, the batch-invariant mode, a cache of another layout), which then runs the
    block's own forward."""

    def __init__(self, block: nn.Module, kernel) -> None:
        from .cpu_kernels import LayerWeights

        attn, mlp = block.self_attn, block.mlp
        config = attn.config
        self._kernel, self._grad = kernel, block.input_layernorm.weight  # (its requires_grad: parameters trained)
        keep = [block.input_layernorm.weight, block.post_attention_layernorm.weight, attn.qkv_proj.packed.weight,
                attn.o_proj.packed.weight, mlp.gate_up_proj.packed.weight, mlp.down_proj.packed.weight]
        bias = attn.qkv_proj.packed.bias
        adapters = []
        rank = config.mask_adapter_rank if attn.qkv_adapter is not None else 0
        if rank:
            for adapter in (attn.qkv_adapter, attn.o_adapter, mlp.gate_up_adapter, mlp.down_adapter):
                adapters += [adapter.down.weight.detach().float().contiguous(),
                             adapter.up.weight.detach().float().contiguous()]
        self._held = keep + adapters + ([] if bias is None else [bias])  # (alive as long as the pointers)
        self.head_dim = attn.head_dim
        ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        self.weights = LayerWeights(
            config.hidden_size, attn.n_heads, attn.n_kv, attn.head_dim, config.intermediate_size, rank,
            block.input_layernorm.eps, *map(ptr, keep), ptr(bias),
            *(t.shape[0] * t.shape[2] for t in keep[2:]), *(map(ptr, adapters) if rank else [None] * 8))

    @staticmethod
    def of(block: nn.Module, kernel) -> "KernelLayer | None":
        """The block's `KernelLayer` where its layers are packed for the kernels (`pack_linears` with
        ``bf16_weights``), else None."""
        attn, mlp = block.self_attn, block.mlp

        def on_kernel(m):
            return (isinstance(m, (PackedLinear, FusedPackedLinear)) and m.packed is not None and m.packed.bf16
                    and (m is attn.qkv_proj or m.packed.bias is None))
        if not (all(on_kernel(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
                and isinstance(block.input_layernorm, KernelRMSNorm)
                and isinstance(block.post_attention_layernorm, KernelRMSNorm) and attn.head_dim <= 512):
            return None
        return KernelLayer(block, kernel)

    def __call__(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask, past, gate, write):
        B, L, _ = x.shape
        R = B * L
        if (x.dtype != torch.float32 or x.device.type != "cpu" or not 0 < R <= BF16_KERNEL_MAX_ROWS
                or mask.batch_invariant or torch.is_grad_enabled() and (x.requires_grad or self._grad.requires_grad)):
            return None
        D, Hkv = self.head_dim, self.weights.kv_heads
        k, v = torch.empty(2, B, Hkv, L, D).unbind(0)  # (the call's keys/values, returned for the cache)
        if write is not None:  # (the model's write: each row's keys at its own columns, rows 0..B-1 in order)
            ka, va = past
            columns, na, keys = write[1], write[2], write[2]
        elif past is not None:
            ka, va = past
            columns, na, keys = None, past[0].shape[2], past[0].shape[2] + L
        else:
            ka, va, columns, na, keys = k, v, None, 0, L
        if (mask.k_len != keys or ka.dtype != torch.float32 or va.dtype != torch.float32 or ka.stride(3) != 1
                or va.stride(3) != 1 or ka.shape[0] < B or va.shape[0] < B):
            return None
        cos, sin = rope
        cos, sin = cos.reshape(R, D).contiguous(), sin.reshape(R, D).contiguous()
        flat = mask.flat(x.device)
        x = x.contiguous()
        y = torch.empty_like(x)
        if columns is not None:
            columns = columns.contiguous()
        if gate is not None:
            gate = gate.reshape(R).contiguous()
        self._kernel(self.weights, x.data_ptr(), y.data_ptr(), B, L, cos.data_ptr(), sin.data_ptr(),
                     None if flat is None else flat.data_ptr(), keys, ka.data_ptr(), va.data_ptr(),
                     *ka.stride()[:3], *va.stride()[:3], na, None if columns is None else columns.data_ptr(),
                     k.data_ptr(), v.data_ptr(), None if gate is None else gate.data_ptr(),
                     torch.get_num_threads())
        return y, (k, v)


_FUSED = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))
"""The products fused into one (`FusedPackedLinear`), read by the attention's and the MLP's forward where set."""


def _fusable(model: nn.Module, linears: set[int]) -> list[tuple[nn.Module, str, list[nn.Linear]]]:
    """(module, fused name, parts) for each attention layer's q/k/v and each MLP's gate/up whose parts are all among
    ``linears`` (ids of the `nn.Linear` layers to be packed)."""
    groups = []
    for module in model.modules():
        for fused, names in _FUSED:
            parts = [getattr(module, n, None) for n in names]
            if hasattr(module, fused) and all(id(p) in linears for p in parts):
                groups.append((module, fused, parts))
    return groups


def reduced_precision_kernels(dtype: torch.dtype) -> bool:
    """Whether this CPU has oneDNN matrix kernels for ``dtype`` (bfloat16 / float16 weights). Without them (an AVX2
    CPU: no AVX512 or AVX-NE-CONVERT), a bfloat16 product is emulated at a cost that grows with every row a call
    carries, and cannot be prepacked: float32 computes faster there (`load_model`'s compute dtype; docs/LOG.md)."""
    if dtype == torch.float32:
        return True
    check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(dtype)
    try:
        return bool(check and torch.backends.mkldnn.is_available() and getattr(torch.ops.mkldnn, check)())
    except (RuntimeError, AttributeError):
        return False


def _packable(linear: nn.Linear) -> bool:
    w = linear.weight
    if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return False
    try:  # oneDNN present and taking this layout: check on a tiny copy, once per layer shape
        probe = torch.zeros(2, linear.in_features, dtype=w.dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach()[:2].contiguous(), 2)
        torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
        return True
    except (RuntimeError, AttributeError):
        return False


@torch.no_grad()
def pack_linears(model: nn.Module, *, rows_hint: int = ROWS_HINT, bf16_weights: bool = False) -> int:
    """Swap every `nn.Linear` of an inference model on a CPU for a `PackedLinear` (the model's weights must not change
    afterwards); returns how many were swapped (0 off a CPU, or without oneDNN). ``bf16_weights``: the float32 weights
    hold bfloat16 values (a bfloat16 model computed in float32), packed for biglm's bfloat16 kernel where this machine
    runs it (`cpu_kernels`: half the bytes a call reads; a float32 layer of other values stays oneDNN's). A mask
    adapter's low-rank products
    (`BiGLMMaskAdapter`) stay `F.linear`: oneDNN's per-call cost outweighs what packing saves there (SmolLM2-135M's
    rank-32 adapters, float32, one thread, AMD EPYC: 576 -> 32 at 1 / 6 / 30 rows 51 / 63 / 64 us packed against
    10 / 16 / 30 us; 32 -> 960 58 / 50 / 83 against 14 / 15 / 51; docs/LOG.md)."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and not isinstance(parent, BiGLMMaskAdapter)]
    if not swaps or not torch.backends.mkldnn.is_available() or not _packable(swaps[0][2]):
        return 0
    if bf16_weights:
        from .cpu_kernels import bf16_linear_kernel, rms_norm_kernel

        bf16_weights = bf16_linear_kernel() is not None
    groups = _fusable(model, {id(child) for _, _, child in swaps})
    parts = {id(p) for _, _, group in groups for p in group}  # (packed once, side by side: not each alone as well)
    swapped = {}
    for parent, name, child in swaps:
        swapped[id(child)] = PackedLinear(child, rows_hint=rows_hint, bf16=bf16_weights, pack=id(child) not in parts)
        setattr(parent, name, swapped[id(child)])
    for module, fused, group in groups:
        setattr(module, fused, FusedPackedLinear([swapped[id(p)] for p in group], rows_hint=rows_hint,
                                                 bf16=bf16_weights))
    if bf16_weights:  # the norms between the products: one C call each (`KernelRMSNorm`)
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is BiGLMRMSNorm and child.weight.dtype == torch.float32:
                    setattr(parent, name, KernelRMSNorm(child, rms_norm_kernel()))
        from .cpu_kernels import decoder_layer_kernel

        for block in model.modules():  # and each decoder layer whole, in one (`KernelLayer`)
            if isinstance(block, BiGLMBlock):
                block.kernel_forward = KernelLayer.of(block, decoder_layer_kernel())
    return len(swaps)


class RowByRowLinear(nn.Module):
    """A linear layer that multiplies its input one row at a time: each row through the one-row kernel, whatever the
    call's row count, so a row's result is its result alone (the batch-invariant mode's fallback for a layer whose
    kernel was measured to depend on the row count, `make_rows_invariant`). ``weight`` and ``bias`` stay the original
    parameters."""

    def __init__(self, linear: nn.Module) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.cat([F.linear(r, self.weight, self.bias) for r in rows.split(1)]) if rows.shape[0] else \
            F.linear(rows, self.weight, self.bias)
        return out.view(*x.shape[:-1], self.out_features)


ROW_COUNTS = (2, 3, 17)  # the call sizes `make_rows_invariant` puts a row in (small calls: where kernels switch)


@torch.no_grad()
def row_count_dependent(linear: nn.Module, rows: torch.Tensor, counts: tuple[int, ...] = ROW_COUNTS) -> int:
    """How many of ``rows`` (R, in) come out of ``linear`` with other bits among ``counts`` rows (at the first and last
    place, beside the other given rows) than alone."""
    alone = [linear(r) for r in rows.split(1)]
    bad = 0
    for i, row in enumerate(rows):
        others = torch.cat((rows[:i], rows[i + 1:])) if rows.shape[0] > 1 else rows
        differs = False
        for M in counts:
            fill = others.repeat((M + others.shape[0] - 1) // others.shape[0], 1)[:M - 1]
            for place in {0, M - 1}:
                call = torch.cat((fill[:place], row[None], fill[place:]))
                differs |= not torch.equal(linear(call)[place], alone[i][0])
        bad += differs
    return bad


@torch.no_grad()
def make_rows_invariant(model: nn.Module, input_ids: torch.Tensor, *, rows: int = 4) -> list[str]:
    """Measure every `nn.Linear` of ``model`` with its own activations (the inputs each layer gets when the model reads
    ``input_ids``, (1, L) real text: up to ``rows`` of them) for row-count dependence (`row_count_dependent`), and
    swap each layer of a shape where any layer shows some for a `RowByRowLinear`; returns the swapped layers' names.
    For the batch-invariant mode (`BiGLMModel.batch_invariant`), on the machine and thread count it will run with:
    a sample, not a proof (a kernel that differs only on rows unlike the sampled ones is not found)."""
    linears = {name: m for name, m in model.named_modules() if type(m) is nn.Linear}
    seen: dict[str, torch.Tensor] = {}
    def keep(name: str, x: torch.Tensor) -> None:
        seen.setdefault(name, x.reshape(-1, x.shape[-1])[-rows:].clone())

    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: keep(name, args[0]))
             for name, m in linears.items()]
    try:
        model(input_ids)
    finally:
        for h in hooks:
            h.remove()
    # a kernel is picked by the product's shape: one layer found row-count dependent condemns every layer of its shape
    # (their own sampled rows may happen to round alike, the next request's need not)
    shapes: dict[tuple, list[str]] = {}
    for name, linear in linears.items():
        shapes.setdefault((linear.in_features, linear.out_features, linear.bias is not None), []).append(name)
    swapped = []
    for names in shapes.values():
        if any(name in seen and row_count_dependent(linears[name], seen[name]) for name in names):
            for name in names:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent) if parent else model, child, RowByRowLinear(linears[name]))
                swapped.append(name)
    return swapped
