"""Fast-forward (``servesim.core.fast_forward``) gives the step-by-step results, bit for bit.

Step by step is the reference mode and the oracle here. The tolerance is zero: a fast-forwarded
run advances the clock by the same float additions in the same order (start + each step's
duration in turn), prices every step to the same floats (``CostModel.step_record``, or its closed
form for decode runs, checked against it), and takes each inter-token gap as the same
subtraction, so every timestamp, every step row, every inter-token gap and every summary figure
is the same float, and the files are the same bytes. A difference in the last bit is a bug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from servesim.config import validate_document
from servesim.core.replica import Replica
from servesim.inputs.files import yaml_mapping
from servesim.pipeline import prepare, simulate
from servesim.pipeline.render import result_files
from servesim.pipeline.result import RunResult

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def both_ways(document: dict[str, Any]) -> tuple[RunResult, RunResult]:
    plan = prepare(validate_document(document))
    return simulate(plan, fast_forward=False), simulate(plan, fast_forward=True)


def fast_forwarded_steps(result: RunResult) -> int:
    return sum(unit.fast_forwarded_steps for run in result.groups for unit in run.replicas
               if isinstance(unit, Replica))


def assert_same(reference: RunResult, fast: RunResult) -> None:
    a, b = reference.request_state, fast.request_state
    for column in ("first_scheduled", "first_token", "last_token", "finish", "max_itl", "computed",
                   "generated", "preemptions", "status", "replica", "blocks_held"):
        np.testing.assert_array_equal(getattr(a, column), getattr(b, column), err_msg=column)
    for ra, rb in zip(a.itl.arrays(), b.itl.arrays(), strict=True):
        np.testing.assert_array_equal(ra, rb)
    steps_a, steps_b = reference.step_log.records(), fast.step_log.records()
    assert steps_a.dtype == steps_b.dtype
    np.testing.assert_array_equal(steps_a, steps_b)
    assert reference.sim_time_s == fast.sim_time_s
    assert result_files(reference) == result_files(fast)  # summary, config, parquet tables


def experiment(**overrides: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": "ff", "seed": 0, "model": "llama-3-8b", "hardware": "h100-sxm-80gb", "engine": "vllm-v0",
        "output": "full", "policy": {"name": "continuous"},
        "workload": {"arrival": {"process": "poisson", "rate": 20.0}, "num_requests": 80,
                     "prompt": {"dist": "uniform", "low": 16, "high": 600},
                     "output": {"dist": "uniform", "low": 1, "high": 300}}}
    document.update(overrides)
    return document


POLICIES = [{"name": "continuous"}, {"name": "chunked_prefill"}, {"name": "sjf"},
            {"name": "continuous", "order": "decode_first"}, {"name": "priority"},
            {"name": "static", "batch_size": 4}]


SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "acceptance": {"rate": 0.7}}


def sessions_workload(rate: float, count: int = 10) -> dict[str, Any]:
    """Chat sessions: each turn after the first is released by the previous turn's completion
    (``servesim.core.release``), at a time the arrival table does not hold."""
    return {"arrival": {"process": "poisson", "rate": rate},
            "sessions": {"count": count, "turns": {"dist": "uniform", "low": 1, "high": 3},
                         "user_tokens": {"dist": "uniform", "low": 16, "high": 200},
                         "output": {"dist": "uniform", "low": 1, "high": 150},
                         "think_time_s": {"dist": "exponential", "mean": 0.3}}}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=(Phase.explicit, Phase.reuse, Phase.generate))  # shrinking a run is slow
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(POLICIES),
       rate=st.sampled_from([0.5, 4.0, 30.0, 200.0]), replicas=st.integers(1, 2),
       block_size=st.sampled_from([1, 16, 32]), max_num_seqs=st.sampled_from([4, 32, 256]),
       blocks=st.sampled_from([None, 60, 400]),
       model=st.sampled_from(["llama-3-8b", "mistral-7b", "gemma-3-27b", "qwen3-30b-a3b"]),
       variant=st.sampled_from([None, None, "speculative", "sessions"]))
def test_fast_forward_matches_step_by_step(seed: int, policy: dict[str, Any], rate: float, replicas: int,
                                           block_size: int, max_num_seqs: int, blocks: int | None,
                                           model: str, variant: str | None) -> None:
    """Every policy, one or two replicas behind the router, tight and loose KV pools (so runs end
    at block shortfalls and preemptions), sparse and dense arrivals, full, windowed and MoE
    models: the same results both ways. Speculative groups and session workloads (requests
    released by completions) cannot be read ahead: they run step by step, and stay exact."""
    deployment: dict[str, Any] = {"replicas": replicas, "block_size": block_size,
                                  "max_num_seqs": max_num_seqs}
    if model == "gemma-3-27b":
        deployment["tp"] = 2
    if blocks is not None:
        deployment["num_gpu_blocks"] = max(blocks, (600 + 300) // block_size + 2)
    if variant == "speculative" and policy["name"] == "static":  # static does not speculate
        policy = {"name": "continuous"}
    document = experiment(seed=seed, model=model, policy=policy, deployment=deployment)
    document["workload"]["arrival"]["rate"] = rate
    if variant == "speculative":
        document["speculative"] = SPECULATIVE
    elif variant == "sessions":
        document["workload"] = sessions_workload(rate)
    reference, fast = both_ways(document)
    assert fast_forwarded_steps(reference) == 0
    if variant is not None:
        assert fast_forwarded_steps(fast) == 0
    assert_same(reference, fast)


def test_runs_are_fast_forwarded_and_exact() -> None:
    """A sparse workload: most steps are taken in runs, and nothing changes."""
    reference, fast = both_ways(experiment(seed=3))
    assert fast_forwarded_steps(fast) > len(fast.step_log) // 2
    assert_same(reference, fast)


def test_chunked_prefill_decode_steps_take_the_decode_path() -> None:
    reference, fast = both_ways(experiment(policy={"name": "chunked_prefill"}, seed=5))
    assert fast_forwarded_steps(fast) > len(fast.step_log) // 2
    assert_same(reference, fast)


@pytest.mark.parametrize("overrides", [
    {"deployment": {"kind": "disaggregated", "link": {"kind": "nvlink"}}},
    {"deployment": {"pp": 2, "tp": 1}},
    {"deployment": {"enable_prefix_caching": True},
     "workload": {"arrival": {"process": "poisson", "rate": 5.0}, "num_requests": 60,
                  "prompt": {"dist": "uniform", "low": 16, "high": 300},
                  "output": {"dist": "fixed", "value": 40}, "shared_prefix": {"tokens": 128, "groups": 2}}},
    {"policy": {"name": "priority", "preemption_mode": "swap"}},
    {"speculative": SPECULATIVE},
    {"policy": {"name": "chunked_prefill"}, "speculative": SPECULATIVE},
    {"workload": sessions_workload(2.0, count=20)},
    {"deployment": {"kind": "fleet", "groups": {"a": {"replicas": 2}}}},
], ids=["disaggregated", "pipeline", "prefix-caching", "swap", "speculative", "speculative-chunked",
        "sessions", "fleet"])
def test_what_does_not_declare_it_runs_step_by_step(overrides: dict[str, Any]) -> None:
    """Topologies, pools and policies that do not declare fast-forward, speculative groups,
    workloads whose requests are released by completions and fleets fall back to steps."""
    reference, fast = both_ways(experiment(seed=1, **overrides))
    assert fast_forwarded_steps(fast) == 0
    assert_same(reference, fast)


def shipped_experiments() -> list[tuple[str, dict[str, Any]]]:
    """Every shipped example as experiments: each experiment file, and the first run of every
    point of every shipped sweep."""
    from servesim.sweep.plan import plan_sweep
    from servesim.sweep.spec import is_sweep_file, load_sweep

    found = []
    for path in sorted([*CONFIGS.glob("*.yaml"), *(CONFIGS / "sweeps").glob("*.yaml")]):
        if not is_sweep_file(path):
            found.append((path.stem, yaml_mapping(path, "config")))
            continue
        for point in plan_sweep(load_sweep(path)).points:
            if point.runs:
                found.append((f"{path.stem}-{point.index}", dict(point.runs[0].document)))
    return found


SHIPPED = shipped_experiments()


@pytest.mark.parametrize("document", [doc for _, doc in SHIPPED], ids=[name for name, _ in SHIPPED])
def test_shipped_examples_give_the_same_results_both_ways(document: dict[str, Any]) -> None:
    """Each shipped experiment and sweep point (its workload cut to 120 requests to keep the suite
    short), with full output: the same files, byte for byte."""
    document = {**document, "output": "full"}
    workload = dict(document["workload"])
    workload["num_requests"] = min(120, workload.get("num_requests") or 120)
    document["workload"] = workload
    reference, fast = both_ways(document)
    assert_same(reference, fast)


def test_linked_workloads_turn_fast_forward_off() -> None:
    """A workload with links may release a request at any completion: the next arrival is not
    in the table, so the whole run is step by step whatever is asked."""
    from servesim.core.sim import Sim
    from servesim.workloads import build_workload, parse_workload_config

    table = build_workload(parse_workload_config(sessions_workload(1.0, count=3)), 0)
    assert table.links is not None
    assert not Sim.start(table, 0, fast_forward=True).fast_forward
    plain = build_workload(parse_workload_config(experiment()["workload"]), 0)
    assert Sim.start(plain, 0, fast_forward=True).fast_forward


def test_closed_loop_clients_and_the_v1_engine_fall_back_and_stay_exact() -> None:
    """Closed-loop clients send at completion times the request table does not hold, and vLLM V1
    (an engine runtime with graph padding and host time) does not declare fast-forward: both run
    step by step under fast_forward=True, with the reference's results."""
    closed = {"arrival": {"process": "closed", "concurrency": 4}, "num_requests": 40,
              "prompt": {"dist": "uniform", "low": 16, "high": 600},
              "output": {"dist": "uniform", "low": 1, "high": 300}}
    v1 = experiment(engine="vllm", policy={"name": "chunked_prefill"})
    for document in (experiment(workload=closed), v1):
        reference, fast = both_ways(document)
        assert fast_forwarded_steps(fast) == 0
        assert_same(reference, fast)
