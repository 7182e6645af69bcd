"""How far ahead biglm's bfloat16 kernel should prefetch the panel it streams (kernels/bf16_linear.c, ``PREFETCH``).

    python docs/experiments/bf16_prefetch_ab.py runs/smol-causal-a80g-bf16 0 32 64 128

Builds the kernel library once per value (``-DPREFETCH=N``, 0: no prefetch) into a temporary folder and times one
call's worth of the model's products (every packed product in the model's order, random float32 rows) with each, the
builds in a rotating order over 9 rounds, at 1, 2 and 6 rows, one thread: the median milliseconds. Results in
docs/LOG.md.
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from common import load_packed  # noqa: E402


def main() -> None:
    model_path, distances = sys.argv[1], [int(v) for v in sys.argv[2:]] or [0, 64]
    torch.set_num_threads(1)
    from biglm.model import cpu_kernels
    from biglm.model.packed import FusedPackedLinear, PackedLinear

    model, _ = load_packed(model_path, Path(__file__).name)
    panels = [m.packed.weight for m in model.modules() if isinstance(m, (PackedLinear, FusedPackedLinear))
              and m.packed is not None and m.packed.bf16]
    if not panels:
        raise SystemExit("no product of this model is packed for the bfloat16 kernel: pass a bfloat16 export")
    folder = Path(tempfile.mkdtemp())
    kernels = {}
    for d in distances:
        target = folder / f"prefetch{d}.so"
        subprocess.run([cpu_kernels.compiler(), *cpu_kernels.FLAGS, f"-DPREFETCH={d}",
                        *map(str, cpu_kernels.SOURCES), "-o", str(target)], check=True)
        lib = ctypes.CDLL(str(target))
        lib.bf16_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
        kernels[d] = lib.bf16_linear
    buffers = {}

    def products(fn, rows: int) -> None:
        for w in panels:
            K, N = w.shape[1], w.shape[0] * w.shape[2]
            x, y = buffers.setdefault((rows, K, N), (torch.randn(rows, K), torch.empty(rows, N)))
            fn(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), rows, N, K, 1)

    for rows in (1, 2, 6):
        times = {d: [] for d in kernels}
        for i in range(9):
            order = distances[i % len(distances):] + distances[:i % len(distances)]
            for d in order:
                t0 = time.perf_counter()
                products(kernels[d], rows)
                times[d].append(time.perf_counter() - t0)
        print(f"{rows} rows: " + ", ".join(f"PREFETCH={d} {1e3 * statistics.median(t):.1f} ms" for d, t in times.items()))


if __name__ == "__main__":
    main()
