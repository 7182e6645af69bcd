"""The project's own CPU kernel: bfloat16 weights multiplied in float32 on CPUs without bfloat16 matrix kernels.

On an AVX2 CPU (no AVX512-BF16 or AMX) PyTorch has no fast bfloat16 product, so `load_model` computes a bfloat16
model in float32 (`packed.reduced_precision_kernels`), and a decoding call, bound by reading the weights, reads twice
the bytes the bfloat16 file holds. ``kernels/bf16_linear.c`` reads them as bfloat16 and widens them in registers
(exact: a bfloat16 is a float32's top 16 bits), summing in float32: the same products as float32 weights of the same
values, in another summation order. `packed.Prepacked` uses it. The same library holds a float32 RMSNorm in one call
(`rms_norm`; `packed.KernelRMSNorm`), for the layers between those products: PyTorch's CPU `rms_norm` dispatches six
element-wise ops for it, about a tenth of a batch-1 call once the products read half the bytes.

It is built once per machine with the system's C compiler (``$CC``, else ``cc``) into
``$XDG_CACHE_HOME/biglm/kernels`` (``~/.cache`` by default; ``BIGLM_KERNEL_CACHE`` overrides) and loaded with ctypes:
no PyTorch headers, so the build takes about a second. Where it cannot be (not x86-64 with AVX2, no compiler, a
failed build) `bf16_linear_kernel` returns None, says why once, and the float32 kernels stay. ``BIGLM_CPU_KERNELS=0``
turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

PANEL = 16  # outputs per panel of the packed weight (NR in the C source)
SOURCES = tuple(Path(__file__).with_name("kernels") / name for name in ("bf16_linear.c", "decoder_layer.c"))
FLAGS = ("-O3", "-mavx2", "-mfma", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC")


def kernel_cache() -> Path:
    """Where built kernels are kept."""
    if os.environ.get("BIGLM_KERNEL_CACHE"):
        return Path(os.environ["BIGLM_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "biglm" / "kernels"


def unavailable_reason() -> str | None:
    """Why this machine cannot run the kernel (None: it can, if it builds)."""
    if os.environ.get("BIGLM_CPU_KERNELS", "1") == "0":
        return "BIGLM_CPU_KERNELS=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"no AVX2 ({torch.backends.cpu.get_cpu_capability()})"
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        return "no C compiler (set CC, or install gcc)"
    return None


def compiler() -> str:
    """The C compiler the kernels are built with: ``$CC``, else ``cc``, else ``gcc``."""
    return os.environ.get("CC") or shutil.which("cc") or "gcc"


def _build() -> Path:
    source = b"".join(path.read_bytes() for path in SOURCES)
    cc = compiler()
    key = hashlib.sha256(source + " ".join((cc, *FLAGS)).encode()).hexdigest()[:16]
    target = kernel_cache() / f"bf16_linear-{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)  # built beside, then renamed: a concurrent load
    os.close(fd)                                                  # never reads a half-written library
    try:
        done = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def load_kernels() -> ctypes.CDLL | None:
    """The built library (its C functions typed), or None where this machine cannot run it (the reason warned once)."""
    reason = unavailable_reason()
    if reason is None:
        try:
            library = ctypes.CDLL(str(_build()))
        except (OSError, RuntimeError) as error:
            reason = f"its build failed ({error})"
    if reason is not None:
        if reason != "BIGLM_CPU_KERNELS=0":
            warnings.warn(f"biglm's bfloat16 CPU kernel is off: {reason}; bfloat16 weights compute as float32 "
                          "(twice the bytes a decoding call reads)", stacklevel=2)
        return None
    library.bf16_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    library.bf16_linear.restype = None
    library.rms_norm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_long,
                                 ctypes.c_long]
    library.rms_norm.restype = None
    library.decoder_layer.argtypes = ([ctypes.POINTER(LayerWeights)] + [ctypes.c_void_p] * 2 + [ctypes.c_long] * 2
                                      + [ctypes.c_void_p] * 3 + [ctypes.c_long] + [ctypes.c_void_p] * 2
                                      + [ctypes.c_long] * 7 + [ctypes.c_void_p] * 4 + [ctypes.c_int])
    library.decoder_layer.restype = None
    return library


class LayerWeights(ctypes.Structure):
    """``layer_weights`` of kernels/decoder_layer.c: a decoder layer's shape, its norms' weights, its products'
    bfloat16 panels and its gated adapters' float32 weights (pointers: the tensors must outlive it)."""

    _fields_ = ([(name, ctypes.c_long) for name in ("hidden", "heads", "kv_heads", "head_dim", "inter", "rank")]
                + [("eps", ctypes.c_float)]
                + [(name, ctypes.c_void_p) for name in ("norm1", "norm2", "qkv", "o", "gate_up", "down", "qkv_bias")]
                + [(name, ctypes.c_long) for name in ("qkv_n", "o_n", "gate_up_n", "down_n")]
                + [(name, ctypes.c_void_p) for name in ("qkv_a", "qkv_b", "o_a", "o_b", "gate_up_a", "gate_up_b",
                                                        "down_a", "down_b")])


def bf16_linear_kernel():
    """The bfloat16 product's C function, or None where this machine cannot run the kernels (`load_kernels`)."""
    library = load_kernels()
    return None if library is None else library.bf16_linear


def decoder_layer_kernel():
    """The whole decoder layer's C function (`packed.KernelLayer`), or None where this machine cannot run the kernels
    (`load_kernels`)."""
    library = load_kernels()
    return None if library is None else library.decoder_layer


def rms_norm_kernel():
    """The float32 RMSNorm's C function, or None where this machine cannot run the kernels (`load_kernels`)."""
    library = load_kernels()
    return None if library is None else library.rms_norm


def bf16_panels(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (N, K), bfloat16 values (any float dtype), as the kernel reads it: (ceil(N / 16), K, 16)
    bfloat16, outputs past N zero. Raises where a value is not a bfloat16 (rounding would change the model)."""
    w = weight.detach()
    held = w.to(torch.bfloat16)
    if w.dtype != torch.bfloat16 and not torch.equal(held.to(w.dtype), w):
        raise ValueError("these weights are not bfloat16 values: the bfloat16 kernel would round them")
    N, K = held.shape
    padded = -(-N // PANEL) * PANEL
    if padded != N:
        held = torch.cat((held, held.new_zeros(padded - N, K)))
    return held.view(padded // PANEL, PANEL, K).transpose(1, 2).contiguous()


def bf16_linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                kernel=None) -> torch.Tensor:
    """``x`` (..., K) float32 times the weight held in ``panels`` (`bf16_panels`), plus ``bias`` (float32, padded to
    the panels' outputs, or None): (..., out_features) float32. Uses torch's thread count. ``kernel``: the function
    `bf16_linear_kernel` gave (looked up when not given; raises where there is none)."""
    fn = kernel or bf16_linear_kernel()
    if fn is None:
        raise RuntimeError(f"biglm's bfloat16 CPU kernel does not run here: {unavailable_reason() or 'its build failed'}")
    K = panels.shape[1]
    rows = x.reshape(-1, K)  # (a view where x is contiguous: nothing copied)
    if not rows.is_contiguous():
        rows = rows.contiguous()
    width = panels.shape[0] * PANEL
    y = torch.empty((*x.shape[:-1], width), dtype=torch.float32)  # (rows, width) row-major, in x's leading shape
    if rows.shape[0]:
        fn(rows.data_ptr(), panels.data_ptr(), bias.data_ptr() if bias is not None else None, y.data_ptr(),
           rows.shape[0], width, K, torch.get_num_threads())
    return y if width == out_features else y[..., :out_features].contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kernel=None) -> torch.Tensor:
    """RMSNorm of ``x`` (..., D) float32 with ``weight`` (D,) float32, in one C call (`rms_norm_kernel`): Llama's
    formula, the mean summed in another order than PyTorch's (float32: to about 1e-7 of the result)."""
    fn = kernel or rms_norm_kernel()
    if fn is None:
        raise RuntimeError(f"biglm's CPU kernels do not run here: {unavailable_reason() or 'their build failed'}")
    D = x.shape[-1]
    rows = x.reshape(-1, D)
    if not rows.is_contiguous():
        rows = rows.contiguous()
    y = torch.empty(x.shape, dtype=torch.float32)
    fn(rows.data_ptr(), weight.data_ptr(), eps, y.data_ptr(), rows.shape[0], D)
    return y
