"""An overlapping engine that schedules one step ahead (``engine.schedule_ahead``: vLLM V1's async
scheduling, SGLang's and TensorRT-LLM's overlap schedulers) first runs a request that arrives
while a step runs in the step after the next one (``servesim.core.replica``'s docstring); a serial
engine, or one without the knob (the default), runs it in the next step, and an idle engine at
once. Fast-forward keeps the step-by-step results with it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from engine_helpers import PLACEHOLDER_WORKLOAD, run, table

from servesim.config import validate_document
from servesim.pipeline import prepare, simulate

LONG_OUTPUT = 60


def _experiment(engine: dict[str, Any] | str, **top: Any) -> Any:
    """``engine`` with no front-end latency (the engine sees each request when it is sent)."""
    section = {"name": engine} if isinstance(engine, str) else engine
    return validate_document({"model": "llama-3-8b", "hardware": "h100-sxm-80gb",
                              "engine": {**section, "frontend_latency_s": 0.0},
                              "workload": PLACEHOLDER_WORKLOAD, **top})


def _ahead(name: str, **knobs: Any) -> dict[str, Any]:
    return {"name": name, "schedule_ahead": True, **knobs}


def _first_scheduled_step(engine: dict[str, Any] | str, step: int, **top: Any) -> tuple[int, float]:
    """Request 0 arrives at t = 0 and decodes alone; request 1 arrives in the middle of its
    ``step``-th step. Returns the index of the step request 1 first runs in, and how long after
    its arrival that step starts."""
    config = _experiment(engine, **top)
    alone = run(config, table([0.0], 128, LONG_OUTPUT)).steps
    start, duration = float(alone["start_s"].iloc[step]), float(alone["duration_s"].iloc[step])
    arrival = start + duration / 2
    both = run(config, table([0.0, arrival], 128, [LONG_OUTPUT, 4]))
    steps = both.steps
    first = float(both.requests.loc[1, "first_scheduled_s"])
    index = int(np.flatnonzero(steps["start_s"].to_numpy() == first)[0])
    # the steps before it are request 0's alone, the same as without request 1
    assert steps["start_s"].iloc[:index].tolist() == alone["start_s"].iloc[:index].tolist()
    return index, first - arrival


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm"])
def test_an_overlapping_engine_runs_an_arrival_two_steps_later(name: str) -> None:
    engine = _ahead(name)
    index, wait = _first_scheduled_step(engine, 10)
    assert index == 12  # arrived during step 10, scheduled at its end for step 12
    log = run(_experiment(engine), table([0.0], 128, LONG_OUTPUT)).steps
    # the rest of step 10 (half of it) and all of step 11
    expected = log["duration_s"].iloc[10] / 2 + log["duration_s"].iloc[11]
    assert wait == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("engine", [_ahead("vllm", async_scheduling=False),
                                    _ahead("sglang", disable_overlap_schedule=True),
                                    _ahead("trtllm", disable_overlap_scheduler=True),
                                    _ahead("vllm-v0"), "vllm", "sglang", "trtllm"])
def test_a_serial_engine_or_the_default_runs_an_arrival_in_the_next_step(engine: dict[str, Any] | str
                                                                          ) -> None:
    index, _ = _first_scheduled_step(engine, 10)
    assert index == 11


def test_an_idle_overlapping_engine_runs_an_arrival_at_once() -> None:
    config = _experiment(_ahead("vllm"))
    result = run(config, table([0.0, 5.0], 128, [8, 8]))
    requests = result.requests
    assert requests.loc[0, "finish_s"] < 5.0
    assert requests.loc[1, "first_scheduled_s"] == 5.0
    assert requests.loc[0, "first_scheduled_s"] == 0.0


def test_held_arrivals_count_as_outstanding_for_routers() -> None:
    """A request held for the next schedule is queued work: least-outstanding routing sees it."""
    config = _experiment(_ahead("vllm"), deployment={"replicas": 2}, router={"name": "least_outstanding"})
    # 0 and 1 start at once on replicas 0 and 1 (each idle); 2 and 3 arrive together mid-step:
    # 2 goes to replica 0 (a tie), and 3 must see 2 held there and go to replica 1.
    result = run(config, table([0.0, 0.0, 0.02, 0.02], 128, 40))
    assert result.requests["replica"].tolist() == [0, 1, 0, 1]


def test_data_parallel_ranks_hold_arrivals_for_the_step_after_next() -> None:
    """A pipelined replica (two attention-DP ranks of one engine) schedules ahead as a replica
    does: request 1 lands on rank 1 while rank 0's micro-batch runs, and first runs two
    micro-batches later."""
    deployment = {"tp": 1, "dp": 2, "ep": 2}
    config = validate_document({"model": "qwen3-30b-a3b", "hardware": "h100-sxm-80gb",
                                "engine": _ahead("vllm", frontend_latency_s=0.0), "deployment": deployment,
                                "workload": PLACEHOLDER_WORKLOAD})
    alone = run(config, table([0.0], 128, LONG_OUTPUT)).steps
    start, duration = float(alone["start_s"].iloc[10]), float(alone["duration_s"].iloc[10])
    both = run(config, table([0.0, start + duration / 2], 128, [LONG_OUTPUT, 4]))
    first = float(both.requests.loc[1, "first_scheduled_s"])
    starts = sorted(set(both.steps["start_s"].tolist()))
    assert first == starts[12]


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_forward_keeps_the_step_by_step_results(name: str, seed: int) -> None:
    """Open-loop arrivals (some land inside fast-forwardable runs, some on an idle engine) and a
    closed loop: fast-forward and step by step agree bit for bit with the knob on or off, and
    the knob raises the mean TTFT."""
    for workload in ({"arrival": {"process": "poisson", "rate": 6.0}, "num_requests": 60,
                      "lengths": {"preset": "azure-conversation"}},
                     {"arrival": {"process": "closed", "concurrency": 6}, "num_requests": 36,
                      "prompt": {"dist": "uniform", "low": 64, "high": 900},
                      "output": {"dist": "uniform", "low": 8, "high": 120}}):
        results = {}
        for knob in (False, True):
            plan = prepare(validate_document({
                "model": "llama-3-8b", "hardware": "h100-sxm-80gb", "seed": seed,
                "engine": {"name": name, "schedule_ahead": knob}, "workload": workload}))
            reference, fast = simulate(plan, fast_forward=False), simulate(plan, fast_forward=True)
            pd.testing.assert_frame_equal(reference.requests, fast.requests)
            pd.testing.assert_frame_equal(reference.steps, fast.steps)
            assert reference.summary.to_dict() == fast.summary.to_dict()
            assert sum(unit.fast_forwarded_steps for group in fast.groups for unit in group.replicas) > 0
            results[knob] = float(reference.requests["ttft_s"].mean())
        assert results[True] > results[False]  # arrivals to a busy engine wait a step longer
