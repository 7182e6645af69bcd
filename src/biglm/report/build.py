"""`build_report`: inputs -> figures, tables and one HTML page in an output folder.

Writes into ``out``: ``report.html`` (self-contained), ``report.md`` (the tables, the figures by file name),
``report.json`` (every number behind every cell, the annealing markers, the skips), ``fig3_scaling.png``,
``fig4_corpora.png`` (when the runs cover two or more corpora) and one ``table_<name>.md`` per table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .figures import Figure, draw_curves, size_label
from .inputs import Run, Skip, read_inputs
from .tables import Cell, Table, ablation_tables, cost_table, find_row, fmt_int, group_rows, reference_tokenizer

__all__ = ["Report", "ReportError", "build_report"]


class ReportError(ValueError):
    """The report cannot be made as asked (e.g. the baseline names no input); the message says what to change."""


@dataclass
class Report:
    title: str
    out: Path
    runs: list[Run]
    figures: dict[str, Figure] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    skipped: list[Skip] = field(default_factory=list)
    html: Path | None = None

    @property
    def anneal(self) -> dict[str, dict[str, float]]:
        """Run label -> where its WSD annealing marker was drawn (steps completed, tokens seen)."""
        return {k: v for f in self.figures.values() for k, v in f.anneal.items()}


def _model_text(r: Run) -> str:
    if r.kind != "pretrain":
        return "—"
    c = r.config or {}
    changed = any(v is not None for v in (c.get("model") or {}).values())
    return f"{c.get('preset', '?')}{' (changed)' if changed else ''}, {size_label(r.params)}"


def _runs_table(runs: list[Run]) -> Table:
    rows = []
    for r in runs:
        c = r.config or {}
        if r.anneal_start is not None:
            anneal = f"step {r.anneal_start:,} ({fmt_int(r.anneal_tokens or 0)} tokens)"
        else:
            anneal = "—" if c.get("schedule") != "wsd" else "no annealing (anneal_fraction 0)"
        last = f"{r.loss.values[-1]:.4f} at step {r.loss.steps[-1]:,}" if r.loss else "—"
        rows.append([Cell(r.label), Cell(r.kind), Cell(str(r.path)),
                     Cell(_model_text(r)),
                     Cell(r.tokenizer_desc), Cell(r.corpus or "—"),
                     Cell(f"{c['steps']:,}" if isinstance(c.get("steps"), int) else "—"),
                     Cell(fmt_int(r.tokens_per_step) if r.tokens_per_step else "—"),
                     Cell(str(c.get("schedule", "—"))), Cell(anneal), Cell(last),
                     Cell(", ".join(sorted(t for t in r.evals if t not in r.group_subtasks)) or "—")])
    header = ["run", "kind", "path", "model", "tokenizer", "corpus", "steps", "tokens/step", "schedule",
              "WSD annealing starts", "last training loss", "eval tasks"]
    return Table("runs", "Inputs", header, rows)


def build_report(inputs: list[str], *, out: Path, baseline: str | None = None, title: str = "biglm report",
                 max_points: int = 500) -> Report:
    """Read ``inputs`` (run directories, eval files or folders, benchmark files) and write the report into
    ``out``; returns what was drawn and tabulated. Bad inputs are skipped with a reason (`Report.skipped`)."""
    data = read_inputs(inputs)
    report = Report(title=title, out=Path(out), runs=data.runs, skipped=data.skipped)
    skipped = report.skipped
    rows = group_rows(data.runs)
    base_row = find_row(rows, baseline) if baseline else None
    if baseline and base_row is None:
        dropped = [s for s in data.skipped if baseline in s.what]
        if not dropped:
            names = ", ".join(r.label for r in rows) or "none were read"
            raise ReportError(f"--baseline {baseline!r} names none of the runs ({names})")
        skipped.append(Skip(f"baseline {baseline}", f"its input was skipped ({dropped[0].why}): no differences to it"))
    base_run = base_row.runs[0] if base_row is not None else None
    reference = reference_tokenizer(data.runs, base_run)
    known = {}
    for r in data.runs:
        if r.tokenizer is not None:
            known.setdefault(r.tokenizer, []).append(r.label)
    if len(known) > 1:
        ref_desc = next(r.tokenizer_desc for r in data.runs if r.tokenizer == reference)
        groups = "; ".join(f"{', '.join(labels)}" for labels in known.values())
        skipped.append(Skip("tokenizers", f"the runs use {len(known)} tokenizers ({groups}); losses and per-token "
                                          f"metrics are compared only under the reference one, {ref_desc}"))

    out = report.out
    out.mkdir(parents=True, exist_ok=True)
    curves = [r for r in data.runs if r.kind == "pretrain" and (r.loss or r.val_loss or r.arc)]
    if curves:
        # Fig. 3 compares sizes on equal data: the runs on the baseline's corpus (else the most common one);
        # Fig. 4 compares corpora: every run, labelled by its data
        corpora = [r.corpus for r in curves if r.corpus]
        ref_corpus = (base_run.corpus if base_run is not None and base_run.corpus else
                      max(corpora, key=corpora.count) if corpora else None)
        colors = {r.label: f"C{i % 10}" for i, r in enumerate(curves)}
        fig3 = [r for r in curves if r.corpus in (None, ref_corpus)]
        for r in curves:
            if r not in fig3:
                skipped.append(Skip(f"fig3: {r.label}", f"trained on {r.corpus}, not {ref_corpus}: Fig. 3 compares "
                                                       "model sizes on one corpus; the run is in Fig. 4"))
        report.figures["fig3"] = draw_curves(
            fig3, key="fig3", title="Loss and ARC average against tokens, one line per run (paper Fig. 3)",
            path=out / "fig3_scaling.png", labels={r.label: f"{r.label} ({size_label(r.params)})" for r in fig3},
            caption=f"Runs on {ref_corpus or 'an unrecorded corpus'}. Training loss (lines; long runs averaged into "
                    "bins) and validation loss (circles) on the left, the ARC-E/ARC-C average of the in-training "
                    "evaluations on the right (± standard error); dotted lines mark where each run's WSD annealing "
                    "starts.",
            reference=reference, max_points=max_points, skipped=skipped, colors=colors)
        if len(set(corpora)) >= 2:
            with_corpus = [r for r in curves if r.corpus]
            report.figures["fig4"] = draw_curves(
                with_corpus, key="fig4", title="The same curves by training corpus (paper Fig. 4)",
                path=out / "fig4_corpora.png", labels={r.label: f"{r.corpus} — {r.label}" for r in with_corpus},
                caption="As Fig. 3, each run labelled by its training data (folder names with their sampling "
                        "shares, then the WSD annealing mixture).", reference=reference, max_points=max_points,
                skipped=skipped, colors=colors)
        else:
            skipped.append(Skip("Fig. 4 (corpora)", "not drawn: the runs with curves share one corpus "
                                f"({ref_corpus or 'unknown'}); it compares runs on different corpora"))
    else:
        skipped.append(Skip("Figs. 3 and 4", "no run with a loss or ARC curve among the inputs"))

    for table in ablation_tables(rows, baseline=base_row, reference=reference, skipped=skipped):
        report.tables[table.key] = table
    if "ablation" not in report.tables:
        skipped.append(Skip("ablation tables", "no eval results among the inputs"))
    report.tables["cost"] = cost_table(data.runs, data.benchmarks, skipped)
    report.tables["runs"] = _runs_table(data.runs)

    for key, table in report.tables.items():
        (out / f"table_{key}.md").write_text(f"## {table.title}\n\n{table.markdown()}\n\n"
                                             + "".join(f"- {n}\n" for n in table.notes))
    md = [f"# {title}", ""]
    md += [f"## {f.title}\n\n![{f.title}]({f.path.name})\n\n{f.caption}\n" for f in report.figures.values()]
    md += [f"## {t.title}\n\n{t.markdown()}\n\n" + "".join(f"- {n}\n" for n in t.notes) for t in report.tables.values()]
    md += ["## Skipped", ""] + [f"- {s.line()}" for s in skipped] + ([] if skipped else ["Nothing."])
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "report.json").write_text(json.dumps({
        "title": title, "baseline": base_row.label if base_row else None, "reference_tokenizer": reference,
        "runs": [{"label": r.label, "name": r.name, "path": str(r.path), "kind": r.kind, "tokenizer": r.tokenizer,
                  "corpus": r.corpus, "params": r.params, "tokens_per_step": r.tokens_per_step,
                  "anneal_start": r.anneal_start, "anneal_tokens": r.anneal_tokens} for r in data.runs],
        "figures": {k: {"path": f.path.name, "lines": f.lines, "anneal": f.anneal} for k, f in report.figures.items()},
        "tables": {k: t.to_json() for k, t in report.tables.items()},
        "skipped": [{"what": s.what, "why": s.why} for s in skipped]}, indent=2) + "\n")
    from .html import render_html

    report.html = out / "report.html"
    report.html.write_text(render_html(report))
    return report
