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


def contended_plan(policy: str, prefix: bool, seed: int = 7) -> Any:
    """A tight KV pool at a high rate (preemptions, recomputes, admissions of several prompts
    at once), with and without prefix caching (hits, evictions)."""
    document = experiment(seed=seed, policy={"name": policy}, engine="vllm",
                          deployment={"num_gpu_blocks": 80, "block_size": 16,
                                      "enable_prefix_caching": prefix})
    document["workload"]["arrival"]["rate"] = 40.0
    if prefix:
        document["workload"]["shared_prefix"] = {"tokens": 64, "groups": 3}
    return prepare(validate_document(document))


POLICIES = [{"name": "continuous"}, {"name": "chunked_prefill"}, {"name": "sjf"},
            {"name": "continuous", "order": "decode_first"}, {"name": "priority"},
            {"name": "static", "batch_size": 4}, {"name": "prefill_first"},
            {"name": "prefill_first", "mixed": True, "new_token_ratio_decay_steps": 20},
            {"name": "no_evict"}]
ENGINES = ["vllm-v0", "vllm", "sglang", "trtllm"]


SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "acceptance": {"rate": 0.7}}


def sessions_workload(rate: float, count: int = 10) -> dict[str, Any]:
    """Chat sessions: each turn after the first is released by the previous turn's completion
    (``servesim.core.release``), at a time the arrival table does not hold."""
    return {"arrival": {"process": "poisson", "rate": rate},
            "sessions": {"count": count, "turns": {"dist": "uniform", "low": 1, "high": 3},
                         "user_tokens": {"dist": "uniform", "low": 16, "high": 200},
                         "output": {"dist": "uniform", "low": 1, "high": 150},
                         "think_time_s": {"dist": "exponential", "mean": 0.3}}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=(Phase.explicit, Phase.reuse, Phase.generate))  # shrinking a run is slow
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(POLICIES),
       rate=st.sampled_from([0.5, 4.0, 30.0, 200.0]), replicas=st.integers(1, 2),
       block_size=st.sampled_from([1, 16, 32]), max_num_seqs=st.sampled_from([4, 32, 256]),
       blocks=st.sampled_from([None, 60, 400]),
       model=st.sampled_from(["llama-3-8b", "mistral-7b", "gemma-3-27b", "qwen3-30b-a3b",
                              "qwen3-next-80b-a3b", "nemotron-3-nano-30b-a3b"]),
       variant=st.sampled_from([None, None, "speculative", "sessions", "prefix"]),
       engine=st.sampled_from(ENGINES), hardware=st.sampled_from(["h100-sxm-80gb", "a100-sxm-80gb"]))
def test_fast_forward_matches_step_by_step(seed: int, policy: dict[str, Any], rate: float, replicas: int,
                                           block_size: int, max_num_seqs: int, blocks: int | None,
                                           model: str, variant: str | None, engine: str,
                                           hardware: str) -> None:
    """Every engine (its runtime: graph padding, host time overlapped or serial) with its own
    scheduler or any policy, one or two replicas behind the router, tight and loose KV pools (so
    runs end at block shortfalls and preemptions), sparse and dense arrivals, full, windowed and
    MoE models, KV tiles (A100), prefix caching, session workloads (requests released by
    completions, announced to ``NextArrival``): the same results both ways. Speculative groups
    cannot be read ahead (their accepted tokens are drawn per step): they run step by step, and
    stay exact. A hybrid model's linear-attention layers (Qwen3-Next) and Nemotron-H's blocks too."""
    deployment: dict[str, Any] = {"replicas": replicas, "block_size": block_size,
                                  "max_num_seqs": max_num_seqs}
    if model == "gemma-3-27b":
        deployment["tp"] = 2
    if model == "qwen3-next-80b-a3b":
        deployment["tp"] = 4  # 160 GB of bf16 weights; its linear layers' state rides in the token part
    if model == "nemotron-3-nano-30b-a3b":
        deployment["tp"] = 2  # 63 GB of bf16 weights in blocks of Mamba2, attention or MoE
    if model == "qwen3-30b-a3b" and engine == "sglang":
        # 57 GiB of bf16 weights: SGLang's own fraction for unchunked prompts (it reserves 1.5 x
        # max_prefill_tokens MiB, 24 GiB) leaves 54.6 GiB of an 80 GB GPU, so set it as a user would
        deployment["gpu_memory_utilization"] = 0.88
    if blocks is not None:
        deployment["num_gpu_blocks"] = max(blocks, (600 + 300) // block_size + 2)
    if variant == "speculative" and policy["name"] in ("static", "prefill_first"):  # no speculation
        policy = {"name": "continuous"}
    document = experiment(seed=seed, model=model, policy=policy, deployment=deployment, engine=engine,
                          hardware=hardware)
    if engine != "vllm-v0" and seed % 2 and not (engine == "sglang" and variant == "speculative"):
        del document["policy"]  # the engine's own scheduler (chunked_prefill, prefill_first, no_evict)
    document["workload"]["arrival"]["rate"] = rate
    if variant == "speculative":
        document["speculative"] = SPECULATIVE
    elif variant == "sessions":
        document["workload"] = sessions_workload(rate)
    elif variant == "prefix":
        deployment["enable_prefix_caching"] = True
        document["workload"]["shared_prefix"] = {"tokens": 64, "groups": 3}
        if document.get("policy", {}).get("name") == "static":
            document["policy"] = {"name": "continuous"}
    if document.get("policy", {}).get("name") == "static":
        deployment["enable_prefix_caching"] = False  # vLLM V1 and SGLang cache prefixes by default
    reference, fast = both_ways(document)
    assert fast_forwarded_steps(reference) == 0
    if variant == "speculative":
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
    {"policy": {"name": "priority", "preemption_mode": "swap"}},
    {"speculative": SPECULATIVE},
    {"policy": {"name": "chunked_prefill"}, "speculative": SPECULATIVE},
    {"deployment": {"kind": "fleet", "groups": {"a": {"replicas": 2}}}},
], ids=["disaggregated", "pipeline", "swap", "speculative", "speculative-chunked", "fleet"])
def test_what_does_not_declare_it_runs_step_by_step(overrides: dict[str, Any]) -> None:
    """Topologies, swap and policies that do not declare fast-forward, speculative groups and
    fleets fall back to steps."""
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


ENGINE_EXAMPLES = [(f"{name}-{engine}", doc, engine) for name, doc in SHIPPED
                   if "engine" in doc and isinstance(doc["engine"], str)
                   for engine in ("vllm", "sglang", "trtllm")]


@pytest.mark.parametrize(("document", "engine"), [(doc, engine) for _, doc, engine in ENGINE_EXAMPLES],
                         ids=[name for name, _, _ in ENGINE_EXAMPLES])
def test_shipped_examples_on_every_engine_give_the_same_results_both_ways(document: dict[str, Any],
                                                                          engine: str) -> None:
    """The shipped examples pin vLLM V0; the same experiments on vLLM V1, SGLang and TensorRT-LLM
    (their runtimes, their KV block sizes, V1's prefix caching, 80 requests each) fast-forward
    and give the same files both ways."""
    document = {**document, "output": "full", "engine": engine}
    document["workload"] = {**document["workload"], "num_requests": 80}
    reference, fast = both_ways(document)
    assert_same(reference, fast)


@pytest.mark.parametrize("front_end_s", [None, 0.003])
@pytest.mark.parametrize("rate", [0.5, 2.0, 20.0])
def test_linked_workloads_fast_forward_exactly(rate: float, front_end_s: float | None) -> None:
    """Sessions: each turn after the first is released by the previous turn's completion (after
    a think time, then the front end's latency), at a time the arrival table does not hold. The
    releases announce their entries to ``NextArrival``, so runs end before them, and every figure
    is the step-by-step one."""
    document = experiment(seed=int(rate * 10), workload=sessions_workload(rate, count=20), engine="vllm")
    if front_end_s is not None:
        document["engine"] = {"name": "vllm", "frontend_latency_s": front_end_s}
    reference, fast = both_ways(document)
    assert fast_forwarded_steps(reference) == 0
    assert fast_forwarded_steps(fast) > len(fast.step_log) // 3
    assert_same(reference, fast)


def test_closed_loop_behind_a_router_runs_step_by_step() -> None:
    """With two replicas, a finish on one can send a request that the router hands to the other
    in the middle of a run planned before it was announced: those replicas take their steps one
    by one (``Sim.sends_at_run_time``), with the reference's results."""
    closed = {"arrival": {"process": "closed", "concurrency": 8}, "num_requests": 60,
              "prompt": {"dist": "uniform", "low": 16, "high": 600},
              "output": {"dist": "uniform", "low": 1, "high": 300}}
    reference, fast = both_ways(experiment(workload=closed, deployment={"replicas": 2}))
    assert fast_forwarded_steps(fast) == 0
    assert_same(reference, fast)


CLOSED_LOOPS = [(4, 0.0, None), (4, 0.0, 0.004), (16, 0.05, None), (16, 0.05, 0.02), (64, 0.0, 0.001)]


@pytest.mark.parametrize(("concurrency", "think_s", "front_end_s"), CLOSED_LOOPS)
@pytest.mark.parametrize("engine", ["vllm-v0", "vllm"])
def test_closed_loop_clients_fast_forward_exactly(concurrency: int, think_s: float,
                                                  front_end_s: float | None, engine: str) -> None:
    """Closed-loop clients send at completion times the request table does not hold: each
    announces its next entry (after its think time and the front end's latency) to
    ``NextArrival``, so runs end before it, and the results are the step-by-step ones."""
    closed = {"arrival": {"process": "closed", "concurrency": concurrency, "think_time_s": think_s},
              "num_requests": 120, "prompt": {"dist": "uniform", "low": 16, "high": 600},
              "output": {"dist": "uniform", "low": 1, "high": 300}}
    document = experiment(workload=closed, engine=engine, seed=concurrency)
    if front_end_s is not None:
        document["engine"] = {"name": engine, "frontend_latency_s": front_end_s}
    reference, fast = both_ways(document)
    assert fast_forwarded_steps(reference) == 0
    assert fast_forwarded_steps(fast) > len(fast.step_log) // 3
    assert_same(reference, fast)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("hardware", ["h100-sxm-80gb", "a100-sxm-80gb"])
def test_every_engine_fast_forwards_with_its_scheduler(engine: str, hardware: str) -> None:
    """vLLM V1 (chunked_prefill, prefix caching on), SGLang (prefill_first) and TensorRT-LLM
    (no_evict) with their runtimes (CUDA-graph padding, overlapped host time; the A100 profile's
    decode kernel reads whole KV tiles): most steps are taken in runs, and nothing changes."""
    document = experiment(seed=3, engine=engine, hardware=hardware)
    del document["policy"]
    reference, fast = both_ways(document)
    assert fast_forwarded_steps(fast) > len(fast.step_log) // 2
    assert_same(reference, fast)


def test_prefix_caching_pools_fast_forward() -> None:
    """Decodes grow past the hashed prompt blocks, and an eviction only makes admission harder:
    a prefix-caching pool under pressure (evictions inside runs) fast-forwards exactly."""
    document = experiment(seed=1, deployment={"enable_prefix_caching": True, "num_gpu_blocks": 120},
                          workload={"arrival": {"process": "poisson", "rate": 5.0}, "num_requests": 60,
                                    "prompt": {"dist": "uniform", "low": 16, "high": 300},
                                    "output": {"dist": "fixed", "value": 40},
                                    "shared_prefix": {"tokens": 128, "groups": 2}})
    reference, fast = both_ways(document)
    assert fast_forwarded_steps(fast) > 0
    assert_same(reference, fast)
    evicted = [unit.state.pool.evicted_blocks for run in fast.groups for unit in run.replicas]
    assert evicted == [unit.state.pool.evicted_blocks for run in reference.groups for unit in run.replicas]


def test_sglang_runs_end_where_the_decaying_ratio_admits() -> None:
    """SGLang's admission reserves new_token_ratio of the running outputs; the ratio decays every
    decode step, so a request refused at a run's start may fit some steps later: the run must
    end there. A tight pool with a queue and a fast decay: runs are cut by the policy's bound,
    and every figure is the step-by-step one."""
    from servesim.policies.prefill_first import PrefillFirst

    document = experiment(seed=2, engine="sglang", policy={"name": "prefill_first",
                                                           "new_token_ratio_decay_steps": 30},
                          deployment={"num_gpu_blocks": 3000, "block_size": 1})
    document["workload"]["arrival"]["rate"] = 200.0
    calls: list[int] = []
    original = PrefillFirst.run_limit

    def counting(self: PrefillFirst, batch: Any) -> Any:
        bound = original(self, batch)
        if bound is None:
            return None

        def limit(steps: int, free: np.ndarray) -> int:
            calls.append(int(bound(steps, free) < steps))
            return bound(steps, free)
        return limit

    PrefillFirst.run_limit = counting  # type: ignore[method-assign]
    try:
        reference, fast = both_ways(document)
    finally:
        PrefillFirst.run_limit = original  # type: ignore[method-assign]
    assert sum(calls) > 0  # some runs were cut short by the ratio's decay
    assert fast_forwarded_steps(fast) > 0
    assert_same(reference, fast)


def test_sglang_ratio_decays_as_step_by_step() -> None:
    """after_run's decay is after_step's, applied once per step (the same floats)."""
    from servesim.policies.prefill_first import PrefillFirst, PrefillFirstOptions

    class Stub:
        running = np.empty(0, dtype=np.int64)

    policy = PrefillFirst(Stub(), PrefillFirstOptions(new_token_ratio_decay_steps=7))  # type: ignore[arg-type]
    ratios = policy._decayed(12)
    stepped = [policy.new_token_ratio]
    for _ in range(12):
        stepped.append(max(policy._min_ratio, stepped[-1] - policy._decay))
    assert ratios == stepped and ratios[-1] == policy._min_ratio
