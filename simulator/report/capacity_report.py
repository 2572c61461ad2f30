"""The HTML report of ``servesim capacity``: the answer first, then why.

Top: the question (model, SLOs, target rate or GPU budget) and a banner naming the winner with
its fleet and price; the ranked candidates with cost and headroom; the winner's launch commands.
Then the charts (:mod:`servesim.report.capacity_figures`): each candidate's search curve, and cost
against latency with the Pareto frontier beside the table of why the losers lose.

Usable from the CLI (``servesim capacity`` writes it; ``servesim report CAPACITY_DIR`` rebuilds it
from ``capacity.json`` alone) and from a notebook::

    from servesim.report.capacity_report import write_capacity_report
    write_capacity_report(Path("runs/capacity-llama3-8b-chat"))
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path
from typing import Any

from servesim.capacity.output import json_safe
from servesim.report.capacity_data import CapacityData, load_capacity
from servesim.report.capacity_figures import build_capacity_charts
from servesim.report.format import fmt_sig
from servesim.report.page import PlotlyJs, render_page, write_page

REPORT_FILE = "report.html"

CAPACITY_CSS = """<style>
.scroll { overflow-x: auto; }
table.ranked { font-size: 0.92em; } table.ranked td { white-space: nowrap; }
table.ranked th { vertical-align: bottom; } table.ranked td.name { white-space: normal; min-width: 12em; }
table.ranked td.name, table.ranked td.left { text-align: left; }
table.ranked tr.winner td { font-weight: 600; background: #f3f9f4; }
td.good { color: #1e6b34; } td.bad { color: #a50e0e; }
.launch pre { white-space: pre; }
</style>"""


def _money(value: Any, digits: int = 2) -> str:
    return "–" if not isinstance(value, int | float) or not math.isfinite(value) else f"${value:,.{digits}f}"


def _rate(value: Any) -> str:
    return "–" if not isinstance(value, int | float) else fmt_sig(value)


def _question(data: CapacityData) -> str:
    a = data.answer
    if data.mode == "target":
        goal = f"the fewest GPUs for {a['target_rate']:g} requests/s"
    elif data.mode == "budget":
        goal = f"the highest rate on {a['gpu_budget']} GPUs"
    else:
        goal = "each candidate's highest rate and its price per token"
    search = a.get("search") or {}
    return (f"<p class=\"sub\">{escape(str(a.get('model')))}: SLO {escape(data.slo.get('description', ''))}; "
            f"{escape(goal)}. Each rate: {search.get('replications')} replication(s) x "
            f"{search.get('requests_per_run')} requests, precision {float(search.get('precision', 0)):.0%}, "
            f"router {escape(str(a.get('router')))}.</p>")


def _banner(data: CapacityData) -> str:
    rows = data.rows()
    best = rows[0] if rows else None
    if best is None or not best["feasible"] or not best["max_rate"]:
        return '<div class="banner bad">No candidate meets the SLOs at any rate searched.</div>'
    price = ""
    if best["usd_per_hour"] is not None:
        fleet = _money(best["usd_per_1m_output_tokens_fleet"], 3)
        at_max = _money(best["usd_per_1m_output_tokens_at_max_rate"], 3)
        price = (f" for {_money(best['usd_per_hour'])}/hour ({fleet} per 1M output tokens at the fleet's "
                 f"rate, {at_max} for one replica set at its own highest rate)")
    a = data.answer
    if data.mode == "target":
        what = f"{best['gpus']} GPUs serve {a['target_rate']:g} req/s"
    elif data.mode == "budget":
        what = f"{best['gpus']} of {a['gpu_budget']} GPUs serve {_rate(best['fleet_rate'])} req/s"
    else:
        what = f"one replica set ({best['gpus']} GPUs) sustains {_rate(best['max_rate'])} req/s"
    verified = best["verified"]
    css = "good" if verified in (True, None) else "bad"
    check = {True: ", verified by simulating the whole fleet", False: ", NOT verified: the fleet run missed "
             "the SLOs", None: ""}[verified]
    return (f'<div class="banner {css}">Best: {escape(best["candidate"])}: {escape(what)}{escape(price)}'
            f"{escape(check)}.</div>")


def _margins(record: dict[str, Any]) -> str:
    margins = ((record.get("knee") or {}).get("passing") or {}).get("margins") or {}
    return ", ".join(f"{k.removesuffix('_s').upper()} {v:+.0%}" for k, v in margins.items()) or "–"


def _ranked_table(data: CapacityData) -> str:
    mode = data.mode
    fleet_head = {"target": "$/1M tok fleet", "budget": "$/1M tok fleet", "rate": "$/1M tok @max"}[mode]
    head = ["#", "candidate", "GPUs", "max rate/set"]
    if mode == "budget":
        head.append("fleet rate")
    head += ["$/hour", fleet_head]
    if mode != "rate":
        head.append("$/1M tok @max")
    head += ["headroom", "breaks first", "bound", "KV peak"]
    if mode != "rate":
        head.append("verified")
    body = []
    for i, (record, row) in enumerate(zip(data.candidates, data.rows(), strict=True)):
        css = ' class="winner"' if i == 0 and row["feasible"] and row["max_rate"] else ""
        name = escape(row["candidate"]) + (" *" if row["on_frontier"] else "")
        if not row["feasible"]:
            reason = escape(str(record.get("infeasible_reason", "")))
            body.append(f'<tr><td>{row["rank"]}</td><td class="name">{name}</td>'
                        f'<td class="left bad" colspan="{len(head) - 2}">infeasible: {reason}</td></tr>')
            continue
        cells = [str(row["rank"]), name, str(row["gpus"] if row["gpus"] is not None else "–"),
                 _rate(row["max_rate"])]
        if mode == "budget":
            cells.append(_rate(row["fleet_rate"]))
        cells += [_money(row["usd_per_hour"]), _money(row["usd_per_1m_output_tokens_fleet"], 3)]
        if mode != "rate":
            cells.append(_money(row["usd_per_1m_output_tokens_at_max_rate"], 3))
        peak = row["peak_kv_use"]
        cells += [_margins(record), escape(row["breaks_first"] or "–"), escape(row["step_bound"] or "–"),
                  f"{peak:.0%}" if isinstance(peak, int | float) else "–"]
        if mode != "rate":
            cells.append("yes" if row["verified"] else "no")
        tds = "".join(f'<td class="name">{c}</td>' if j == 1 else f"<td>{c}</td>"
                      for j, c in enumerate(cells))
        body.append(f"<tr{css}>{tds}</tr>")
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    return ('<h2>Ranked candidates</h2><p class="note">max rate/set: the highest arrival rate one replica '
            "set sustains within the SLOs (the search's answer). Two prices per output token, never to be "
            "confused: <b>fleet</b>, the fleet's $/hour over the output tokens of the rate it serves, and "
            "<b>@max</b>, one replica set at its own max rate (the cheapest a token gets on that candidate). "
            "Headroom: each SLO's margin at the max rate. * on the cost-rate Pareto frontier.</p>"
            f'<div class="scroll"><table class="ranked"><tr>{ths}</tr>{"".join(body)}</table></div>')


def _launch(data: CapacityData) -> str:
    launch = data.answer.get("launch")
    if not launch:
        return ""
    blocks = []
    for family, label in (("vllm", "vLLM"), ("sglang", "SGLang")):
        if family in launch:
            blocks.append(f"<h3>{label}</h3><pre>{escape(launch[family]['text'])}</pre>")
    return (f'<section class="launch" id="launch"><h2>Launch the winner as simulated</h2><p class="note">'
            f"{escape(launch['candidate'])}, {launch['replica_sets']} replica set(s): the engine arguments "
            "the simulation ran with, as each engine's flags (also in launch-vllm.sh, launch-sglang.sh and "
            "launch-trtllm.sh). "
            f"Notes say what no flag expresses.</p>{''.join(blocks)}</section>")


def _warnings(data: CapacityData) -> str:
    items = [f"<li>{escape(r['candidate'])}: {escape(w)}</li>" for r in data.candidates
             for w in r.get("warnings", [])]
    return f'<ul class="warnings">{"".join(items)}</ul>' if items else ""


def render_header(data: CapacityData) -> str:
    return (f'<header><h1>servesim capacity report</h1>{_question(data)}</header>'
            f'<section class="verdict" id="verdict">{_banner(data)}{_warnings(data)}{_ranked_table(data)}'
            f"</section>{_launch(data)}")


def render_capacity_report(data: CapacityData, plotlyjs: PlotlyJs = "inline") -> str:
    config = data.answer.get("config")
    config_text = json.dumps(config, indent=2) if config is not None else None
    return render_page(f"servesim capacity: {data.answer.get('name', data.folder.name)}",
                       CAPACITY_CSS + render_header(data), build_capacity_charts(data), config_text,
                       footer=f"servesim capacity report for {data.folder.resolve()}",
                       config_name="the capacity config, defaults filled in", plotlyjs=plotlyjs)


def write_capacity_report(folder: Path, out: Path | None = None, answer: dict[str, Any] | None = None,
                          plotlyjs: PlotlyJs = "inline") -> Path:
    """Write ``folder/report.html`` (or ``out``) from ``answer`` (in memory) or ``capacity.json``."""
    folder = Path(folder)
    if answer is not None:  # the JSON's view of it: infinities as null, tuples as lists
        data = CapacityData(folder, json.loads(json.dumps(json_safe(answer))))
    else:
        data = load_capacity(folder)
    target = Path(out) if out is not None else folder / REPORT_FILE
    return write_page(target, render_capacity_report(data, plotlyjs), plotlyjs)
