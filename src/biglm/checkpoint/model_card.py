"""The model card `biglm export` writes beside the weights: ``README.md`` in the Hugging Face model-card format.

YAML front matter (``library_name: biglm``, ``license``, ``tags``: biglm, masked-lm and the objective, ``base_model``
when the run started from another model, ``datasets`` from the run's data sources, ``pipeline_tag``), then the
architecture, the objective, the training (steps and tokens of the exported checkpoint, schedule, data), the
evaluation results the run holds (the validation loss of metrics.jsonl, zero-shot scores logged during training,
``RUN/eval/*.json`` written by `biglm eval --output_path RUN/eval`), and how to load and generate.

Everything comes from what the run wrote (train_config.json, metrics.jsonl, the checkpoint's meta.json; for a
`biglm finetune` run task.json and finetune_config.json); nothing is measured here. A value the run did not record
is left out, never guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..model import count_parameters
from .source import SourceRef, base_of

DEFAULT_LICENSE = "apache-2.0"
# the task metric of a fine-tuning kind, when task.json does not name it (finetune/ owns the tasks; this mirrors them)
_KIND_METRIC = {"classification": "accuracy", "retrieval": "ndcg@10", "squad": "f1"}
_KIND_PIPELINE = {"classification": "text-classification", "retrieval": "sentence-similarity",
                  "squad": "question-answering", "seq2seq": "text2text-generation", "instruct": "text-generation"}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _dataset_names(folders: list[str], hub_sources: dict[str, str]) -> tuple[list[str], list[str]]:
    """The sources the run's shard folders were prepared from, as (hub dataset ids, other names): a hub source
    ``hf:ORG/NAME[:CONFIG][@SPLIT]`` as its id ``ORG/NAME`` (what a card's ``datasets`` field takes), a local file or
    folder by its name alone (never its path), ``builtin`` as itself."""
    hub: list[str] = []
    local: list[str] = []
    for folder in folders:
        manifest = _json(Path(folder) / "manifest.json")
        sources = (manifest or {}).get("config", {}).get("sources") if isinstance(manifest, dict) else None
        if not sources:
            sources = hub_sources.get(folder, "").split() or [folder]
        for s in map(str, sources):
            if s.startswith("hf:"):
                hub.append(_hub_dataset_id(s))
            else:
                local.append(Path(s.rstrip("/")).name or s)
    return _unique(hub), _unique(local)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _hub_dataset_id(source: str) -> str:
    """``hf:ORG/NAME[:CONFIG][@SPLIT]`` -> ``ORG/NAME``."""
    return source[3:].split("@")[0].split(":")[0]


def _base(explicit: str | None, lineage_of: Path | None) -> tuple[str | None, str | None]:
    """(the card's ``base_model`` — a hub id or nothing —, the phrase naming it in the text): `base_of`, named by hub
    id or file name + sha256; a start with no such root is named by its folder's name, never its path."""
    root = base_of(lineage_of, explicit)
    if root is not None:
        return root.hub_id, root.describe()
    start = explicit
    if start is None and lineage_of is not None:
        start = (_json(lineage_of / "train_config.json") or {}).get("init_from") or \
            (_json(lineage_of / "finetune_config.json") or {}).get("model")
    return None, (f"a local model (`{Path(str(start)).name}`)" if start else None)


def _eval_results(run_dir: Path) -> list[tuple[str, str, float]]:
    """(task, metric, value) from ``RUN/eval/**/*.json`` files in lm-eval's results layout (standard errors left out)."""
    out = []
    for f in sorted((run_dir / "eval").rglob("*.json")) if (run_dir / "eval").is_dir() else []:
        data = _json(f)
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, dict):
            continue
        for task, metrics in results.items():
            for key, value in (metrics or {}).items():
                name = key.split(",")[0]
                if isinstance(value, (int, float)) and not isinstance(value, bool) and "stderr" not in name:
                    out.append((task, name, float(value)))
    return out


def _architecture(config) -> list[str]:
    n = count_parameters(config)
    return ["## Architecture", "",
            "| layers | hidden | heads | kv heads | intermediate | vocab | max positions | parameters | non-embedding |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {config.num_hidden_layers} | {config.hidden_size} | {config.num_attention_heads} | "
            f"{config.num_key_value_heads} | {config.intermediate_size} | {config.vocab_size} | "
            f"{config.max_position_embeddings} | {n['total'] / 1e6:.2f}M | {n['non_embedding'] / 1e6:.2f}M |", "",
            "A BiGLM encoder (RMSNorm, RoPE, SwiGLU, grouped-query attention, "
            f"{'q/k/v biases' if getattr(config, 'attention_bias', False) else 'no biases'}), "
            f"{'tied' if config.tie_word_embeddings else 'untied'} input/output embeddings."
            + (" A masked token is predicted from the previous position's hidden state (`shift_logits`, kept from the "
               "autoregressive model it was converted from); biglm's decoding and scoring apply it."
               if getattr(config, "shift_logits", False) else ""), ""]


def _usage(name: str) -> list[str]:
    return ["## How to use", "", "```python", "from biglm.checkpoint import load_model",
            "from biglm.generation import generate", "",
            f'model, tok = load_model("{name}")  # this directory (or: import biglm; AutoModelForMaskedLM.from_pretrained)',
            'print(generate(model, tok, ["The default value is"], max_new_tokens=32, steps=8))', "```", "",
            f'On the command line: `biglm generate {name} --prompt "..."`; `biglm eval --model_args pretrained={name}` '
            "scores it.", ""]


def _finetune_usage(name: str, config) -> list[str]:
    arch = (config.architectures or ["BiGLMForMaskedLM"])[0]
    return ["## How to use", "", "```python", f"from biglm.model import {arch}", "from transformers import AutoTokenizer",
            "", f'model = {arch}.from_pretrained("{name}")  # this directory',
            f'tok = AutoTokenizer.from_pretrained("{name}")', "```", "",
            "`biglm_task.json` beside the weights holds the task's settings and template (what `biglm finetune` "
            "used to build the inputs); `biglm generate` / `biglm serve` read it for generation tasks.", ""]


def pretrain_card(run_dir: Path, *, checkpoint: Path, config, name: str, license: str,
                  base_model: str | None) -> str:
    """The card of a `biglm pretrain` run exported from ``checkpoint``."""
    train = _json(run_dir / "train_config.json") or {}
    meta = _json(checkpoint / "meta.json") or {}
    step = meta.get("step")
    objective = (train.get("objective") or {}).get("name", "unknown")
    hub_base, base = _base(base_model, run_dir)
    folders = list(train.get("data") or {}) + [f for f in (train.get("anneal_data") or {}) if f not in (train.get("data") or {})]
    hub_data, local_data = _dataset_names(folders, train.get("hub_sources") or {})
    front: dict[str, Any] = {"library_name": "biglm", "license": license, "pipeline_tag": "fill-mask",
                             "tags": _unique(["biglm", "masked-lm", objective])}
    if hub_base:
        front["base_model"] = hub_base
    if hub_data:
        front["datasets"] = hub_data
    body = [f"# {name}", "",
            f"A BiGLM (bidirectional language model) pre-trained with `biglm pretrain` (run `{train.get('name', run_dir.name)}`)"
            + (f", continued from {base}." if base else "."), ""]
    body += _architecture(config)
    block = f", block lengths {config.prefix_block_lengths}" if config.prefix_attention == "blocks" else ""
    body += ["## Objective", "", f"`{objective}`; the model's prefix attention: `{config.prefix_attention}`{block} "
             "(read by block decoding to choose its cache).", ""]
    body += ["## Training", ""]
    if step is not None:
        total = train.get("steps")
        body.append(f"- steps: {step}" + (f" of {total}" if total else "") + f" (checkpoint `{checkpoint.name}`)")
        if train.get("global_batch") and train.get("seq_len"):
            tokens = step * train["global_batch"] * train["seq_len"]
            body.append(f"- tokens: {tokens:,} ({train['global_batch']} windows x {train['seq_len']} tokens per step)")
    if train.get("lr") is not None:
        body.append(f"- schedule: {train.get('schedule')} lr {train['lr']:g} -> {train.get('min_lr', 0):g}, "
                    f"{train.get('warmup_steps')} warm-up steps")
    if base:
        body.append(f"- started from {base} (its weights; a fresh optimizer)")
    if hub_data or local_data:
        body.append("- data: " + ", ".join(f"`{d}`" for d in hub_data + local_data))
    body.append("")
    rows = _rows(run_dir)
    upto = [r for r in rows if step is None or (isinstance(r.get("step"), int) and r["step"] <= step)]
    val = [r for r in upto if r.get("kind") == "val" and "val_loss" in r]
    tasks = [r for r in upto if r.get("kind") == "tasks"]
    results = _eval_results(run_dir)
    body += ["## Evaluation", ""]
    if val:
        body.append(f"- validation masked-token loss at step {val[-1]['step']}: {val[-1]['val_loss']:.4f}")
    if tasks:
        scores = {k: v for k, v in tasks[-1].items() if k not in {"kind", "step", "tokens"} and "stderr" not in k}
        body.append(f"- zero-shot during training (step {tasks[-1]['step']}): "
                    + ", ".join(f"{k} {100 * v:.1f}" for k, v in scores.items() if isinstance(v, (int, float))))
    if results:
        body += ["", "| task | metric | value |", "|---|---|---|"]
        body += [f"| {t} | {m} | {v:.4g} |" for t, m, v in results]
    if not (val or tasks or results):
        body.append("No evaluation results were found in the run.")
    body.append("")
    body += _usage(name)
    return _render(front, body)


def finetune_card(run_dir: Path, *, config, name: str, license: str, base_model: str | None) -> str:
    """The card of a `biglm finetune` run (its best epoch is what is exported)."""
    task = _json(run_dir / "task.json") or {}
    ft = _json(run_dir / "finetune_config.json") or {}
    kind = str(task.get("kind", ""))
    task_name = str(task.get("task", "task"))
    settings = task.get("settings") if isinstance(task.get("settings"), dict) else {}
    metric = task.get("metric") or settings.get("metric") or _KIND_METRIC.get(kind)
    if kind == "seq2seq" and not metric:
        metric = "rougeL" if settings.get("metrics") == "rouge" else "bleu4"
    hub_base, base = _base(base_model, run_dir)
    front: dict[str, Any] = {"library_name": "biglm", "license": license,
                             "pipeline_tag": _KIND_PIPELINE.get(kind, "fill-mask"),
                             "tags": _unique(["biglm", "masked-lm", "fine-tuned", task_name])}
    if hub_base:
        front["base_model"] = hub_base
    data = [str(settings[k]) for k in ("data", "dataset", "train") if isinstance(settings.get(k), str)]
    hub_data = _unique([_hub_dataset_id(d) for d in data if d.startswith("hf:")])
    if hub_data:
        front["datasets"] = hub_data
    body = [f"# {name}", "", f"A BiGLM fine-tuned with `biglm finetune` on the task `{task_name}`"
            + (f" ({kind})" if kind else "") + (f", from {base}." if base else "."), ""]
    body += _architecture(config)
    evals = [r for r in _rows(run_dir) if r.get("kind") == "eval"]
    body += ["## Task and evaluation", "", f"- task: `{task_name}`" + (f", metric: `{metric}`" if metric else "")]
    scored = [r for r in evals if metric and isinstance(r.get(metric), (int, float))]
    if scored:
        best = max(scored, key=lambda r: r[metric])
        body.append(f"- best epoch: {best.get('epoch')} ({best.get('split', 'validation')} {metric} {best[metric]:.4g});"
                    " this export is that epoch's model")
        body += ["", f"| epoch | {metric} |", "|---|---|"] + [f"| {r.get('epoch')} | {r[metric]:.4g} |" for r in scored]
    elif not evals:
        body.append("- no evaluation results were found in the run")
    if ft:
        body.append("")
        body.append(f"- training: {ft.get('epochs')} epochs, lr {ft.get('lr')}, global batch {ft.get('global_batch')}")
    body.append("")
    body += _finetune_usage(name, config)
    return _render(front, body)


def convert_card(*, config, source: SourceRef, name: str) -> str:
    """The card `biglm convert` writes: the source named portably (hub id, or file name and sha256), the shape, and
    that the weights are the autoregressive source's, not yet trained as a BiGLM."""
    front: dict[str, Any] = {"library_name": "biglm", "pipeline_tag": "fill-mask",
                             "tags": ["biglm", "masked-lm", "converted"]}
    if source.hub_id:
        front["base_model"] = source.hub_id
    if getattr(config, "prefix_attention", "bidirectional") == "causal":
        said = ("the source's weights, mapped by name, reading its text as the source did: one token per call writes "
                "the source's greedy text and `biglm eval` gives its scores. Its mask slots have not learned to draft "
                f"yet: `biglm pretrain blocks-adapt --init_from {name}` trains them (mask adapters; the next-token "
                "predictions stay the source's), so it writes the same text in fewer calls.")
    else:
        said = ("the source's weights, mapped by name, with bidirectional attention. It has not been trained as a "
                f"BiGLM yet: adapt it with `biglm pretrain blocks-adapt --init_from {name}` (or a `*-from-*` recipe) "
                "before relying on it.")
    body = [f"# {name}", "", f"{source.describe()} converted to a BiGLM by `biglm convert`: {said}", ""]
    body += _architecture(config)
    body += _usage(name)
    return _render(front, body)


def _render(front: dict[str, Any], body: list[str]) -> str:
    return "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n\n" + "\n".join(body).rstrip() + "\n"
