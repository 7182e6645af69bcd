"""Issue 21: can small blocks (fewer positions per committed token) keep the quality of blocks of 8 at T = N/2?

`blocks_quality_eval.py`'s grammar evaluation (48 held-out prompts of 24 tokens, N = 64, T = 32 calls, grammatical
share of the complete sentences written) with its lean settings replaced by:
- ``confidence`` at blocks of 2, 4 and 8, the suffix the current block only (``block``: 2.3 / 3.3 / 5.3 positions per
  committed token with the append cache) and, at 2 and 4, the block plus every mask after it (``rest``);
- one token per call (T = N) at blocks of 1, 2 and 8, and the threshold rule (tau = 0.9, 0.7, 0.5) at blocks of 2;
- ``spread`` at blocks of 4 and 8: the confidence schedule, but the kept predictions taken apart (the most confident,
  then the most confident whose neighbouring slots were not kept this step, ...): two neighbouring masked tokens are
  sampled independently in one pass and depend most on each other. A strategy plug-in: one `DecodingStrategy`
  subclass overriding `choose` and one `register` call (`biglm.generation.strategies`), nothing in the library.

    python docs/experiments/small_blocks_eval.py MODELS_DIR DATA_ROOT OUT.json [small|threshold]

``threshold`` (instead of the default ``small``): does a longer-trained model commit more than two tokens per call at
the quality of T = N/2? Blocks of 8: confidence at T = N/2 (the reference), the threshold rule at tau = 0.9 / 0.7 / 0.5
with at least two tokens per call (steps = N/2) and at tau = 0.9 with at least one, and one token per call.

MODELS_DIR holds `grammar-*` exports or run directories, DATA_ROOT the prepared grammar `data` folder's parent.
"""

import runpy
import sys
from pathlib import Path

import torch

from biglm.generation import register
from biglm.generation.strategies import Confidence


class Spread(Confidence):
    """Confidence's schedule; the kept predictions are taken apart (no two neighbouring slots kept in one step
    while another slot is left)."""

    name = "spread"

    def choose(self, predicted: torch.Tensor, conf: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        R, N = conf.shape
        rows = torch.arange(R, device=conf.device)
        keep = torch.zeros_like(predicted)
        free = predicted.clone()  # predicted, not kept, and no kept neighbour
        for i in range(int(k.max()) if R else 0):
            pool = torch.where(free.any(1, keepdim=True), free, predicted & ~keep)
            j = torch.where(pool, conf, float("-inf")).argmax(1)  # the first of equal maxima: ties by slot
            take = (k > i) & pool.any(1)
            keep[rows[take], j[take]] = True
            for d in (-1, 0, 1):
                free[rows[take], (j + d).clamp(0, N - 1)[take]] = False
        return keep


SETTINGS = {
    **{f"confidence, blocks of {b} ({s}), T=N/2": dict(strategy="confidence", steps=32, block_length=b, block_suffix=s)
       for b, s in ((2, "block"), (4, "block"), (8, "block"), (2, "rest"), (4, "rest"))},
    **{f"spread, blocks of {b}, T=N/2": dict(strategy="spread", steps=32, block_length=b) for b in (4, 8)},
    # one token per call (T = N): 2 + 1 positions per token at blocks of 1 / 2 (the append pass of each block, folded)
    **{f"confidence, blocks of {b}, T=N": dict(strategy="confidence", steps=64, block_length=b) for b in (1, 2, 8)},
    # the threshold rule at blocks of 2: two tokens in a call when the model is sure of both, else one
    **{f"threshold {t}, blocks of 2": dict(strategy="threshold", threshold=t, block_length=2) for t in (0.9, 0.7, 0.5)},
}

THRESHOLD = {
    "confidence, blocks of 8, T=N/2": dict(strategy="confidence", steps=32, block_length=8),
    **{f"threshold {t}, blocks of 8, >= 2 per call": dict(strategy="threshold", threshold=t, steps=32, block_length=8)
       for t in (0.9, 0.7, 0.5)},
    "threshold 0.9, blocks of 8, >= 1 per call": dict(strategy="threshold", threshold=0.9, block_length=8),
    "confidence, blocks of 1, T=N": dict(strategy="confidence", steps=64, block_length=1),
}

if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[4:] not in ([], ["small"], ["threshold"]):
        sys.exit(__doc__)
    models, data, out = sys.argv[1:4]
    register(Spread)
    evaluate = runpy.run_path(str(Path(__file__).with_name("blocks_quality_eval.py")), run_name="blocks_quality_eval")
    evaluate["LEAN"].clear()
    evaluate["LEAN"].update(THRESHOLD if sys.argv[4:] == ["threshold"] else SETTINGS)
    sys.argv = ["blocks_quality_eval.py", "--models", models, "--data", data, "--only", "grammar", "--settings", "lean",
                "--out", out]
    evaluate["main"]()
