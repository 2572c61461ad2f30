"""``fleet``: groups of replicas, possibly on different GPUs and autoscaled, behind one router.

Keys (``deployment.kind: fleet``)::

    deployment:
      kind: fleet
      enable_prefix_caching: true           # shared keys (block_size, max_model_len, ...) apply to
      groups:                               # every group; a group's own keys override them
        h100: {hardware: h100-sxm-80gb, tp: 1, replicas: 2}
        l40s:
          hardware: l40s
          replicas: 1
          autoscaling: {min_replicas: 1, max_replicas: 8, signal: in_flight, target: 24,
                        cold_start: {storage: io2-streamer}}
    router: {name: prompt_length, threshold_tokens: 2048, long: h100, short: l40s}

Each group is resolved as a colocated deployment is (:func:`~servesim.topology.group.resolve_group`
on the deployment's keys with the group's own laid over them), so its memory plan and KV pool come
from its own GPU; an error names the group's key (``deployment.groups.l40s.tp``). Replica indices
run over the groups in the order written, ``replicas`` (or ``max_replicas``) slots each
(:mod:`servesim.topology.fleet_runtime`); the step table's ``pool`` column names each replica's
group. The router sees only live replicas; a request is only sent to a group whose replicas could
ever serve it (its KV fits their pool), and refused at arrival when no group could.

Outputs: the summary's ``fleet`` section (per group: GPUs, price, replicas over the run, GPU-hours,
cost, cold start, scale events; in all: GPU-hours, cost; per hour: arrivals, SLO attainment, TTFT
p99, mean replicas, cost) and ``replicas.parquet`` (every change of each group's ready,
provisioning and draining replicas). The run is billed from time 0 to the end of the run: the
later of the last arrival and the last answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.core.prefix_index import PrefixIndex
from servesim.core.replica_state import ReplicaState, rejection_codes
from servesim.engines import Engine
from servesim.errors import ServesimError
from servesim.hardware_io import load_hardware
from servesim.metrics.columns import column
from servesim.metrics.stats import describe, fmt_seconds
from servesim.model_config import load_model
from servesim.policies.base import choose_policy
from servesim.policies.fleet_routers import PromptLength
from servesim.policies.routers import RouterChoice
from servesim.topology.base import Built, Topology, register_topology
from servesim.topology.colocated import deployment_keys, experiment_policy, precision_of, router_of
from servesim.topology.fleet_keys import AutoscalingKeys, FleetGroupKeys, cold_start_s
from servesim.topology.group import ReplicaGroup, resolve_group
from servesim.topology.keys import GROUP_ENGINE_KEYS

if TYPE_CHECKING:
    import pandas as pd  # the summary's tables; a plan (validate) loads no table library

    from servesim.config import ExperimentConfig
    from servesim.core.sim import Sim
    from servesim.topology.autoscaler import Autoscaler
    from servesim.topology.fleet_runtime import FleetRuntime

HOUR_S = 3600.0
REPLICAS_FILE = "replicas.parquet"


@dataclass(frozen=True)
class FleetGroup:
    """A resolved group of the fleet: the replica group, its autoscaler and its price."""

    group: ReplicaGroup
    autoscaling: AutoscalingKeys | None
    initial: int
    cold_start_s: float
    cold_start_note: str
    price: float | None
    price_source: str

    @property
    def slots(self) -> int:
        return self.autoscaling.max_replicas if self.autoscaling is not None else self.group.replicas


@dataclass
class FleetBuilt(Built):
    """A fleet on the clock: its runtime and autoscaler, for the summary."""

    runtime: FleetRuntime | None = None
    autoscaler: Autoscaler | None = None


@register_topology
class Fleet(Topology):
    kind = "fleet"

    def __init__(self, members: tuple[FleetGroup, ...], router: RouterChoice,
                 slo_limits: dict[str, float]) -> None:
        # the fleet's runtime is loaded here, not at import: another deployment's plan needs none of it
        from servesim.topology.fleet_runtime import relative_speeds

        super().__init__(tuple(member.group for member in members))
        self.members = members
        self.router = router
        self.slo_limits = slo_limits
        self.speeds = relative_speeds([member.group for member in members])

    # ------------------------------------------------------------------ resolution
    @classmethod
    def resolve(cls, config: ExperimentConfig, engine: Engine) -> Fleet:
        d = config.deployment
        for key in ("prefill", "decode", "link"):
            if getattr(d, key) is not None:
                raise ServesimError(f"deployment.{key}", "applies to deployment.kind disaggregated only",
                                    "remove it (a fleet's groups go under deployment.groups)")
        if config.speculative is not None and config.speculative.enabled:
            raise ServesimError("speculative", f"is not modelled for deployment kind {cls.kind!r} yet",
                                "remove speculative, or use deployment.kind: colocated")
        if not d.groups:
            raise ServesimError("deployment.groups", "a fleet needs at least one group",
                                "add groups: {NAME: {hardware: ..., replicas: ...}}")
        if d.replicas != 1:
            raise ServesimError("deployment.replicas", "a fleet sizes its groups itself",
                                "set deployment.groups.NAME.replicas instead")
        router = router_of(config, engine)
        if issubclass(router.cls, PromptLength):
            for knob in ("long", "short"):
                name = router.knobs.get(knob)
                if name not in d.groups:
                    raise ServesimError(f"router.{knob}", f"{name!r} is not a group of the fleet",
                                        f"use one of: {', '.join(d.groups)}")
        model = load_model(config.model, "model")
        default_policy = experiment_policy(config, engine)
        members = tuple(_resolve_member(config, engine, model, name, keys, default_policy)
                        for name, keys in d.groups.items())
        slo = config.slo.limits() if config.slo is not None else {}
        return cls(members, router, slo)

    # ------------------------------------------------------------------ what it is
    @property
    def kv_group(self) -> ReplicaGroup:
        return self.groups[0]

    def group_of_replica(self) -> list[str]:
        return [m.group.name for m in self.members for _ in range(m.slots)]

    def describe(self) -> dict[str, Any]:
        first = self.groups[0]
        out = first.describe()
        names = sorted({g.hardware.name for g in self.groups})
        out.update({"hardware": " + ".join(names) if len(names) > 1 else names[0],
                    "tp": "/".join(str(g.tp) for g in self.groups) if len({g.tp for g in self.groups}) > 1
                    else first.tp,
                    "replicas": sum(m.slots for m in self.members),
                    "gpus": sum(m.slots * m.group.parallelism.gpus_per_replica for m in self.members),
                    "groups": {m.group.name: self._describe_member(m, speed)
                               for m, speed in zip(self.members, self.speeds, strict=True)}})
        return out

    def _describe_member(self, member: FleetGroup, speed: float) -> dict[str, Any]:
        g = member.group
        out: dict[str, Any] = {"hardware": g.hardware.name, "tp": g.tp,
                               "gpus_per_replica": g.parallelism.gpus_per_replica,
                               "kv_blocks_per_replica": g.limits.num_blocks,
                               "max_num_seqs": g.limits.max_num_seqs, "policy": g.policy.name,
                               "relative_speed": speed, "usd_per_gpu_hour": member.price}
        if member.autoscaling is None:
            out["replicas"] = g.replicas
        else:
            a = member.autoscaling
            out.update({"replicas": {"initial": member.initial, "min": a.min_replicas, "max": a.max_replicas},
                        "autoscaling": {"signal": a.signal, "target": a.target, "interval_s": a.interval_s,
                                        "window_s": a.window_s, "scale_down_delay_s": a.scale_down_delay_s},
                        "cold_start_s": member.cold_start_s})
        return out

    def describe_links(self) -> list[str]:
        lines = []
        for member, speed in zip(self.members, self.speeds, strict=True):
            a = member.autoscaling
            size = f"{member.group.replicas} replicas" if a is None else (
                f"{a.min_replicas}..{a.max_replicas} replicas on {a.signal} (target {a.target:g}), "
                f"cold start {member.cold_start_s:.0f} s = {member.cold_start_note}")
            price = f"${member.price:.2f}/GPU-hour" if member.price is not None else "no price"
            lines.append(f"group {member.group.name}: {size}; relative speed {speed:.2f}; {price}")
        return lines

    # ------------------------------------------------------------------ before and during a run
    def rejection_codes(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Refused when no group could ever serve it (the first group's reason is given)."""
        codes = np.stack([rejection_codes(prompt, output, m.group.limits) for m in self.members])
        return np.where((codes == 0).any(axis=0), 0, codes[0]).astype(np.int8)

    def build(self, sim: Sim, reject_codes: np.ndarray) -> Built:
        from servesim.topology.autoscaler import Autoscaler, GroupScaler
        from servesim.topology.fleet_runtime import FleetRuntime, GroupPlan

        table = sim.workload
        per_group = [rejection_codes(table.prompt_tokens, table.output_tokens, m.group.limits)
                     for m in self.members]
        eligible = np.stack([codes == 0 for codes in per_group]) if per_group else np.zeros((0, len(table)))
        caching = self.groups[0].limits.enable_prefix_caching
        prefixes = PrefixIndex(table, self.groups[0].limits.block_size) if caching else None
        codes_of = {m.group.name: codes for m, codes in zip(self.members, per_group, strict=True)}
        plans, first = [], 0
        for member, speed in zip(self.members, self.speeds, strict=True):
            plans.append(GroupPlan(member.group, first, member.slots, member.initial, member.cold_start_s,
                                   speed))
            first += member.slots
        runtime = FleetRuntime(sim, plans, partial(_state, sim, prefixes, codes_of), self.router, eligible)
        scalers = [GroupScaler(g, m.autoscaling) for g, m in enumerate(self.members)
                   if m.autoscaling is not None]
        autoscaler = Autoscaler(runtime, scalers)
        return FleetBuilt(runtime.entry, runtime.runs, [], runtime, autoscaler)

    # ------------------------------------------------------------------ after a run
    def summary_sections(self, sim: Sim, built: Built, requests: pd.DataFrame, steps: pd.DataFrame,
                         span: float) -> dict[str, Any]:
        from servesim.topology.fleet_runtime import gpu_hours

        assert isinstance(built, FleetBuilt) and built.runtime is not None
        timeline = built.runtime.timeline_frame()
        horizon = _horizon(requests, steps)
        hours = gpu_hours(timeline, horizon)
        scalers = {built.runtime.plans[s.group].group.name: s
                   for s in (built.autoscaler.scalers if built.autoscaler else [])}
        groups: dict[str, Any] = {}
        total_cost: float | None = 0.0
        for member in self.members:
            name = member.group.name
            rows = timeline[timeline["group"] == name]
            billed = rows["ready"] + rows["provisioning"] + rows["draining"]
            cost = hours[name] * member.price if member.price is not None else None
            total_cost = None if cost is None or total_cost is None else total_cost + cost
            mine = steps[steps["pool"] == name] if "pool" in steps else steps
            scaler = scalers.get(name)
            groups[name] = {
                "hardware": member.group.hardware.name, "tp": member.group.tp,
                "usd_per_gpu_hour": member.price, "price_source": member.price_source,
                "replicas_mean": _time_mean(rows["time_s"].to_numpy(), billed.to_numpy(), horizon),
                "replicas_peak": int(billed.max()), "gpu_hours": hours[name], "cost_usd": cost,
                "busy_s": float(column(mine, "duration_s").sum()),
                "requests": int((requests["pool"] == name).sum()) if "pool" in requests else None,
                "cold_start_s": member.cold_start_s if member.autoscaling else None,
                "scale_ups": scaler.scale_ups if scaler else 0,
                "scale_downs": scaler.scale_downs if scaler else 0}
        return {"fleet": {"horizon_s": horizon, "gpu_hours": float(sum(hours.values())),
                          "cost_usd": total_cost, "groups": groups,
                          "hourly": self._hourly(requests, timeline, horizon)}}

    def _hourly(self, requests: pd.DataFrame, timeline: pd.DataFrame, horizon: float) -> list[dict[str, Any]]:
        """Per hour of the run (by arrival): requests, SLO attainment, TTFT p99, mean replicas
        and cost of the hour."""
        from servesim.metrics.summary import slo_met  # with pandas: a plan (validate) needs neither

        hour_of = np.floor(column(requests, "arrival_s") / HOUR_S).astype(np.int64)
        met = slo_met(requests, self.slo_limits) if self.slo_limits else None
        prices = {m.group.name: m.price for m in self.members}
        out = []
        for h in range(int(np.ceil(horizon / HOUR_S))):
            mask = hour_of == h
            start, end = h * HOUR_S, min((h + 1) * HOUR_S, horizon)
            done = mask & (column(requests, "status") == "completed")
            ttft = describe(column(requests, "ttft_s")[done])
            replicas = 0.0
            cost: float | None = 0.0
            for name, rows in timeline.groupby("group", sort=False):
                times = rows["time_s"].to_numpy()
                billed = (rows["ready"] + rows["provisioning"] + rows["draining"]).to_numpy()
                replicas += _window_mean(times, billed, start, end)
                price = prices.get(str(name))
                gpu_hours_in_hour = _window_mean(times, rows["gpus"].to_numpy(dtype=float), start, end) \
                    * (end - start) / HOUR_S
                cost = None if price is None or cost is None else cost + gpu_hours_in_hour * price
            out.append({"hour": h, "arrivals": int(mask.sum()), "completed": int(done.sum()),
                        "slo_attainment": float(met[mask].mean()) if met is not None and mask.any() else None,
                        "ttft_p99": ttft["p99"], "replicas_mean": replicas, "cost_usd": cost})
        return out

    def summary_lines(self, sections: dict[str, Any]) -> list[str]:
        fleet = sections["fleet"]
        cost = f"${fleet['cost_usd']:,.2f}" if fleet["cost_usd"] is not None else "no price"
        lines = [f"fleet: {fleet['gpu_hours']:,.2f} GPU-hours over {fmt_seconds(fleet['horizon_s'])}, {cost}"]
        for name, g in fleet["groups"].items():
            lines.append(f"  {name}: {g['hardware']} x{g['replicas_mean']:.2f} mean (peak "
                         f"{g['replicas_peak']}), {g['gpu_hours']:,.2f} GPU-hours, scale ups "
                         f"{g['scale_ups']}, downs {g['scale_downs']}")
        return lines

    def request_columns(self, sim: Sim) -> dict[str, np.ndarray]:
        names = np.asarray([*self.group_of_replica(), ""], dtype=object)
        replica = sim.requests.replica
        return {"pool": names[np.where(replica >= 0, replica, len(names) - 1)]}

    def extra_tables(self, built: Built) -> dict[str, pd.DataFrame]:
        assert isinstance(built, FleetBuilt) and built.runtime is not None
        return {REPLICAS_FILE: built.runtime.timeline_frame()}

    def resolved_deployment(self, deployment: dict[str, Any]) -> str:
        header = []
        groups = deployment.get("groups") or {}
        for member in self.members:
            g = member.group
            section = groups.get(g.name) or {}
            section.update({"max_num_batched_tokens": g.limits.max_num_batched_tokens,
                            "max_num_seqs": g.limits.max_num_seqs, "tp": g.tp,
                            "hardware": g.hardware.name, "policy": {"name": g.policy.name, **g.policy.knobs}})
            groups[g.name] = section
            header.append(f"{g.name}: {g.limits.num_blocks:,} KV blocks of {g.limits.block_size} tokens per "
                          f"replica on {g.hardware.name}")
        deployment["groups"] = groups
        deployment["max_model_len"] = self.groups[0].limits.max_model_len
        deployment["block_size"] = self.groups[0].limits.block_size
        return "; ".join(header)


# ---------------------------------------------------------------------------------------- helpers
def _resolve_member(config: ExperimentConfig, engine: Engine, model: Any, name: str, keys: FleetGroupKeys,
                    default_policy: tuple[str, dict[str, Any]]) -> FleetGroup:
    where = f"deployment.groups.{name}"
    policy = choose_policy(*keys.policy_section(default_policy), where=f"{where}.policy")
    overrides = {key: getattr(keys, key) for key in GROUP_ENGINE_KEYS if getattr(keys, key) is not None}
    auto = keys.autoscaling
    slots = auto.max_replicas if auto is not None else keys.replicas
    if auto is None and keys.replicas < 1:
        raise ServesimError(f"{where}.replicas", "a fixed group needs at least 1 replica",
                            "give replicas >= 1, or autoscaling with min_replicas: 0")
    group_keys = deployment_keys(config, **overrides, replicas=slots)
    try:
        hardware = load_hardware(keys.hardware or config.hardware, "hardware")
        group = resolve_group(name, group_keys, model, hardware, precision_of(config), engine, policy)
    except ServesimError as exc:
        head, _, rest = exc.field.partition(".")
        key = rest if head == "deployment" else head
        field = f"{where}.{key}" if key in overrides or key == "hardware" else f"{exc.field} (group {name})"
        raise ServesimError(field, exc.problem, exc.fix) from None
    if group.runs_pipeline:
        raise ServesimError(f"{where}.pp", "pipeline stages and data-parallel attention ranks are not "
                            "modelled in a fleet (its replicas come and go one TP group at a time)",
                            "use pp: 1 and dp: 1 in a fleet, or deployment.kind: colocated")
    initial = keys.replicas if auto is None else min(max(keys.replicas, auto.min_replicas), auto.max_replicas)
    start, note = (0.0, "")
    if auto is not None:
        start, note = cold_start_s(auto.cold_start, group.memory.weight_bytes * group.tp)
    price: float | None
    if keys.cost_per_gpu_hour is not None:
        price, source = keys.cost_per_gpu_hour, f"{where}.cost_per_gpu_hour"
    else:
        price, source = hardware.cost_per_gpu_hour, f"hardware profile {hardware.name}"
    return FleetGroup(group, auto, initial, start, note, price, source)


def _state(sim: Sim, prefixes: PrefixIndex | None, codes: dict[str, np.ndarray], group: ReplicaGroup,
           index: int) -> ReplicaState:
    return ReplicaState(index, sim.requests, group.limits, seed=sim.seed, prefixes=prefixes,
                        reject_codes=codes[group.name])


def _horizon(requests: pd.DataFrame, steps: pd.DataFrame) -> float:
    """The run's billed span: from 0 to the later of the last arrival, answer and step end."""
    ends = [0.0]
    if len(requests):
        ends.append(float(column(requests, "arrival_s").max()))
        finish = column(requests, "finish_s")
        if np.isfinite(finish).any():
            ends.append(float(np.nanmax(finish)))
    if len(steps):
        ends.append(float((column(steps, "start_s") + column(steps, "duration_s")).max()))
    return max(ends)


def _time_mean(times: np.ndarray, values: np.ndarray, horizon: float) -> float:
    return _window_mean(times, values, 0.0, horizon)


def _window_mean(times: np.ndarray, values: np.ndarray, start: float, end: float) -> float:
    """The time-average over ``[start, end)`` of a step function that is ``values[k]`` from
    ``times[k]`` on."""
    if end <= start or times.size == 0:
        return 0.0
    edges = np.clip(np.append(times, np.inf), start, end)
    return float(np.sum(np.diff(edges) * values) / (end - start))
