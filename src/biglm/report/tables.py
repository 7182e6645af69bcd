"""The report's tables, as data (`Table`: cells that keep the number they show) and as Markdown.

Notable features
- **Ablation table** in the layout of the paper's Tables 1, 2 and 8: one row per run (seed replicas of one
  recipe — same configuration but for the seed — folded into one row: the mean, and the standard error over
  seeds), the Table 1 columns of `biglm.scoring.suite` in percent with the paper's metric (acc_norm for PIQA,
  ARC-C, LogiQA, HellaSwag; acc elsewhere), their average, the difference of that average to a named baseline
  run, then MMLU/LAMBADA, then every other task and metric found (e.g. ``heldout``'s masked_loss, fill_acc,
  cont_nll, cont_ppl) in their own units. ``±`` is the standard error lm-eval (or the held-out evaluation)
  reports; for an average, the errors of its columns combined as independent.
- **Difference table**: every column minus the baseline's, ``±`` combining both errors as independent (an
  upper bound when the runs were scored on the same questions, which they are).
- Per-token metrics (losses, NLL, perplexity, and the held-out task, measured on token shards) are left out
  for a run whose tokenizer differs from the reference one, with a line saying so: nats per token of two
  vocabularies do not compare.
- **Cost table** (paper Table 6): device-hours of a recipe = its tokens / measured tokens per second per
  device / 3600, the device named; beside it the FLOP-based estimate (the recipe's training FLOPs / the FLOP/s
  a device sustained in the measurement, i.e. peak x measured MFU) and the paper's own GPU hours.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from .inputs import Metric, Run, Skip, Throughput

__all__ = ["Cell", "Table", "Row", "PAPER_GPU_HOURS", "group_rows", "find_row", "reference_tokenizer",
           "ablation_tables", "cost_table", "fmt_pct", "fmt_num", "fmt_hours", "fmt_int"]

# Paper, Appendix D "Training Cost Analysis", Table 6 ("The training cost", GPU hours) for the §4 models,
# each trained 300k steps x 1024 windows x 2048 tokens (Table 7). The GPU type of these runs is not stated;
# §3.1 trains the 124M trial models on 64 NVIDIA A100-PCIE-80GB.
PAPER_GPU_HOURS: dict[str, float] = {"biglm-136m": 11392, "biglm-360m": 22528, "biglm-1.3b": 45568,
                                     "biglm-3.5b": 100250}
PAPER_GPU_NOTE = ("paper: Table 6 of Appendix D; GPU type not stated there (§3.1 trained its 124M models on "
                  "NVIDIA A100-PCIE-80GB)")


# ---------------------------------------------------------------------------------------------- cells
def fmt_pct(v: float) -> str:
    return f"{100 * v:.2f}"


def fmt_num(v: float) -> str:
    return f"{v:.4f}" if abs(v) < 1e5 else f"{v:.4e}"


def fmt_int(v: float) -> str:
    return f"{v:,.0f}"


def fmt_hours(h: float) -> str:
    """Device-hours: whole hours from 1,000 on, else three significant digits."""
    return f"{h:,.0f}" if h >= 1000 else f"{h:.3g}"


@dataclass(frozen=True)
class Cell:
    """What a table shows, and the number(s) behind it (None for text and missing cells)."""

    text: str
    value: float | None = None
    stderr: float | None = None


EMPTY = Cell("—")


@dataclass
class Table:
    key: str
    title: str
    header: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        out = [line(self.header), "|" + "|".join("---" for _ in self.header) + "|"]
        out += [line([c.text for c in row]) for row in self.rows]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "header": self.header, "notes": self.notes,
                "rows": [[{"text": c.text, "value": c.value, "stderr": c.stderr} for c in row] for row in self.rows]}


# ---------------------------------------------------------------------------------------------- rows
@dataclass
class Row:
    """A table row: one run, or the seed replicas of one recipe."""

    label: str
    runs: list[Run]

    @property
    def tokenizer(self) -> str | None:
        return self.runs[0].tokenizer


def _recipe_key(run: Run) -> Any:
    if run.kind != "pretrain" or run.config is None:
        return ("single", id(run))
    rest = {k: v for k, v in run.config.items() if k not in {"seed", "out_dir"}}
    return (run.name, repr(sorted(rest.items())))


def group_rows(runs: list[Run]) -> list[Row]:
    """Rows in input order; runs whose configurations differ only in seed (and output folder) share one."""
    groups: dict[Any, list[Run]] = {}
    for r in runs:
        groups.setdefault(_recipe_key(r), []).append(r)
    rows = []
    for members in groups.values():
        if len(members) == 1:
            rows.append(Row(members[0].label, members))
        else:
            rows.append(Row(members[0].name, members))
    labels = [r.label for r in rows]
    for r in rows:  # a replica group named like a single run elsewhere: name it by its folders
        if labels.count(r.label) > 1:
            r.label = " / ".join(m.label for m in r.runs)
    return rows


def find_row(rows: list[Row], name: str) -> Row | None:
    """The row named ``name``: its label, or the label, recorded name or folder of one of its runs."""
    for row in rows:
        if row.label == name:
            return row
    for row in rows:
        if any(name in {r.label, r.name, r.path.name, str(r.path)} for r in row.runs):
            return row
    return None


def reference_tokenizer(runs: list[Run], baseline: Run | None) -> str | None:
    """The tokenizer runs are compared under: the baseline's when known, else the most common known one."""
    if baseline is not None and baseline.tokenizer is not None:
        return baseline.tokenizer
    known = [r.tokenizer for r in runs if r.tokenizer is not None]
    return max(known, key=known.count) if known else None


# ---------------------------------------------------------------------------------------------- the ablation table
@dataclass(frozen=True)
class Column:
    key: tuple[str, str]
    """(task, metric); ("", "avg") for the average"""
    header: str
    percent: bool
    per_token: bool
    tasks: tuple[str, ...] = ()
    """task names the value may be found under (a suite task's local and built-in names)"""


def _per_token(task: str, metric: str) -> bool:
    # the held-out task is measured on token shards; losses, NLLs and perplexities are per token
    return task == "heldout" or bool(re.search(r"(^|_)(loss|nll|ppl)($|_| )", metric)) or metric == "token_perplexity"


def _columns(rows: list[Row]) -> tuple[list[Column], list[Column], list[Column], list[Column]]:
    """(Table 1 columns, MMLU/LAMBADA, other tasks' metrics, the paper tasks' other metrics) found in ``rows``."""
    from ..scoring.suite import LOCAL_SUFFIX, PAPER_SUITE

    runs = [r for row in rows for r in row.runs]
    suite_names = {n for t in PAPER_SUITE for n in (t.task, t.task + LOCAL_SUFFIX)}
    paper, extra = [], []
    for t in PAPER_SUITE:
        names = (t.task + LOCAL_SUFFIX, t.task)
        if any(t.metric in r.evals.get(n, {}) for r in runs for n in names):
            col = Column((t.task, t.metric), t.column, True, False, names)
            (paper if t.in_average else extra).append(col)
    other: dict[tuple[str, str], Column] = {}
    secondary: dict[tuple[str, str], Column] = {}
    subtasks = set().union(*(r.group_subtasks for r in runs)) if runs else set()
    for r in runs:
        for task, metrics in r.evals.items():
            if task in subtasks:
                continue
            base = task[: -len(LOCAL_SUFFIX)] if task.endswith(LOCAL_SUFFIX) else task
            for metric in metrics:
                if task in suite_names:
                    if any(c.key == (base, metric) for c in paper + extra):
                        continue
                    secondary.setdefault((base, metric), Column((base, metric), f"{base} {metric}", False,
                                                                _per_token(base, metric), (task, base)))
                else:
                    other.setdefault((task, metric), Column((task, metric), f"{task} {metric}", False,
                                                            _per_token(task, metric), (task,)))
    return paper, extra, list(other.values()), list(secondary.values())


def _metric(run: Run, col: Column) -> Metric | None:
    for name in col.tasks:
        m = run.evals.get(name, {}).get(col.key[1])
        if m is not None:
            return m
    return None


@dataclass(frozen=True)
class _Value:
    value: float
    stderr: float | None
    n: int


def _combine(values: list[tuple[float, float | None]]) -> _Value | None:
    """One run: its value and error. Seed replicas: the mean and the standard error over seeds."""
    if not values:
        return None
    if len(values) == 1:
        return _Value(values[0][0], values[0][1], 1)
    xs = [v for v, _ in values]
    return _Value(statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs)), len(xs))


def _avg_of(run: Run, paper: list[Column]) -> tuple[float, float | None, frozenset[str]] | None:
    got = [(c, _metric(run, c)) for c in paper]
    got = [(c, m) for c, m in got if m is not None]
    if not got:
        return None
    k = len(got)
    errs = [m.stderr for _, m in got]
    se = math.sqrt(sum(e * e for e in errs)) / k if all(e is not None for e in errs) else None  # type: ignore[operator]
    return sum(m.value for _, m in got) / k, se, frozenset(c.header for c, _ in got)


def _cell(v: _Value | None, percent: bool, *, signed: bool = False) -> Cell:
    if v is None:
        return EMPTY
    scale = 100.0 if percent else 1.0
    fmt = (lambda x: f"{100 * x:+.2f}" if percent else f"{x:+.4f}") if signed else (fmt_pct if percent else fmt_num)
    text = fmt(v.value)
    if v.stderr is not None and math.isfinite(v.stderr):
        text += f" ± {(fmt_pct if percent else fmt_num)(abs(v.stderr))}"
    if v.n > 1:
        text += f" (n={v.n})"
    return Cell(text, v.value * scale, None if v.stderr is None else v.stderr * scale)


def ablation_tables(rows: list[Row], *, baseline: Row | None, reference: str | None,
                    skipped: list[Skip]) -> list[Table]:
    """The ablation table (paper layout), the difference-to-baseline table, and the paper tasks' other
    metrics; only rows with eval results appear."""
    for row in rows:
        for run in row.runs:
            if not run.evals and run.kind == "pretrain":
                where = "this replica is not in its row's mean" if any(r.evals for r in row.runs) else \
                    "not in the ablation tables (evaluate it into RUN/eval/, e.g. `biglm eval --output_path RUN/eval`)"
                skipped.append(Skip(f"{run.label}: eval results", f"none under {run.path}/eval: {where}"))
    rows = [r for r in rows if any(run.evals for run in r.runs)]
    if not rows:
        return []
    paper, extra, other, secondary = _columns(rows)
    base_in = baseline if baseline is not None and baseline in rows else None
    if baseline is not None and base_in is None:
        skipped.append(Skip(f"baseline {baseline.label}", "has no eval results: no differences to it"))

    def comparable(row: Row, col: Column) -> bool:
        return not (col.per_token and reference is not None and row.tokenizer is not None and row.tokenizer != reference)

    for row in rows:
        dropped = [c.header for c in other + secondary if not comparable(row, c)
                   and any(_metric(r, c) for r in row.runs)]
        if dropped:
            skipped.append(Skip(f"{row.label}: {', '.join(dropped)}",
                                f"its tokenizer ({row.runs[0].tokenizer_desc}) is not the reference one: per-token "
                                "numbers of different vocabularies do not compare, so they are left out of the tables"))

    def value(row: Row, col: Column) -> _Value | None:
        if not comparable(row, col):
            return None
        found = [(m.value, m.stderr) for m in (_metric(r, col) for r in row.runs) if m is not None]
        return _combine(found)

    def average(row: Row) -> tuple[_Value | None, frozenset[str]]:
        avgs = [a for a in (_avg_of(r, paper) for r in row.runs) if a is not None]
        if not avgs:
            return None, frozenset()
        return _combine([(a[0], a[1]) for a in avgs]), avgs[0][2]

    base_avg, base_cols = average(base_in) if base_in is not None else (None, frozenset())
    header = ["run"] + [c.header for c in paper] + (["Avg"] if paper else [])
    header += [f"Δ Avg vs {base_in.label}"] if base_in is not None and paper else []
    header += [c.header for c in extra + other]
    body: list[list[Cell]] = []
    for row in rows:
        cells = [Cell(row.label)] + [_cell(value(row, c), True) for c in paper]
        if paper:
            avg, cols = average(row)
            cells.append(_cell(avg, True))
            if base_in is not None:
                if row is base_in:
                    cells.append(Cell("baseline"))
                elif avg is None or base_avg is None:
                    cells.append(EMPTY)
                elif cols != base_cols:
                    cells.append(EMPTY)
                    skipped.append(Skip(f"{row.label}: Δ Avg", f"its average covers {len(cols)} column(s) "
                                        f"({', '.join(sorted(cols))}), the baseline's {len(base_cols)}: not comparable"))
                else:
                    cells.append(_cell(_diff(avg, base_avg), True, signed=True))
        cells += [_cell(value(row, c), c.percent) for c in extra + other]
        body.append(cells)
    notes = ["Zero-shot columns in percent with the paper's metric (acc_norm: PIQA, ARC-C, LogiQA, HellaS; acc "
             "elsewhere); Avg over the Table 1 columns present; other metrics in their own units."
             if paper else "No Table 1 column in these results; metrics in their own units.",
             "± is the evaluation's standard error (for Avg, its columns' errors combined as independent); a row "
             "with (n=k) is the mean of k seed replicas and ± the standard error over seeds."]
    if reference is not None:
        notes.append("Per-token metrics (losses, NLL, perplexity, held-out) only for runs with the reference tokenizer.")
    tables = [Table("ablation", "Ablation table (layout of the paper's Tables 1, 2 and 8)", header, body, notes)]

    if base_in is not None:
        dheader = ["run"] + [c.header for c in paper] + (["Avg"] if paper else []) + [c.header for c in extra + other]
        drows = []
        for row in rows:
            if row is base_in:
                continue
            cells = [Cell(row.label)] + [_cell(_diff(value(row, c), value(base_in, c)), True, signed=True)
                                         for c in paper]
            if paper:
                avg, acols = average(row)
                cells.append(_cell(_diff(avg, base_avg), True, signed=True) if acols == base_cols else EMPTY)
            for c in extra + other:
                cells.append(_cell(_diff(value(row, c), value(base_in, c)), c.percent, signed=True))
            drows.append(cells)
        if drows:
            tables.append(Table("delta", f"Difference to the baseline {base_in.label}", dheader, drows,
                                ["Each cell: run − baseline, in the column's units (percentage points for the "
                                 "zero-shot columns); ± combines both errors as independent (an upper bound: the "
                                 "runs are scored on the same questions)."]))
    if secondary:
        srows = [[Cell(row.label)] + [_cell(value(row, c), False) for c in secondary] for row in rows]
        tables.append(Table("other_metrics", "Other metrics of the zero-shot tasks",
                            ["run"] + [c.header for c in secondary], srows, ["Fractions, as lm-eval reports them."]))
    return tables


def _diff(a: _Value | None, b: _Value | None) -> _Value | None:
    if a is None or b is None:
        return None
    se = math.sqrt(a.stderr**2 + b.stderr**2) if a.stderr is not None and b.stderr is not None else None
    return _Value(a.value - b.value, se, 1)


# ---------------------------------------------------------------------------------------------- the cost table
@dataclass(frozen=True)
class Recipe:
    name: str
    tokens: int
    flops_per_token: float | None
    preset: str | None
    seq_len: int
    paper: bool = False
    """one of the paper's §4 recipes (Table 6)"""


# the paper's recipes as `biglm pretrain RECIPE` trains them: (tokens, dense training FLOPs per token, preset, L).
# Written here, not recomputed: a report reads what runs and recipes record (tests/test_report.py checks these
# numbers against the recipes and the trainer's FLOP count)
PAPER_RECIPES: dict[str, tuple[int, float, str, int]] = {
    "biglm-136m": (629_145_600_000, 1_121_348_275.2, "biglm-136m", 2048),
    "biglm-360m": (629_145_600_000, 2_741_876_352.0, "biglm-360m", 2048),
    "biglm-1.3b": (629_145_600_000, 8_818_706_841.6, "biglm-1.3b", 2048),
    "biglm-3.5b": (629_145_600_000, 22_442_560_512.0, "biglm-3.5b", 2048),
}


def _paper_recipes() -> list[Recipe]:
    return [Recipe(name, tokens, flops, preset, seq_len, paper=True)
            for name, (tokens, flops, preset, seq_len) in PAPER_RECIPES.items() if name in PAPER_GPU_HOURS]


def _run_recipe(run: Run) -> Recipe | None:
    c = run.config or {}
    if not all(isinstance(c.get(k), int) for k in ("steps", "global_batch", "seq_len")):
        return None
    flops = run.throughput.flops_per_token if run.throughput is not None else None
    return Recipe(run.label, c["steps"] * c["global_batch"] * c["seq_len"], flops, c.get("preset"), c["seq_len"])


def _device_text(m: Throughput) -> str:
    return m.device + (f" ×{m.world_size}" if m.world_size > 1 else "")


def _cost_row(recipe: Recipe, m: Throughput | None, ref: Throughput | None, notes: list[str]) -> list[Cell]:
    """One row: direct hours from ``m`` (a measurement of this very model), FLOP-based hours from ``ref``."""
    name = f"{recipe.name} (paper recipe)" if recipe.paper else recipe.name
    cells = [Cell(name), Cell(fmt_int(recipe.tokens), float(recipe.tokens))]
    if m is not None:
        hours = recipe.tokens / m.tokens_per_s_per_device / 3600
        if m.seq_len is not None and m.seq_len != recipe.seq_len:
            notes.append(f"measured at L={m.seq_len}, the recipe trains at L={recipe.seq_len}")
        if not m.world_size_known:
            notes.append("world size not logged: tokens/s taken as one device's")
        cells += [Cell(_device_text(m)), Cell(m.source),
                  Cell(fmt_int(m.tokens_per_s_per_device), m.tokens_per_s_per_device),
                  Cell(fmt_hours(hours), hours),
                  Cell(f"{100 * m.mfu:.1f}%", m.mfu) if m.mfu is not None else Cell("— (no peak known)" if not m.is_gpu
                                                                                     else "—")]
    else:
        cells += [EMPTY, Cell("no measurement of this model"), EMPTY, EMPTY, EMPTY]
    if ref is not None and ref.achieved_flops and recipe.flops_per_token:
        fh = recipe.tokens * recipe.flops_per_token / ref.achieved_flops / 3600
        if ref is not m:
            notes.append(f"FLOP-based at the FLOP/s sustained in {ref.source} on {ref.device}"
                         + (f" (MFU {100 * ref.mfu:.1f}%)" if ref.mfu is not None else ""))
        cells.append(Cell(fmt_hours(fh), fh))
    else:
        cells.append(EMPTY)
    paper = PAPER_GPU_HOURS.get(recipe.name) if recipe.paper else None
    if paper is not None:
        cells += [Cell(fmt_int(paper), paper), Cell(fmt_int(recipe.tokens / (paper * 3600)), recipe.tokens / (paper * 3600))]
    else:
        cells += [EMPTY, EMPTY]
    cells.append(Cell("; ".join(notes) if notes else ""))
    return cells


def cost_table(runs: list[Run], benchmarks: list[Throughput], skipped: list[Skip]) -> Table:
    """Table 6: the paper's final recipes, then each run's own recipe, with measured device-hours."""
    measured = [r.throughput for r in runs if r.throughput is not None] + list(benchmarks)
    for r in runs:
        if r.kind == "pretrain" and r.throughput is None and r.loss is not None:
            skipped.append(Skip(f"{r.label}: speed", "no tokens_per_s in its metrics.jsonl 'log' records: not in the cost table"))
    with_flops = [m for m in measured if m.achieved_flops]
    # the best stand-in for an unmeasured model: a GPU measurement of the largest model measured
    fallback = max(with_flops, key=lambda m: (bool(m.is_gpu), m.flops_per_token or 0.0), default=None)

    def same_model(recipe: Recipe) -> list[Throughput]:
        cands = [m for m in measured if m.full_preset and m.preset == recipe.preset]
        best: dict[str, Throughput] = {}  # one per device: the one at the recipe's window, else the fastest
        for m in sorted(cands, key=lambda m: (m.seq_len == recipe.seq_len, m.tokens_per_s_per_device)):
            best[m.device] = m
        return sorted(best.values(), key=lambda m: not m.is_gpu)

    rows: list[list[Cell]] = []
    paper_recipes = _paper_recipes()
    for recipe in paper_recipes:
        ms = same_model(recipe)
        for m in ms or [None]:
            ref = m if m is not None and m.achieved_flops else fallback
            rows.append(_cost_row(recipe, m, ref, []))
    for r in runs:
        recipe = _run_recipe(r)
        if r.throughput is None or recipe is None:
            continue
        if any(p.name == r.name and p.tokens == recipe.tokens for p in paper_recipes):
            continue  # the paper recipe's row above already uses this run's measurement
        rows.append(_cost_row(recipe, r.throughput, r.throughput if r.throughput.achieved_flops else fallback, []))
    header = ["recipe", "tokens", "device", "measured in", "tokens/s per device", "device-hours", "MFU",
              "FLOP-based device-hours", "paper GPU hours (Table 6)", "paper tokens/s per GPU (implied)", "notes"]
    notes = ["device-hours = recipe tokens / measured tokens per second per device / 3600 (a CPU's are CPU-hours). "
             "Measured speed: the median of a run's logged tokens/s after its first log interval, divided by its "
             "world size; or a bench_pretrain.py row (one device).",
             "FLOP-based = recipe tokens × training FLOPs per token (the trainer's dense count) / the FLOP/s per "
             "device sustained in the measurement (= peak × measured MFU).", PAPER_GPU_NOTE]
    return Table("cost", "Training cost (layout of the paper's Table 6)", header, rows, notes)
