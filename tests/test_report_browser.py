"""The reports in a real browser: headless Chromium loads a run report (from a real simulation)
and a sweep report (synthetic results.parquet), and every chart must render with data, no
JavaScript error may reach the console, and a hover must show the point's values.

Needs Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium``,
``/usr/bin/chromedriver``; .ci/run installs them) and ``selenium`` (the ``dev`` extra); skipped
with the reason when one is missing. Full-page screenshots are saved for a human to look at, into
``$SERVESIM_ARTIFACTS`` or else ``tests/artifacts/`` (git-ignored); the path is printed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sweep_fixtures import fabricate_sweep

from servesim.report.sweep_report import write_sweep_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--window-size=1280,1000")
RUN_CHARTS = 9  # latency, TTFT/prompt, throughput, batch/KV, queue, step time, replicas, roofline, ops
SWEEP_CHARTS = 5  # knee, latency, two heatmaps, Pareto
CAPACITY_CHARTS = 2  # search curves, cost against latency


def _missing() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).is_file():
            return f"{path} not found: apt-get install {package}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[dev]'"
    return None


# Locally a missing browser skips the test; under CI (CI=true, where .ci/run installs it) it fails.
if _missing() is not None and os.environ.get("CI") == "true":
    raise RuntimeError(f"browser test cannot run in CI: {_missing()}")
pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def artifacts_dir() -> Path:
    folder = Path(os.environ.get("SERVESIM_ARTIFACTS") or Path(__file__).parent / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="servesim-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from servesim.config import load_experiment
    from servesim.pipeline import prepare, render, simulate
    from servesim.resources import configs_dir

    run_dir = tmp_path_factory.mktemp("run")
    config = load_experiment(configs_dir() / "quickstart.yaml", ["workload.num_requests=400"])
    render(simulate(prepare(config)), run_dir)
    return run_dir / "report.html"


FLEET_CHARTS = RUN_CHARTS + 3  # + replicas over time, cost and attainment per hour, turns


@pytest.fixture(scope="module")
def fleet_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An autoscaled fleet serving chat sessions under a load that steps up: the report's fleet and
    session charts."""
    from servesim.config import validate_document
    from servesim.pipeline import prepare, render, simulate

    run_dir = tmp_path_factory.mktemp("fleet")
    document = {
        "model": "llama-3-8b", "hardware": "h100-sxm-80gb", "engine": "vllm-v0",
        "deployment": {"kind": "fleet", "enable_prefix_caching": True, "groups": {"a": {
            "max_num_seqs": 8, "autoscaling": {"max_replicas": 3, "target": 6, "interval_s": 5,
                                               "cold_start": {"total_s": 10}}}}},
        "router": {"name": "least_outstanding"}, "slo": {"ttft_s": 1.0},
        "workload": {"arrival": {"process": "poisson", "rate": 4.0,
                                 "profile": {"points": [[0, 0.2], [60, 1.0]], "interpolate": "step"}},
                     "duration_s": 120, "sessions": {
                         "turns": {"dist": "uniform", "low": 1, "high": 3},
                         "user_tokens": {"dist": "fixed", "value": 200},
                         "output": {"dist": "fixed", "value": 80},
                         "think_time_s": {"dist": "fixed", "value": 2}}}}
    render(simulate(prepare(validate_document(document))), run_dir)
    return run_dir / "report.html"


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    fabricate_sweep(folder)
    return write_sweep_report(folder)


@pytest.fixture(scope="module")
def capacity_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_capacity import SERVICE_S, one_at_a_time

    from servesim.capacity import plan_capacity, validate_capacity
    from servesim.capacity.output import write_capacity
    from servesim.report.capacity_report import write_capacity_report

    doc = one_at_a_time("constant", 2 * SERVICE_S, 99, 300, 1, target_rate=2.5 / SERVICE_S)
    doc["candidates"] = {"hardware": ["h100-sxm-80gb"], "kind": ["colocated", "disaggregated"],
                         "splits": ["1:1", "3:1"]}
    answer = plan_capacity(validate_capacity(doc))
    folder = tmp_path_factory.mktemp("capacity")
    write_capacity(answer, folder)
    return write_capacity_report(folder, answer=answer)


PLOTS = """return Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
    id: el.id, traces: (el.data || []).length, svg: !!el.querySelector('svg.main-svg'),
    drawn: el.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .hm, canvas').length}))"""


def load(driver, page: Path, expected: int, timeout: float = 30.0) -> list[dict]:
    """Open ``page``, wait until ``expected`` plots are drawn, return what each one drew."""
    driver.get_log("browser")  # drop anything from an earlier page
    driver.get(page.resolve().as_uri())
    deadline = time.monotonic() + timeout
    plots: list[dict] = []
    while time.monotonic() < deadline:
        plots = driver.execute_script(PLOTS)
        if len(plots) >= expected and all(p["svg"] and p["drawn"] for p in plots):
            break
        time.sleep(0.25)
    return plots


def severe_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def screenshot(driver, name: str) -> Path:
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1280, min(int(height) + 40, 16_000))
    time.sleep(0.5)
    path = artifacts_dir() / name
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 1000)
    print(f"screenshot: {path}")
    return path


def hover_text(driver, div_id: str, curve: int = 0, point: int = 0) -> str:
    return driver.execute_script(
        "const el = document.getElementById(arguments[0]);"
        "Plotly.Fx.hover(el, [{curveNumber: arguments[1], pointNumber: arguments[2]}]);"
        "return el.querySelector('.hoverlayer').textContent;", div_id, curve, point)


def test_run_report_renders_in_chromium(browser, run_report: Path) -> None:
    plots = load(browser, run_report, RUN_CHARTS)
    assert severe_errors(browser) == []
    assert len(plots) == RUN_CHARTS, plots
    for plot in plots:
        assert plot["traces"] > 0 and plot["svg"] and plot["drawn"] > 0, plot
    assert {p["id"] for p in plots} >= {"chart-roofline", "chart-operators"}
    # The operator chart's first bar: GEMM seconds over all steps, with its share and steps.
    text = hover_text(browser, "chart-operators")
    assert "all steps" in text and "GEMMs" in text and "% of these steps' time" in text
    assert screenshot(browser, "run_report.png").stat().st_size > 50_000


def test_fleet_report_renders_in_chromium(browser, fleet_report: Path) -> None:
    plots = load(browser, fleet_report, FLEET_CHARTS)
    assert severe_errors(browser) == []
    assert len(plots) == FLEET_CHARTS, plots
    for plot in plots:
        assert plot["traces"] > 0 and plot["svg"] and plot["drawn"] > 0, plot
    assert {p["id"] for p in plots} >= {"chart-replicas", "chart-hourly", "chart-turns"}
    assert "replicas" in hover_text(browser, "chart-hourly", curve=1)
    assert screenshot(browser, "fleet_report.png").stat().st_size > 50_000


def test_sweep_report_renders_in_chromium(browser, sweep_report: Path) -> None:
    plots = load(browser, sweep_report, SWEEP_CHARTS)
    assert severe_errors(browser) == []
    assert len(plots) == SWEEP_CHARTS, plots
    for plot in plots:
        assert plot["traces"] > 0 and plot["svg"] and plot["drawn"] > 0, plot
    # Hovering a Pareto point names its full configuration and its numbers.
    text = hover_text(browser, "chart-pareto")
    for part in ("hardware = ", "deployment.tp = ", "workload.arrival.rate = ", "p99 TTFT", "req/s"):
        assert part in text, text
    assert screenshot(browser, "sweep_report.png").stat().st_size > 50_000


def test_capacity_report_renders_in_chromium(browser, capacity_report: Path) -> None:
    plots = load(browser, capacity_report, CAPACITY_CHARTS)
    assert severe_errors(browser) == []
    assert len(plots) == CAPACITY_CHARTS, plots
    for plot in plots:
        assert plot["traces"] > 0 and plot["svg"] and plot["drawn"] > 0, plot
    # The winner's search: hovering its first simulated rate names the step and the verdict.
    text = hover_text(browser, "chart-search")
    assert "req/s: p99 TTFT" in text and "step" in text and ("passed" in text or "failed" in text), text
    # Picking another candidate in the menu shows its traces.
    shown = browser.execute_script(
        "const el = document.getElementById('chart-search');"
        "const menu = el.layout.updatemenus[0].buttons[1];"
        "return Plotly.update(el, menu.args[0]).then(() => el.data.filter(t => t.visible === true).length);")
    assert shown >= 4
    text = hover_text(browser, "chart-cost")
    assert "$ per 1M output tokens" in text and "p99 TTFT" in text, text
    assert browser.execute_script("return document.querySelectorAll('aside table.why tr').length") == 4
    assert screenshot(browser, "capacity_report.png").stat().st_size > 50_000
