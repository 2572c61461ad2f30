"""``servesim plan-day``: a fixed fleet sized for the peak against autoscaled ones, over a day."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from servesim.atomic_io import atomic_write_text, make_output_dir
from servesim.cli.console import console
from servesim.resources import configs_dir, find_builtin

PLAN_FILES = ("day.json", "day.csv")


def plan_day_command(
    plan: Annotated[str, typer.Argument(help="Day plan YAML (or a built-in name, e.g. chat-day)")],
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a plan key, e.g. --set fixed.max_replicas=8 (repeatable)")] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder (default runs/day-<name>)")] = None,
    workers: Annotated[int, typer.Option(help="Processes for the whole-day runs")] = os.cpu_count() or 1,
    runs: Annotated[bool, typer.Option(help="Also write each whole-day run's folder (tables, report) "
                                             "under the output folder")] = False,
) -> None:
    """What fleet, scaled how, serves a day of traffic within the SLOs at the lowest cost."""
    from servesim.capacity.day import load_day_plan, plan_day
    from servesim.errors import at_least_one

    at_least_one("--workers", workers)
    path = find_builtin(plan, [configs_dir() / "plans"], "PLAN", "day plan")
    config, experiment, base_dir = load_day_plan(path, overrides)
    out_dir = out or Path("runs") / f"day-{config.name}"
    make_output_dir(out_dir)
    slo = experiment.slo.limits() if experiment.slo else {}
    limits = ", ".join(f"{k.removesuffix('_s').upper()} <= {v:g} s" for k, v in slo.items())
    hourly = config.slo.hourly_attainment
    console.print(f"[bold]{config.name}[/]: size group {config.group} of {experiment.model} for "
                  f"{escape(limits)}, attainment >= {config.slo.attainment:.1%}"
                  + (f" (every hour >= {hourly:.1%})" if hourly else ""))
    answer = plan_day(config, experiment, base_dir, workers, out_dir / "runs" if runs else None)
    write_answer(answer, out_dir)
    render(answer)
    console.print(f"wrote {out_dir}/ ({', '.join(PLAN_FILES)})")


def write_answer(answer: dict[str, Any], out_dir: Path) -> None:
    from servesim.capacity.day import day_rows
    from servesim.capacity.output import json_safe

    atomic_write_text(out_dir / "day.json", json.dumps(json_safe(answer), indent=2) + "\n")
    rows = day_rows(answer)
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    atomic_write_text(out_dir / "day.csv", buffer.getvalue())


def render(answer: dict[str, Any]) -> None:
    from servesim.capacity.day import day_rows

    window = answer["window"]
    searched = ", ".join(f"{w['replicas']}: {w['attainment']:.1%}" for w in answer["window_search"])
    console.print(f"busiest {window['end_s'] - window['judged_from_s']:g} s start at "
                  f"{window['judged_from_s'] / 3600:.2f} h; fixed replicas tried there (attainment): "
                  f"{searched}")
    if not answer["options"]:
        console.print(f"[bold red]no answer[/]: {escape(answer.get('why', ''))}")
        return
    table = Table(show_edge=False, box=None, pad_edge=False)
    names = ("option", "passes", "attainment", "worst hour", "replicas mean/peak", "GPU-hours", "cost",
             "TTFT p99")
    for name in names:
        table.add_column(name, justify="left" if name in ("option", "passes") else "right")
    for row in day_rows(answer):
        worst = row["worst_hour_attainment"]
        table.add_row(escape(row["option"]) + (" *" if row["chosen"] else ""),
                      "yes" if row["passed"] else "no",
                      f"{row['attainment']:.2%}", "-" if worst is None else f"{worst:.2%}",
                      f"{row['replicas_mean']:.2f} / {row['replicas_peak']}", f"{row['gpu_hours']:,.1f}",
                      "-" if row["cost_usd"] is None else f"${row['cost_usd']:,.2f}",
                      "-" if row["ttft_p99_s"] is None else f"{row['ttft_p99_s']:.2f} s")
    console.print(table)
    if answer.get("answer"):
        saving = answer.get("savings_vs_fixed")
        tail = f", {saving:.1%} cheaper than the fixed fleet" if saving else ""
        console.print(f"answer: [bold]{escape(answer['answer'])}[/]{tail}")
    else:
        console.print("[bold red]no option meets the SLOs over the day[/]")
