"""One self-contained HTML page: figures embedded as base64 PNG data URIs, tables as HTML, inline CSS; no
script, font, stylesheet or image is fetched, so it opens from a file with no network."""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .build import Report
    from .tables import Table

__all__ = ["render_html", "table_html"]

_CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1250px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
nav a { margin-right: 1em; } figure { margin: 0; } img { max-width: 100%; border: 1px solid #eee; }
figcaption, .notes { color: #555; font-size: .92em; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: .9em; margin: .6em 0; }
th, td { border: 1px solid #ddd; padding: .25em .55em; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
td.text { text-align: left; white-space: normal; min-width: 12em; }
ul.skipped li { margin: .15em 0; } code { background: #f4f4f4; padding: 0 .2em; }
"""


def table_html(table: "Table") -> str:
    """A `Table` as an HTML table (every cell escaped) with its notes."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
    body = []
    for row in table.rows:
        tds = []
        for cell in row:
            cls = ' class="text"' if cell.value is None and len(cell.text) > 40 else ""
            tds.append(f"<td{cls}>{html.escape(cell.text)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in table.notes)
    return (f'<div class="scroll"><table id="table-{html.escape(table.key)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>' + (f'<ul class="notes">{notes}</ul>' if notes else ""))


def render_html(report: "Report") -> str:
    """The whole page of ``report``."""
    parts = [f"<h1>{html.escape(report.title)}</h1>",
             f"<p>{len(report.runs)} run(s) and evaluated model(s); written by <code>biglm report</code>.</p>"]
    nav = [(f"fig-{k}", f.title) for k, f in report.figures.items()]
    nav += [(f"sec-{k}", t.title) for k, t in report.tables.items()] + [("skipped", "Skipped")]
    parts.append("<nav>" + "".join(f'<a href="#{i}">{html.escape(t)}</a>' for i, t in nav) + "</nav>")
    for key, fig in report.figures.items():
        data = base64.b64encode(fig.path.read_bytes()).decode("ascii")
        parts.append(f'<section id="fig-{key}"><h2>{html.escape(fig.title)}</h2><figure>'
                     f'<img alt="{html.escape(fig.title)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{html.escape(fig.caption)}</figcaption></figure></section>")
    for key, table in report.tables.items():
        parts.append(f'<section id="sec-{key}"><h2>{html.escape(table.title)}</h2>{table_html(table)}</section>')
    if report.skipped:
        items = "".join(f"<li><b>{html.escape(s.what)}</b>: {html.escape(s.why)}</li>" for s in report.skipped)
        parts.append(f'<section id="skipped"><h2>Skipped</h2><ul class="skipped">{items}</ul></section>')
    else:
        parts.append('<section id="skipped"><h2>Skipped</h2><p>Nothing: every input was read in full.</p></section>')
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(report.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(parts) + "\n</body></html>\n")
