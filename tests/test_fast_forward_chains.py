"""Fast-forwarded runs that go on through a request's finish (``Replica._chain``) stay exact.

A run that ends with a finish is credited at once and the policy is asked, at the run's end, for
the next batch; while that is again a pure-decode run ending before the next arrival and the
horizon (where the capacity planner reads the state between slices), it joins the same SimPy
timeout. The oracle is the step-by-step mode, with zero tolerance (``test_fast_forward.py`` says
why), and each test counts that runs were chained, so that it cannot pass by never chaining.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_fast_forward import assert_same, both_ways, experiment

from servesim.config import validate_document
from servesim.core.replica import Replica
from servesim.pipeline import prepare
from servesim.pipeline.result import RunResult
from servesim.pipeline.slices import SlicedSimulation


def chained_runs(result: RunResult) -> int:
    return sum(unit.chained_runs for run in result.groups for unit in run.replicas
               if isinstance(unit, Replica))


CHAINING_POLICIES = [{"name": "continuous"}, {"name": "chunked_prefill"}, {"name": "sjf"},
                     {"name": "prefill_first"},
                     {"name": "prefill_first", "mixed": True, "new_token_ratio_decay_steps": 20},
                     {"name": "no_evict"}]


def sparse(rate: float = 2.0, requests: int = 60, **overrides: Any) -> dict[str, Any]:
    """Sparse arrivals and short prompts: between arrivals the batch drains, request by request."""
    document = experiment(**overrides)
    document["workload"]["arrival"]["rate"] = rate
    document["workload"]["num_requests"] = requests
    return document


@pytest.mark.parametrize("policy", CHAINING_POLICIES, ids=lambda p: "-".join(map(str, p.values())))
@pytest.mark.parametrize("engine", ["vllm-v0", "vllm", "sglang", "trtllm"])
def test_runs_through_finishes_are_exact(policy: dict[str, Any], engine: str) -> None:
    """Every policy that fast-forwards, on every engine: runs were chained, and both modes agree."""
    reference, fast = both_ways(sparse(policy=policy, engine=engine))
    assert chained_runs(reference) == 0
    assert chained_runs(fast) > 0
    assert_same(reference, fast)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(CHAINING_POLICIES),
       rate=st.sampled_from([0.5, 2.0, 8.0]), replicas=st.integers(1, 2),
       block_size=st.sampled_from([1, 16]), blocks=st.sampled_from([None, 60]),
       engine=st.sampled_from(["vllm-v0", "vllm", "sglang", "trtllm"]),
       prefix=st.booleans(), hardware=st.sampled_from(["h100-sxm-80gb", "a100-sxm-80gb"]))
def test_chained_runs_match_step_by_step(seed: int, policy: dict[str, Any], rate: float, replicas: int,
                                         block_size: int, blocks: int | None, engine: str, prefix: bool,
                                         hardware: str) -> None:
    """Seeded configurations where finishes fall inside runs (sparse arrivals), with tight pools
    (runs after a finish end at block shortfalls too), two replicas (a run ends before any arrival)
    and prefix caching (a finish frees blocks to the cache): the same results both ways."""
    deployment: dict[str, Any] = {"replicas": replicas, "block_size": block_size,
                                  "enable_prefix_caching": prefix}
    if blocks is not None:
        deployment["num_gpu_blocks"] = max(blocks, (600 + 300) // block_size + 2)
    document = sparse(rate, 40, seed=seed, policy=policy, engine=engine, hardware=hardware,
                      deployment=deployment)
    if prefix:
        document["workload"]["shared_prefix"] = {"tokens": 64, "groups": 3}
    reference, fast = both_ways(document)
    assert_same(reference, fast)


def test_most_finishes_are_run_through_on_a_sparse_workload() -> None:
    """At 2 requests/s on one replica most runs that end with a finish go on in the same timeout:
    fewer SimPy events, the same results."""
    reference, fast = both_ways(sparse(rate=2.0, requests=80))
    finishes = int((fast.request_state.status == 3).sum())
    assert chained_runs(fast) > finishes // 3
    assert_same(reference, fast)


STATE_READ_BETWEEN_SLICES = ("status", "finish", "first_token", "first_scheduled", "preemptions",
                             "replica")


def slices_in_lockstep(fast: SlicedSimulation, reference: SlicedSimulation, slice_s: float) -> int:
    """Advance both simulations slice by slice to the end, checking at every boundary that the
    state the capacity planner reads is the step-by-step one; the number of boundaries."""
    until, boundaries = 0.0, 0
    while True:
        until += slice_s
        done = fast.advance(until)
        assert reference.advance(until) == done
        for column in STATE_READ_BETWEEN_SLICES:
            np.testing.assert_array_equal(getattr(fast.requests, column), getattr(reference.requests, column),
                                          err_msg=f"{column} at {until}")
        boundaries += 1
        if done:
            return boundaries


@pytest.mark.parametrize(("replicas", "slice_s"), [(1, 0.25), (1, 2.0), (2, 0.7)])
def test_the_capacity_probes_slices_see_every_finish_on_time(replicas: int, slice_s: float) -> None:
    """The capacity planner reads the requests' state between slices of simulated time
    (``capacity/probe.py``: certain-failure lower bounds from finishes and first tokens). A run
    chained through a finish is credited before its timeout ends, so chains stop before each
    slice's end: at every slice boundary the state the bounds read is the step-by-step state,
    and runs are still chained inside the slices."""
    config = validate_document(sparse(rate=3.0 * replicas, requests=60,
                                      deployment={"replicas": replicas}), "test")
    fast, reference = SlicedSimulation(prepare(config)), SlicedSimulation(prepare(config), fast_forward=False)
    assert slices_in_lockstep(fast, reference, slice_s) > 10
    assert chained_runs(fast.result()) > 0
    assert_same(reference.result(), fast.result())


def test_a_horizon_bounds_chains() -> None:
    """Slices shorter than a step leave no room for a chain; whole runs chain freely."""
    config = validate_document(sparse(rate=2.0, requests=40), "test")
    whole = SlicedSimulation(prepare(config))
    whole.advance(float("inf"))
    fine = SlicedSimulation(prepare(config))
    until = 0.0
    while not fine.advance(until):
        until += 0.004  # about a decode step of Llama-3-8B on an H100
    assert chained_runs(whole.result()) > 0
    assert chained_runs(fine.result()) < chained_runs(whole.result()) // 4
    assert_same(whole.result(), fine.result())
