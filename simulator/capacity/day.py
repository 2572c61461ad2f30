"""What fleet, scaled how, serves a day of traffic within the SLOs at the lowest cost
(``servesim plan-day``): a fixed fleet sized for the peak against autoscaled ones.

The plan file names an experiment whose deployment is a fleet (``deployment.kind: fleet``) and the
group to size; its workload is the day (typically sessions under a diurnal rate profile) and its
``slo:`` the per-request limits::

    name: chat-day
    experiment: chat-day.yaml       # relative to this file
    group: h100                     # default: the fleet's only group
    slo: {attainment: 0.99, hourly_attainment: 0.95}
    fixed: {max_replicas: 16, window_s: 3600, warmup_s: 900}
    autoscaled:                     # each laid over the group's own autoscaling keys, if any
      - {signal: in_flight, target: 24}
      - {signal: queue, target: 2}

How it answers:

1. **Fixed fleet.** A fixed fleet must hold the busiest hour. The day's requests are built once;
   the ``window_s`` stretch (a whole hour by default) with the most arrivals, and ``warmup_s``
   before it (left out of the verdict), is cut out (:mod:`servesim.workloads.window`: whole
   sessions), and the fewest replicas whose
   attainment there reaches ``slo.attainment`` are found by bisection on ``[1, max_replicas]``.
   That size is then simulated over the whole day (one more replica if the day still misses).
2. **Autoscaled.** Each setting is simulated over the whole day with ``min_replicas`` from the
   group (default 1) and ``max_replicas`` the fixed answer (never more than the peak needs).
3. A day passes when its attainment reaches ``slo.attainment`` and, if given, every hour's reaches
   ``slo.hourly_attainment``. The answer is the cheapest passing option (GPU-hours at the group's
   price), with what it saves against the fixed fleet.

Whole-day runs are independent and go to a process pool; the bisection runs one window at a time.
Same plan and seed give the same answer whatever the number of workers.
"""

from __future__ import annotations

import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError

import servesim.policies  # noqa: F401  (registers the built-in policies and routers)
from servesim.config import ExperimentConfig, load_experiment, read_yaml_document, validate_document
from servesim.errors import ServesimError
from servesim.inputs.overrides import apply_overrides
from servesim.inputs.schema import StrictModel, user_error
from servesim.metrics.summary import slo_met
from servesim.pipeline import prepare, render, simulate
from servesim.workloads import build_workload
from servesim.workloads.requests import RequestTable
from servesim.workloads.window import busiest, window


class DaySlo(StrictModel):
    attainment: float = Field(0.99, gt=0, le=1, description="share of the day's requests within every limit")
    hourly_attainment: float | None = Field(None, gt=0, le=1, description="and of every hour's")


class FixedSearch(StrictModel):
    max_replicas: PositiveInt = 16
    window_s: PositiveFloat = Field(3600.0, description="the busiest stretch the fixed fleet must hold")
    warmup_s: float = Field(900.0, ge=0, description="simulated before the window, not judged")


class DayPlanConfig(StrictModel):
    name: str = "day"
    experiment: Path
    group: str | None = None
    slo: DaySlo = DaySlo()
    fixed: FixedSearch = FixedSearch()
    autoscaled: list[dict[str, Any]] = Field(default_factory=list, description="autoscaling keys to try")


def load_day_plan(path: Path, overrides: list[str] | None = None
                  ) -> tuple[DayPlanConfig, ExperimentConfig, Path]:
    """Read a plan file and its experiment (and the experiment's folder, against which its
    relative paths resolve); every mistake is one line naming the key."""
    document = apply_overrides(read_yaml_document(path), overrides or [])
    try:
        plan = DayPlanConfig.model_validate(document)
    except ValidationError as exc:
        raise user_error(exc, DayPlanConfig, file=path.name) from None
    experiment_path = plan.experiment if plan.experiment.is_absolute() else path.parent / plan.experiment
    experiment = load_experiment(experiment_path)
    groups = experiment.deployment.groups or {}
    if experiment.deployment.kind != "fleet" or not groups:
        raise ServesimError("experiment", f"{experiment_path.name} is not a fleet",
                            "give an experiment with deployment.kind: fleet and deployment.groups")
    if plan.group is None:
        if len(groups) != 1:
            raise ServesimError("group", f"the fleet has groups {', '.join(groups)}",
                                "name the group to size")
        plan = plan.model_copy(update={"group": next(iter(groups))})
    elif plan.group not in groups:
        raise ServesimError("group", f"{plan.group!r} is not a group of the fleet",
                            f"use one of: {', '.join(groups)}")
    if experiment.slo is None:
        raise ServesimError("experiment", "has no slo: limits to judge the day by",
                            "add slo: {ttft_s: ..., tpot_s: ...} to the experiment")
    for index, setting in enumerate(plan.autoscaled):  # each must make a valid group
        _variant(experiment, plan, replicas=1, autoscaling=_autoscaling(experiment, plan, setting, 2),
                 where=f"autoscaled[{index}]")
    return plan, experiment.model_copy(update={"name": plan.name}), experiment_path.parent


# ---------------------------------------------------------------------------------------- the plan
def plan_day(plan: DayPlanConfig, experiment: ExperimentConfig, base_dir: Path | None,
             workers: int = 1, runs_dir: Path | None = None) -> dict[str, Any]:
    """The answer as plain data (see the module docstring). With ``runs_dir``, every whole-day
    run also writes its run folder there (tables and report), named after its option."""
    table = build_workload(experiment.workload, experiment.seed, base_dir)
    peak = busiest(table, plan.fixed.window_s)
    start = max(peak - plan.fixed.warmup_s, 0.0)
    part = window(table, start, peak + plan.fixed.window_s)
    judged_from = peak - start
    searched: dict[int, dict[str, Any]] = {}

    def window_passes(replicas: int) -> bool:
        config = _variant(experiment, plan, replicas=replicas, autoscaling=None)
        searched[replicas] = _window_result(config, part, judged_from, plan)
        return bool(searched[replicas]["passed"])

    size = _smallest(window_passes, plan.fixed.max_replicas)
    out: dict[str, Any] = {"name": plan.name, "group": plan.group, "slo": plan.slo.model_dump(),
                           "limits": experiment.slo.limits() if experiment.slo else {},
                           "peak_hour_start_s": peak, "window": {"start_s": start, "judged_from_s": peak,
                                                                   "end_s": peak + plan.fixed.window_s},
                           "window_search": [searched[k] for k in sorted(searched)], "options": []}
    if size is None:
        out["answer"] = None
        out["why"] = (f"even {plan.fixed.max_replicas} replicas miss the SLOs in the busiest hour: raise "
                      "fixed.max_replicas or change the deployment")
        return out
    jobs = [(f"fixed x{size}", _variant(experiment, plan, replicas=size, autoscaling=None))]
    for setting in plan.autoscaled:
        auto = _autoscaling(experiment, plan, setting, size)
        label = "autoscaled " + ", ".join(f"{k}={v}" for k, v in setting.items())
        jobs.append((label, _variant(experiment, plan, replicas=auto["min_replicas"], autoscaling=auto)))
    results = _run_all(jobs, table, plan, workers, runs_dir)
    fixed_runs = [results[0]]
    if not results[0]["passed"]:  # the busiest hour held, the day did not: one replica more
        more = size + 1
        fixed_runs.append(_day_result(f"fixed x{more}", _variant(experiment, plan, replicas=more,
                                                                  autoscaling=None), table, plan, runs_dir))
    chosen_fixed = fixed_runs[-1]
    options = [chosen_fixed, *results[1:]]
    out["options"] = options
    out["fixed_day_runs"] = fixed_runs
    passing = [o for o in options if o["passed"] and o["cost_usd"] is not None]
    # the cheapest; on a tie the fixed fleet (the simpler one to run)
    best = min(passing, key=lambda o: (o["cost_usd"], o is not chosen_fixed)) if passing else None
    out["answer"] = best["label"] if best else None
    if best is not None and chosen_fixed["cost_usd"]:
        out["savings_vs_fixed"] = 1.0 - best["cost_usd"] / chosen_fixed["cost_usd"]
    return out


def _smallest(passes: Any, limit: int) -> int | None:
    """The smallest n in [1, limit] with passes(n), assuming it is monotone; None if limit fails."""
    if not passes(limit):
        return None
    low, high = 0, limit  # low fails (0 replicas serve nothing), high passes
    while high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle
    return high


def _window_result(config: ExperimentConfig, table: RequestTable, judged_from: float,
                   plan: DayPlanConfig) -> dict[str, Any]:
    result = simulate(prepare(config, workload=table))
    requests = result.requests
    judged = requests["arrival_s"].to_numpy() >= judged_from
    met = slo_met(requests, config.slo.limits() if config.slo else {})[judged]
    attainment = float(met.mean()) if met.size else 0.0
    group = (config.deployment.groups or {})[str(plan.group)]
    return {"replicas": group.replicas, "requests": int(judged.sum()), "attainment": attainment,
            "passed": attainment >= plan.slo.attainment}


def _run_all(jobs: list[tuple[str, ExperimentConfig]], table: RequestTable, plan: DayPlanConfig,
             workers: int, runs_dir: Path | None) -> list[dict[str, Any]]:
    if workers <= 1 or len(jobs) == 1:
        return [_day_result(label, config, table, plan, runs_dir) for label, config in jobs]
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = [pool.submit(_day_result, label, config, table, plan, runs_dir) for label, config in jobs]
        return [f.result() for f in futures]


def _day_result(label: str, config: ExperimentConfig, table: RequestTable, plan: DayPlanConfig,
                runs_dir: Path | None = None) -> dict[str, Any]:
    """One whole-day run, judged (and written to ``runs_dir/<label>`` if given)."""
    if runs_dir is not None:
        config = config.model_copy(update={"output": "full"})
    result = simulate(prepare(config, workload=table))
    if runs_dir is not None:
        render(result, runs_dir / slug(label))
    summary = result.summary.to_dict()
    fleet = summary["fleet"]
    group = fleet["groups"][str(plan.group)]
    hourly = [h for h in fleet["hourly"] if h["arrivals"]]
    worst = min((h["slo_attainment"] for h in hourly if h["slo_attainment"] is not None), default=None)
    attainment = summary["slo_attainment"]
    passed = attainment is not None and attainment >= plan.slo.attainment and (
        plan.slo.hourly_attainment is None or (worst is not None and worst >= plan.slo.hourly_attainment))
    return {"label": label, "passed": bool(passed), "attainment": attainment, "worst_hour_attainment": worst,
            "gpu_hours": fleet["gpu_hours"], "cost_usd": fleet["cost_usd"],
            "replicas_mean": group["replicas_mean"], "replicas_peak": group["replicas_peak"],
            "scale_ups": group["scale_ups"], "scale_downs": group["scale_downs"],
            "ttft_p99_s": summary["ttft_s"]["p99"], "tpot_p99_s": summary["tpot_s"]["p99"],
            "completed": summary["completed"], "requests": summary["num_requests"],
            "hourly": [{k: h[k] for k in ("hour", "arrivals", "slo_attainment", "replicas_mean", "cost_usd")}
                       for h in fleet["hourly"]],
            "wall_s": result.wall_time_s}


# ---------------------------------------------------------------------------------------- helpers
def _autoscaling(experiment: ExperimentConfig, plan: DayPlanConfig, setting: dict[str, Any],
                 max_replicas: int) -> dict[str, Any]:
    group = (experiment.deployment.groups or {})[str(plan.group)]
    base = group.autoscaling.model_dump() if group.autoscaling is not None else {}
    merged = {**base, "min_replicas": base.get("min_replicas", 1), **setting}
    merged["max_replicas"] = max(int(setting.get("max_replicas", max_replicas)), int(merged["min_replicas"]))
    return merged


def _variant(experiment: ExperimentConfig, plan: DayPlanConfig, *, replicas: int,
             autoscaling: dict[str, Any] | None, where: str = "") -> ExperimentConfig:
    """The experiment with the sized group fixed at ``replicas`` or autoscaled."""
    document = experiment.model_dump(mode="json")
    document["output"] = "summary"
    group = document["deployment"]["groups"][str(plan.group)]
    group["replicas"] = replicas
    group["autoscaling"] = autoscaling
    try:
        return validate_document(document, "plan")
    except ServesimError as exc:
        if not where:
            raise
        raise ServesimError(where, f"{exc.field}: {exc.problem}", exc.fix) from None


def slug(label: str) -> str:
    """A folder name for an option's label (``autoscaled signal=in_flight, target=24`` ->
    ``autoscaled-signal-in_flight-target-24``)."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", label).strip("-")


def day_rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per whole-day option (the CSV and the printed table)."""
    rows = []
    for option in answer.get("options", []):
        rows.append({"option": option["label"], "passed": option["passed"],
                     "attainment": option["attainment"],
                     "worst_hour_attainment": option["worst_hour_attainment"],
                     "replicas_mean": option["replicas_mean"], "replicas_peak": option["replicas_peak"],
                     "gpu_hours": option["gpu_hours"], "cost_usd": option["cost_usd"],
                     "ttft_p99_s": option["ttft_p99_s"], "chosen": option["label"] == answer.get("answer")})
    return rows
