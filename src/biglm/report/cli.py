"""`biglm report RUN_OR_EVAL... --out DIR [--baseline NAME]`

Figures (PNG) and tables (Markdown) from what runs wrote, gathered in one self-contained HTML page
(OUT/report.html: images embedded, no network needed):

- loss and ARC-E/ARC-C average against tokens, one line per run, the WSD annealing start marked
  (paper Fig. 3), and the same by training corpus when the runs cover several (Fig. 4);
- the ablation table in the layout of the paper's Tables 1, 2 and 8 from eval results (lm-eval's JSON,
  found under RUN/eval/ or given as files or folders), with the average, its difference to --baseline and
  standard errors, then every other task and metric found; a table of differences to the baseline;
- the cost table (Table 6): device-hours of the paper's final recipes and of each run's recipe from the
  measured tokens/s per device (a run's metrics or a benchmarks/bench_pretrain.py result, device named),
  the FLOP-based estimate at the measured MFU, and the paper's own GPU hours.

Inputs are run directories, eval result files or folders, and benchmark JSON files; NAME=PATH gives an
input its name. Whatever cannot be used (an empty directory, metrics cut off mid-line, a JSON file of
another tool, runs whose tokenizers differ) is listed with the reason on stderr and in the page's
Skipped section, and the rest is still reported. Exit code 0 when a page was written from at least one
input, 1 when no input could be used (the page then lists why), 2 for bad options.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ReportArgs:
    """The options of `biglm report`."""

    inputs: list[str]
    """run directories, eval result files or folders (lm-eval's JSON layout), benchmark JSON files; NAME=PATH names one"""
    out: Path = Path("report")
    """folder for report.html, report.md, report.json, the PNG figures and the Markdown tables"""
    baseline: str | None = None
    """the run the ablation table's differences are taken to (a run's name or folder name)"""
    title: str = "biglm report"
    """the page's title"""
    max_points: int = 500
    """at most this many points per training-loss line (long runs are averaged into bins)"""

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError("no inputs: give run directories, eval result files or benchmark files")
        if self.max_points < 10:
            raise ValueError(f"--max_points must be at least 10, got {self.max_points}")


def main(argv: list[str]) -> int:
    from ..config import parse_cli

    args = parse_cli(ReportArgs, argv, prog="biglm report", doc=__doc__, positionals=("inputs",))
    from .build import ReportError, build_report

    try:
        report = build_report(args.inputs, out=args.out, baseline=args.baseline, title=args.title,
                              max_points=args.max_points)
    except ReportError as e:
        print(f"biglm report: error: {e}", file=sys.stderr)
        return 2
    for s in report.skipped:
        print(f"biglm report: skipped {s.line()}", file=sys.stderr)
    made = [f.path.name for f in report.figures.values()] + [f"table_{k}.md" for k in report.tables]
    print(f"wrote {report.html} ({len(report.figures)} figure(s), {len(report.tables)} table(s): {', '.join(made)})")
    return 0 if report.runs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
