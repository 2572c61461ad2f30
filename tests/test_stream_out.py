"""The front end's streaming cost (``CpuCosts.frontend_chunk_s``, knob ``engine.frontend_chunk_s``):
one process sends every streamed chunk, so clients see tokens late once the engine emits chunks
faster than it sends them (``servesim.core.stream_out``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from engine_helpers import experiment as helper_experiment
from engine_helpers import run, tabulate
from test_fast_forward import assert_same, both_ways, experiment, fast_forwarded_steps
from test_front_end import document as front_end_document

from servesim.calibration.replay import Coefficients
from servesim.calibration.serving_data import ServingRow
from servesim.calibration.serving_validate import STREAM_GRID_S, pick_stream, runtime_profile_yaml
from servesim.config import validate_document
from servesim.core.stream_out import OutputStream
from servesim.engines import make_engine
from servesim.errors import ServesimError
from servesim.pipeline import prepare, simulate
from servesim.workloads import build_workload, parse_workload_config


def document(arrival: dict[str, Any], requests: int, prompt: int, output: int, chunk_s: float | None,
             engine: str = "vllm-v0", **extra: Any) -> dict[str, Any]:
    """The front-end tests' experiment, with a time per chunk instead of a latency."""
    built = front_end_document(arrival, requests, prompt, output, None, engine, **extra)
    if chunk_s is not None:
        built["engine"]["frontend_chunk_s"] = chunk_s
    return built


def test_the_sender_is_lindleys_recursion_worked_by_hand() -> None:
    stream = OutputStream(0.01)
    assert stream.emit(1.0, 3) == pytest.approx(0.03)  # idle: sent at 1.00 + 3 x 0.01
    assert stream.sent_until == pytest.approx(1.03)
    assert stream.emit(1.02, 2) == pytest.approx(0.03)  # busy until 1.03: sent at 1.05
    assert stream.emit(2.0, 0) == 0.0  # nothing to send: no lag, the backlog is unchanged
    assert stream.sent_until == pytest.approx(1.05)
    assert stream.emit(2.0, 1) == pytest.approx(0.01)  # idle again
    fast = OutputStream(0.001)
    # 5 chunks a step, steps 1 ms apart: 5 ms of sending each, so the lag grows 4 ms a step.
    assert fast.emit_steps([3.0, 3.001, 3.002], 5) == pytest.approx(0.013)
    assert fast.sent_until == pytest.approx(3.015)


def test_a_lone_request_is_seen_one_chunk_late_and_its_steps_are_unchanged() -> None:
    """One request on an idle replica: each step hands over one chunk, sent 2 ms later, so the
    client sees its first and last token 2 ms late: TTFT and E2E grow by 2 ms, TPOT does not."""
    arrival = {"process": "poisson", "rate": 1.0}
    without = tabulate(run(validate_document(document(arrival, 1, 512, 8, None)), None))
    late = tabulate(run(validate_document(document(arrival, 1, 512, 8, 0.002)), None))
    a, b = without.requests.iloc[0], late.requests.iloc[0]
    assert b["ttft_s"] == pytest.approx(a["ttft_s"] + 0.002, rel=1e-12)
    assert b["e2e_s"] == pytest.approx(a["e2e_s"] + 0.002, rel=1e-12)
    assert b["tpot_s"] == pytest.approx(a["tpot_s"], rel=1e-12)
    np.testing.assert_array_equal(late.steps["duration_s"].to_numpy(), without.steps["duration_s"].to_numpy())


def test_a_saturated_front_end_caps_a_closed_loop_at_one_chunk_per_chunk_s() -> None:
    """32 clients, 640 requests of 128 + 64 tokens, 2 ms per chunk: the engine emits 32 chunks
    every ~10 ms step (3,000 a second), the front end sends 500. The clients stay in lock-step:
    each round they send together, the engine prefills the 32 prompts (P seconds), and from the
    first chunk on the front end is busy until it has sent all 32 x 64 chunks, when every client
    sees its last token at once and sends again. So a round lasts exactly P + 32 x 64 x 2 ms
    (a round's first tokens are seen P + 32 x 2 ms after the send: the front end sends a step's
    chunks together), the run's throughput is 1 / (64 x 2 ms)
    but for the prefills, and Little's law holds on the times the clients see (they send their
    next request when they see the last token): mean E2E x throughput = 32."""
    chunk_s, clients, requests, output = 0.002, 32, 640, 64
    tables = tabulate(run(validate_document(document({"process": "closed", "concurrency": clients},
                                                     requests, 128, output, chunk_s)), None))
    done = tables.requests
    assert (done["status"] == "completed").all()
    rounds = done.groupby("arrival_s")
    assert rounds.ngroups == requests // clients and (rounds.size() == clients).all()
    sends = np.array(sorted(rounds.groups))
    # a round's first step's chunks wait for nothing but each other
    prefill = rounds["ttft_s"].min().to_numpy() - clients * chunk_s
    sending = clients * output * chunk_s
    np.testing.assert_allclose(np.diff(sends), prefill[:-1] + sending, rtol=1e-9)
    span = float((done["arrival_s"] + done["e2e_s"]).max())
    assert span == pytest.approx(prefill.sum() + requests * output * chunk_s, rel=1e-9)
    throughput = requests / span
    assert 1 / (output * chunk_s) * 0.95 < throughput < 1 / (output * chunk_s)
    assert done["e2e_s"].mean() * throughput == pytest.approx(clients, rel=1e-9)
    # Without the streaming cost the same loop runs several times faster: the cap is the front end's.
    free = tabulate(run(validate_document(document({"process": "closed", "concurrency": clients},
                                                   requests, 128, output, None)), None)).requests
    assert float((free["arrival_s"] + free["e2e_s"]).max()) < span / 4


@pytest.mark.parametrize("engine", ["vllm-v0", "vllm", "sglang"])
@pytest.mark.parametrize("arrival", [{"process": "closed", "concurrency": 4},
                                     {"process": "closed", "concurrency": 48, "think_time_s": 0.02},
                                     {"process": "poisson", "rate": 30.0}])
def test_fast_forward_gives_the_step_by_step_results_with_a_streaming_cost(engine: str,
                                                                           arrival: dict[str, Any]) -> None:
    workload = {"arrival": arrival, "num_requests": 120,
                "prompt": {"dist": "uniform", "low": 16, "high": 600},
                "output": {"dist": "uniform", "low": 1, "high": 300}}
    document = experiment(workload=workload, engine={"name": engine, "frontend_chunk_s": 0.0004}, seed=5)
    reference, fast = both_ways(document)
    assert fast_forwarded_steps(fast) > len(fast.step_log) // 3
    assert_same(reference, fast)
    if arrival["process"] == "poisson":
        # Open loop: the engine's schedule is the same as without the cost (nothing it reads
        # changes), and every request is seen at least one chunk later.
        free = simulate(prepare(validate_document(experiment(workload=workload, engine=engine, seed=5))))
        late, soon = reference.request_state, free.request_state
        np.testing.assert_array_equal(reference.step_log.records(), free.step_log.records())
        assert np.all(late.first_token - soon.first_token >= 0.0004 - 1e-12)
        assert np.all(late.finish - soon.finish >= 0.0004 - 1e-12)


def test_deployments_it_does_not_model_say_so_in_one_line() -> None:
    arrival = {"process": "poisson", "rate": 2.0}
    for extra in ({"deployment": {"pp": 2, "tp": 1}}, {"deployment": {"kind": "disaggregated"}}):
        plan = prepare(validate_document(document(arrival, 4, 256, 4, 0.001, **extra)))
        with pytest.raises(ServesimError, match=r"engine\.frontend_chunk_s") as caught:
            simulate(plan)
        assert "\n" not in str(caught.value)


def test_the_knob_overrides_the_engine_and_profiles_carry_it(tmp_path: Any) -> None:
    assert make_engine("sglang", {}).runtime("h200-sxm-141gb").frontend_chunk_s == 0.0  # shipped: off
    assert make_engine("trtllm", {"frontend_chunk_s": 1e-4}).runtime("h100-sxm-80gb").frontend_chunk_s == 1e-4
    text = runtime_profile_yaml("sglang", Coefficients(fixed_s=1e-3, frontend_chunk_s=5.1e-5), "test")
    path = tmp_path / "sglang.yaml"
    path.write_text(text)
    assert make_engine("sglang", {"profile": str(path)}).runtime("h200-sxm-141gb").frontend_chunk_s == 5.1e-5
    assert "frontend_chunk_s" not in runtime_profile_yaml("sglang", Coefficients(fixed_s=1e-3), "test")
    with pytest.raises(ServesimError, match=r"engine.frontend_chunk_s"):
        prepare(validate_document(document({"process": "poisson", "rate": 1.0}, 1, 10, 2, -1.0)))


def row(number: int, model: str, ttft_s: float, tpot_s: float) -> ServingRow:
    return ServingRow(row=number, engine="sglang", model=model, hf_model=model, gpu="h200_sxm", tp=1,
                      precision="bf16", isl=1000, osl=100, concurrency=256, ttft_s=ttft_s, tpot_s=tpot_s,
                      version="")


def test_the_fit_keeps_zero_unless_saturated_rows_say_otherwise_beyond_their_noise() -> None:
    """20 rows whose front end saturates, each measured at 80 us per chunk (TTFT rising and TPOT
    falling with it, +/- 1% noise), and 40 rows it never touches (flat curves with 0.1% jitter per
    grid value, measured +/- 5% off): all together pick 80 us; the untouched rows alone pick 0,
    although the least mean loss among them lies elsewhere (the jitter), because no value beats 0
    by 2.5 standard errors; one row, or two that disagree, are no evidence either."""
    grid = np.asarray(STREAM_GRID_S)
    curves: dict[int, np.ndarray] = {}
    rows = []
    for i in range(20):
        curves[i] = np.stack([0.2 + 10 * grid, 0.03 - 50 * grid], axis=1)
        noise = 1 + 0.01 * np.sin(i)
        rows.append(row(i, f"m{i % 3}", (0.2 + 8e-4) * noise, (0.03 - 4e-3) / noise))
    flat = []
    rng = np.random.default_rng(1)
    for i in range(20, 60):
        jitter = 1 + 1e-3 * rng.standard_normal(grid.size)
        curves[i] = np.stack([0.5 * jitter, 0.01 * jitter], axis=1)
        flat.append(row(i, "flat", 0.5 * (1 + 0.05 * np.cos(i)), 0.01 * (1 + 0.05 * np.sin(i))))
    assert pick_stream(curves, rows + flat) == 8e-5
    assert pick_stream(curves, rows) == 8e-5
    assert pick_stream(curves, flat) == 0.0
    losses = np.mean([np.abs(np.log(curves[r.row] / [r.ttft_s, r.tpot_s])).sum(axis=1) for r in flat], axis=0)
    assert np.argmin(losses) != 0  # so the rule, not the jitter, keeps 0
    disagree = {0: np.stack([0.2 + 10 * np.minimum(grid, 3e-5), np.full(grid.size, 0.02)], axis=1),
                1: np.stack([0.2 + 10 * grid, 0.03 - 50 * grid], axis=1)}
    pair = [row(0, "a", 0.2 + 3e-4, 0.02), row(1, "b", 0.2 + 8e-4, 0.03 - 4e-3)]
    assert pick_stream(disagree, pair[:1]) == 0.0  # one row has no standard error: no evidence
    assert pick_stream(disagree, pair) == 0.0
    assert pick_stream(curves, []) == 0.0


def test_a_one_group_fleet_streams_as_the_colocated_deployment_does() -> None:
    """Fleet replicas get their own front ends too: the same requests, replicas and router give
    the same (late) latencies to the bit, later than without the cost."""
    trace = build_workload(parse_workload_config({
        "arrival": {"process": "poisson", "rate": 20}, "num_requests": 300,
        "lengths": {"preset": "azure-conversation"}}), 0)
    engine = {"name": "vllm-v0", "frontend_chunk_s": 0.001}
    colocated = tabulate(run(helper_experiment({"replicas": 2}, engine=engine), trace)).requests
    fleet = tabulate(run(helper_experiment({"kind": "fleet", "groups": {"a": {"replicas": 2}}}, engine=engine,
                                           router={"name": "round_robin"}), trace)).requests
    for column in ("replica", "ttft_s", "tpot_s", "e2e_s"):
        np.testing.assert_array_equal(colocated[column].to_numpy(), fleet[column].to_numpy())
    free = tabulate(run(helper_experiment({"replicas": 2}, engine="vllm-v0"), trace)).requests
    assert np.all(fleet["ttft_s"].to_numpy() >= free["ttft_s"].to_numpy() + 0.001 - 1e-12)
