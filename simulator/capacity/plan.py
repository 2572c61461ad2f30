"""``servesim capacity`` as a Python API: search every candidate, then rank them by cost.

:func:`plan_capacity` checks everything a user can get wrong up front (model, hardware names,
policy and router knobs, price keys), runs :func:`~servesim.capacity.candidate.analyse_candidate`
for every candidate in a process pool, and puts the answers together:

- **cost**: USD per GPU-hour from ``prices`` (``--price``) or the hardware profile's
  ``cost_per_gpu_hour``; ``$/hour`` is GPUs x price. Two prices per output token, named so they
  cannot be confused: ``usd_per_1m_output_tokens_at_max_rate`` is one replica set running at its
  own highest sustainable rate (the cheapest a token gets on that candidate), and the fleet's
  ``usd_per_1m_output_tokens`` (in ``target`` or ``budget``) is the whole fleet's $/hour over the
  output tokens of the rate it serves (the target rate, or the budget fleet's verified rate);
- **ranking**: with a target rate, cheapest fleet first ($/hour at the target, verified fleets
  before unverified ones); with a GPU budget, the highest verified rate on the budget first
  (then the cheaper); without either, cheapest per output token at each candidate's own highest
  rate. Infeasible and unattainable candidates come last;
- **frontier**: the Pareto set of (USD/hour of one replica set, highest sustainable rate):
  candidates no other candidate beats on both;
- **why the losers lose**: for each candidate ranked below the first, its cost (or rate) against
  the winner's and the diagnosis of its knee;
- **launch**: the winner's fleet as ``vllm serve`` and SGLang command lines
  (:mod:`servesim.launch`), so the plan can be tried as it was simulated.

Same config and seed give the same answer, whatever the number of workers: each candidate is
computed on its own from the config's seeds, and the results are put back in candidate order.
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import servesim.policies  # noqa: F401  (registers the built-in policies and routers)
from servesim.capacity.candidate import (
    Candidate,
    analyse_candidate,
    capacity_names,
    expand_candidates,
    experiment_for,
)
from servesim.capacity.config import CapacityConfig
from servesim.capacity.evaluate import sample_workload
from servesim.capacity.limits import decode_batch_limits
from servesim.dtypes import Precision
from servesim.engines import make_engine
from servesim.errors import ServesimError, at_least_one
from servesim.hardware_io import load_hardware
from servesim.launch import launch_configs
from servesim.model_config import load_model
from servesim.policies.base import check_policy
from servesim.policies.routers import check_router
from servesim.topology.resolve import resolve_topology

MILLION = 1e6


def check_inputs(config: CapacityConfig) -> tuple[dict[str, float | None], set[str]]:
    """Raise a one-line error for any mistake that is not a candidate's own (an unknown model or
    GPU, a bad policy knob, a price for hardware not among the candidates); returns the USD per
    GPU-hour of each candidate hardware (by profile name) and the names whose price was given."""
    load_model(config.model, "model")
    p = config.precision
    Precision.from_names(p.weights, p.activations, p.kv_cache, p.group_size, p.expert_weights)
    engine = make_engine(config.engine.name, config.engine.knobs())
    for policy in config.candidates.policy:
        check_policy(policy.name or engine.defaults.policy, policy.knobs())
    check_router(config.router.name, config.router.knobs())
    prices: dict[str, float | None] = {}
    aliases: dict[str, str] = {}
    overridden: set[str] = set()
    for name in config.candidates.hardware:
        profile = load_hardware(name, "candidates.hardware")
        prices[profile.name] = profile.cost_per_gpu_hour
        aliases[name] = profile.name
    for name, price in config.prices.items():
        resolved = aliases.get(name, name)
        if resolved not in prices:
            raise ServesimError(f"prices.{name}", "is not among the candidate hardware",
                                f"price one of: {', '.join(prices)}")
        prices[resolved] = price
        overridden.add(resolved)
    return prices, overridden


def with_engine_defaults(config: CapacityConfig) -> CapacityConfig:
    """``config`` with the shared engine arguments it leaves unset filled in from its engine, so
    the answer records what every candidate ran with."""
    defaults = make_engine(config.engine.name, config.engine.knobs()).defaults
    shared = config.deployment
    filled = {"gpu_memory_utilization": defaults.gpu_memory_utilization, "block_size": defaults.block_size,
              "max_num_seqs": defaults.max_num_seqs, "watermark": defaults.watermark}
    update = {key: value for key, value in filled.items() if getattr(shared, key) is None}
    return config.model_copy(update={"deployment": shared.model_copy(update=update)})


def plan_capacity(config: CapacityConfig, base_dir: Path | None = None, workers: int = 1
                  ) -> dict[str, Any]:
    """The whole capacity answer as one JSON-ready mapping (see the module docstring)."""
    prices, overridden = check_inputs(config)
    config = with_engine_defaults(config)
    at_least_one("--workers", workers)
    candidates = expand_candidates(config)
    records = _analyse_all(config, candidates, base_dir, workers)
    for record in records:
        _add_costs(record, prices, overridden, config)
    ranking = _rank(records, config)
    for rank, record in enumerate(ranking, 1):
        record["rank"] = rank
    _mark_frontier(records)
    _explain_losers(ranking, config)
    launch = winner_launch(config, candidates, ranking[0]) if ranking else None
    return {
        "name": config.name,
        "model": config.model,
        "slo": {**config.slo.model_dump(), "mode": config.slo.mode, "description": config.slo.describe()},
        "target_rate": config.target_rate,
        "gpu_budget": config.gpu_budget,
        "router": config.router.name,
        "search": {**config.search.model_dump(), "requests_per_run": config.requests_per_run,
                   "rule": "a rate passes when the mean over replications of each SLO metric meets "
                           "its target; the answer is the highest passing rate simulated"},
        "seed": config.seed,
        "prices_usd_per_gpu_hour": prices,
        "candidates": sorted(records, key=lambda r: r["rank"]),
        "frontier": [r["index"] for r in sorted((r for r in records if r.get("on_frontier")),
                                                key=lambda r: r["usd_per_hour_per_set"])],
        "launch": launch,
        "config": config.model_dump(mode="json"),
    }


def winner_sets(record: dict[str, Any]) -> int:
    """Replica sets of the winner's fleet: sized for the target or the budget, else one."""
    for key in ("target", "budget"):
        fleet = record.get(key)
        if fleet and fleet.get("sets"):
            return int(fleet["sets"])
    return 1


def winner_launch(config: CapacityConfig, candidates: list[Candidate], record: dict[str, Any]
                  ) -> dict[str, Any] | None:
    """The launch configuration of the winner's fleet (None when no candidate can serve)."""
    if not record.get("feasible") or record["search"]["max_rate"] <= 0:
        return None
    candidate = candidates[record["index"]]
    topology = resolve_topology(experiment_for(config, candidate, winner_sets(record)))
    return {"candidate": record["candidate"], "replica_sets": winner_sets(record),
            **launch_configs(topology, config.router.name, config.model)}


def _analyse_all(config: CapacityConfig, candidates: list[Candidate], base_dir: Path | None,
                 workers: int) -> list[dict[str, Any]]:
    if workers == 1 or len(candidates) == 1:
        return [analyse_candidate(config, c, base_dir) for c in candidates]
    with ProcessPoolExecutor(max_workers=min(workers, len(candidates))) as pool:
        futures = [pool.submit(analyse_candidate, config, c, base_dir) for c in candidates]
        return [f.result() for f in futures]


def _add_costs(record: dict[str, Any], prices: dict[str, float | None], overridden: set[str],
               config: CapacityConfig) -> None:
    price = prices.get(record["hardware"]) if record.get("feasible") else None
    record["usd_per_gpu_hour"] = price
    record["price_source"] = (("prices" if record["hardware"] in overridden else "hardware profile")
                              if price is not None else None)
    gpus_per_set = record.get("gpus_per_replica", record["tp"]) * record["replicas"]
    search = record.get("search", {})
    rate = search.get("max_rate") or 0.0
    per_set = price * gpus_per_set if price is not None else None
    record["gpus_per_set"] = gpus_per_set
    record["usd_per_hour_per_set"] = per_set
    tokens_per_hour = rate * record.get("mean_output_tokens", 0.0) * 3600
    record["usd_per_1m_output_tokens_at_max_rate"] = (
        per_set / tokens_per_hour * MILLION if per_set is not None and tokens_per_hour > 0 else None)
    target = record.get("target")
    if target is not None and target.get("gpus") is not None:
        usd = price * target["gpus"] if price is not None else None
        target["usd_per_hour"] = usd
        at_target = config.target_rate * record["mean_output_tokens"] * 3600
        target["usd_per_1m_output_tokens"] = usd / at_target * MILLION if usd is not None else None
    budget = record.get("budget")
    if budget is not None:
        usd = price * budget["gpu_budget"] if price is not None else None  # idle GPUs are paid too
        budget["usd_per_hour"] = usd
        served = (budget.get("rate") or 0.0) * record.get("mean_output_tokens", 0.0) * 3600
        budget["usd_per_1m_output_tokens"] = usd / served * MILLION if usd is not None and served > 0 \
            else None


def _sort_key(record: dict[str, Any], config: CapacityConfig) -> tuple:
    if not record.get("feasible"):
        return (3, math.inf, record["index"])
    search = record["search"]
    if search["max_rate"] <= 0:
        return (2, math.inf, record["index"])
    if config.target_rate is not None:
        target = record["target"]
        usd = target.get("usd_per_hour")
        return (0 if target["verified"] else 1, usd if usd is not None else math.inf,
                -search["max_rate_per_replica"], record["index"])
    if config.gpu_budget is not None:
        budget = record["budget"]
        if budget.get("rate") is None:  # no whole replica set fits the budget
            return (2, math.inf, record["index"])
        usd = budget.get("usd_per_hour")
        return (0 if budget["verified"] else 1, -budget["rate"], usd if usd is not None else math.inf,
                record["index"])
    usd = record["usd_per_1m_output_tokens_at_max_rate"]
    return (0, usd if usd is not None else math.inf, -search["max_rate"], record["index"])


def _rank(records: list[dict[str, Any]], config: CapacityConfig) -> list[dict[str, Any]]:
    return sorted(records, key=lambda r: _sort_key(r, config))


def _mark_frontier(records: list[dict[str, Any]]) -> None:
    """Pareto set over (USD/hour of one set: lower is better, highest rate: higher is better)."""
    points = [r for r in records if r.get("feasible") and r["search"]["max_rate"] > 0
              and r["usd_per_hour_per_set"] is not None]
    for r in records:
        r["on_frontier"] = False
    for r in points:
        cost, rate = r["usd_per_hour_per_set"], r["search"]["max_rate"]
        dominated = any(o is not r and o["usd_per_hour_per_set"] <= cost and o["search"]["max_rate"] >= rate
                        and (o["usd_per_hour_per_set"] < cost or o["search"]["max_rate"] > rate)
                        for o in points)
        r["on_frontier"] = not dominated


def _explain_losers(ranking: list[dict[str, Any]], config: CapacityConfig) -> None:
    best = ranking[0] if ranking else None
    for record in ranking:
        if not record.get("feasible"):
            record["why"] = f"infeasible: {record['infeasible_reason']}"
            continue
        knee = record["knee"]["summary"]
        if record is best:
            record["why"] = f"best; {knee}"
            continue
        if record["search"]["max_rate"] <= 0:
            record["why"] = knee
            continue
        comparison = _cost_comparison(record, best, config)
        record["why"] = f"{comparison}; {knee}" if comparison else knee


def _cost_comparison(record: dict[str, Any], best: dict[str, Any] | None, config: CapacityConfig) -> str:
    if best is None or not best.get("feasible") or best["search"]["max_rate"] <= 0:
        return ""
    if config.target_rate is not None:
        mine, theirs = record["target"].get("usd_per_hour"), best["target"].get("usd_per_hour")
        if mine is None or theirs is None:
            return "no price"
        return (f"{mine / theirs:.2f}x the cost of the best ({record['target']['gpus']} vs "
                f"{best['target']['gpus']} GPUs)")
    if config.gpu_budget is not None:
        mine_budget, best_budget = record["budget"], best["budget"]
        if mine_budget.get("rate") is None:
            return mine_budget.get("note", "")
        if not best_budget.get("rate"):
            return ""
        return (f"{mine_budget['rate'] / best_budget['rate']:.0%} of the best's rate on "
                f"{config.gpu_budget} GPUs ({mine_budget['rate']:.3g} vs {best_budget['rate']:.3g} req/s)")
    mine, theirs = (record["usd_per_1m_output_tokens_at_max_rate"],
                    best["usd_per_1m_output_tokens_at_max_rate"])
    if mine is None or theirs is None:
        return "no price"
    return f"{mine / theirs:.2f}x the best's $/1M output tokens"


def decode_limits_only(config: CapacityConfig, base_dir: Path | None = None) -> list[dict[str, Any]]:
    """Each candidate's decode-batch limits, without simulating (``--limits-only``): seconds,
    not minutes, for the textbook question."""
    check_inputs(config)
    context = config.decode_context or sample_workload(config, base_dir).decode_context()
    out = []
    for candidate in expand_candidates(config):
        record: dict[str, Any] = {"index": candidate.index, "candidate": candidate.label}
        try:
            group = resolve_topology(experiment_for(config, candidate)).kv_group
        except ServesimError as exc:
            record.update(feasible=False, infeasible_reason=str(capacity_names(exc)))
        else:
            record.update(feasible=True,
                          decode_batch_limits=decode_batch_limits(group, context, config.slo.tpot_s))
        out.append(record)
    return out
