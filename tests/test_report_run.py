"""The run report: its numeric helpers, checked by hand, and the HTML it writes from a run directory.

The engine is not needed: ``fabricate_run`` writes a run directory with the engine's exact schemas
from a small synthetic M/M/1-like process (Poisson arrivals, Lindley-recursion queueing, a step
timeline whose durations grow with the tokens processed).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.offline
import pytest

from servesim.errors import ServesimError
from servesim.metrics.stats import weighted_percentile
from servesim.report import write_run_report
from servesim.report.balance_figures import replica_balance, replica_chart, ttft_prompt_chart
from servesim.report.format import METRICS
from servesim.report.run_data import RunData, load_run
from servesim.report.run_report import build_run_charts
from servesim.report.series import (
    bin_edges,
    bin_max,
    event_rate,
    hold_durations,
    interval_covered_mean,
    interval_integral,
    interval_mean,
    interval_rate,
    nice_width,
    thin_cdf,
    weighted_cdf,
)
from servesim.report.verdict import SloCheck

NUM_CHARTS = 9
LATENCY_KEYS = ("ttft_s", "tpot_s", "e2e_s", "queueing_s")

# ---------------------------------------------------------------- fabricated run directory


def _stats(values: np.ndarray) -> dict[str, float]:
    v = values[np.isfinite(values)]
    if not v.size:
        return dict.fromkeys(("mean", "p50", "p90", "p95", "p99", "max"), float("nan"))
    p50, p90, p95, p99 = np.percentile(v, [50, 90, 95, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p95": float(p95),
            "p99": float(p99), "max": float(v.max())}


def _weighted_stats(values: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """Independent of the code under test: a plain sort and cumulative sum."""
    order = np.argsort(values)
    v, c = values[order], counts[order].astype(float)
    cum = np.cumsum(c) / c.sum()

    def pct(q: float) -> float:
        return float(v[np.searchsorted(cum, q / 100)])

    return {"mean": float((v * c).sum() / c.sum()), "p50": pct(50), "p90": pct(90), "p95": pct(95),
            "p99": pct(99), "max": float(v.max())}


def _fabricate_requests(rng: np.random.Generator, n: int, rate: float, replicas: int) -> pd.DataFrame:
    inter = rng.exponential(1 / rate, n)
    arrival = np.cumsum(inter)
    prompt = rng.integers(16, 2048, n)
    output = rng.integers(1, 400, n)
    output[::97] = 1  # some one-token outputs: TPOT is undefined for them
    service = 0.02 + prompt * 4e-5
    # Lindley recursion W_n = max(0, W_{n-1} + S_{n-1} - A_n), vectorised as C_n - min_{k<=n} C_k.
    c = np.concatenate([[0.0], np.cumsum(service[:-1] - inter[1:])])
    wait = c - np.minimum.accumulate(c)
    first_scheduled = arrival + wait
    first_token = first_scheduled + service
    tpot_true = rng.gamma(8.0, 0.004, n)
    finish = first_token + tpot_true * (output - 1)
    status = np.full(n, "completed", dtype=object)
    reason = np.full(n, "", dtype=object)
    rejected = rng.random(n) < 0.02
    status[rejected] = "rejected"
    reason[rejected] = "prompt_too_long"
    unfinished = np.zeros(n, dtype=bool)
    unfinished[-3:] = ~rejected[-3:]
    status[unfinished] = "unfinished"
    first_scheduled[rejected] = np.nan
    first_token[rejected] = np.nan
    finish[rejected | unfinished] = np.nan
    one_token = output == 1
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(one_token, np.nan, (finish - first_token) / (output - 1))
    max_itl = np.where(one_token | ~np.isfinite(finish), np.nan, tpot_true * rng.uniform(1.0, 3.0, n))
    return pd.DataFrame({
        "request_id": np.arange(n, dtype=np.int64), "replica": np.arange(n, dtype=np.int64) % replicas,
        "arrival_s": arrival, "prompt_tokens": prompt.astype(np.int64),
        "output_tokens": output.astype(np.int64), "priority": np.zeros(n, dtype=np.int64),
        "status": status.astype(str), "reject_reason": reason.astype(str),
        "first_scheduled_s": first_scheduled, "first_token_s": first_token, "finish_s": finish,
        "preemptions": (rng.random(n) < 0.01).astype(np.int64), "queueing_s": first_scheduled - arrival,
        "ttft_s": first_token - arrival, "tpot_s": tpot, "max_itl_s": max_itl, "e2e_s": finish - arrival,
    })


def _fabricate_steps(rng: np.random.Generator, n_steps: int, replicas: int, horizon: float) -> pd.DataFrame:
    frames = []
    per_replica = n_steps // replicas
    for replica in range(replicas):
        m = per_replica
        walk = np.abs(np.cumsum(rng.normal(0, 3, m)))  # a slowly varying load level
        num_decodes = np.clip(walk, 0, 256).astype(np.int64)
        num_prefills = rng.poisson(0.4, m)
        prefill_tokens = num_prefills * rng.integers(16, 2048, m)
        duration = 0.006 + 4e-5 * prefill_tokens + 5e-5 * num_decodes
        idle = np.where(rng.random(m) < 0.05, rng.exponential(0.05, m), 0.0)
        if duration.sum() >= horizon:  # busy all along: squeeze the steps, no idle time
            duration, idle = duration * horizon / duration.sum(), np.zeros(m)
        else:  # spread the spare time over the idle gaps
            idle = idle * (horizon - duration.sum()) / max(idle.sum(), 1e-9)
        start = np.concatenate([[0.0], np.cumsum(duration + idle)[:-1]])
        kv_total = 4000
        kv_used = np.minimum(kv_total, num_decodes * 14 + prefill_tokens // 16)
        bound = np.where(prefill_tokens > 512, "compute", np.where(num_decodes + num_prefills < 4, "overhead",
                                                                      "memory"))
        # A Llama-3-8B-like anatomy: 2 x 8e9 FLOPs per token, the 16 GB of weights read every step;
        # the time split into operator classes in fixed shares that add up to the duration.
        tokens = prefill_tokens + num_decodes
        ops = {"op_gemm_s": 0.6 * duration,
               "op_attn_prefill_s": np.where(num_prefills > 0, 0.1, 0.0) * duration,
               "op_attn_decode_s": np.where(num_prefills > 0, 0.0, 0.1) * duration,
               "op_elementwise_s": 0.1 * duration, "op_communication_s": 0.0 * duration,
               "op_overhead_s": 0.2 * duration}
        frames.append(pd.DataFrame({
            "replica": np.full(m, replica, dtype=np.int64), "step": np.arange(m, dtype=np.int64),
            "start_s": start, "duration_s": duration, "num_prefills": num_prefills.astype(np.int64),
            "num_decodes": num_decodes, "prefill_tokens": prefill_tokens.astype(np.int64),
            "decode_tokens": num_decodes, "batch_size": num_prefills + num_decodes,
            "kv_blocks_used": kv_used.astype(np.int64),
            "kv_blocks_total": np.full(m, kv_total, dtype=np.int64),
            "waiting": np.clip(walk - 200, 0, None).astype(np.int64), "running": num_prefills + num_decodes,
            "preempted": (kv_used >= kv_total).astype(np.int64) * rng.poisson(1.0, m), "bound": bound,
            "flops": 1.6e10 * tokens, "hbm_bytes": 1.6e10 + 1e5 * tokens, **ops,
        }))
    return pd.concat(frames, ignore_index=True)


def fabricate_run(run_dir: Path, *, n_requests: int = 3000, n_steps: int = 6000, replicas: int = 1,
                  slos: dict[str, float] | None = None, rate: float = 20.0, seed: int = 0) -> dict:
    """Write a run directory with the engine's schemas; return the summary it wrote."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    req = _fabricate_requests(rng, n_requests, rate, replicas)
    duration_s = float(np.nanmax(req["finish_s"]))
    steps = _fabricate_steps(rng, n_steps, replicas, duration_s)
    decode = steps[steps["decode_tokens"] > 0]
    itl_value, inverse = np.unique(np.round(decode["duration_s"].to_numpy(), 5), return_inverse=True)
    itl_count = np.bincount(inverse, weights=decode["decode_tokens"].to_numpy()).astype(np.int64)
    itl = pd.DataFrame({"itl_s": itl_value, "count": itl_count})
    completed = req["status"] == "completed"
    met = completed.to_numpy().copy()
    for key, limit in (slos or {}).items():
        column = "max_itl_s" if key == "itl_s" else key
        met &= ~(req[column].to_numpy() > limit)
    tokens = req.loc[completed, ["prompt_tokens", "output_tokens"]].sum().sum()
    summary = {
        **{k: _stats(req[k].to_numpy()) for k in LATENCY_KEYS},
        "itl_s": _weighted_stats(itl_value, itl_count),
        "throughput": {"requests_per_s": completed.sum() / duration_s,
                       "output_tokens_per_s": req.loc[completed, "output_tokens"].sum() / duration_s,
                       "total_tokens_per_s": tokens / duration_s},
        "completed": int(completed.sum()), "rejected": int((req["status"] == "rejected").sum()),
        "preemptions": int(req["preemptions"].sum()),
        "slo_attainment": float(met.mean()) if slos else None,
        "goodput_requests_per_s": float(met.sum() / duration_s) if slos else None,
        "slos": slos, "duration_s": duration_s, "num_requests": n_requests, "offered_rate": rate,
        "deployment": {"model": "llama-3-8b", "hardware": "h100-sxm-80gb", "tp": 1, "replicas": replicas,
                       "policy": "continuous", "precision": "bf16"},
        "kv": {"blocks_total": 4000, "block_size": 16, "peak_blocks_used": int(steps["kv_blocks_used"].max()),
               "mean_utilization": float(steps["kv_blocks_used"].mean() / 4000)},
    }
    req.to_parquet(run_dir / "requests.parquet", index=False)
    steps.to_parquet(run_dir / "steps.parquet", index=False)
    itl.to_parquet(run_dir / "itl.parquet", index=False)
    (run_dir / "summary.json").write_text(json.dumps(summary, default=float), encoding="utf-8")
    (run_dir / "config.resolved.yaml").write_text(
        "model: llama-3-8b\nhardware: h100-sxm-80gb\nnote: <b>escaped & shown</b>\n", encoding="utf-8")
    return summary


# ---------------------------------------------------------------- helpers on hand-checked data


def test_weighted_cdf_by_hand() -> None:
    x, cdf = weighted_cdf(np.array([3.0, 1.0, 2.0]), np.array([2, 1, 1]))
    np.testing.assert_array_equal(x, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(cdf, [0.25, 0.5, 1.0])


def test_weighted_cdf_merges_duplicates_and_drops_nan() -> None:
    x, cdf = weighted_cdf(np.array([2.0, np.nan, 2.0, 5.0]), np.array([1, 7, 1, 2]))
    np.testing.assert_array_equal(x, [2.0, 5.0])
    np.testing.assert_allclose(cdf, [0.5, 1.0])


def test_weighted_cdf_equals_cdf_of_expanded_sample() -> None:
    rng = np.random.default_rng(1)
    values = np.round(rng.gamma(2.0, 0.01, 300), 4)
    counts = rng.integers(1, 50, 300)
    expanded = np.sort(np.repeat(values, counts))
    x, cdf = weighted_cdf(values, counts)
    np.testing.assert_allclose(cdf, np.searchsorted(expanded, x, side="right") / expanded.size)


def test_weighted_percentile_by_hand() -> None:
    values, counts = np.array([1.0, 2.0, 3.0]), np.array([1, 1, 2])  # expanded: 1 2 3 3
    assert weighted_percentile(values, counts, 25, method="inverted_cdf") == 1.0
    assert weighted_percentile(values, counts, 50, method="inverted_cdf") == 2.0
    assert weighted_percentile(values, counts, 50.1, method="inverted_cdf") == 3.0
    assert weighted_percentile(values, counts, 100, method="inverted_cdf") == 3.0
    # linear: rank q (N - 1) / 100 over 1 2 3 3 -> p50 at rank 1.5 = 2.5, p25 at rank 0.75 = 1.75
    assert weighted_percentile(values, counts, 50) == pytest.approx(2.5)
    assert weighted_percentile(values, counts, 25) == pytest.approx(1.75)
    assert weighted_percentile(values, counts, 0) == 1.0 and weighted_percentile(values, counts, 100) == 3.0
    assert np.isnan(weighted_percentile(np.array([np.nan]), None, 50))
    with pytest.raises(ValueError, match="method"):
        weighted_percentile(values, counts, 50, method="nearest")


@pytest.mark.parametrize("method", ["linear", "inverted_cdf"])
def test_weighted_percentile_equals_numpy_on_the_expanded_sample(method: str) -> None:
    rng = np.random.default_rng(2)
    values = np.round(rng.exponential(1.0, 200), 2)  # rounding makes duplicate values
    counts = rng.integers(1, 20, 200)
    q = np.array([0, 1, 10, 33.3, 50, 90, 99, 99.9, 100])
    np.testing.assert_allclose(weighted_percentile(values, counts, q, method=method),
                               np.percentile(np.repeat(values, counts), q, method=method), rtol=1e-12)


def test_thin_cdf_keeps_the_extremes_and_the_tail() -> None:
    x, cdf = weighted_cdf(np.arange(100_000, dtype=float))
    tx, tcdf = thin_cdf(x, cdf, max_points=2000)
    assert tx.size <= 2000
    assert tx[0] == 0.0 and tx[-1] == 99_999.0
    assert np.all(np.diff(tx) > 0) and np.all(np.diff(tcdf) > 0)
    assert (tcdf > 0.999).sum() >= 50  # the last 0.1% (100 values) is still drawn in detail
    assert thin_cdf(x[:10], cdf[:10], max_points=2000)[0].size == 10


def test_bin_edges_use_round_widths() -> None:
    assert nice_width(0.0037) == pytest.approx(0.005)
    assert nice_width(0.2) == pytest.approx(0.2)
    assert nice_width(2.2) == pytest.approx(2.5)
    edges = bin_edges(0.0, 10.0, max_bins=4)
    np.testing.assert_allclose(edges, [0.0, 2.5, 5.0, 7.5, 10.0])
    edges = bin_edges(0.0, 1234.5, max_bins=2000)
    assert edges.size - 1 <= 2000 and edges[-1] >= 1234.5


def test_interval_integral_splits_a_step_across_bins() -> None:
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    # step A: [0.5, 1.5) value 4; step B: [1.5, 1.75) value 8 -> bin0 2.0, bin1 2.0 + 2.0, bin2 0.
    integral = interval_integral(np.array([0.5, 1.5]), np.array([1.0, 0.25]), np.array([4.0, 8.0]), edges)
    np.testing.assert_allclose(integral, [2.0, 4.0, 0.0])
    np.testing.assert_allclose(interval_mean(np.array([0.5]), np.array([1.0]), np.array([4.0]), edges),
                               [2.0, 2.0, 0.0])


def test_interval_mean_adds_overlapping_replicas() -> None:
    edges = np.array([0.0, 2.0])
    mean = interval_mean(np.array([0.0, 1.0]), np.array([2.0, 1.0]), np.array([3.0, 5.0]), edges)
    np.testing.assert_allclose(mean, [(3 * 2 + 5 * 1) / 2])


def test_interval_covered_mean_ignores_idle_time() -> None:
    edges = np.array([0.0, 1.0, 2.0])
    mean = interval_covered_mean(np.array([0.0, 0.5]), np.array([0.25, 0.25]), np.array([10.0, 30.0]), edges)
    np.testing.assert_allclose(mean[0], 20.0)
    assert np.isnan(mean[1])


def test_interval_rate_conserves_tokens() -> None:
    edges = np.array([0.0, 0.5, 1.0])
    # 100 tokens over [0.25, 0.75): 50 in each half-second bin -> 100 tokens/s; plus 10 at t=0.9 instantly.
    rate = interval_rate(np.array([0.25, 0.9]), np.array([0.5, 0.0]), np.array([100.0, 10.0]), edges)
    np.testing.assert_allclose(rate, [100.0, 120.0])


def test_event_rate_and_bin_max_by_hand() -> None:
    edges = np.array([0.0, 1.0, 2.0, 4.0])
    np.testing.assert_allclose(event_rate(np.array([0.1, 0.2, 1.5, np.nan, 3.0]), edges), [2.0, 1.0, 0.5])
    np.testing.assert_allclose(event_rate(np.array([0.1, 0.2]), edges, np.array([3.0, 4.0])), [7.0, 0.0, 0.0])
    peak = bin_max(np.array([0.1, 0.9, 2.5, 4.0]), np.array([3.0, 7.0, 1.0, 9.0]), edges)
    np.testing.assert_array_equal(peak[[0, 2]], [7.0, 9.0])
    assert np.isnan(peak[1])


def test_hold_durations_stretch_to_the_next_step_of_the_same_replica() -> None:
    start = np.array([0.0, 5.0, 1.0, 2.0])
    held = hold_durations(start, np.array([1.0, 1.0, 0.5, 0.5]), np.array([0, 0, 1, 1]))
    np.testing.assert_allclose(held, [5.0, 1.0, 1.0, 0.5])


def test_slo_sentences_by_hand() -> None:
    ttft, tpot = METRICS["ttft_s"], METRICS["tpot_s"]
    assert SloCheck(ttft, 2.0, 1.42, 0.99).sentence() == "p99 TTFT 1.42 s ≤ 2.00 s: meets, 29% margin"
    assert SloCheck(tpot, 0.05, 0.06, 0.9).sentence() == "p99 TPOT 60.0 ms > 50.0 ms: misses by 20%"
    assert SloCheck(ttft, 2.0, 8.0, 0.1).sentence() == "p99 TTFT 8.00 s > 2.00 s: misses, 4.00× the limit"
    assert SloCheck(ttft, 2.0, 2.0, 1.0).meets and not SloCheck(ttft, 2.0, 2.001, 1.0).meets
    assert not SloCheck(ttft, 2.0, float("nan"), float("nan")).meets


# ---------------------------------------------------------------- the report


def _plot_data(html: str) -> list[list[dict]]:
    """The data array passed to each Plotly.newPlot call."""
    decoder = json.JSONDecoder()
    traces = []
    for match in re.finditer(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*", html):
        data, _ = decoder.raw_decode(html, match.end())
        traces.append(data)
    return traces


def _has_points(trace: dict) -> bool:
    for key in ("y", "x"):
        value = trace.get(key)
        if isinstance(value, dict) and value.get("bdata"):
            return True
        if isinstance(value, list) and value:
            return True
    return False


@pytest.fixture(scope="module")
def report_with_slos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    run_dir = tmp_path_factory.mktemp("run")
    summary = fabricate_run(run_dir, slos={"ttft_s": 100.0, "tpot_s": 0.05})
    out = write_run_report(run_dir)
    return out, summary, out.read_text(encoding="utf-8")


def test_report_is_written_self_contained(report_with_slos: tuple[Path, dict, str]) -> None:
    out, _, html = report_with_slos
    assert out.name == "report.html" and out.is_file()
    assert html.count(plotly.offline.get_plotlyjs()[:400]) == 1
    assert not re.search(r"<script[^>]+src=[\"']?https?:", html, flags=re.IGNORECASE)
    # The bundle itself names cdn.plot.ly (for map topojson it never loads here); nothing else may.
    assert "cdn.plot.ly" not in html.replace(plotly.offline.get_plotlyjs(), "")
    assert html.count('class="plotly-graph-div"') == NUM_CHARTS
    assert not list(out.parent.glob("*.tmp"))


def test_every_figure_has_data(report_with_slos: tuple[Path, dict, str]) -> None:
    _, _, html = report_with_slos
    figures = _plot_data(html)
    assert len(figures) == NUM_CHARTS
    for traces in figures:
        assert traces and all(_has_points(t) for t in traces)


def test_verdict_matches_the_summary(report_with_slos: tuple[Path, dict, str]) -> None:
    _, summary, html = report_with_slos
    assert summary["ttft_s"]["p99"] <= 100.0 and 0.05 < summary["tpot_s"]["p99"] < 0.1
    assert re.search(r"p99 TTFT [\d.,]+ s ≤ 100 s: meets, \d+% margin", html)
    assert re.search(r"p99 TPOT [\d.,]+ ms &gt; 50.0 ms: misses by \d+%", html)
    assert "Misses 1 of 2 SLO(s) at p99: TPOT" in html
    assert f"SLO attainment {100 * summary['slo_attainment']:.1f}%" in html
    assert "fraction of requests whose own latencies meet all SLOs" in html
    assert "&lt;b&gt;escaped &amp; shown&lt;/b&gt;" in html  # the config is shown, escaped
    assert "rejected (prompt_too_long:" in html


def test_report_without_slos_and_with_replicas(tmp_path: Path) -> None:
    fabricate_run(tmp_path, n_requests=800, n_steps=3000, replicas=3, slos=None)
    out = write_run_report(tmp_path, tmp_path / "sub" / "r.html")
    html = out.read_text(encoding="utf-8")
    assert "No SLOs set" in html
    assert ": meets" not in html and ": misses" not in html
    charts = build_run_charts(load_run(tmp_path))
    batch_kv = next(c for c in charts if c.key == "batch_kv")
    names = {t.name for t in batch_kv.figure.data}
    assert {"batch, replica 0", "batch, replica 1", "batch, replica 2"} <= names


def test_all_met_banner(tmp_path: Path) -> None:
    fabricate_run(tmp_path, n_requests=300, n_steps=600, slos={"ttft_s": 1e6, "e2e_s": 1e6, "itl_s": 1e6})
    html = write_run_report(tmp_path).read_text(encoding="utf-8")
    assert "Meets all 3 SLO(s) at p99." in html
    assert "p99 ITL" in html and "misses" not in html


@pytest.mark.filterwarnings("error")
def test_sparse_run_still_renders(tmp_path: Path) -> None:
    """Every request rejected, no steps, no ITL samples, a summary with nothing but one SLO."""
    fabricate_run(tmp_path, n_requests=200, n_steps=400)
    req = pd.read_parquet(tmp_path / "requests.parquet")
    for column in ("first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "max_itl_s"):
        req[column] = np.nan
    req["status"] = "rejected"
    req.to_parquet(tmp_path / "requests.parquet")
    for name in ("steps.parquet", "itl.parquet"):
        pd.read_parquet(tmp_path / name).iloc[:0].to_parquet(tmp_path / name)
    (tmp_path / "summary.json").write_text('{"slos": {"ttft_s": 5}}', encoding="utf-8")
    (tmp_path / "config.resolved.yaml").unlink()
    html = write_run_report(tmp_path).read_text(encoding="utf-8")
    assert "1 of 1 SLO(s) cannot be checked (no data): TTFT" in html
    assert "p99 TTFT – vs 5.00 s: no data" in html
    assert "No config.resolved.yaml" in html
    # TTFT against prompt length has no completed request to show and says so instead
    assert "has no completed request with a prompt length" in html
    assert html.count('class="plotly-graph-div"') == NUM_CHARTS - 1


@pytest.mark.parametrize("missing", ["requests.parquet", "steps.parquet", "itl.parquet", "summary.json"])
def test_missing_file_is_a_user_error(tmp_path: Path, missing: str) -> None:
    fabricate_run(tmp_path, n_requests=100, n_steps=200)
    (tmp_path / missing).unlink()
    with pytest.raises(ServesimError, match=rf"run_dir: {re.escape(missing)} not found in .*servesim run"):
        write_run_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_missing_column_and_directory_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(ServesimError, match="is not a directory"):
        write_run_report(tmp_path / "nope")
    fabricate_run(tmp_path, n_requests=100, n_steps=200)
    steps_path = tmp_path / "steps.parquet"
    pd.read_parquet(steps_path).drop(columns=["waiting"]).to_parquet(steps_path)
    with pytest.raises(ServesimError, match=r"steps\.parquet lacks column\(s\) waiting"):
        write_run_report(tmp_path)


def test_large_run_stays_small_and_fast(tmp_path: Path) -> None:
    fabricate_run(tmp_path, n_requests=100_000, n_steps=200_000, rate=15.0,
                  slos={"ttft_s": 2.0, "tpot_s": 0.05})
    t0 = time.perf_counter()
    out = write_run_report(tmp_path)
    elapsed = time.perf_counter() - t0
    size = out.stat().st_size
    print(f"large run report: {size / 1e6:.2f} MB written in {elapsed:.2f} s")
    assert size < 6e6
    assert elapsed < 6.0  # target < 2 s; headroom for a loaded CI machine


# ---------------------------------------------------------------- router balance, TTFT by prompt


def test_replica_balance_by_hand() -> None:
    """Replica 0 gets 3 requests and is busy 2 s of the 10 s run; replica 1 gets 1 and is busy 5 s.
    p99 TTFT of replica 0's TTFTs 0.1, 0.2, 0.3 is 0.298 (linear interpolation)."""
    requests = pd.DataFrame({"replica": [0, 0, 0, 1], "arrival_s": [0.0, 1.0, 2.0, 3.0],
                             "finish_s": [4.0, 5.0, 6.0, 10.0], "status": ["completed"] * 4,
                             "ttft_s": [0.1, 0.2, 0.3, 1.0]})
    steps = pd.DataFrame({"replica": [0, 0, 1], "start_s": [0.0, 3.0, 4.0], "duration_s": [1.0, 1.0, 5.0]})
    data = RunData(Path("."), requests, steps, np.empty(0), np.empty(0), {}, None)
    b = replica_balance(data)
    assert list(b["replica"]) == [0, 1] and list(b["requests"]) == [3, 1]
    np.testing.assert_allclose(b["busy"], [0.2, 0.5])
    np.testing.assert_allclose(b["p99_ttft_s"], [0.298, 1.0])
    chart = replica_chart(data)
    assert chart.figure is not None and "3.00x the requests of the least busy" in chart.caption


def test_ttft_prompt_bins_by_hand() -> None:
    """Prompts 10..10,000 with TTFT = prompt / 1000 s: each bin's p50 rises with its lengths."""
    prompts = np.repeat([10, 100, 1000, 10000], 20).astype(float)
    requests = pd.DataFrame({"replica": 0, "arrival_s": np.arange(80.0), "finish_s": np.arange(80.0) + 1,
                             "status": "completed", "ttft_s": prompts / 1000, "prompt_tokens": prompts})
    data = RunData(Path("."), requests, pd.DataFrame(), np.empty(0), np.empty(0), {}, None)
    chart = ttft_prompt_chart(data, [])
    assert chart.figure is not None
    p50 = chart.figure.data[1]
    np.testing.assert_allclose(p50.y, [0.01, 0.1, 1.0, 10.0], rtol=1e-6)
