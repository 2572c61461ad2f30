"""summary.json's vLLM-named keys: the numbers vllm bench serve would write for the same requests
(its formulas applied to the run's own tables), the peaks by hand, and the stable keys untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_cli import servesim as cli

from servesim.config import load_experiment
from servesim.metrics.benchmark_names import (
    is_benchmark_key,
    max_concurrent_requests,
    max_output_tokens_per_s,
    percentile_word,
)
from servesim.metrics.summary import Summary
from servesim.pipeline import prepare, simulate
from servesim.resources import configs_dir
from servesim.sweep.aggregate import flatten_metrics

STABLE_KEYS = ["ttft_s", "tpot_s", "itl_s", "e2e_s", "queueing_s", "throughput", "completed", "rejected",
               "unfinished", "preemptions", "slo_attainment", "goodput_requests_per_s", "slos", "duration_s",
               "num_requests", "offered_rate", "deployment", "kv", "swap", "batch", "prefix_cache"]


@pytest.fixture(scope="module")
def run():
    config = load_experiment(configs_dir() / "quickstart.yaml",
                             ["engine=vllm-v0", "workload.num_requests=400", "workload.arrival.rate=15",
                              "metric_percentiles=[50, 99, 99.9]"])
    return simulate(prepare(config))


def test_as_vllm_bench_serve_computes_them(run) -> None:
    """vLLM: np.mean / np.median / np.std / np.percentile over the successful requests' TTFTs,
    TPOTs (outputs longer than one token), every ITL gap, and latencies; times 1000."""
    summary = run.summary.to_dict()
    done = run.requests[run.requests["status"] == "completed"]
    itl = np.repeat(run.itl["itl_s"].to_numpy(), run.itl["count"].to_numpy().astype(int))
    lists = {"ttft": done["ttft_s"].to_numpy(),
             "tpot": done.loc[done["output_tokens"] > 1, "tpot_s"].to_numpy(),
             "itl": itl, "e2el": done["e2e_s"].to_numpy()}
    for name, values in lists.items():
        assert summary[f"mean_{name}_ms"] == pytest.approx(np.mean(values) * 1000, rel=1e-9)
        assert summary[f"median_{name}_ms"] == pytest.approx(np.median(values) * 1000, rel=1e-9)
        assert summary[f"std_{name}_ms"] == pytest.approx(np.std(values) * 1000, rel=1e-9)
        for p in (50, 99, 99.9):
            assert summary[f"p{percentile_word(p)}_{name}_ms"] == pytest.approx(
                np.percentile(values, p) * 1000, rel=1e-9)
    assert summary["p99_ttft_ms"] == pytest.approx(summary["ttft_s"]["p99"] * 1000)
    assert summary["request_throughput"] == summary["throughput"]["requests_per_s"]
    assert summary["output_throughput"] == summary["throughput"]["output_tokens_per_s"]
    assert summary["total_token_throughput"] == pytest.approx(summary["throughput"]["total_tokens_per_s"])
    assert summary["total_input_tokens"] == done["prompt_tokens"].sum()
    assert summary["total_output_tokens"] == done["output_tokens"].sum()
    assert summary["duration"] == summary["duration_s"] and summary["failed"] == 0
    assert summary["request_goodput"] == summary["goodput_requests_per_s"]


def test_stable_keys_come_first_unchanged(run) -> None:
    summary = run.summary.to_dict()
    assert list(summary)[:len(STABLE_KEYS)] == STABLE_KEYS
    assert all(is_benchmark_key(k) for k in list(summary)[len(STABLE_KEYS):])
    assert Summary.from_dict(json.loads(json.dumps(summary))).to_dict() == json.loads(json.dumps(summary))
    assert not any(is_benchmark_key(k.split(".")[0]) for k in flatten_metrics(summary))  # not sweep columns


def test_peaks_by_hand() -> None:
    """Requests in flight: [0, 2), [1, 3), [2, 4): at t=2 one leaves as one arrives, so at most 2.
    Tokens: first tokens at 0.5, 1.5, 2.5 and steps ending at 1.2 (10 tokens) and 1.9 (5): the
    second [1, 2) holds 1 + 10 + 5 = 16."""
    requests = pd.DataFrame({"status": ["completed"] * 3, "arrival_s": [0.0, 1.0, 2.0],
                             "finish_s": [2.0, 3.0, 4.0], "first_token_s": [0.5, 1.5, 2.5]})
    steps = pd.DataFrame({"start_s": [1.0, 1.5], "duration_s": [0.2, 0.4], "decode_tokens": [10, 5]})
    assert max_concurrent_requests(requests) == 2
    assert max_output_tokens_per_s(requests, steps) == 16.0


@pytest.mark.parametrize("seed", range(8))
def test_most_in_flight_is_the_running_sum_of_sorted_events(seed: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The peak read off the sorted arrivals and finishes (a few at a time) is the maximum of the
    running sum of +1 per arrival and -1 per finish in time order, finishes first at an instant
    (ties are frequent here: times are whole numbers)."""
    import servesim.metrics.benchmark_names as names

    monkeypatch.setattr(names, "BUCKET_CHUNK", 5)
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 40))
    arrival = rng.integers(0, 20, size=count).astype(float)
    finish = arrival + rng.integers(0, 6, size=count)
    requests = pd.DataFrame({"status": ["completed"] * count + ["rejected"], "arrival_s": [*arrival, 0.0],
                             "finish_s": [*finish, np.nan]})
    times = np.concatenate([arrival, finish])
    deltas = np.concatenate([np.ones(count), -np.ones(count)])
    expected = int(np.cumsum(deltas[np.lexsort((deltas, times))]).max())
    assert max_concurrent_requests(requests) == expected


def test_cli_flag_sets_the_percentiles_and_default_runs_keep_their_names(tmp_path: Path) -> None:
    done = cli("run", "quickstart", "--set", "workload.num_requests=50", "--metric-percentiles", "25,75",
               "--out", str(tmp_path), "--no-report", "--quiet")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "p25_tpot_ms" in summary and "p75_e2el_ms" in summary and "p99_ttft_ms" not in summary
    assert "metric_percentiles:\n- 25.0\n- 75.0\n" in (tmp_path / "config.resolved.yaml").read_text()
    bad = cli("run", "quickstart", "--metric-percentiles", "p99", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "--metric-percentiles: 'p99' is not a list of numbers" in bad.stderr


def test_peak_tokens_per_second_by_chunks_is_one_bincount(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bucketing the steps a few at a time gives the very float of one ``bincount`` over every
    emission (whole-token sums are exact in any order), on narrow integer columns too."""
    from servesim.metrics import benchmark_names

    rng = np.random.default_rng(11)
    n = 300
    arrival = np.sort(rng.uniform(0.5, 50.0, n))
    requests = pd.DataFrame({"arrival_s": arrival, "first_token_s": arrival + rng.uniform(0, 2, n),
                             "status": np.where(rng.random(n) < 0.9, "completed", "unfinished")})
    starts = np.sort(rng.uniform(0.0, 60.0, 5000))
    steps = pd.DataFrame({"start_s": starts, "duration_s": rng.uniform(0.0, 0.05, 5000),
                          "decode_tokens": rng.integers(0, 300, 5000).astype(np.int16)})
    done = requests[requests["status"] == "completed"]
    ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
    t = np.concatenate([done["first_token_s"].to_numpy(), ends])
    w = np.concatenate([np.ones(len(done)), steps["decode_tokens"].to_numpy(float)])
    buckets = np.floor(t - arrival.min()).astype(np.int64)
    keep = (buckets >= 0) & (w > 0)
    expected = float(np.bincount(buckets[keep], weights=w[keep]).max())
    for chunk in (1 << 20, 7, 1):
        monkeypatch.setattr(benchmark_names, "BUCKET_CHUNK", chunk)
        assert max_output_tokens_per_s(requests, steps) == expected
    assert expected > 300 * 10  # many steps per second: a real peak
