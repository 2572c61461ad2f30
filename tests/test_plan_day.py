"""``servesim plan-day``: the fixed fleet the busiest stretch needs (found by bisection), against an
autoscaled one over the whole (here: five-minute) day, and the cheaper of the two."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servesim.capacity.day import load_day_plan, plan_day
from servesim.errors import ServesimError

EXPERIMENT = {
    "name": "t", "model": "llama-3-8b", "hardware": "h100-sxm-80gb", "engine": "vllm-v0",
    "deployment": {"kind": "fleet", "groups": {"g": {"max_num_seqs": 8, "autoscaling": {
        "min_replicas": 1, "max_replicas": 4, "signal": "in_flight", "target": 6, "interval_s": 5,
        "window_s": 10, "scale_down_delay_s": 30, "cold_start": {"total_s": 5}}}}},
    "router": {"name": "least_outstanding"},
    "workload": {"arrival": {"process": "poisson", "rate": 10.0,
                             "profile": {"diurnal": {"period_s": 300, "peak_s": 150, "trough": 0.05}}},
                 "duration_s": 300, "sessions": {
                     "turns": {"dist": "uniform", "low": 1, "high": 3},
                     "user_tokens": {"dist": "fixed", "value": 200},
                     "output": {"dist": "fixed", "value": 100},
                     "think_time_s": {"dist": "fixed", "value": 3}}},
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
}
PLAN = {"name": "t", "experiment": "exp.yaml", "slo": {"attainment": 0.95},
        "fixed": {"max_replicas": 4, "window_s": 60, "warmup_s": 30}, "autoscaled": [{"target": 6}]}


def write(folder: Path, experiment: dict = EXPERIMENT, plan: dict = PLAN) -> Path:
    (folder / "exp.yaml").write_text(yaml.safe_dump(experiment))
    (folder / "plan.yaml").write_text(yaml.safe_dump(plan))
    return folder / "plan.yaml"


def test_fixed_against_autoscaled(tmp_path: Path) -> None:
    plan, experiment, base = load_day_plan(write(tmp_path))
    answer = plan_day(plan, experiment, base, workers=1)
    # the busiest minute (the diurnal peak at 150 s) starts at 120 s; 2 replicas miss there, 3 hold
    assert answer["window"]["judged_from_s"] == 120.0
    tried = [(w["replicas"], w["passed"]) for w in answer["window_search"]]
    assert tried == [(2, False), (3, True), (4, True)]
    fixed, auto = answer["options"]
    assert fixed["label"] == "fixed x3" and fixed["passed"] and fixed["replicas_mean"] == 3.0
    horizon_hours = fixed["gpu_hours"] / 3  # a fixed fleet is billed all along
    assert auto["passed"] and auto["replicas_peak"] <= 3 and auto["gpu_hours"] < fixed["gpu_hours"]
    assert auto["gpu_hours"] == pytest.approx(auto["replicas_mean"] * horizon_hours, rel=0.02)
    assert answer["answer"] == auto["label"]
    assert answer["savings_vs_fixed"] == pytest.approx(1 - auto["cost_usd"] / fixed["cost_usd"])


def test_plan_errors_are_one_line(tmp_path: Path) -> None:
    colocated = {**EXPERIMENT, "deployment": {"replicas": 1}}
    with pytest.raises(ServesimError, match="is not a fleet"):
        load_day_plan(write(tmp_path, colocated))
    with pytest.raises(ServesimError, match=r"group: 'x' is not a group of the fleet"):
        load_day_plan(write(tmp_path, plan={**PLAN, "group": "x"}))
    with pytest.raises(ServesimError, match=r"autoscaled\[0\]: .*signal"):
        load_day_plan(write(tmp_path, plan={**PLAN, "autoscaled": [{"signal": "speed"}]}))
    with pytest.raises(ServesimError, match=r"plan\.yaml: fixed\.max_replicas"):
        load_day_plan(write(tmp_path, plan={**PLAN, "fixed": {"max_replicas": 0}}))


def test_the_shipped_day_plan_loads() -> None:
    """configs/plans/chat-day.yaml (the README's day) names a valid fleet experiment: a whole day
    of sessions under the diurnal profile, the h100 group sized between 1 and 4 replicas."""
    from servesim.resources import configs_dir

    plan, experiment, _ = load_day_plan(configs_dir() / "plans" / "chat-day.yaml")
    assert plan.group == "h100" and plan.fixed.max_replicas == 4
    assert [setting["target"] for setting in plan.autoscaled] == [24, 16]
    assert experiment.workload.duration_s == 86_400 and experiment.workload.sessions is not None
    assert experiment.slo is not None and experiment.slo.limits() == {"ttft_s": 2.0, "tpot_s": 0.04}
