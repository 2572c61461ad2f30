"""The capacity search's probes: simulations run in slices are the same runs, the bounds of a
stopped run never exceed the final latencies, a probe stops only when its failure is certain
(the answer is the same with and without stopping), and a round-robin fleet simulated replica by
replica gives every request the very latencies of the whole fleet."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from test_capacity import SERVICE_S, one_at_a_time

from servesim.capacity import plan_capacity, validate_capacity
from servesim.capacity.bounds import certainly_missed, lower_bounds, settled_failure
from servesim.capacity.evaluate import latency_values
from servesim.capacity.fleet import fleet_replication, splits_by_replica
from servesim.capacity.output import candidate_row, json_safe
from servesim.capacity.probe import Part, Replication, run_together
from servesim.capacity.saturation import FALSE_POSITIVE_BOUND, RUN, BacklogTrend
from servesim.config import validate_document
from servesim.pipeline import prepare, simulate
from servesim.pipeline.slices import SlicedSimulation
from servesim.topology.resolve import resolve_topology


def experiment(replicas: int = 1, rate: float = 12.0, router: str = "round_robin", requests: int = 400,
               engine: str = "vllm-v0", **deployment: Any) -> Any:
    """Llama-3-8B on H100s under chat lengths: batches of many decodes, prefills between them."""
    return validate_document({
        "name": "probe", "seed": 3, "model": "llama-3-8b", "hardware": "h100-sxm-80gb",
        "engine": {"name": engine}, "deployment": {"replicas": replicas, **deployment},
        "router": {"name": router},
        "workload": {"arrival": {"process": "poisson", "rate": rate}, "num_requests": requests,
                     "lengths": {"preset": "azure-conversation"}},
        "output": "summary"}, "test")


def assert_same_requests(a: Any, b: Any) -> None:
    for field in ("status", "first_token", "finish", "first_scheduled", "preemptions"):
        assert np.array_equal(getattr(a, field), getattr(b, field), equal_nan=True), field


@pytest.mark.parametrize(("replicas", "slice_s"), [(1, 0.37), (3, 1.0), (1, 5.0)])
def test_a_sliced_simulation_is_the_same_run(replicas: int, slice_s: float) -> None:
    """Taking the events slice by slice only reads state between them: every request's times and
    every step row are those of ``simulate``, bit for bit."""
    config = experiment(replicas, rate=12.0 * replicas)
    whole = simulate(prepare(config))
    sliced = SlicedSimulation(prepare(config))
    until = 0.0
    while not sliced.advance(until):
        until += slice_s
    result = sliced.result()
    assert_same_requests(whole.request_state, result.request_state)
    assert whole.step_log.records().tobytes() == result.step_log.records().tobytes()
    assert result.sim_time_s == whole.sim_time_s


@pytest.mark.parametrize("rate", [8.0, 30.0])
def test_bounds_never_exceed_the_final_latencies(rate: float) -> None:
    """At every slice of a run (below and far above saturation), each request's lower bounds are
    at most its final TTFT, TPOT and E2E; a request the bounds call missed misses."""
    slo = validate_capacity({**one_at_a_time("poisson", 0.5, 99, 400, 1),
                             "slo": {"ttft_s": 0.5, "tpot_s": 0.03, "percentile": 99}})
    config = experiment(rate=rate)
    final = latency_values(simulate(prepare(config)).request_state)
    sliced = SlicedSimulation(prepare(config))
    checks = missed_any = 0
    until = 0.0
    while not sliced.advance(until):
        until += 0.5
        bounds = lower_bounds(sliced.requests, sliced.now)
        for key, low in bounds.items():
            nan = np.isnan(low)
            assert np.all(np.isnan(final[key][nan]) | np.isinf(final[key][nan]) | nan[nan])
            assert np.all(low[~nan] <= final[key][~nan]), key
        missed = certainly_missed(bounds, sliced.requests, slo)
        assert np.all((final["ttft_s"][missed] > 0.5) | (final["tpot_s"][missed] > 0.03))
        missed_any += int(missed.sum())
        checks += 1
    assert checks > 20
    if rate > 20:  # far past saturation, queueing requests miss the TTFT limit long before served
        assert missed_any > 0


def bounds_of(ttft: list[float], tpot: list[float]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    values = {"ttft_s": np.array(ttft), "tpot_s": np.array(tpot), "e2e_s": np.zeros(len(ttft))}
    return values, np.zeros(len(ttft), dtype=bool)


def test_settled_failure_by_hand() -> None:
    """p99 of 100 values at positions 98.01 (NumPy's linear rule). Five requests already past 3 s
    in one replication put its p99 bound at 3 s; the other's bound is 0 s, so the mean over the
    two is at least 1.5 s > 1 s: settled. One request at 3 s puts the p99 bound at
    0.01 x 3 = 0.03 s: not settled. With attainment >= 0.99, two replications in which 2% and 0%
    of requests certainly missed have an attainment of at most 0.99: not settled (>= passes);
    3% and 0% cap it at 0.985: settled."""
    config = validate_capacity({**one_at_a_time("poisson", 1.0, 99, 100, 2),
                                "search": {"replications": 2, "warmup_fraction": 0.0}})
    five = bounds_of([3.0] * 5 + [0.0] * 95, [0.0] * 100)
    one = bounds_of([3.0] + [0.0] * 99, [0.0] * 100)
    zero = bounds_of([0.0] * 100, [0.0] * 100)
    reason = settled_failure(config, [five, zero])
    assert reason is not None and "TTFT at least 1.5 s > 1 s" in reason
    assert settled_failure(config, [one, zero]) is None
    attain = validate_capacity({**one_at_a_time("poisson", 1.0, 99, 100, 2),
                                "slo": {"ttft_s": 1.0, "attainment": 0.99},
                                "search": {"replications": 2, "warmup_fraction": 0.0}})

    def missing(count: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        values, missed = bounds_of([0.0] * 100, [0.0] * 100)
        missed[:count] = True
        return values, missed

    assert settled_failure(attain, [missing(2), missing(0)]) is None
    assert "at most 0.985" in (settled_failure(attain, [missing(3), missing(0)]) or "")


def strip_stopped(answer: dict[str, Any], stopped: set[float]) -> str:
    """The answer as JSON, with only the rate and verdict of the probes at ``stopped`` rates
    (whose other figures a stopped probe reports as bounds)."""
    out = copy.deepcopy(answer)
    out.pop("config")
    out["search"].pop("early_stop")
    for record in out["candidates"]:
        search = record.get("search")
        if search:
            search.pop("stopped_early", None)
            search["evaluations"] = [(e["rate"], e["passed"]) if e["rate"] in stopped else e
                                     for e in search["evaluations"]]
    return json.dumps(json_safe(out), sort_keys=True)


@pytest.mark.parametrize("slo", [{"ttft_s": 2 * SERVICE_S, "percentile": 99},
                                 {"ttft_s": 2 * SERVICE_S, "attainment": 0.95}])
def test_early_stop_gives_the_same_answer(slo: dict[str, Any]) -> None:
    """D/D/1 queues (as in test_capacity) over two GPUs and two replications, with a target rate:
    the search stops failing probes early (some do: far past the knee the queue grows at once)
    and still takes every step, ranks and sizes the fleets, and diagnoses the knee exactly as with
    ``early_stop: false`` (the knee's own probe runs on to the end)."""
    knee = 1 / SERVICE_S
    doc = one_at_a_time("constant", 2 * SERVICE_S, 99, 400, 2, target_rate=2.5 * knee)
    doc["slo"] = slo
    doc["candidates"] = {"hardware": ["h100-sxm-80gb", "a100-sxm-80gb"]}
    doc["search"] = {"replications": 2, "warmup_fraction": 0.1}
    fast = plan_capacity(validate_capacity(doc))
    slow = plan_capacity(validate_capacity({**doc, "search": {**doc["search"], "early_stop": False}}))
    assert sum(r["search"]["stopped_early"] for r in fast["candidates"]) > 0
    stopped = {e["rate"] for r in fast["candidates"] for e in r["search"]["evaluations"]
               if "stopped_early" in e}
    assert strip_stopped(fast, stopped) == strip_stopped(slow, stopped)
    assert [candidate_row(r) for r in fast["candidates"]] == [candidate_row(r) for r in slow["candidates"]]
    for record in fast["candidates"]:
        for e in record["search"]["evaluations"]:
            if "stopped_early" in e:
                assert not e["passed"] and e["stopped_early"]["at_s"] > 0
                assert e["stopped_early"]["requests_finished"] < e["stopped_early"]["requests"]
        knee_rate = record["search"]["failing_rate"]
        assert all("stopped_early" not in e for e in record["search"]["evaluations"]
                   if e["rate"] == knee_rate)


@pytest.mark.parametrize(("engine", "replicas", "rate"), [("vllm-v0", 3, 40.0), ("vllm", 4, 60.0),
                                                          ("vllm-v0", 2, 70.0)])
def test_a_round_robin_fleet_is_its_replicas_apart(engine: str, replicas: int, rate: float) -> None:
    """Every request's TTFT, TPOT and E2E are the same floats whether the fleet runs whole or
    each replica runs alone on its round-robin share (below and past saturation)."""
    config = experiment(replicas, rate=rate, engine=engine, requests=300 * replicas,
                        enable_prefix_caching=False)
    whole = latency_values(simulate(prepare(config)).request_state)
    replication = fleet_replication(config, prepare(config).workload)
    assert len(replication.parts) == replicas
    for part in replication.parts:
        part.sim.advance(math.inf)
    apart, done = replication.values()
    assert done.all()
    for key in whole:
        assert np.array_equal(whole[key], apart[key], equal_nan=True), key


def test_only_round_robin_colocated_fleets_are_split() -> None:
    table = prepare(experiment(3)).workload
    for config, split in ((experiment(3), True), (experiment(1), False),
                          (experiment(3, router="least_outstanding"), False),
                          (experiment(3, enable_prefix_caching=True), False),
                          (experiment(3, pp=2), False)):
        assert splits_by_replica(config, resolve_topology(config), table) == split


def test_a_queue_rising_seven_times_in_a_row_is_saturation_by_hand() -> None:
    """Seven window-end queue lengths each above the last (six rises) declare it; a tie or a fall
    restarts the count; an empty queue (all ties) never does."""
    trend = BacklogTrend()
    assert not any(trend.add(v) for v in [0, 0, 0, 0, 0, 0, 0, 0])
    assert [trend.add(v) for v in [1, 2, 3, 3, 4, 5, 6, 7, 8, 9]] == [False] * 9 + [True]
    assert RUN == 7 and pytest.approx(1 / 5040) == FALSE_POSITIVE_BOUND


@pytest.mark.parametrize(("load", "saturated"), [(2.0, True), (0.5, False)])
def test_saturation_stop_fires_on_a_growing_queue_only(load: float, saturated: bool) -> None:
    """D/D/1 (one request per D-second step, constant gaps): at twice the service rate the queue
    grows by one request every 2D, so every window ends with a longer queue and the opt-in test
    declares the probe saturated, before any bound is past the (loose, 1,000 D) TTFT limit; at half
    the service rate nobody ever waits and the probe runs to its end."""
    config = validate_capacity({**one_at_a_time("constant", 1000 * SERVICE_S, 99, 2000, 1),
                                "search": {"replications": 1, "saturation_stop": True}})
    workload = one_at_a_time("constant", 1000 * SERVICE_S, 99, 2000, 1)["workload"]
    experiment = validate_document({
        "name": "dd1", "seed": 0, "model": "llama-3-8b", "hardware": "h100-sxm-80gb", "engine": "vllm-v0",
        "deployment": {"max_num_seqs": 1}, "output": "summary", "workload": workload}, "test")
    base = prepare(experiment).workload  # constant gaps of 1 s (rate 1)
    table = replace(base, arrival_s=base.arrival_s * SERVICE_S / load)
    replication = Replication(table, [Part(SlicedSimulation(prepare(experiment, workload=table)))])
    stopped = run_together([replication], config, early_stop=True, saturation_stop=True)
    if saturated:
        assert stopped is not None and not stopped.certain and "queue grew" in stopped.reason
        assert stopped.at_s < table.arrival_s[-1] / 2
    else:
        assert stopped is None and replication.done
