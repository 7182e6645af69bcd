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

    python docs/experiments/small_blocks_eval.py MODELS_DIR DATA_ROOT OUT.json [small|threshold|per-prompt|trace]

``threshold`` (instead of the default ``small``): does a longer-trained model commit more than two tokens per call at
the quality of T = N/2? Blocks of 8: confidence at T = N/2 (the reference), the threshold rule at tau = 0.9 / 0.7 / 0.5
with at least two tokens per call (steps = N/2) and at tau = 0.9 with at least one, and one token per call. The 48
prompts decode as one batch, whose rows run in lockstep: a block ends early only when it ends early in every row.
``per-prompt``: the threshold rule (tau = 0.9 / 0.7 / 0.5, at least two per call, blocks of 8) one prompt at a time,
so the calls counted are each prompt's own (batch 1). ``trace``: the first held-out prompt's first 16 tokens at blocks
of 8, two per call; every step's predictions with their confidences (written to OUT.json and printed).

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


def _evaluator() -> dict:
    """`blocks_quality_eval.py`'s namespace (its prompts, grammar check, settings and main)."""
    return runpy.run_path(str(Path(__file__).with_name("blocks_quality_eval.py")), run_name="blocks_quality_eval")


def _grammar_models(models: Path):
    """(name, model in fp32 eval mode, tokenizer) of every `grammar-*` model under ``models``, one thread."""
    from biglm.checkpoint import load_model

    torch.set_num_threads(1)
    for model_dir in sorted(p for p in models.iterdir() if p.name.startswith("grammar")):
        model, tok = load_model(model_dir)
        yield model_dir.name, model.float().eval(), tok


def per_prompt(models: Path, data: Path, out: Path) -> None:
    """The threshold rule one prompt at a time: each prompt's own calls and the grammatical share."""
    import json
    import statistics

    from biglm.generation import generate_ids

    evaluate = _evaluator()
    results = {}
    for name, model, tok in _grammar_models(models):
        prompts = evaluate["prompts"](data / "data", n=48, prompt_len=24, new=64)
        results[name] = row = {}
        for tau in (0.9, 0.7, 0.5):
            calls, good, total = [], 0, 0
            for prompt in prompts:
                answer = generate_ids(model, prompt[None], max_new_tokens=64, strategy="threshold", threshold=tau,
                                      steps=32, block_length=8)
                calls.append(answer.steps)
                c = evaluate["check"](tok.decode(prompt.tolist(), skip_special_tokens=True),
                                      tok.decode(answer.token_lists()[0], skip_special_tokens=True))
                good, total = good + c["grammatical"], total + c["sentences"]
            row[f"threshold {tau}, blocks of 8, >= 2 per call, one prompt at a time"] = dict(
                mean_calls=statistics.mean(calls), min_calls=min(calls), grammatical=good / max(1, total))
            print(name, tau, row, flush=True)
    out.write_text(json.dumps(results, indent=1))


def trace(models: Path, data: Path, out: Path) -> None:
    """Each step's predictions and confidences for one prompt (what the threshold rule sees)."""
    import json

    from biglm.generation import generate_ids

    evaluate = _evaluator()
    results = {}
    for name, model, tok in _grammar_models(models):
        prompt = evaluate["prompts"](data / "data", n=1, prompt_len=24, new=64)
        steps: list = []
        generate_ids(model, prompt, max_new_tokens=16, strategy="confidence", steps=8, block_length=8,
                     on_step=steps.append)
        mask = tok.convert_tokens_to_ids(tok.mask_token)
        rows = []
        for s in steps:  # each slot the step predicted: its token if kept ("?" if not), its confidence, kept or not
            where = s.predicted[0]
            rows.append([(tok.decode([int(t)]) if int(t) != mask else "?", round(float(p), 2), bool(k))
                         for t, p, k in zip(s.output_ids[0][where], s.probs[0][where], s.committed[0][where])])
        results[name] = dict(prompt=tok.decode(prompt[0].tolist()), steps=rows)
        print(name, results[name]["prompt"])
        for r in rows:
            print("  ", " ".join(f"{t}:{p}{'*' if k else ''}" for t, p, k in r))
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    modes = ([], ["small"], ["threshold"], ["per-prompt"], ["trace"])
    if len(sys.argv) not in (4, 5) or sys.argv[4:] not in modes:
        sys.exit(__doc__)
    models, data, out = sys.argv[1:4]
    for folder in (models, f"{data}/data"):
        if not Path(folder).is_dir():
            sys.exit(f"small_blocks_eval.py: {folder} is not a directory (MODELS_DIR holds grammar-* models; DATA_ROOT/data "
                     "the prepared grammar data)")
    if sys.argv[4:] == ["per-prompt"]:
        sys.exit(per_prompt(Path(models), Path(data), Path(out)))
    if sys.argv[4:] == ["trace"]:
        sys.exit(trace(Path(models), Path(data), Path(out)))
    register(Spread)
    evaluate = _evaluator()
    evaluate["LEAN"].clear()
    evaluate["LEAN"].update(THRESHOLD if sys.argv[4:] == ["threshold"] else SETTINGS)
    sys.argv = ["blocks_quality_eval.py", "--models", models, "--data", data, "--only", "grammar", "--settings", "lean",
                "--out", out]
    evaluate["main"]()
