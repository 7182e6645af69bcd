"""What runs wrote, read into plain records: nothing here draws, formats or computes a table.

Inputs, by what they are rather than by name:

- a **pre-training run directory** (``biglm pretrain``): ``metrics.jsonl`` (kinds ``train``: step, loss;
  ``log``: tokens/s, MFU, lr; ``val``: validation loss; ``tasks``: the in-training ARC-E/ARC-C scores),
  ``train_config.json`` (the recipe: steps, batch, window, schedule, WSD annealing, data), ``config.json``
  (the model), ``tokenizer/`` and ``checkpoints/step_*/meta.json`` (world size). Evaluation results under
  ``RUN/eval/`` (any depth) belong to the run.
- **evaluation results in lm-eval's layout** — ``{"results": {task: {"acc,none": v, "acc_stderr,none": se}},
  "config": {"model_args": "pretrained=DIR,..."}}`` — as `biglm eval`, ``biglm eval --suite heldout`` and
  lm-eval itself write them; a file, or a folder of them. A file whose ``pretrained`` lies inside a run
  directory given beside it is attributed to that run.
- **pre-training benchmark results** (``benchmarks/bench_pretrain.py``): tokens/s (and MFU on a GPU) of a
  preset's training step on a named machine.

Every input, or part of one, that cannot be used becomes a `Skip` that names it and says why (an empty
directory, a metrics file cut off mid-line, a JSON file of another tool, a run with no losses yet); the
rest is still read. A resumed run logs the steps after its last checkpoint twice: the later record of a
step wins, which is the one the continued run produced (a resumed run reproduces the lost steps exactly).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["Skip", "Curve", "Metric", "Throughput", "Run", "Inputs", "read_inputs", "read_eval_file",
           "is_lm_eval_results", "corpus_label"]


@dataclass(frozen=True)
class Skip:
    """An input, or part of one, left out of the report, and why."""

    what: str
    why: str

    def line(self) -> str:
        return f"{self.what}: {self.why}"


@dataclass
class Curve:
    """A quantity against training progress; ``tokens[i]`` is the tokens seen after ``steps[i]`` steps."""

    steps: list[int]
    tokens: list[float]
    values: list[float]
    stderr: list[float | None] | None = None
    what: str = ""
    """what the values are, when a curve may hold one of several things (the ARC columns averaged)"""


@dataclass(frozen=True)
class Metric:
    """One evaluation number with its standard error (None when the file has none) and the file it came from."""

    value: float
    stderr: float | None
    source: str


@dataclass
class Throughput:
    """A measured training speed: tokens per second on one device, and where it was measured."""

    source: str
    """the run or benchmark file it comes from"""
    device: str
    """the device, named as precisely as the input allows (e.g. "NVIDIA H100 80GB HBM3", "CPU (AMD EPYC)")"""
    is_gpu: bool | None
    tokens_per_s_per_device: float
    world_size: int
    world_size_known: bool
    mfu: float | None
    """model FLOPs utilisation, as the trainer or benchmark logged it (None on CPU: no known peak)"""
    flops_per_token: float | None
    """training FLOPs per token of the measured model at the measured window (dense count, as the trainer's MFU)"""
    preset: str | None
    full_preset: bool
    """the measured model is exactly ``preset`` (no layer cut, no architecture change)"""
    seq_len: int | None

    @property
    def achieved_flops(self) -> float | None:
        """FLOP/s per device actually sustained (= peak x MFU where both are known)."""
        return self.tokens_per_s_per_device * self.flops_per_token if self.flops_per_token else None


@dataclass
class Run:
    """A pre-training run or an evaluated model: everything the figures and tables need, as read."""

    name: str
    """the name it recorded (``train_config.json`` name, or the evaluated model's folder name)"""
    path: Path
    kind: Literal["pretrain", "eval"]
    label: str = ""
    """a name unique among the inputs (the recorded name, or the folder name where names repeat)"""
    config: dict[str, Any] | None = None
    """``train_config.json`` as saved"""
    model_config: Any = None
    tokenizer: str | None = None
    """the tokenizer's identity: its fingerprint, else the name it was given; None when unknown"""
    tokenizer_desc: str = "unknown"
    params: int | None = None
    """non-embedding parameters"""
    tokens_per_step: int | None = None
    anneal_start: int | None = None
    """WSD: steps completed when the annealing phase starts (its first step has 0-based index ``anneal_start``)"""
    loss: Curve | None = None
    val_loss: Curve | None = None
    arc: Curve | None = None
    """ARC-E/ARC-C average of the in-training evaluations, in percent"""
    throughput: Throughput | None = None
    evals: dict[str, dict[str, Metric]] = field(default_factory=dict)
    """task -> metric -> value, from every eval file of this model"""
    group_subtasks: set[str] = field(default_factory=set)
    corpus: str | None = None
    seed: int | None = None

    @property
    def anneal_tokens(self) -> float | None:
        if self.anneal_start is None or self.tokens_per_step is None:
            return None
        return float(self.anneal_start * self.tokens_per_step)


@dataclass
class Inputs:
    runs: list[Run] = field(default_factory=list)
    benchmarks: list[Throughput] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- evaluation files
def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def is_lm_eval_results(data: Any) -> bool:
    """True for lm-eval's results layout: ``results`` maps tasks to ``{"METRIC,FILTER": number}``."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict) or not data["results"]:
        return False
    return any(isinstance(m, dict) and any("," in k and _number(v) is not None for k, v in m.items())
               for m in data["results"].values())


def read_eval_file(path: Path, data: dict[str, Any]) -> tuple[dict[str, dict[str, Metric]], set[str]]:
    """Task -> metric -> `Metric` of one lm-eval results dict, and the tasks that are subtasks of a group
    (e.g. MMLU's 57 subjects, shown through their group). A metric under a filter other than ``none`` is
    named ``METRIC (FILTER)``."""
    out: dict[str, dict[str, Metric]] = {}
    blocks = {**(data.get("groups") or {}), **data["results"]}  # lm-eval repeats group rows in both
    for task, metrics in blocks.items():
        if not isinstance(metrics, dict):
            continue
        for key, raw in metrics.items():
            if "," not in key or "_stderr," in key:
                continue
            value = _number(raw)
            if value is None:
                continue
            metric, filt = key.split(",", 1)
            name = metric if filt == "none" else f"{metric} ({filt})"
            se = _number(metrics.get(f"{metric}_stderr,{filt}"))
            out.setdefault(task, {})[name] = Metric(value, se, str(path))
    subtasks: set[str] = set()
    for members in (data.get("group_subtasks") or {}).values():
        subtasks.update(m for m in members or () if isinstance(m, str))
    return out, subtasks


def _eval_date(path: Path, data: dict[str, Any]) -> float:
    d = data.get("date")
    return float(d) if isinstance(d, (int, float)) else path.stat().st_mtime


def _pretrained_of(data: dict[str, Any]) -> str | None:
    args = (data.get("config") or {}).get("model_args")
    if isinstance(args, dict):
        v = args.get("pretrained")
        return str(v) if v else None
    if isinstance(args, str):
        for part in args.split(","):
            key, _, value = part.partition("=")
            if key.strip() == "pretrained" and value.strip():
                return value.strip()
    return None


def _merge_evals(run: Run, files: list[tuple[Path, dict[str, Any]]], skipped: list[Skip]) -> None:
    """Add the evaluations of ``files`` to ``run``; where two files hold the same task the newer one wins."""
    for path, data in sorted(files, key=lambda f: _eval_date(*f)):
        evals, subtasks = read_eval_file(path, data)
        for task, metrics in evals.items():
            if task in run.evals:
                old = next(iter(run.evals[task].values())).source
                skipped.append(Skip(f"{old} ({task})", f"{task} is also in the newer {path}: the newer values are used"))
            run.evals[task] = metrics
        run.group_subtasks |= subtasks


def _load_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except (OSError, UnicodeDecodeError) as e:
        return None, f"cannot be read ({e.__class__.__name__})"
    except json.JSONDecodeError as e:
        return None, f"not valid JSON (line {e.lineno}: {e.msg})"


def _classify_json(data: Any) -> str:
    if is_lm_eval_results(data):
        return "eval"
    if isinstance(data, dict) and isinstance(data.get("rows"), list) and any(
            isinstance(r, dict) and "biglm_tokens_per_s" in r for r in data["rows"]):
        return "benchmark"
    return "foreign"


def _foreign_reason(data: Any) -> str:
    if isinstance(data, dict) and "machine" in data:
        return "a benchmark result without pre-training throughput rows (benchmarks/bench_pretrain.py writes those)"
    if isinstance(data, dict) and "superglue" in data and "genset" in data:
        return "a `biglm eval --suite multitask` summary (Table 5), not lm-eval's results layout"
    keys = ", ".join(list(data)[:5]) if isinstance(data, dict) else type(data).__name__
    return f"not lm-eval's results layout (no 'results' mapping of task -> 'METRIC,FILTER' numbers; has: {keys})"


# ---------------------------------------------------------------------------------------------- benchmarks
def read_benchmark(path: Path, data: dict[str, Any], skipped: list[Skip]) -> list[Throughput]:
    """One `Throughput` per row of a ``bench_pretrain.py`` result (the BiGLM step; one device per row)."""
    machine, args = data.get("machine") or {}, data.get("args") or {}
    gpu = machine.get("gpu")
    on_gpu = bool(gpu) and str(args.get("device", "cuda")).startswith("cuda")
    if on_gpu:
        device = str(gpu)
    else:
        threads = machine.get("torch_threads") or args.get("threads") or machine.get("threads")
        device = f"CPU ({machine.get('cpu', 'unknown')}" + (f", {threads} thread{'s' if threads != 1 else ''})"
                                                              if threads else ")")
    cut = args.get("layers")
    out = []
    for i, row in enumerate(data["rows"]):
        tps = _number(row.get("biglm_tokens_per_s"))
        if tps is None or tps <= 0:
            skipped.append(Skip(f"{path} row {i}", "no biglm_tokens_per_s"))
            continue
        out.append(Throughput(
            source=f"{path.name} ({row.get('preset')}, B={row.get('B')}, L={row.get('L')}"
                   + (f", {cut} layers" if cut else "") + ")",
            device=device, is_gpu=on_gpu, tokens_per_s_per_device=tps, world_size=1, world_size_known=True,
            mfu=_number(row.get("biglm_mfu")), flops_per_token=_number(row.get("flops_per_token")),
            preset=row.get("preset"), full_preset=not cut, seq_len=row.get("L")))
    return out


# ---------------------------------------------------------------------------------------------- runs
def corpus_label(config: dict[str, Any] | None) -> str | None:
    """The run's training data as a short label: folder names with their shares, then the annealing mixture."""
    if not config or not config.get("data"):
        return None

    def mix(d: dict[str, Any]) -> str:
        total = sum(float(w) for w in d.values()) or 1.0
        names = ["built-in corpus" if k == "builtin" else Path(str(k)).name or str(k) for k in d]
        if len(d) == 1:
            return names[0]
        return " + ".join(f"{n} {100 * float(w) / total:.0f}%" for n, w in zip(names, d.values()))

    label = mix(config["data"])
    if config.get("anneal_data") and config.get("schedule") == "wsd" and config.get("anneal_fraction"):
        label += f" → anneal: {mix(config['anneal_data'])}"
    return label


def _read_metrics(path: Path, what: str, skipped: list[Skip]) -> dict[str, dict[int, dict[str, Any]]]:
    by_kind: dict[str, dict[int, dict[str, Any]]] = {}
    bad: list[int] = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        skipped.append(Skip(str(path), f"cannot be read ({e.__class__.__name__})"))
        return {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad.append(i)
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec.get("step"), bool):
            bad.append(i)
            continue
        # a resumed run logs the steps after its last checkpoint again: the later record is the continued run's
        by_kind.setdefault(str(rec.get("kind", "train")), {})[rec["step"]] = rec
    if bad:
        lines = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        skipped.append(Skip(f"{what}: metrics.jsonl line {lines}",
                            "not a JSON record with an integer step (a run cut off mid-write?); the other lines are used"))
    return by_kind


def _curve(records: dict[int, dict[str, Any]], key: str, tokens_per_step: int | None) -> Curve | None:
    pts = [(s, _number(r.get(key)), _number(r.get("tokens"))) for s, r in sorted(records.items())]
    pts = [(s, v, t) for s, v, t in pts if v is not None]
    if not pts:
        return None
    tokens = [float(s * tokens_per_step) if tokens_per_step else t for s, v, t in pts]
    if any(t is None for t in tokens):
        return None
    return Curve([s for s, _, _ in pts], tokens, [v for _, v, _ in pts])  # type: ignore[arg-type]


def _arc_curve(records: dict[int, dict[str, Any]], tokens_per_step: int | None
               ) -> tuple[Curve | None, str | None]:
    """The ARC-E/ARC-C average (percent) of the in-training evaluations; where a run evaluated only one of the
    two (e.g. no ARC-Challenge data), that one alone, said in the returned note."""
    steps, tokens, values, errors = [], [], [], []
    seen: set[str] = set()
    used: set[tuple[str, ...]] = set()
    for s, r in sorted(records.items()):
        seen |= {k for k in r if k not in {"kind", "step", "tokens", "avg"} and not k.endswith("_stderr")}
        cols = [c for c in ("ARC-E", "ARC-C") if _number(r.get(c)) is not None]
        t = float(s * tokens_per_step) if tokens_per_step else _number(r.get("tokens"))
        if not cols or t is None:
            continue
        ses = [_number(r.get(f"{c}_stderr")) for c in cols]
        steps.append(s)
        tokens.append(t)
        values.append(100 * sum(float(r[c]) for c in cols) / len(cols))
        errors.append(100 * math.sqrt(sum(e * e for e in ses)) / len(cols) if None not in ses else None)  # type: ignore[operator]
        used.add(tuple(cols))
    if not steps:
        return None, f"its in-training evaluations hold {', '.join(sorted(seen)) or 'nothing'}, not ARC-E or ARC-C"
    note = None
    if used != {("ARC-E", "ARC-C")}:
        note = "the ARC curve averages " + " / ".join("+".join(u) for u in sorted(used)) + \
               " (the paper's is ARC-E + ARC-C: train with --eval_tasks ARC-E,ARC-C)"
    what = "+".join(sorted(used, key=len)[-1]) if len(used) == 1 else "ARC-E/ARC-C where evaluated"
    return Curve(steps, tokens, values, errors, what=what), note


def _tokenizer_identity(run_dir: Path, config: dict[str, Any] | None) -> tuple[str | None, str]:
    """The run's tokenizer fingerprint (as the trainer computes it) from ``RUN/tokenizer``, else the data
    manifest's, else the name it was given; (None, "unknown") when nothing says."""
    tok_dir = run_dir / "tokenizer"
    if (tok_dir / "tokenizer.json").is_file():
        try:
            from ..data import load_tokenizer, tokenizer_fingerprint

            fp = tokenizer_fingerprint(load_tokenizer(tok_dir))
            return f"sha:{fp}", f"fingerprint {fp[:12]} ({tok_dir})"
        except Exception as e:  # noqa: BLE001 - a broken tokenizer folder only makes the identity unknown
            return None, f"unknown ({tok_dir} does not load: {e.__class__.__name__})"
    for folder in (config or {}).get("data") or {}:
        manifest = Path(folder) / "manifest.json"
        if manifest.is_file():
            m, _ = _load_json(manifest)
            fp = ((m or {}).get("config") or {}).get("tokenizer_fingerprint")
            if fp:
                return f"sha:{fp}", f"fingerprint {fp[:12]} (from {manifest})"
    name = (config or {}).get("tokenizer")
    if name:
        return f"name:{name}", f"{name} (by name: no tokenizer/ folder in the run)"
    return None, "unknown"


def _world_size(run_dir: Path) -> int | None:
    from ..checkpoint.layout import checkpoint_dirs

    for ckpt in reversed(checkpoint_dirs(run_dir)):
        meta, _ = _load_json(ckpt / "meta.json")
        if isinstance(meta, dict) and isinstance(meta.get("world_size"), int):
            return meta["world_size"]
    return None


def _checkpoint_on_gpu(run_dir: Path) -> bool | None:
    """Whether the run trained on CUDA: its checkpoints keep a CUDA RNG state exactly then."""
    from ..checkpoint.layout import checkpoint_dirs

    dirs = checkpoint_dirs(run_dir)
    if not dirs or not (dirs[-1] / "rank00000.pt").is_file():
        return None
    try:
        import torch

        state = torch.load(dirs[-1] / "rank00000.pt", map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - an unreadable file only leaves the device unknown
        return None
    return "rng_cuda" in state if isinstance(state, dict) else None


def _device_of(run_dir: Path, config: dict[str, Any] | None, log: dict[int, dict[str, Any]]) -> tuple[str, bool | None]:
    """The training device as precisely as the run says: a device name the metrics carry, else CPU/CUDA from
    the configuration or the checkpoint's RNG state (the GPU model is then unknown)."""
    for rec in log.values():
        name = rec.get("device_name") or rec.get("device")
        if isinstance(name, str) and name:
            return name, not name.lower().startswith("cpu")
    wanted = (config or {}).get("device")
    on_gpu = {"cpu": False, "cuda": True}.get(wanted) if isinstance(wanted, str) else None
    if on_gpu is None:
        on_gpu = _checkpoint_on_gpu(run_dir)
    if on_gpu is None:
        return "unknown device (not logged, no checkpoint)", None
    return ("CUDA GPU (model not logged)", True) if on_gpu else ("CPU", False)


def _throughput(run: Run, log: dict[int, dict[str, Any]], skipped: list[Skip]) -> Throughput | None:
    recs = [r for _, r in sorted(log.items()) if _number(r.get("tokens_per_s"))]
    if not recs:
        return None
    # the first interval holds start-up (and compilation on GPU): left out once there are enough others
    timed = recs[1:] if len(recs) >= 3 else recs
    tps = statistics.median(float(r["tokens_per_s"]) for r in timed)
    mfus = [float(r["mfu"]) for r in timed if _number(r.get("mfu")) is not None]
    logged_ws = next((r["world_size"] for r in recs if isinstance(r.get("world_size"), int)), None)
    ws = logged_ws or _world_size(run.path)
    if ws is None:
        skipped.append(Skip(f"{run.path}: world size", "not logged and no checkpoint: tokens/s taken as one device's"))
    device, on_gpu = _device_of(run.path, run.config, log)
    # the trainer logs its FLOPs per token (dense count) beside tokens/s; a run that did not has no FLOP-based hours
    flops = next((float(r["flops_per_token"]) for r in recs if _number(r.get("flops_per_token"))), None)
    return Throughput(
        source=f"run {run.path}", device=device, is_gpu=on_gpu, tokens_per_s_per_device=tps / (ws or 1),
        world_size=ws or 1, world_size_known=ws is not None, mfu=statistics.median(mfus) if mfus else None,
        flops_per_token=flops, preset=(run.config or {}).get("preset"),
        full_preset=not any(v is not None for v in ((run.config or {}).get("model") or {}).values()),
        seq_len=(run.config or {}).get("seq_len"))


def _anneal_start(config: dict[str, Any]) -> int | None:
    if config.get("schedule") != "wsd":
        return None
    # the trainer's rule (`TrainConfig.anneal_steps`) on the settings the run wrote
    anneal = int(round(float(config.get("anneal_fraction") or 0.0) * int(config.get("steps") or 0)))
    return int(config["steps"]) - anneal if anneal > 0 else None


def _read_run(path: Path, name: str | None, inputs: Inputs) -> Run | None:
    skipped = inputs.skipped
    config, _ = _load_json(path / "train_config.json") if (path / "train_config.json").is_file() else (None, None)
    if config is not None and not isinstance(config, dict):
        skipped.append(Skip(str(path / "train_config.json"), "not a JSON mapping of TrainConfig fields"))
        config = None
    run = Run(name=name or (config or {}).get("name") or path.name, path=path, kind="pretrain", config=config)
    if config is not None:
        if all(isinstance(config.get(k), int) for k in ("global_batch", "seq_len")):
            run.tokens_per_step = config["global_batch"] * config["seq_len"]
        if isinstance(config.get("steps"), int):
            run.anneal_start = _anneal_start(config)
        run.corpus = corpus_label(config)
        run.seed = config.get("seed") if isinstance(config.get("seed"), int) else None
    if (path / "config.json").is_file():
        try:
            from ..model import BiGLMConfig, count_parameters

            run.model_config = BiGLMConfig.from_pretrained(path)
            run.params = count_parameters(run.model_config)["non_embedding"]
        except Exception as e:  # noqa: BLE001 - the model size is only a label
            skipped.append(Skip(str(path / "config.json"), f"not a BiGLM config ({e.__class__.__name__}): no model size"))
    run.tokenizer, run.tokenizer_desc = _tokenizer_identity(path, config)

    metrics = path / "metrics.jsonl"
    by_kind = _read_metrics(metrics, str(path), skipped) if metrics.is_file() else {}
    if (path / "finetune_config.json").is_file() and config is None:
        skipped.append(Skip(str(path), "a fine-tuning run (finetune_config.json): its curves are not pre-training "
                                       "curves; only its eval results are read"))
        by_kind = {}
    elif not metrics.is_file():
        skipped.append(Skip(str(path), "no metrics.jsonl (the run has not logged a step): no curves or speed"))
    elif not by_kind:
        skipped.append(Skip(str(metrics), "no records (empty file): no curves or speed"))
    if run.tokens_per_step is None:  # no saved config: tokens per step from records that log both
        pairs = {(r["tokens"] // r["step"]) for recs in by_kind.values() for r in recs.values()
                 if isinstance(r.get("tokens"), int) and r["step"] > 0 and r["tokens"] % r["step"] == 0}
        if len(pairs) == 1:
            run.tokens_per_step = pairs.pop()
    if by_kind:
        train = by_kind.get("train") or by_kind.get("log") or {}
        run.loss = _curve(train, "loss", run.tokens_per_step)
        run.val_loss = _curve(by_kind.get("val", {}), "val_loss", run.tokens_per_step)
        if run.loss is None:
            why = ("no training losses in metrics.jsonl" if not train else
                   "tokens per step unknown (no train_config.json and no record with tokens)")
            skipped.append(Skip(f"{path}: loss curve", why))
        if by_kind.get("tasks"):
            run.arc, why = _arc_curve(by_kind["tasks"], run.tokens_per_step)
            if why:
                skipped.append(Skip(f"{path}: ARC curve", why))
        run.throughput = _throughput(run, by_kind.get("log", {}), skipped)

    eval_files = sorted((path / "eval").rglob("*.json")) if (path / "eval").is_dir() else []
    _merge_evals(run, _eval_files(eval_files, inputs), skipped)
    if run.loss is None and run.val_loss is None and not run.evals and run.throughput is None:
        skipped.append(Skip(str(path), "nothing to report: no losses, speed or eval results"))
        return None
    return run


def _eval_files(paths: list[Path], inputs: Inputs) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for p in paths:
        data, err = _load_json(p)
        if err:
            inputs.skipped.append(Skip(str(p), err))
        elif _classify_json(data) == "eval":
            out.append((p, data))
        else:
            inputs.skipped.append(Skip(str(p), _foreign_reason(data)))
    return out


def _is_run_dir(path: Path) -> bool:
    return any((path / f).is_file() for f in ("metrics.jsonl", "train_config.json", "finetune_config.json"))


def _split_spec(spec: str) -> tuple[str | None, Path]:
    """``NAME=PATH`` names an input; a plain path keeps its recorded name."""
    name, sep, rest = spec.partition("=")
    if sep and name and "/" not in name and not Path(spec).exists():
        return name, Path(rest)
    return None, Path(spec)


def read_inputs(specs: list[str]) -> Inputs:
    """Read every input (run directories, eval files or folders, benchmark files; ``NAME=PATH`` names one)."""
    inputs = Inputs()
    loose: list[tuple[str | None, Path, dict[str, Any]]] = []  # eval files not inside a run directory
    for spec in specs:
        name, path = _split_spec(spec)
        if not path.exists():
            inputs.skipped.append(Skip(spec, "no such file or directory"))
        elif path.is_dir():
            if not any(path.iterdir()):
                inputs.skipped.append(Skip(str(path), "empty directory"))
            elif _is_run_dir(path):
                run = _read_run(path, name, inputs)
                if run is not None:
                    inputs.runs.append(run)
            else:
                files = sorted(path.rglob("*.json"))
                if not files:
                    inputs.skipped.append(Skip(str(path), "neither a run directory (no metrics.jsonl or "
                                                          "train_config.json) nor a folder of eval results (no .json files)"))
                for f in files:
                    _read_file(f, name, inputs, loose)
        else:
            _read_file(path, name, inputs, loose)
    _attribute(loose, inputs)
    _label(inputs.runs)
    return inputs


def _read_file(path: Path, name: str | None, inputs: Inputs, loose: list) -> None:
    data, err = _load_json(path)
    if err:
        inputs.skipped.append(Skip(str(path), err))
        return
    kind = _classify_json(data)
    if kind == "eval":
        loose.append((name, path, data))
    elif kind == "benchmark":
        inputs.benchmarks += read_benchmark(path, data, inputs.skipped)
    else:
        inputs.skipped.append(Skip(str(path), _foreign_reason(data)))


def _attribute(loose: list[tuple[str | None, Path, dict[str, Any]]], inputs: Inputs) -> None:
    """Loose eval files go to the run directory their ``pretrained`` lies in, else to one model per
    ``pretrained`` (or per file, without one)."""
    runs = {r.path.resolve(): r for r in inputs.runs}
    models: dict[str, tuple[Run, list]] = {}
    for name, path, data in loose:
        pretrained = _pretrained_of(data)
        owner = None
        if pretrained is not None:
            target = Path(pretrained).resolve()
            owner = next((r for p, r in runs.items() if target == p or p in target.parents), None)
        if owner is not None and name is None:
            _merge_evals(owner, [(path, data)], inputs.skipped)
            continue
        key = name or pretrained or str(path)
        if key not in models:
            label = name or (Path(pretrained).name if pretrained else path.stem)
            run = Run(name=label, path=Path(pretrained) if pretrained else path, kind="eval")
            if pretrained is not None:
                run.tokenizer, run.tokenizer_desc = _model_tokenizer(Path(pretrained))
            models[key] = (run, [])
        models[key][1].append((path, data))
    for run, files in models.values():
        _merge_evals(run, files, inputs.skipped)
        inputs.runs.append(run)


def _model_tokenizer(model_dir: Path) -> tuple[str | None, str]:
    if (model_dir / "tokenizer.json").is_file():
        try:
            from ..data import load_tokenizer, tokenizer_fingerprint

            fp = tokenizer_fingerprint(load_tokenizer(model_dir))
            return f"sha:{fp}", f"fingerprint {fp[:12]} ({model_dir})"
        except Exception:  # noqa: BLE001
            pass
    if (model_dir / "tokenizer" / "tokenizer.json").is_file():
        return _tokenizer_identity(model_dir, None)
    return None, "unknown (the evaluated model's folder is not here)"


def _label(runs: list[Run]) -> None:
    """Unique labels: the recorded name, else the folder name, else both with a counter."""
    names = [r.name for r in runs]
    for r in runs:
        r.label = r.name if names.count(r.name) == 1 else (r.path.name or r.name)
    labels = [r.label for r in runs]
    seen: dict[str, int] = {}
    for r in runs:
        if labels.count(r.label) > 1:
            seen[r.label] = seen.get(r.label, 0) + 1
            r.label = f"{r.label} #{seen[r.label]}"
