"""The capacity report, the two-run comparison and the plotly.js modes, read back from the files
(the charts in Chromium are in test_report_browser.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from test_capacity import SERVICE_S, one_at_a_time
from typer.testing import CliRunner

from servesim.capacity import plan_capacity, validate_capacity
from servesim.capacity.output import write_capacity
from servesim.cli.app import app
from servesim.report.capacity_data import load_capacity, search_phases
from servesim.report.capacity_figures import cost_latency_chart, search_chart
from servesim.report.capacity_report import write_capacity_report
from servesim.report.compare_report import comparison_rows

runner = CliRunner()


@pytest.fixture(scope="module")
def capacity_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Colocated tp1 and a 3:1 disaggregated set on the D/D/1 workload, target 2.5/D."""
    doc = one_at_a_time("constant", 2 * SERVICE_S, 99, 300, 1, target_rate=2.5 / SERVICE_S,
                        prices={"h100-sxm-80gb": 2.0})
    doc["candidates"] = {"hardware": ["h100-sxm-80gb"], "tp": [1, 3], "kind": ["colocated", "disaggregated"],
                         "splits": ["3:1"]}
    answer = plan_capacity(validate_capacity(doc))
    folder = tmp_path_factory.mktemp("capacity")
    write_capacity(answer, folder)
    write_capacity_report(folder, answer=answer)
    return folder


def test_search_phases_name_the_guess_the_bracket_and_the_bisection() -> None:
    rates = [100, 50, 25, 12.5, 6.25, 8.84, 7.43, 6.81]
    assert search_phases([{"rate": r} for r in rates]) == [
        "first guess", "bracket", "bracket", "bracket", "bracket", "bisect", "bisect", "bisect"]


def test_report_ranks_prices_and_launches_the_winner(capacity_dir: Path) -> None:
    html = (capacity_dir / "report.html").read_text()
    answer = json.loads((capacity_dir / "capacity.json").read_text())
    winner = answer["candidates"][0]
    assert winner["candidate"] == "h100-sxm-80gb tp1 continuous" and winner["target"]["gpus"] == 3
    banner = re.search(r'<div class="banner good">(.*?)</div>', html).group(1)
    assert banner.startswith("Best: h100-sxm-80gb tp1 continuous: 3 GPUs serve")
    assert "$6.00/hour" in banner and "verified by simulating the whole fleet" in banner
    ranked = html[html.index('<table class="ranked">'):html.index("</table>", html.index('class="ranked"'))]
    assert ranked.count("<tr") == 1 + 4  # header + colocated tp1, tp3, disaggregated tp1, tp3
    assert "infeasible: candidates.tp: 3 does not divide" in ranked
    assert "$/1M tok fleet" in ranked and "$/1M tok @max" in ranked
    assert '<section class="launch" id="launch">' in html and "vllm serve meta-llama/Meta-Llama-3-8B" in html
    assert "--tensor-parallel-size 1" in html and "sglang.launch_server" in html


def test_search_chart_holds_every_simulated_rate_and_the_slo(capacity_dir: Path) -> None:
    data = load_capacity(capacity_dir)
    chart = search_chart(data)
    assert chart.figure is not None
    for k, record in enumerate(data.searched):
        ttft = [t for t in chart.figure.data if t.name == record["candidate"] and t.yaxis == "y"]
        assert len(ttft) == 1 and len(ttft[0].x) == len(record["search"]["evaluations"])
        assert ttft[0].visible is (k == 0)
        limit = 2 * SERVICE_S
        assert list(ttft[0].x) == sorted(e["rate"] for e in record["search"]["evaluations"])
        passed = [e for e in record["search"]["evaluations"] if e["passed"]]
        assert max(e["rate"] for e in passed) == record["search"]["max_rate"]
        assert all(e["metrics"]["p99_ttft_s"] <= limit for e in passed)
        # a probe stopped once its failure was certain shows its bound as a bound
        stopped = sorted(e["rate"] for e in record["search"]["evaluations"] if "stopped_early" in e)
        bounded = [x for x, row in zip(ttft[0].x, ttft[0].customdata, strict=True) if row[3].startswith("≥")]
        assert bounded == stopped and (stopped or k > 0)
    hline = [s for s in chart.figure.layout.shapes if s.yref == "y"]
    assert hline and hline[0].y0 == pytest.approx(2 * SERVICE_S)
    labels = [b["label"] for b in chart.figure.layout.updatemenus[0].buttons]
    assert labels == ["1. h100-sxm-80gb tp1 continuous", "2. h100-sxm-80gb tp1 disagg 3:1 continuous"]


def test_cost_chart_frontier_and_why_table(capacity_dir: Path) -> None:
    data = load_capacity(capacity_dir)
    chart = cost_latency_chart(data)
    assert chart.figure is not None and "<table class=\"why\">" in chart.aside
    points = chart.figure.data[0]
    for record, x in zip(data.searched, points.x, strict=True):
        usd = record["target"]["gpus"] * 2.0
        assert x == pytest.approx(usd / (2.5 / SERVICE_S * 3600) * 1e6)
    assert chart.aside.count("<tr>") == 1 + len(data.candidates)
    assert "infeasible" in chart.aside


def test_report_command_rebuilds_the_same_page(capacity_dir: Path, tmp_path: Path) -> None:
    rebuilt = tmp_path / "again.html"
    result = runner.invoke(app, ["report", str(capacity_dir), "--out", str(rebuilt)])
    assert result.exit_code == 0, result.output
    assert rebuilt.read_text() == (capacity_dir / "report.html").read_text()


def test_plotlyjs_modes(capacity_dir: Path, tmp_path: Path) -> None:
    """inline embeds the 4.8 MB bundle; cdn links the bundled version; directory writes it once
    beside the page."""
    inline = (capacity_dir / "report.html").stat().st_size
    assert inline > 4_000_000
    cdn = tmp_path / "cdn.html"
    done = runner.invoke(app, ["report", str(capacity_dir), "--out", str(cdn), "--plotlyjs", "cdn"])
    assert done.exit_code == 0
    text = cdn.read_text()
    assert cdn.stat().st_size < 200_000 and re.search(r'src="https://cdn\.plot\.ly/plotly-\d+\.\d+\.\d+\.min\.js"',
                                                      text)
    folder = tmp_path / "shared"
    folder.mkdir()
    for name in ("a.html", "b.html"):
        out = folder / name
        assert runner.invoke(app, ["report", str(capacity_dir), "--out", str(out), "--plotlyjs",
                                   "directory"]).exit_code == 0
        assert '<script src="plotly.min.js"' in out.read_text()
    assert (folder / "plotly.min.js").stat().st_size > 4_000_000
    bad = runner.invoke(app, ["report", str(capacity_dir), "--plotlyjs", "online"])
    assert bad.exit_code != 0


def summary(**values: Any) -> dict[str, Any]:
    return {"ttft_s": {"p50": values.get("ttft", 1.0), "p90": 2.0, "p99": 4.0},
            "throughput": {"requests_per_s": values.get("rps", 10.0), "output_tokens_per_s": 100.0},
            "slo_attainment": values.get("att", 0.9), "preemptions": values.get("pre", 0)}


def test_comparison_rows_by_hand() -> None:
    """B halves TTFT p50 (better, -50%), raises throughput 10 -> 12 (+20%, better), lowers
    attainment 0.9 -> 0.81 (-10%, worse); unchanged numbers are neither."""
    rows = {r["label"]: r for r in comparison_rows(summary(), summary(ttft=0.5, rps=12.0, att=0.81))}
    assert rows["TTFT p50"]["change"] == pytest.approx(-0.5) and rows["TTFT p50"]["better"] is True
    assert rows["requests/s"]["change"] == pytest.approx(0.2) and rows["requests/s"]["better"] is True
    assert rows["SLO attainment"]["change"] == pytest.approx(-0.1)
    assert rows["SLO attainment"]["better"] is False
    assert rows["TTFT p99"]["better"] is None and rows["preemptions"]["better"] is None
    assert math.isnan(rows["preemptions"]["change"])
    assert "TPOT p50" not in rows  # absent from both summaries


def test_report_of_two_runs_compares_them(tmp_path: Path) -> None:
    from servesim.config import load_experiment
    from servesim.pipeline import prepare, render, simulate
    from servesim.resources import configs_dir

    for name, policy in (("a", "continuous"), ("b", "chunked_prefill")):
        config = load_experiment(configs_dir() / "quickstart.yaml",
                                 ["workload.num_requests=200", f"policy.name={policy}", "engine=vllm-v0"])
        render(simulate(prepare(config)), tmp_path / name, report=False)
    result = runner.invoke(app, ["report", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "a" / "compare-b.html").read_text()
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    row = re.search(r"<tr><th>TTFT p99</th><td>(.*?)</td><td>(.*?)</td><td[^>]*>(.*?)</td></tr>", html)
    assert row is not None
    assert row.group(1) == f"{a['ttft_s']['p99']:#.3g} s".replace(". s", " s")
    change = (b["ttft_s"]["p99"] - a["ttft_s"]["p99"]) / a["ttft_s"]["p99"]
    assert row.group(3) == f"{change:+.1%}"
    assert "chart-latency" in html and "policy chunked_prefill" in html
    wrong = runner.invoke(app, ["report", str(tmp_path / "a"), str(tmp_path)])
    assert wrong.exit_code != 0
