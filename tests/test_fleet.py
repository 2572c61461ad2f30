"""Fleets: heterogeneous groups behind one router, routers that know group speeds and prompt
lengths, autoscaling with a cold start (the queue during it, checked against theory), scale to
zero, and GPU-hours integrated exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from engine_helpers import experiment, run, table, tabulate

from servesim.config import validate_document
from servesim.errors import ServesimError
from servesim.pipeline import prepare, simulate
from servesim.topology.fleet_runtime import gpu_hours
from servesim.topology.resolve import resolve_topology
from servesim.workloads import build_workload, parse_workload_config


def fleet(groups: dict, router: str | dict = "round_robin", **top: object):
    router_section = {"name": router} if isinstance(router, str) else router
    return experiment({"kind": "fleet", "groups": groups}, engine="vllm-v0", router=router_section, **top)


# ---------------------------------------------------------------------------------------- fixed
def test_a_one_group_fleet_is_a_colocated_deployment() -> None:
    """Same replicas, same router, same requests: the same latencies to the bit."""
    trace = build_workload(parse_workload_config({
        "arrival": {"process": "poisson", "rate": 20}, "num_requests": 400,
        "lengths": {"preset": "azure-conversation"}}), 0)
    colocated = tabulate(run(experiment({"replicas": 2}, engine="vllm-v0"), trace)).requests
    fleet_run = tabulate(run(fleet({"a": {"replicas": 2}}), trace)).requests
    for column in ("replica", "ttft_s", "tpot_s", "e2e_s"):
        assert np.array_equal(colocated[column].to_numpy(), fleet_run[column].to_numpy(), equal_nan=True)
    assert set(fleet_run["pool"]) == {"a"}


def test_fixed_fleet_gpu_hours_and_cost() -> None:
    """2 H100 replicas at TP 1 and 1 L40S at TP 2 for the whole run: GPU-hours = (2 + 2) x the
    billed span / 3600, cost at each profile's price."""
    trace = table(np.linspace(0, 30, 61), 300, 40)
    result = run(fleet({"h": {"replicas": 2}, "l": {"hardware": "l40s", "tp": 2, "replicas": 1}}), trace)
    section = tabulate(result).summary["fleet"]
    horizon = section["horizon_s"]
    assert horizon == pytest.approx(max(result.requests["finish_s"].max(), 30.0))
    assert section["gpu_hours"] == pytest.approx(4 * horizon / 3600)
    groups = section["groups"]
    assert groups["h"]["cost_usd"] == pytest.approx(2 * horizon / 3600 * groups["h"]["usd_per_gpu_hour"])
    assert groups["l"]["gpu_hours"] == pytest.approx(2 * horizon / 3600)
    assert groups["h"]["requests"] + groups["l"]["requests"] == 61


def test_gpu_hours_integrate_the_timeline_exactly() -> None:
    """A group at 1 replica (2 GPUs each) from 0, 3 from 100 s, 2 from 250 s, until 400 s:
    (1 x 100 + 3 x 150 + 2 x 150) x 2 GPUs / 3600."""
    timeline = pd.DataFrame({"time_s": [0.0, 100.0, 250.0], "group": ["g"] * 3, "ready": [1, 3, 2],
                             "provisioning": [0, 0, 0], "draining": [0, 0, 0], "gpus": [2, 6, 4]})
    assert gpu_hours(timeline, 400.0) == {"g": pytest.approx((100 + 450 + 300) * 2 / 3600)}
    assert gpu_hours(timeline, 200.0) == {"g": pytest.approx((100 + 300) * 2 / 3600)}


# ---------------------------------------------------------------------------------------- routers
def test_speed_weighted_router_favours_the_faster_gpu() -> None:
    """An H100 and an L40S (relative decode speed 0.29): the H100 takes several times more
    requests, where round robin splits them evenly."""
    trace = build_workload(parse_workload_config({
        "arrival": {"process": "poisson", "rate": 12}, "num_requests": 600,
        "lengths": {"preset": "azure-conversation"}}), 1)
    groups = {"h100": {"replicas": 1}, "l40s": {"hardware": "l40s", "replicas": 1}}
    topology = resolve_topology(fleet(groups, "speed_weighted"))
    assert topology.speeds[0] == 1.0 and 0.2 < topology.speeds[1] < 0.4
    weighted = tabulate(run(fleet(groups, "speed_weighted"), trace)).requests["pool"].value_counts()
    even = tabulate(run(fleet(groups, "round_robin"), trace)).requests["pool"].value_counts()
    assert even["h100"] == even["l40s"] == 300
    assert weighted["h100"] > 2.5 * weighted["l40s"]


def test_prompt_length_router_splits_by_prompt() -> None:
    prompts = [100, 3000, 200, 5000, 2048, 2047]
    trace = table(np.arange(6.0), prompts, 10)
    router = {"name": "prompt_length", "threshold_tokens": 2048, "long": "big", "short": "small"}
    result = run(fleet({"big": {"replicas": 1}, "small": {"hardware": "l40s", "replicas": 2}}, router), trace)
    pools = tabulate(result).requests["pool"].tolist()
    assert pools == ["small", "big", "small", "big", "big", "small"]


def test_requests_only_go_where_they_fit() -> None:
    """The L40S group's pool holds 100 blocks: a 3,000-token request cannot fit there, so it goes
    to the H100 though round robin would pick the L40S; one that fits nowhere is refused."""
    trace = table([0.0, 1.0, 2.0], [3000, 3000, 100_000], 10)
    result = run(fleet({"h": {"replicas": 1, "num_gpu_blocks": 1000},
                        "l": {"hardware": "l40s", "replicas": 1, "num_gpu_blocks": 100}}), trace)
    requests = tabulate(result).requests
    assert requests["pool"].tolist()[:2] == ["h", "h"]
    assert requests["status"].tolist() == ["completed", "completed", "rejected"]


# ---------------------------------------------------------------------------------------- autoscaling
def step_load(low: float, high: float, at: float, end: float, prompt: int, output: int):
    return parse_workload_config({
        "arrival": {"process": "constant", "rate": high,
                    "profile": {"points": [[0, low / high], [at, 1.0]], "interpolate": "step"}},
        "duration_s": end, "prompt": {"dist": "fixed", "value": prompt},
        "output": {"dist": "fixed", "value": output}})


def test_autoscaler_cold_start_shows_the_queue_it_should() -> None:
    """One seat per replica (max_num_seqs 1), so a replica serves exactly 1 / S requests per
    second (S: one request's service time, measured at low load). Load steps from 0.5 mu to
    2.5 mu at t0 = 20 s. The autoscaler (queue per replica, target 1, deciding every second)
    asks for 2 more replicas at its first decision after the step; they serve D = 30 s later.
    Until then the queue grows at (2.5 - 1) mu, so it holds (lambda - mu)(t_ready - t0) requests
    when they arrive; GPU-hours are 1 replica all along plus 2 from the moment they were asked
    for (no scale-down within the run)."""
    config = fleet({"a": {"replicas": 1, "max_num_seqs": 1, "autoscaling": {
        "min_replicas": 1, "max_replicas": 3, "signal": "queue", "target": 1, "interval_s": 1,
        "window_s": 1, "scale_down_delay_s": 10_000, "cold_start": {"total_s": 30}}}},
        router="least_outstanding")
    probe = tabulate(run(config, table([0.0], 512, 64))).requests
    service = float(probe["e2e_s"][0])
    mu = 1 / service
    t0, end = 20.0, 80.0
    workload = build_workload(step_load(0.5 * mu, 2.5 * mu, t0, end, 512, 64), 0)
    result = run(config, workload)
    tables = tabulate(result)
    timeline = pd.read_parquet(_replicas(result))
    asked = float(timeline.loc[timeline["provisioning"] > 0, "time_s"].iloc[0])
    ready = float(timeline.loc[timeline["ready"] == 3, "time_s"].iloc[0])
    assert t0 < asked <= t0 + 2.0 and ready == pytest.approx(asked + 30.0)
    steps = tables.steps
    before = steps[(steps["replica"] == 0) & (steps["start_s"] < ready)].iloc[-1]
    expected = (2.5 * mu - mu) * (ready - t0)
    assert before["waiting"] == pytest.approx(expected, abs=3)
    # once the new replicas serve, arrivals avoid replica 0 and its queue drains at mu
    after = steps[(steps["replica"] == 0) & (steps["start_s"] >= ready) & (steps["num_prefills"] > 0)]
    drained = after.iloc[10]
    served = mu * (drained["start_s"] - before["start_s"])
    assert before["waiting"] - drained["waiting"] == pytest.approx(served, abs=3)
    section = tables.summary["fleet"]
    horizon = section["horizon_s"]
    assert section["gpu_hours"] == pytest.approx((horizon + 2 * (horizon - asked)) / 3600)
    assert section["groups"]["a"]["scale_ups"] == 1 and section["groups"]["a"]["scale_downs"] == 0


def _replicas(result) -> object:
    import io

    frame = result.plan.topology.extra_tables(result.built)["replicas.parquet"]
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    buffer.seek(0)
    return buffer


def test_scale_down_waits_for_the_stabilization_window_and_drains() -> None:
    """A burst, then a stream of long requests. A replica is removed only once every
    recommendation of the last scale_down_delay_s (60 s) is below the replicas there are (HPA's
    stabilization: the 2 recommended at 15 s holds 2 replicas until 80 s), and a draining replica
    is billed until the last request it holds ends."""
    config = fleet({"a": {"replicas": 3, "max_num_seqs": 4, "autoscaling": {
        "min_replicas": 1, "max_replicas": 3, "signal": "in_flight", "target": 10, "interval_s": 5,
        "window_s": 5, "scale_down_delay_s": 60, "cold_start": {"total_s": 10}}}},
        router="least_outstanding")
    arrivals = np.concatenate([np.linspace(0, 10, 60), np.arange(20.0, 200.0, 3.0)])
    outputs = np.concatenate([np.full(60, 200), np.full(60, 3000)])
    result = run(config, table(arrivals, 256, outputs))
    timeline = pd.read_parquet(_replicas(result)).reset_index(drop=True)
    decisions = result.built.autoscaler.scalers[0].decisions
    # after the replica asked for at 10 s is ready (20 s), the next scale-down is at 80 s:
    high = max(t for t, _, desired in decisions if desired >= 2 and t < 80)
    assert high == 15.0
    downs = timeline.loc[timeline["draining"].diff() > 0, "time_s"].tolist()
    assert 80.0 in downs and not any(20.0 < t < 80.0 for t in downs)
    # every replica that drains stops being billed exactly when its last request ends (a slot is
    # reused by later replicas, so compare with every finish)
    finishes = set(result.requests["finish_s"].round(9))
    ends = timeline.loc[timeline["draining"].diff() < 0, "time_s"].round(9)
    assert len(ends) >= 2 and set(ends) <= finishes


def test_scale_from_zero_holds_requests_until_a_replica_is_ready() -> None:
    """No replica at first (min_replicas 0): a request arriving at 3 s waits at the fleet's door;
    the next decision (at 5 s) sees it and asks for one replica, ready D = 20 s later, so its
    TTFT is its service TTFT plus 22 s."""
    config = fleet({"a": {"replicas": 0, "autoscaling": {
        "min_replicas": 0, "max_replicas": 2, "signal": "queue", "target": 1, "interval_s": 5,
        "window_s": 5, "cold_start": {"total_s": 20}}}})
    warm = tabulate(run(fleet({"a": {"replicas": 1}}), table([0.0], 200, 20))).requests["ttft_s"][0]
    requests = tabulate(run(config, table([3.0], 200, 20))).requests
    assert requests["ttft_s"][0] == pytest.approx(22.0 + warm)


def test_cold_start_from_weights_and_storage() -> None:
    """Llama-3-8B in bf16 (16.06 GB of weights) from the io2-streamer preset (2 GB/s) plus the
    engine's 60 s: 68.0 s; TP 2 loads the same bytes."""
    for tp in (1, 2):
        config = fleet({"a": {"tp": tp, "autoscaling": {"max_replicas": 2, "target": 4}}})
        member = resolve_topology(config).members[0]
        weights = member.group.memory.weight_bytes * tp
        assert weights == pytest.approx(16.06e9, rel=1e-3)
        assert member.cold_start_s == pytest.approx(60 + weights / 2.0e9)


@pytest.mark.parametrize(("deployment", "router", "message"), [
    ({"kind": "fleet", "groups": {"a": {"autoscaling": {"min_replicas": 3, "max_replicas": 2, "target": 1}}}},
     "round_robin", "max_replicas (2) must be >= min_replicas (3)"),
    ({"kind": "fleet", "groups": {"a": {"replicas": 0}}}, "round_robin", "a fixed group needs at least 1"),
    ({"kind": "fleet", "groups": {"a": {}}}, {"name": "prompt_length", "threshold_tokens": 10, "long": "a",
                                              "short": "b"}, "router.short: 'b' is not a group"),
    ({"kind": "colocated"}, "speed_weighted", "routes between the groups of a fleet"),
    ({"kind": "fleet", "groups": {"a": {"tp": 3}}}, "round_robin", "deployment.groups.a.tp"),
    ({"kind": "fleet"}, "round_robin", "a fleet needs at least one group"),
])
def test_fleet_errors_are_one_line(deployment: dict, router: str | dict, message: str) -> None:
    document = {"model": "llama-3-8b", "hardware": "h100-sxm-80gb", "deployment": deployment,
                "router": {"name": router} if isinstance(router, str) else router,
                "workload": {"arrival": {"process": "poisson", "rate": 1}, "num_requests": 1,
                             "lengths": {"preset": "azure-conversation"}}}
    with pytest.raises(ServesimError) as info:
        simulate(prepare(validate_document(document)))
    assert message in str(info.value) and "\n" not in str(info.value)


class FakeRuntime:
    """What the autoscaler asks of a fleet: counts, the door, and scale requests (recorded)."""

    def __init__(self, ready: int, starting: int = 0, held: int = 0) -> None:
        self.ready, self.starting, self.held = ready, starting, list(range(held))
        self.asked: list[tuple[str, int]] = []

    def counts(self, g: int) -> dict[str, int]:
        return {"ready": self.ready, "provisioning": self.starting, "draining": 0, "inactive": 0}

    def scale_up(self, g: int, count: int, now: float) -> int:
        self.asked.append(("up", count))
        return count

    def scale_down(self, g: int, count: int, now: float) -> int:
        self.asked.append(("down", count))
        return count


@pytest.mark.parametrize(("signal", "ready", "value", "expected"), [
    ("in_flight", 2, 60.0, ("up", 1)),     # total 60 over 2 replicas, target 20: ceil(60 / 20) = 3
    ("in_flight", 2, 42.0, None),          # 21 per replica: within 10% of 20, no change
    ("queue", 4, 2.0, ("down", 2)),        # 0.5 per replica, target 1: ceil(4 x 0.5 / 1) = 2
    ("kv", 3, 0.9, ("up", 1)),             # 90% use, target 0.7: ceil(3 x 0.9 / 0.7) = 4
    ("kv", 0, 0.0, ("up", 1)),             # scaled to zero, a request at the door: one replica
])
def test_hpa_recommendation(signal: str, ready: int, value: float, expected: tuple[str, int] | None) -> None:
    """ceil(ready x value per replica / target), unchanged within the tolerance, clamped to
    [min, max]; scale-down to the highest recommendation of the window (here: none before)."""
    from servesim.topology.autoscaler import Autoscaler, GroupScaler
    from servesim.topology.fleet_keys import AutoscalingKeys

    target = {"in_flight": 20.0, "queue": 1.0, "kv": 0.7}[signal]
    keys = AutoscalingKeys(min_replicas=0 if ready == 0 else 1, max_replicas=8, signal=signal,
                           target=target, scale_down_delay_s=0)
    runtime = FakeRuntime(ready, held=1 if ready == 0 else 0)
    scaler = GroupScaler(0, keys)
    scaler.samples.append((0.0, value))
    autoscaler = Autoscaler.__new__(Autoscaler)
    autoscaler.runtime = runtime  # type: ignore[assignment]
    autoscaler._decide(scaler, 15.0)
    assert runtime.asked == ([expected] if expected else [])
