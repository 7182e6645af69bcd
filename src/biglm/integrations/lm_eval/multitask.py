"""Table 5's multitask suite through lm-eval: MMLU zero/few-shot and the SuperGLUE average by lm-eval, Genset by
biglm's own decoding (`biglm.scoring.multitask`), on one loaded model.

    summary = run_multitask("runs/flan-hf", data_dir="../shared/data/eval", limit=50)
    print(summary["table"])          # Table 5's row: MMLU ZS / FS | SuperGLUE AVG ACC. | Genset B-2 / D-2
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...scoring.multitask import (PARTS, GensetSpec, default_gensets, genset_decoding, genset_scores, load_genset,
                                  multitask_table, run_genset)
from ...scoring.suite import LOCAL_SUFFIX, default_data_dir
from .yamls import write_multitask_yamls

__all__ = ["run_multitask"]


def _value(results: dict[str, Any], task: str, metric: str) -> float | None:
    v = results.get("results", {}).get(task, {}).get(f"{metric},none")
    return float(v) if isinstance(v, (int, float)) and not math.isnan(v) else None


def run_multitask(
    pretrained: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    parts: Sequence[str] = PARTS,
    gensets: Sequence[GensetSpec] | None = None,
    genset_n: int = 100,
    genset_seed: int = 0,
    genset_batch_size: int = 16,
    decoding: Mapping[str, Any] | None = None,
    mmlu_fewshot: int = 5,
    limit: float | None = None,
    batch_size: int | str | None = None,
    device: str | None = None,
    model_args: dict[str, Any] | None = None,
    output_path: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Run Table 5's suite and return its summary: ``mmlu``, ``superglue``, ``genset`` (every number,
    the tasks covered, the instances drawn and generated), ``skipped`` and the Markdown ``table``.

    ``gensets`` None takes `default_gensets` (WikiAuto beside ``data_dir``); ``[]`` runs none.
    ``decoding``: Genset's decoding options given explicitly (field -> value); the others are the model's saved
    settings (`genset_decoding`, as `biglm generate` decodes the model); ``limit`` cuts each lm-eval task to that many
    documents (quick checks). With ``output_path`` (a folder) ``multitask.json`` and ``multitask.md``
    are written there. Skipped parts and folders are named on stderr.
    """
    from .harness import build_lm, evaluate

    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"unknown multitask part(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(PARTS)}")
    if not Path(pretrained).exists():
        raise FileNotFoundError(f"no model at {pretrained}: pass a directory written by `biglm export` or a run.")
    if mmlu_fewshot < 1:
        raise ValueError(f"mmlu_fewshot={mmlu_fewshot} must be >= 1 (the zero-shot column always runs)")
    data = Path(data_dir) if data_dir is not None else default_data_dir()
    specs = list(default_gensets(data) if gensets is None else gensets) if "Genset" in parts else []
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"genset names must be unique, got {', '.join(names)}")
    samples = [load_genset(s, n=genset_n, seed=genset_seed) for s in specs]  # bad files fail before the model
    args = {"pretrained": str(pretrained), **(model_args or {})}
    with tempfile.TemporaryDirectory(prefix="biglm-multitask-") as tmp:
        plan = write_multitask_yamls(data_dir=data, out_dir=tmp, parts=parts)
        if "Genset" in parts and not samples:
            plan.skipped["Genset"] = ("no generation set: pass --genset NAME:PATH:SOURCE:TARGET (WikiAuto is read "
                                      f"from {data.parent / 'finetune' / 'wikiauto' / 'valid.jsonl'} when present)")
        for what, why in plan.skipped.items():
            print(f"biglm eval: multitask: skipping {what}: {why}", file=sys.stderr)
        zero_tasks = ([plan.mmlu_task] if plan.mmlu_task else []) + [t.task + LOCAL_SUFFIX for t in plan.superglue]
        if not zero_tasks and not samples:
            raise FileNotFoundError(f"nothing of the multitask suite has data under {data}: "
                                    + "; ".join(f"{k}: {v}" for k, v in plan.skipped.items()))
        lm = build_lm(model_args=args, batch_size=batch_size, device=device)
        config = genset_decoding(lm.model.config, decoding) if samples else None  # refused before lm-eval runs
        common = dict(include_path=tmp, limit=limit, lm=lm, include_defaults=False)
        zero = evaluate(tasks=zero_tasks, num_fewshot=0, **common) if zero_tasks else {}
        few = evaluate(tasks=[plan.mmlu_task], num_fewshot=mmlu_fewshot, **common) if plan.mmlu_task else {}
    if getattr(lm, "rank", 0) != 0:  # torchrun: rank 0 reports
        return {}
    sets = [run_genset(lm.model, lm.tokenizer, s, config=config, batch_size=genset_batch_size) for s in samples]
    sg_values = {t.config: _value(zero, t.task + LOCAL_SUFFIX, t.metric) for t in plan.superglue}
    ran = {k: v for k, v in sg_values.items() if v is not None}
    pooled = genset_scores([i["output"] for s in sets for i in s["instances"]],
                     [i["references"] for s in sets for i in s["instances"]]) if sets else {"bleu2": None,
                                                                                             "distinct2": None}
    summary: dict[str, Any] = {
        "model": Path(pretrained).name,
        "pretrained": str(pretrained),
        "limit": limit,
        "parts": [p for p in PARTS if p in parts],
        "mmlu": {"zero_shot": _value(zero, plan.mmlu_task, "acc") if plan.mmlu_task else None,
                 "few_shot": _value(few, plan.mmlu_task, "acc") if plan.mmlu_task else None,
                 "fewshot": mmlu_fewshot, "subjects": plan.mmlu_subjects},
        "superglue": {"average": sum(ran.values()) / len(ran) if ran else None, "covered": list(ran),
                      "tasks": ran, "metrics": {t.config: t.metric for t in plan.superglue}},
        "genset": {**pooled, "seed": genset_seed, "n_per_set": genset_n,
                   "decoding": asdict(config) if config else None, "sets": sets},
        "skipped": plan.skipped,
        "scales": {"accuracy": "fraction in JSON, percent in the table", "bleu2": "percent",
                   "distinct2": "fraction (the paper's scale)"},
        "lm_eval": {"zero_shot": {k: zero.get(k, {}) for k in ("results", "n-shot", "n-samples")},
                    "few_shot": {k: few.get(k, {}) for k in ("results", "n-shot", "n-samples")}},
    }
    summary["table"] = multitask_table(summary)
    if output_path is not None:
        out = Path(output_path)
        out.mkdir(parents=True, exist_ok=True)
        (out / "multitask.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        (out / "multitask.md").write_text(summary["table"] + "\n")
    return summary
