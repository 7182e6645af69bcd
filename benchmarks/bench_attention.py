"""BiGLM-masked attention against dense bidirectional attention (issue: model and objective).

Under the BiGLM mask a prefix query does not see the suffix, so with p ~ U[0.2L, 0.8L] about a quarter
to a third of the (query, key) blocks are skipped by FlexAttention's block mask. Target on an
H100-class GPU: masked time <= 0.9x dense at L=2048 for the 136M and 360M shapes.

    python benchmarks/bench_attention.py                  # GPU: bf16, compiled flex, fwd+bwd
    python benchmarks/bench_attention.py --device cpu --seq-len 512 --batch 2   # CPU: forward only

Also checks that flex (masked and dense) matches SDPA with the same boolean mask.
"""

from __future__ import annotations

import argparse

import torch

from biglm.model import BiGLMConfig
from biglm.model.attention import AttentionMask, flex_attention, sdpa_attention
from biglm.objective import get_objective, make_generator, draw_masks

from common import timeit, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="biglm-136m,biglm-360m")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="results file stem under benchmarks/results/")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    train = dev.type == "cuda"  # FlexAttention has no backward on CPU
    rows = []
    for name in args.presets.split(","):
        c = BiGLMConfig.from_preset(name)
        B, L, H, Hkv, D = args.batch, args.seq_len, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(B, H, L, D, device=dev, dtype=dtype, generator=g, requires_grad=train)
        k = torch.randn(B, Hkv, L, D, device=dev, dtype=dtype, generator=g, requires_grad=train)
        v = torch.randn(B, Hkv, L, D, device=dev, dtype=dtype, generator=g, requires_grad=train)
        pattern = draw_masks(B, L, get_objective("biglm"), generator=make_generator(seed=0, step=0, rank=0, device=dev),
                             device=dev)
        masked = AttentionMask(batch=B, q_len=L, k_len=L, prefix_len=pattern.split)
        dense = AttentionMask(batch=B, q_len=L, k_len=L)
        allowed = masked.dense(dev).float().mean().item()
        with torch.no_grad():
            ref = sdpa_attention(q, k, v, masked)
            out = flex_attention(q, k, v, masked)
            err = (out.float() - ref.float()).abs().max().item()

        def run(fn, mask):
            def step():
                o = fn(q, k, v, mask)
                if train:
                    o.sum().backward()
            return step

        ctx = torch.enable_grad() if train else torch.no_grad()
        with ctx:
            t = {f"{fn.__name__}/{m}": timeit(run(fn, mk), device=dev, iters=args.iters)
                 for fn in (flex_attention, sdpa_attention) for m, mk in (("masked", masked), ("dense", dense))}
        ratio = t["flex_attention/masked"] / t["flex_attention/dense"]
        row = {"preset": name, "B": B, "L": L, "heads": H, "kv_heads": Hkv, "head_dim": D, "dtype": str(dtype),
               "fwd_bwd": train, "allowed_fraction": allowed, "max_abs_err_flex_vs_sdpa": err,
               **{k2: v2 * 1e3 for k2, v2 in t.items()}, "flex_masked_over_dense": ratio}
        rows.append(row)
        print(f"{name}: allowed {allowed:.3f} of pairs | flex masked {t['flex_attention/masked'] * 1e3:.2f} ms, "
              f"dense {t['flex_attention/dense'] * 1e3:.2f} ms (ratio {ratio:.2f}) | sdpa masked "
              f"{t['sdpa_attention/masked'] * 1e3:.2f} ms, dense {t['sdpa_attention/dense'] * 1e3:.2f} ms | "
              f"max |flex - sdpa| {err:.2e}")
    print("wrote", write_result("attention", {"args": vars(args), "rows": rows}, stem=args.out))


if __name__ == "__main__":
    main()
