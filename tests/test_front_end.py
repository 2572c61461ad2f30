"""The engine front end's latency per request (``CpuCosts.frontend_s``, knob
``engine.frontend_latency_s``): every request enters the deployment that long after its client sent
it, so it adds to TTFT and end-to-end latency, never to a step, and a closed loop's cycle grows by it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from engine_helpers import run, tabulate

from servesim import BatchShape
from servesim.calibration.engine_fit import FRONT_END_MAX_CONCURRENCY, Measurement, fit_front_end
from servesim.calibration.replay import (
    TRACE_FRONTEND_S,
    ZERO_CPU,
    Coefficients,
    retimes_exactly,
    simulate_document,
    trace_run,
)
from servesim.calibration.serving_validate import runtime_profile_yaml
from servesim.calibration.stacked_means import StackedMeans
from servesim.config import validate_document
from servesim.engines import make_engine
from servesim.errors import ServesimError
from servesim.pipeline import prepare, simulate
from servesim.topology.resolve import resolve_topology

LATENCY = 0.037


def document(arrival: dict[str, Any], requests: int, prompt: int, output: int, latency: float | None,
             engine: str = "vllm-v0", **extra: Any) -> dict[str, Any]:
    knobs: dict[str, Any] = {"name": engine}
    if latency is not None:
        knobs["frontend_latency_s"] = latency
    return {"model": "llama-3-8b", "hardware": "h100-sxm-80gb", "engine": knobs, "seed": 3,
            "workload": {"arrival": arrival, "num_requests": requests,
                         "prompt": {"dist": "fixed", "value": prompt},
                         "output": {"dist": "fixed", "value": output}}, **extra}


def test_a_lone_request_pays_the_latency_once_in_ttft_and_e2e_and_never_in_a_step() -> None:
    """One request on an idle replica: TTFT = latency + its prefill step; the steps (and so TPOT)
    are those of the run without a front end, each shifted by the latency."""
    arrival = {"process": "poisson", "rate": 1.0}
    without = tabulate(run(validate_document(document(arrival, 1, 512, 8, None)), None))
    with_fe = tabulate(run(validate_document(document(arrival, 1, 512, 8, LATENCY)), None))
    a, b = without.requests.iloc[0], with_fe.requests.iloc[0]
    assert b["arrival_s"] == a["arrival_s"]  # the client sent it then
    assert b["ttft_s"] == pytest.approx(a["ttft_s"] + LATENCY, rel=1e-12)
    assert b["e2e_s"] == pytest.approx(a["e2e_s"] + LATENCY, rel=1e-12)
    assert b["tpot_s"] == pytest.approx(a["tpot_s"], rel=1e-12)
    assert with_fe.steps["duration_s"].to_numpy() == pytest.approx(without.steps["duration_s"].to_numpy(),
                                                                   rel=1e-15)
    assert with_fe.steps["start_s"].to_numpy() == pytest.approx(without.steps["start_s"].to_numpy() + LATENCY,
                                                                rel=1e-12)


def test_a_closed_loop_cycle_grows_by_the_latency_littles_law() -> None:
    """4 clients, 40 one-token requests of 256 tokens, answered by one prefill step of S each
    round: every response time is latency + S, the clients send every latency + S, and the
    throughput is N / (S + latency) (Little's law with the front end counted in R)."""
    config = validate_document(document({"process": "closed", "concurrency": 4}, 40, 256, 1, LATENCY))
    tables = tabulate(run(config, None))
    service = resolve_topology(config).kv_group.cost_model().step_time(BatchShape.prefill(256, 256, 256, 256))
    requests = tables.requests
    assert (requests["status"] == "completed").all()
    assert requests["e2e_s"].to_numpy() == pytest.approx(np.full(40, LATENCY + service), rel=1e-12)
    assert requests["ttft_s"].to_numpy() == pytest.approx(np.full(40, LATENCY + service), rel=1e-12)
    sent = np.sort(requests["arrival_s"].unique())
    assert sent == pytest.approx(np.arange(10) * (LATENCY + service), rel=1e-12)
    span = 10 * (LATENCY + service)
    assert tables.summary["throughput"]["requests_per_s"] == pytest.approx(40 / span, rel=1e-9)


def test_a_session_turn_enters_the_latency_after_the_client_sends_it() -> None:
    """Sessions: a follow-up turn is sent when the previous answer ends (plus the think time); it
    still crosses the front end, so its TTFT includes the latency exactly as a first turn's does,
    and each turn is sent R_j + Z after the one before, R_j counting the latency."""
    workload = {"arrival": {"process": "constant", "rate": 1.0}, "sessions": {
        "count": 1, "turns": {"dist": "fixed", "value": 4}, "user_tokens": {"dist": "fixed", "value": 50},
        "output": {"dist": "fixed", "value": 20}, "think_time_s": {"dist": "fixed", "value": 1.0}}}
    base: dict[str, Any] = {"model": "llama-3-8b", "hardware": "h100-sxm-80gb", "seed": 5,
                            "workload": workload}
    plain = tabulate(run(validate_document({**base, "engine": {"name": "vllm-v0"}}), None)).requests
    delayed = tabulate(run(validate_document(
        {**base, "engine": {"name": "vllm-v0", "frontend_latency_s": LATENCY}}), None)).requests
    assert len(plain) == len(delayed) == 4
    assert delayed["ttft_s"].to_numpy() == pytest.approx(plain["ttft_s"].to_numpy() + LATENCY, rel=1e-9)
    assert delayed["tpot_s"].to_numpy() == pytest.approx(plain["tpot_s"].to_numpy(), rel=1e-9)
    sent, e2e = delayed["arrival_s"].to_numpy(), delayed["e2e_s"].to_numpy()
    assert np.diff(sent) == pytest.approx(e2e[:-1] + 1.0, abs=1e-12)


def test_fast_forward_and_step_by_step_agree_with_a_front_end() -> None:
    """The shifted entries are what the fast-forwarding replica bounds its runs by: both modes give
    the same timestamps, bit for bit."""
    doc = document({"process": "poisson", "rate": 20.0}, 300, 300, 80, LATENCY, engine="vllm")
    plan = prepare(validate_document(doc))
    fast = simulate(plan).requests
    steps = simulate(plan, fast_forward=False).requests
    for column in ("arrival_s", "first_token_s", "finish_s"):
        assert np.array_equal(fast[column].to_numpy(), steps[column].to_numpy()), column


def test_the_knob_overrides_the_fitted_latency_and_profiles_carry_it(tmp_path: Any) -> None:
    assert make_engine("trtllm", {"frontend_latency_s": 0.005}).cpu("h100-sxm-80gb").frontend_s == 0.005
    text = runtime_profile_yaml("sglang", Coefficients(fixed_s=1e-3, frontend_s=0.0421), "test")
    path = tmp_path / "sglang.yaml"
    path.write_text(text)
    engine = make_engine("sglang", {"profile": str(path)})
    assert engine.cpu("h200-sxm-141gb").frontend_s == pytest.approx(0.0421)
    assert engine.runtime("h200-sxm-141gb").frontend_s == pytest.approx(0.0421)
    with pytest.raises(ServesimError, match=r"engine.frontend_latency_s"):
        prepare(validate_document(document({"process": "poisson", "rate": 1.0}, 1, 10, 2, -1.0)))


def _closed_trace(concurrency: int, latency: float, prompt: int = 1024) -> tuple[Any, float]:
    """A closed loop simulated with a front end of ``latency`` (the measured run), and the trace
    of the same run made with the replay's 10 us front end (what the replay re-times)."""
    doc = document({"process": "closed", "concurrency": concurrency}, concurrency * 4, prompt, 64, None,
                   engine="vllm", deployment={"enable_prefix_caching": False})
    measured = simulate_document(doc, cpu={**ZERO_CPU, "frontend_latency_s": latency}).requests
    trace = trace_run(simulate_document(doc, cpu={**ZERO_CPU, "frontend_latency_s": TRACE_FRONTEND_S}))
    ttft = float((measured["first_token_s"] - measured["arrival_s"]).mean())
    return trace, ttft


@pytest.mark.parametrize("latency", [0.0, TRACE_FRONTEND_S, 4e-4])
def test_a_drifting_closed_loop_re_times_exactly_for_a_latency_shorter_than_its_steps(latency: float) -> None:
    """24 vLLM V1 clients with 3,000-token prompts: the budget of 8,192 tokens spreads the first
    round's prompts over steps and the clients drift apart, so a request enters a busy replica.
    On the trace made with the replay's 10 us front end, re-timing with CPU coefficients and any
    latency shorter than every step gives the full simulation's TTFT and TPOT to rounding; a
    front end of 0 is a different schedule (a request joins the step that starts as it is sent)."""
    doc = document({"process": "closed", "concurrency": 24}, 96, 3000, 40, None, engine="vllm",
                   deployment={"enable_prefix_caching": False})
    trace = trace_run(simulate_document(doc, cpu={**ZERO_CPU, "frontend_latency_s": TRACE_FRONTEND_S}))
    assert trace.waited is not None and trace.waited[0] and not trace.waited[1:].all()
    c = Coefficients(fixed_s=2e-3, per_seq_s=3e-5, frontend_s=latency)
    full = simulate_document(doc, cpu=c.knobs()).requests
    ttft, tpot = trace.evaluate(c)
    assert retimes_exactly(trace, c)
    assert not retimes_exactly(trace, replace(c, frontend_s=0.05))  # longer than a decode step
    if latency == 0.0:
        assert not np.allclose(ttft, full["ttft_s"].to_numpy(), rtol=1e-3)
        return
    assert ttft == pytest.approx(full["ttft_s"].to_numpy(), rel=1e-9)
    assert tpot == pytest.approx(full["tpot_s"].to_numpy(), rel=1e-9)
    m = Measurement(trace, np.arange(96), np.array([0.5]), np.array([0.02]), concurrency=24)
    stacked = StackedMeans.build([m], c.scales)
    assert stacked is not None
    assert stacked.predicted(c)["ttft"] == pytest.approx(m.predicted(c)[0], rel=1e-12)


def test_the_replay_adds_the_latency_and_the_fit_recovers_it_from_light_rows() -> None:
    """A lock-step loop of 2 clients, its engine idle while the requests cross the front end: the
    re-timed TTFT plus the latency is the simulated one, and fitting recovers the latency; a row
    above FRONT_END_MAX_CONCURRENCY does not steer it."""
    trace, ttft = _closed_trace(2, LATENCY)
    everyone = np.arange(trace.done.size)
    light = Measurement(trace, everyone, np.array([ttft]), np.array([np.nan]), concurrency=2)
    predicted, _ = light.predicted(Coefficients(frontend_s=LATENCY))
    assert predicted[0] == pytest.approx(ttft, rel=1e-9)
    heavy_trace, heavy_ttft = _closed_trace(4, 0.0)
    heavy = Measurement(heavy_trace, np.arange(heavy_trace.done.size), np.array([heavy_ttft * 3]),
                        np.array([np.nan]), concurrency=FRONT_END_MAX_CONCURRENCY + 1)
    fitted = fit_front_end([light, heavy], Coefficients())
    assert fitted.frontend_s == pytest.approx(LATENCY, rel=1e-3)
    assert fit_front_end([heavy], Coefficients()).frontend_s == 0.0  # nothing light: left as it was


def test_stacked_means_add_the_latency_like_the_row_by_row_replay() -> None:
    trace, ttft = _closed_trace(2, 0.0)
    m = Measurement(trace, np.arange(trace.done.size), np.array([ttft]), np.array([1e-3]), concurrency=2)
    stacked = StackedMeans.build([m, m], Coefficients().scales)
    assert stacked is not None
    c = Coefficients(fixed_s=2e-3, per_seq_s=1e-4, frontend_s=0.05)
    row_ttft, row_tpot = m.predicted(c)
    both = stacked.predicted(c)
    assert both["ttft"] == pytest.approx([row_ttft[0]] * 2, rel=1e-9)
    assert both["tpot"] == pytest.approx([row_tpot[0]] * 2, rel=1e-9)
