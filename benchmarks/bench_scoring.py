"""Scoring throughput (questions/s) of each likelihood estimator on a fixed set of local questions.

    python benchmarks/bench_scoring.py --pretrained runs/scoring-ckpt [--questions 40] [--threads 2]

Protocol: the first `--questions` items of PIQA (2 choices), ARC-Easy (3-5 choices) and WinoGrande
(2 contexts, 1 shared continuation) from ../shared/data/eval, rendered with lm-eval's own prompts
(the built-in tasks' doc_to_text/doc_to_choice), scored through the `biglm` lm-eval adapter (the
real path: tokenisation, context grouping, prefix cache). One untimed warm-up pass on 4 questions
per estimator, then one timed pass. The result (machine, torch version, git commit, per-estimator
seconds and questions/s) is printed and written to benchmarks/results/scoring-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
EVAL = REPO.parent / "shared" / "data" / "eval"
TASKS = {"piqa": "baber__piqa/validation.jsonl", "arc_easy": "allenai__ai2_arc/ARC-Easy/test.jsonl",
         "winogrande": "allenai__winogrande/winogrande_xl/validation.jsonl"}


def _requests(n: int) -> tuple[list, int]:
    """lm-eval Instances for the first ``n`` docs of each task, built by the tasks themselves."""
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager, get_task_dict

    import lm_eval.tasks as tasks_pkg
    import yaml
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bench-scoring-"))
    root = Path(tasks_pkg.__file__).parent
    builtin = {"piqa": "piqa/piqa.yaml", "arc_easy": "arc/arc_easy.yaml", "winogrande": "winogrande/default.yaml"}
    for name, rel in TASKS.items():
        split = Path(rel).stem
        doc = {"include": str(root / builtin[name]), "task": f"{name}_bench", "dataset_path": "json", "dataset_name": None,
               "dataset_kwargs": {"data_files": {split: str(EVAL / rel)}}, "training_split": None}
        if name == "arc_easy":
            doc["validation_split"] = None
        (tmp / f"{name}_bench.yaml").write_text(yaml.safe_dump(doc))
    tdict = get_task_dict([f"{n}_bench" for n in TASKS], TaskManager(include_path=str(tmp)))
    reqs, questions = [], 0
    for task in tdict.values():
        task.build_all_requests(limit=n, rank=0, world_size=1)
        reqs += [Instance("loglikelihood", {}, i.args, len(reqs) + k) for k, i in enumerate(task.instances)]
        questions += len({i.doc_id for i in task.instances})
    return reqs, questions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pretrained", default=str(REPO / "runs" / "scoring-ckpt"))
    ap.add_argument("--questions", type=int, default=40, help="per task")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--mc-samples", type=int, default=32)
    ap.add_argument("--row-batch-size", type=int, default=256)
    ap.add_argument("--estimators", default="one-pass,chain,pll,mc")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from biglm.integrations.lm_eval.adapter import BiGLMLM

    reqs, questions = _requests(args.questions)
    n_tokens = None
    rows = []
    for est in args.estimators.split(","):
        lm = BiGLMLM(pretrained=args.pretrained, scorer=est, device="cpu", mc_samples=args.mc_samples,
                     row_batch_size=args.row_batch_size)
        if n_tokens is None:
            n_tokens = sum(len(lm._encode_pair(*r.args)[1]) for r in reqs)
        lm.loglikelihood(reqs[:12], disable_tqdm=True)  # warm-up, untimed
        t0 = time.perf_counter()
        lm.loglikelihood(reqs, disable_tqdm=True)
        sec = time.perf_counter() - t0
        rows.append({"estimator": est, "seconds": round(sec, 3), "questions_per_s": round(questions / sec, 2),
                     "requests_per_s": round(len(reqs) / sec, 2)})
        print(f"{est:>9}: {sec:7.2f} s  {questions / sec:7.2f} questions/s  {len(reqs) / sec:7.2f} requests/s", flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "git_commit": commit, "torch": torch.__version__,
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "torch_threads": args.threads},
        "pretrained": args.pretrained, "config": json.loads(Path(args.pretrained, "config.json").read_text())
        if Path(args.pretrained, "config.json").is_file() else None,
        "questions": questions, "requests": len(reqs), "continuation_tokens": n_tokens,
        "tasks": {k: f"first {args.questions} of {v}" for k, v in TASKS.items()},
        "mc_samples": args.mc_samples, "row_batch_size": args.row_batch_size, "results": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"scoring-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
