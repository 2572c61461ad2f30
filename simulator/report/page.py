"""Assemble a self-contained HTML page and write it atomically.

The page must open offline and years later, so by default plotly.js is inlined once in the head
(about 4.8 MB) and every figure is a bare ``<div>`` plus a ``Plotly.newPlot`` call. Where many
reports are kept (a sweep's points, CI artifacts) ``plotlyjs`` can instead be ``cdn`` (a
``<script src>`` to plotly's CDN, pinned to the bundled version: the page then needs the network)
or ``directory`` (a ``plotly.min.js`` written once beside the report and loaded from there, so a
folder of reports shares one copy and still opens offline). Writing goes to a temporary file
beside the target and is renamed over it, so a reader never sees half a report.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from pathlib import Path
from typing import Literal

import plotly.io as pio
import plotly.offline

from servesim.atomic_io import atomic_write_text
from servesim.errors import ServesimError
from servesim.report.figures import Chart

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
PlotlyJs = Literal["inline", "cdn", "directory"]
PLOTLYJS_MODES: tuple[PlotlyJs, ...] = ("inline", "cdn", "directory")
PLOTLYJS_FILE = "plotly.min.js"

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       max-width: 1200px; margin: 0 auto; padding: 16px 24px 48px; line-height: 1.4; }
h1 { font-size: 1.5em; margin: 0.2em 0; } h2 { font-size: 1.15em; margin: 1.6em 0 0.2em; }
.sub { margin: 0.15em 0; color: #444; }
.banner { padding: 10px 14px; border-radius: 6px; font-weight: 600; margin: 12px 0; }
.banner.good { background: #e6f4ea; color: #1e6b34; } .banner.bad { background: #fce8e6; color: #a50e0e; }
.banner.neutral { background: #eef1f5; color: #333; }
ul.slos li.good { color: #1e6b34; } ul.slos li.bad { color: #a50e0e; }
.note, .caption { color: #666; font-size: 0.92em; }
ul.warnings { background: #fff8e1; border-left: 4px solid #f9a825; padding: 8px 8px 8px 28px; }
.tables { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e4e4e4; text-align: right; }
th:first-child, table.kv th { text-align: left; } tr:first-child th { border-bottom: 2px solid #bbb; }
table.kv tr:first-child th { border-bottom: 1px solid #e4e4e4; }
.with-aside { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.with-aside > .plot { flex: 3 1 560px; min-width: 0; } .with-aside > aside { flex: 2 1 320px; }
aside table td, aside table th { text-align: left; vertical-align: top; font-size: 0.9em; }
details { margin-top: 2em; } pre { background: #f6f8fa; padding: 12px; overflow-x: auto; font-size: 0.85em; }
footer { margin-top: 2em; color: #888; font-size: 0.85em; }
"""


def check_plotlyjs(mode: str) -> PlotlyJs:
    """``mode`` as a plotly.js mode, or a one-line error naming the choices."""
    for known in PLOTLYJS_MODES:
        if mode == known:
            return known
    raise ServesimError("--plotlyjs", f"unknown mode {mode!r}",
                        "use inline (self-contained, the default), cdn or directory")


def chart_html(chart: Chart) -> str:
    """One chart as a heading, a caption and a plotly div that uses the page's plotly.js (with
    its ``aside`` beside it, when it has one)."""
    if chart.figure is None:
        return (f'<section id="{chart.key}"><h2>{escape(chart.title)}</h2>'
                f'<p class="note">{escape(chart.caption)}</p></section>')
    div = pio.to_html(chart.figure, include_plotlyjs=False, full_html=False, config=PLOT_CONFIG,
                      default_width="100%", default_height=f"{chart.height}px", div_id=f"chart-{chart.key}")
    if chart.aside:
        div = f'<div class="with-aside"><div class="plot">{div}</div><aside>{chart.aside}</aside></div>'
    return (f'<section id="{chart.key}"><h2>{escape(chart.title)}</h2>'
            f'<p class="caption">{escape(chart.caption)}</p>{div}</section>')


def plotly_script(mode: PlotlyJs) -> str:
    """The page's one ``<script>`` that loads plotly.js."""
    if mode == "cdn":
        url = f"https://cdn.plot.ly/plotly-{plotly_js_version()}.min.js"
        return f'<script src="{url}" charset="utf-8"></script>'
    if mode == "directory":
        return f'<script src="{PLOTLYJS_FILE}" charset="utf-8"></script>'
    return f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'


def plotly_js_version() -> str:
    """The version of the plotly.js bundled with the installed plotly (what ``cdn`` loads)."""
    return str(plotly.offline.get_plotlyjs_version())


def render_page(title: str, header_html: str, charts: Iterable[Chart], config_text: str | None,
                footer: str, config_name: str = "config.resolved.yaml", plotlyjs: PlotlyJs = "inline") -> str:
    """The whole page: head with CSS and plotly.js, the verdict, the charts, the config."""
    if config_text is None:
        config_block = f'<p class="note">No {escape(config_name)} in the output folder.</p>'
    else:
        config_block = f"<pre>{escape(config_text)}</pre>"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{CSS}</style>",
        plotly_script(plotlyjs),
        "</head><body>",
        header_html,
        *(chart_html(c) for c in charts),
        f"<details><summary>Resolved configuration ({config_name})</summary>{config_block}</details>",
        f"<footer>{escape(footer)}</footer>",
        "</body></html>",
    ])


def write_page(target: Path, html: str, plotlyjs: PlotlyJs = "inline") -> Path:
    """Write ``html`` to ``target`` atomically; with ``directory``, put plotly.js beside it once."""
    if plotlyjs == "directory":
        beside = target.parent / PLOTLYJS_FILE
        if not beside.is_file() or beside.stat().st_size == 0:
            atomic_write_text(beside, plotly.offline.get_plotlyjs())
    atomic_write_text(target, html)
    return target
