"""Issue 23's 2 x 2 (ar_to_biglm_options.sh): one table and one results JSON from what the runs wrote.

    python docs/experiments/ar_options_summary.py runs/ar2biglm-opts [more run roots] --out results.json

Reads each root's eval.json (blocks_quality_eval.py), the AR model's ar.log (its held-out AR loss) and every arm's
pretrain log (the final validation loss); prints a Markdown table per root, with each option's effect averaged over
the other option and the seeds (paired: the same held-out windows, masks and documents for every model).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

METRICS = ("masked_loss", "fill_acc", "cont_nll")


def arm_name(name: str) -> tuple[str, str, str] | None:
    m = re.fullmatch(r"ts-(own|shift)-(switch|anneal|step0)(?:-s(\d+))?", name)
    return None if m is None else (m.group(1), m.group(2), m.group(3) or "-")


def summarise(root: Path) -> dict:
    evals = json.loads((root / "eval.json").read_text())
    ar = json.loads((root / "ar.log").read_text().strip().splitlines()[-1]) if (root / "ar.log").is_file() else {}
    rows = {}
    for name, row in sorted(evals.items()):
        parsed = arm_name(name)
        if parsed is None:
            continue
        head, attn, seed = parsed
        log = root / f"{name[3:]}.log"
        val = re.findall(r"val loss ([\d.]+)", log.read_text()) if log.is_file() else []
        rows[name] = {"head": head, "attention": attn, "seed": seed, "val_loss": float(val[-1]) if val else None,
                      **{m: row[m] for m in METRICS}, **{f"{m}_stderr": row[f"{m}_stderr"] for m in METRICS},
                      "samples": row.get("one block, T=N/2", {}).get("samples", [])}
    effects = {}
    trained = {k: v for k, v in rows.items() if v["attention"] != "step0"}
    for option, a, b in (("head", "shift", "own"), ("attention", "anneal", "switch")):
        diffs = {m: [] for m in METRICS}
        for name, r in trained.items():
            if r[option] != a:
                continue
            twin = next((o for o in trained.values() if o[option] == b and o["seed"] == r["seed"]
                         and all(o[k] == r[k] for k in ("head", "attention") if k != option)), None)
            if twin is not None:
                for m in METRICS:
                    diffs[m].append(r[m] - twin[m])
        if diffs[METRICS[0]]:  # a root without both sides of this option has no effect to show
            effects[f"{a} - {b}"] = {m: {"mean": statistics.mean(d), "pairs": len(d),
                                         "min": min(d), "max": max(d)} for m, d in diffs.items() if d}
    return {"ar_model": ar, "arms": rows, "effects": effects}


def table(summary: dict) -> str:
    lines = ["| arm | seed | val loss (training's) | masked loss | fill-in acc. | continuation NLL |",
             "|---|---|---|---|---|---|"]
    for name, r in summary["arms"].items():
        val = "" if r["val_loss"] is None else f"{r['val_loss']:.3f}"
        lines.append(f"| {r['head']}, {r['attention']} | {r['seed']} | {val} | {r['masked_loss']:.3f} ± "
                     f"{r['masked_loss_stderr']:.3f} | {100 * r['fill_acc']:.1f}% | {r['cont_nll']:.3f} ± "
                     f"{r['cont_nll_stderr']:.3f} |")
    for effect, ms in summary["effects"].items():
        lines.append(f"\n{effect} (mean over {next(iter(ms.values()))['pairs']} pairs [min, max]): " + "; ".join(
            f"{m} {v['mean']:+.4f} [{v['min']:+.4f}, {v['max']:+.4f}]" for m, v in ms.items()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = {}
    for root in args.roots:
        out[root.name] = summarise(root)
        print(f"## {root}\n{table(out[root.name])}\n")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
