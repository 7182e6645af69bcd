"""Issue 21: `blocks_quality_eval.py` with its lean settings replaced by a threshold sweep at blocks of 8.

    python docs/experiments/threshold_sweep.py MODELS_DIR DATA_DIR OUT.json [TAU ...]   (default taus 0.5 0.3 0.1)

MODELS_DIR holds exported grammar/TinyStories models as blocks_quality_eval.py expects; results go to OUT.json.
"""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    models, data, out, *taus = sys.argv[1:]
    evaluate = runpy.run_path(str(Path(__file__).with_name("blocks_quality_eval.py")), run_name="blocks_quality_eval")
    evaluate["LEAN"].clear()
    for tau in [float(t) for t in taus] or [0.5, 0.3, 0.1]:
        evaluate["LEAN"][f"threshold {tau}, blocks of 8"] = dict(strategy="threshold", threshold=tau, block_length=8)
    sys.argv = ["blocks_quality_eval.py", "--models", models, "--data", data, "--settings", "lean", "--out", out]
    evaluate["main"]()
