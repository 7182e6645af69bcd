"""One decoding call's forward, this tree's model against the model of an earlier commit, in one process.

A cached decoding call at batch 1 (a prefix of ``--prefix`` tokens in the cache, 1 / 8 / 24 new positions, logits at
each) is timed for both models, interleaved round by round so the machine's drift hits both alike; the two must give
the same logits bit for bit (checked first). Used for the 2026-11-25 (late) entry of docs/LOG.md:

    python docs/experiments/forward_ab.py --base 791f8e3 --threads 1

Only ``src/biglm/model/modeling.py`` is taken from ``--base`` (its package imports point at this tree's attention,
config and loss), so the comparison is of that file's changes alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from biglm.model import BiGLMConfig, BiGLMForMaskedLM

ROOT = Path(__file__).resolve().parents[2]


def base_model_class(rev: str) -> type:
    """``BiGLMForMaskedLM`` as ``modeling.py`` defined it at ``rev``."""
    shown = subprocess.run(["git", "show", f"{rev}:src/biglm/model/modeling.py"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode:
        sys.exit(f"forward_ab.py: --base {rev}: no src/biglm/model/modeling.py at that revision ({shown.stderr.strip()})")
    text = shown.stdout
    for rel, absolute in (("from ..objective", "from biglm.objective"), ("from .attention", "from biglm.model.attention"),
                          ("from .config", "from biglm.model.config")):
        text = text.replace(rel, absolute)
    path = Path(tempfile.mkdtemp()) / "base_modeling.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("base_modeling", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["base_modeling"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.BiGLMForMaskedLM


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the git revision whose modeling.py is the baseline")
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = BiGLMConfig(vocab_size=4096, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024, attn_backend="sdpa")
    torch.manual_seed(0)
    new = BiGLMForMaskedLM(cfg).eval()
    old = base_model_class(args.base)(cfg).eval()
    old.load_state_dict(new.state_dict())
    ids = torch.randint(5, 4000, (1, args.prefix))
    print(f"4x192, vocab 4096, float32, {args.threads} thread(s); cached prefix {args.prefix}; ms per call "
          f"(median of {args.rounds} rounds of 20 calls; min in brackets)")
    with torch.inference_mode():
        for m in (new, old):
            m.model.validate_inputs = False  # as in decoding (`decoding._unchecked`)
        caches = {id(m): m.encode_prefix(ids) for m in (new, old)}
        for n in (1, 8, 24):
            x, where = torch.randint(5, 4000, (1, n)), torch.arange(n)
            call = {name: (lambda m=m: m(x, prefix_cache=caches[id(m)], logits_positions=where).logits)
                    for name, m in (("this tree", new), (args.base, old))}
            a, b = (f() for f in call.values())
            if not torch.equal(a, b):
                sys.exit(f"the logits differ at {n} positions (max {(a - b).abs().max():.2e}): not the same model")
            times: dict[str, list[float]] = {k: [] for k in call}
            for _ in range(args.rounds):
                for name, f in call.items():
                    for _ in range(3):
                        f()
                    t0 = time.perf_counter()
                    for _ in range(20):
                        f()
                    times[name].append((time.perf_counter() - t0) / 20 * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"  {n:2d} positions: " + " | ".join(f"{k} {med[k]:.3f} ({min(times[k]):.3f})" for k in call)
                  + f" | base / this tree {med[args.base] / med['this tree']:.2f}x; logits bitwise equal")


if __name__ == "__main__":
    main()
