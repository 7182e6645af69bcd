"""`biglm eval` on a converted model against lm-eval's own `hf` model on its autoregressive source: same tasks, same
documents, same threads, back to back, wall time and accuracy of each.

    python benchmarks/bench_eval_vs_hf.py --source ../shared/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--biglm runs/smol-biglm] [--tasks piqa,arc_easy,sciq,winogrande] [--limit 100] \
        [--scorers chain,blocks:8,blocks:16,one-pass] [--threads 1]

Protocol:
- The source: a GGUF file is written once as a transformers directory (what lm-eval's `hf` model and vLLM load;
  `--work/source-hf`), a transformers directory is used as it is. `--biglm` (default: `biglm convert` of the source
  into `--work/biglm`) is the BiGLM scored.
- Tasks: lm-eval's built-in YAMLs pointed at the local copies in ../shared/data/eval (`write_suite_yamls`, as
  `biglm eval --suite` does), the first `--limit` documents of each, zero-shot.
- Each run is a fresh process (`lm_eval --model hf ...`, `biglm eval ...`) with OMP_NUM_THREADS=`--threads`; its wall
  time includes loading, as a user sees it. Runs alternate (hf, each scorer), `--rounds` times.
- Written: benchmarks/results/eval-vs-hf-<date>.json and .md (machine, commit, per run: seconds, accuracies, the
  ratio to the hf run of the same round).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, hf_directory, machine, positive_int

REPO = Path(__file__).resolve().parents[1]
EVAL = REPO.parent / "shared" / "data" / "eval"
SUITE_NAMES = {"piqa": "PIQA", "arc_easy": "ARC-E", "sciq": "SciQ", "winogrande": "WinoGrande", "arc_challenge": "ARC-C",
               "hellaswag": "HellaSwag", "openbookqa": "OBQA", "siqa": "SIQA", "race": "RACE", "logiqa": "LogiQA",
               "boolq": "BoolQ", "copa": "COPA", "lambada_openai": "LAMBADA", "commonsense_qa": "CSQA"}


def loglikelihoods(results_dir: Path) -> dict[str, dict[int, list[float]]]:
    """task -> doc_id -> each choice's log-likelihood, from the newest ``--log_samples`` files under ``results_dir``."""
    out: dict[str, dict[int, list[float]]] = {}
    for path in sorted(results_dir.rglob("samples_*.jsonl"), key=lambda p: p.stat().st_mtime):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0].removesuffix("_local")
        docs = out.setdefault(task, {})
        for line in path.read_text().splitlines():
            sample = json.loads(line)
            docs[int(sample["doc_id"])] = [float(r[0][0]) for r in sample["resps"]]
    return out


def agreement(ours: dict, ref: dict) -> dict[str, dict[str, float]]:
    """Per task: documents whose choice (argmax log-likelihood) is the same, and the largest log-likelihood gap."""
    out = {}
    for task, docs in ref.items():
        mine = ours.get(task, {})
        both = [d for d in docs if d in mine and len(mine[d]) == len(docs[d])]
        same = sum(max(range(len(docs[d])), key=docs[d].__getitem__) == max(range(len(mine[d])), key=mine[d].__getitem__)
                   for d in both)
        gap = max((abs(a - b) for d in both for a, b in zip(mine[d], docs[d])), default=float("nan"))
        out[task] = {"same_choice": f"{same}/{len(docs)}", "max_abs_loglik_diff": round(gap, 6)}
    return out


def accuracies(results_dir: Path) -> dict[str, dict[str, float]]:
    """task -> {acc, acc_norm} from the newest lm-eval results JSON under ``results_dir``."""
    files = sorted(results_dir.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    data = json.loads(files[-1].read_text())["results"]
    out = {}
    for task, metrics in data.items():
        name = task.removesuffix("_local")
        out[name] = {k.split(",")[0]: round(float(v), 4) for k, v in metrics.items()
                     if k.split(",")[0] in ("acc", "acc_norm") and isinstance(v, (int, float))}
    return out


def run(cmd: list[str], *, threads: int, log: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    sec = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"bench_eval_vs_hf: {' '.join(cmd[:4])} ... failed (exit {proc.returncode}); see {log}")
    return sec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="the autoregressive source: a .gguf file or a transformers dir")
    ap.add_argument("--biglm", default=None, help="the BiGLM to score (default: `biglm convert` of --source)")
    ap.add_argument("--tasks", default="piqa,arc_easy,sciq,winogrande")
    ap.add_argument("--limit", type=positive_int, default=100, help="documents per task")
    ap.add_argument("--scorers", default="chain,blocks:8,blocks:16,one-pass",
                    help="biglm scorers, each a run; blocks:B sets score_block=B")
    ap.add_argument("--model-args", default="", help="more biglm --model_args, e.g. batch_size=32")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--rounds", type=positive_int, default=1)
    ap.add_argument("--batch-size", type=positive_int, default=16, help="both sides' --batch_size")
    ap.add_argument("--work", default=str(REPO / "runs" / "bench-eval-vs-hf"))
    ap.add_argument("--tag", default="", help="a word for the results file name")
    args = ap.parse_args()
    at_start = machine()  # the load average before the runs (each run's own threads: --threads)
    tasks = args.tasks.split(",")
    unknown = [t for t in tasks if t not in SUITE_NAMES]
    if unknown:
        sys.exit(f"bench_eval_vs_hf: unknown task(s) {unknown}; choose from {', '.join(SUITE_NAMES)}")
    source, work = Path(args.source), Path(args.work)
    if not source.exists():
        sys.exit(f"bench_eval_vs_hf: --source {source} does not exist")
    work.mkdir(parents=True, exist_ok=True)
    hf_dir = hf_directory(source, work)
    biglm_dir = Path(args.biglm) if args.biglm else work / "biglm"
    if not (biglm_dir / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "biglm", "convert", str(source), str(biglm_dir)], check=True)
    from biglm.integrations.lm_eval.yamls import write_suite_yamls

    yamls = Path(tempfile.mkdtemp(prefix="eval-vs-hf-"))
    write_suite_yamls(data_dir=EVAL, out_dir=yamls, only=[SUITE_NAMES[t] for t in tasks])
    local = ",".join(f"{t}_local" for t in tasks)
    rows = []
    for r in range(args.rounds):
        out = work / f"hf-{r}"
        sec = run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                   f"pretrained={hf_dir},dtype=float32", "--device", "cpu", "--tasks", local, "--include_path", str(yamls),
                   "--limit", str(args.limit), "--batch_size", str(args.batch_size), "--output_path", str(out),
                   "--log_samples"], threads=args.threads, log=work / f"hf-{r}.log")
        hf_sec, hf_ll = sec, loglikelihoods(out)
        rows.append({"round": r, "model": "lm-eval hf (source)", "seconds": round(sec, 1), "ratio": 1.0,
                     "scores": accuracies(out)})
        print(f"round {r} hf: {sec:.1f} s {rows[-1]['scores']}", flush=True)
        for scorer in args.scorers.split(","):
            out = work / f"biglm-{scorer.replace(':', '')}-{r}"
            name, _, block = scorer.partition(":")
            margs = f"pretrained={biglm_dir},scorer={name},dtype=float32" + (f",score_block={block}" if block else "") + (
                f",{args.model_args}" if args.model_args else "")
            sec = run([sys.executable, "-m", "biglm", "eval", "--model_args", margs, "--device", "cpu", "--tasks", local,
                       "--include_path", str(yamls), "--limit", str(args.limit), "--batch_size", str(args.batch_size),
                       "--output_path", str(out), "--log_samples"], threads=args.threads,
                      log=work / f"biglm-{scorer.replace(':', '')}-{r}.log")
            rows.append({"round": r, "model": f"biglm eval scorer={scorer}", "seconds": round(sec, 1),
                         "ratio": round(sec / hf_sec, 2), "scores": accuracies(out),
                         "vs_hf": agreement(loglikelihoods(out), hf_ll)})
            print(f"round {r} biglm {scorer}: {sec:.1f} s ({sec / hf_sec:.2f}x hf) {rows[-1]['scores']} "
                  f"per document vs hf: {rows[-1]['vs_hf']}", flush=True)
    result = {"date": dt.datetime.now().isoformat(timespec="seconds"), "machine": at_start,
              "command": " ".join(sys.argv), "source": source.name, "biglm": biglm_dir.name, "tasks": tasks,
              "limit": args.limit, "threads": args.threads, "runs": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"eval-vs-hf-{args.tag + '-' if args.tag else ''}{dt.datetime.now():%Y%m%d-%H%M%S}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# biglm eval vs lm-eval hf ({result['date']})", "", f"`{result['command']}`", "",
             f"machine: {json.dumps(result['machine'])}", "",
             "| round | model | seconds | x hf | " + " | ".join(tasks) + " |", "|---|---|---|---|" + "---|" * len(tasks)]
    for row in rows:
        cells = [" / ".join(f"{100 * v:.0f}" for v in row["scores"].get(t, {}).values()) for t in tasks]
        lines.append(f"| {row['round']} | {row['model']} | {row['seconds']} | {row['ratio']} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: acc / acc_norm (%) on the first --limit documents.", "",
              "| round | model | " + " | ".join(f"{t}: same choice as hf, max |d loglik|" for t in tasks) + " |",
              "|---|---|" + "---|" * len(tasks)]
    for row in rows:
        if "vs_hf" in row:
            cells = [f"{row['vs_hf'].get(t, {}).get('same_choice', '-')}, {row['vs_hf'].get(t, {}).get('max_abs_loglik_diff', '-')}"
                     for t in tasks]
            lines.append(f"| {row['round']} | {row['model']} | " + " | ".join(cells) + " |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and .md")


if __name__ == "__main__":
    main()
