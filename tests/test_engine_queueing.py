"""Queueing behaviour checked against theory: M/D/1 and a closed batch priced step by step."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import experiment, run, table, tabulate

from servesim import BatchShape, CostModel, load_hardware, load_model


def test_md1_mean_wait_matches_pollaczek_khinchine() -> None:
    """One request at a time (max_num_seqs 1), each a 512-token prompt with one output token: every
    request is served by exactly one prefill step of fixed length D, so under Poisson arrivals the
    replica is an M/D/1 queue. Pollaczek-Khinchine: mean wait Wq = rho D / (2 (1 - rho)), and by
    PASTA a fraction 1 - rho of arrivals find the server idle and wait exactly 0.

    Four independent seeds of 30,000 requests at rho = 0.5; the sampling error of their mean is
    about 1% (Lindley-recursion experiments over 20 seeds), so 3% is a ~3 sigma bound."""
    config = experiment({"max_num_seqs": 1})
    service = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb")).step_time(
        BatchShape.prefill(512))
    rho = 0.5
    waits, idle = [], []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(service / rho, 30_000))
        result = run(config, table(arrivals, 512, 1))
        tables = tabulate(result)
        assert np.allclose(tables.steps["duration_s"], service, rtol=1e-12)
        queueing = tables.requests["queueing_s"].to_numpy()
        waits.append(queueing.mean())
        idle.append(np.mean(queueing == 0.0))
    expected = rho * service / (2 * (1 - rho))
    assert np.mean(waits) == pytest.approx(expected, rel=0.03)
    assert np.mean(idle) == pytest.approx(1 - rho, abs=0.01)


def test_closed_batch_makespan_is_the_sum_of_priced_steps() -> None:
    """Eight identical requests arriving together: one prefill step of 8 x 300 tokens, then 49
    decode steps whose contexts grow by one each step. The engine's clock must equal the cost
    model's prices summed by hand, and TTFT/TPOT must follow from them exactly."""
    config = experiment()
    prompt, output, batch = 300, 50, 8
    result = run(config, table([0.0] * batch, prompt, output))
    cost = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb"))
    prefill = cost.step_time(BatchShape.prefill(*[prompt] * batch))
    decodes = [cost.step_time(BatchShape.decode(batch, prompt + k)) for k in range(output - 1)]
    tables = tabulate(result)
    requests = tables.requests
    assert len(tables.steps) == output
    assert requests["ttft_s"].to_numpy() == pytest.approx(np.full(batch, prefill), rel=1e-12)
    assert requests["e2e_s"].to_numpy() == pytest.approx(np.full(batch, prefill + sum(decodes)), rel=1e-12)
    assert requests["tpot_s"].to_numpy() == pytest.approx(np.full(batch, sum(decodes) / (output - 1)),
                                                          rel=1e-12)
    # Every request emits a token per decode step: the ITL distribution is the decode steps'
    # durations, each counted once per request.
    itl = tables.itl
    assert int(itl["count"].sum()) == batch * (output - 1)
    assert tables.summary["itl_s"]["max"] == pytest.approx(max(decodes), rel=1e-12)


def test_prefill_first_stalls_running_decodes() -> None:
    """vLLM v0 without chunked prefill runs a newly admitted prompt in a step of its own, so a
    request decoding when it arrives sees one inter-token gap of (its decode step + the prefill)."""
    config = experiment()
    cost = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb"))
    first_prefill = cost.step_time(BatchShape.prefill(100))
    decode = cost.step_time(BatchShape.decode(1, 100))
    # The second request arrives during the first decode step of the first one.
    result = run(config, table([0.0, first_prefill + decode / 2], [100, 4000], [20, 2]))
    tables = tabulate(result)
    second_prefill = cost.step_time(BatchShape.prefill(4000))
    # After the prefill both decode together: the first over 101 cached tokens, the second over 4000.
    joint_decode = cost.step_time(BatchShape.build(decode_context=[101, 4000]))
    first = tables.requests.iloc[0]
    assert first["max_itl_s"] == pytest.approx(second_prefill + joint_decode, rel=1e-12)
    kinds = tables.steps[["num_prefills", "num_decodes"]].to_numpy()
    assert not np.any((kinds[:, 0] > 0) & (kinds[:, 1] > 0)), "prefill and decode never share a step"


def test_round_robin_spreads_requests_over_replicas() -> None:
    """Two replicas behind round robin: arrivals alternate between them, each replica keeps its
    own KV pool and step loop, and with arrivals far apart every request is served at once."""
    config = experiment({"replicas": 2})
    result = run(config, table(np.arange(10) * 5.0, 200, 5))
    tables = tabulate(result)
    assert tables.requests["replica"].tolist() == [0, 1] * 5
    assert set(tables.steps["replica"]) == {0, 1}
    assert (tables.steps.groupby("replica").size() == 5 * 5).all()  # 1 prefill + 4 decodes each
    assert (tables.requests["queueing_s"] == 0).all()
    assert tables.summary["deployment"]["gpus"] == 2


def test_progress_reporting_does_not_change_results() -> None:
    """The progress monitor only reads state: results are identical with and without it, and
    its last report counts every request."""
    from servesim.pipeline import prepare, simulate

    config = experiment()
    rng = np.random.default_rng(7)
    workload = table(np.cumsum(rng.exponential(0.05, 400)), rng.integers(10, 2000, 400),
                     rng.integers(1, 300, 400))
    calls: list[tuple[int, int, float]] = []
    plan = prepare(config, workload=workload)
    with_progress = tabulate(simulate(plan, progress=lambda *a: calls.append(a)))
    without = tabulate(run(config, workload))
    assert with_progress.requests.equals(without.requests)
    assert calls and calls[-1][0] == calls[-1][1] == 400
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
