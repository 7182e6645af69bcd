"""A model call's milliseconds by its row count, each decoder layer in one C call (`packed.KernelLayer`) against
PyTorch's ops around the same bfloat16 kernel products.

    python docs/experiments/layer_kernel_rows.py runs/smol-causal-a80g-bf16

One thread; a 200-token random prompt encoded once; then calls of 1, 2, 4, 6, 8 and 12 random tokens after its cache
(logits at every position), 7 of each way alternating: the median. Results in docs/LOG.md.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from common import kernel_switch, load_packed  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    model, _ = load_packed(sys.argv[1], Path(__file__).name)
    use = kernel_switch(model)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        cache = model.encode_prefix(torch.randint(100, 20000, (1, 200), generator=g))
        for rows in (1, 2, 4, 6, 8, 12):
            x = torch.randint(100, 20000, (1, rows), generator=g)
            times = {True: [], False: []}
            for i in range(14):
                layers = bool(i % 2)
                use(True, layers)
                t0 = time.perf_counter()
                model(x, prefix_cache=cache)
                times[layers].append(time.perf_counter() - t0)
            print(f"{rows} rows: layer kernel {1e3 * statistics.median(times[True]):.1f} ms, PyTorch's layers "
                  f"{1e3 * statistics.median(times[False]):.1f} ms")


if __name__ == "__main__":
    main()
