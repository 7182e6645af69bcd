# Issue 21: the lean decoding settings of blocks_quality_eval.py swapped for a threshold sweep (one model folder).
# Run from the repository root: python docs/experiments/threshold_sweep.py
import sys, runpy
sys.argv = ["blocks_quality_eval.py", "--models", "/tmp/b8/hf", "--data", "/work/exp21", "--settings", "lean", "--out", "/tmp/b8/tau.json"]
mod = runpy.run_path("docs/experiments/blocks_quality_eval.py", run_name="not_main")
mod["LEAN"].clear()
for t in (0.5, 0.3, 0.1):
    mod["LEAN"][f"threshold {t}, blocks of 8"] = dict(strategy="threshold", threshold=t, block_length=8)
mod["main"]()
