"""Reports (paper §5, Table 6, Figures 3-4): figures and tables from what runs wrote (`biglm report`).

    biglm report runs/136m runs/360m runs/360m-pile --baseline 136m --out report/

Reads pre-training run directories (metrics.jsonl, the saved configuration, eval results under RUN/eval),
lm-eval results files and benchmark results; writes PNG figures, Markdown tables and one self-contained
HTML page (`build_report`). Nothing else in biglm imports this package: it only reads files.
"""

from .build import Report, ReportError, build_report

__all__ = ["Report", "ReportError", "build_report"]
