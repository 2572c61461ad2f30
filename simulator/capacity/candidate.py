"""Everything servesim learns about one candidate deployment, computed in one worker process.

For a candidate (hardware x TP x PP x DP x EP x policy x replica set: colocated replicas, or
a disaggregated prefill:decode split) :func:`analyse_candidate` resolves the deployment (a
model that does not fit is *infeasible*, with the reason, not an error), computes its
decode-batch limits, searches the highest sustainable rate of one replica set, diagnoses the
knee, and then sizes and verifies the fleet: the fewest sets for a target rate
(:func:`size_for_target`), or the sets that fit a GPU budget and the highest rate they sustain
together (:func:`size_for_budget`). It returns plain data, so the process pool can send it back
and the JSON can hold it as is.

A *replica set* is the unit a fleet is made of: ``replicas`` colocated replicas, or ``p`` prefill
and ``d`` decode replicas behind one KV link. A fleet of ``n`` sets is one deployment of ``n x
replicas`` replicas (or ``n x p`` prefill and ``n x d`` decode replicas) behind the router.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.capacity.config import CapacityConfig, Split
from servesim.capacity.evaluate import (
    WorkloadSample,
    judge,
    latency_metrics,
    measure,
    sample_workload,
    verdict,
)
from servesim.capacity.fleet import fleet_replication
from servesim.capacity.limits import decode_batch_limits
from servesim.capacity.probe import Part, Replication, run_together, stopped_record
from servesim.capacity.search import SearchResult, search_rate, topology_saturation_rate
from servesim.config import ExperimentConfig, PolicyConfig, validate_document
from servesim.engines import make_engine
from servesim.errors import ServesimError
from servesim.inputs.flag_names import relabel
from servesim.pipeline import prepare
from servesim.pipeline.slices import SlicedSimulation
from servesim.topology.base import Topology
from servesim.topology.group import ReplicaGroup
from servesim.topology.resolve import resolve_topology
from servesim.workloads import build_workload
from servesim.workloads.requests import RequestTable

VERIFY_ATTEMPTS = 3
"""Fleet sizes tried at the target rate: the computed one, then one and two more replica sets."""

SHORT_RUN_FACTOR = 10.0
"""A search run whose arrivals span less than this many times the latency limit cannot show a
queue that builds up: a burst drains within the limit, and the knee comes out too high."""

KV_FULL = 0.95
"""Peak KV-pool use at which a run counts as KV-cache limited (vLLM preempts near a full pool)."""


@dataclass(frozen=True)
class Candidate:
    index: int
    hardware: str
    tp: int
    policy: PolicyConfig
    replicas: int
    """Replicas per set: a colocated set's replicas; a disaggregated set's prefill + decode."""
    split: Split | None = None
    """Disaggregated candidates only: (prefill, decode) replicas per set."""
    pp: int = 1
    dp: int = 1
    ep: int = 1

    @property
    def kind(self) -> str:
        return "colocated" if self.split is None else "disaggregated"

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def gpus_per_set(self) -> int:
        return self.gpus_per_replica * self.replicas

    @property
    def layout(self) -> dict[str, int]:
        """The degrees beyond TP, when any is above 1 (the record leaves them out otherwise)."""
        if self.pp == self.dp == self.ep == 1:
            return {}
        return {"pp": self.pp, "dp": self.dp, "ep": self.ep}

    @property
    def policy_label(self) -> str:
        knobs = self.policy.knobs()
        return str(self.policy.name) + (" " + ",".join(f"{k}={v}" for k, v in knobs.items()) if knobs else "")

    @property
    def label(self) -> str:
        if self.split is not None:
            set_ = f" disagg {self.split[0]}:{self.split[1]}"
        else:
            set_ = f" x{self.replicas}" if self.replicas > 1 else ""
        extra = "".join(f" {k}{v}" for k, v in self.layout.items() if v > 1)
        return f"{self.hardware} tp{self.tp}{extra}{set_} {self.policy_label}"


def expand_candidates(config: CapacityConfig) -> list[Candidate]:
    """The cartesian product, in the order hardware, tp, pp, dp, ep, policy, then the colocated
    replica counts and the disaggregated splits (a policy without a name is the engine's
    default)."""
    c = config.candidates
    default = make_engine(config.engine.name, config.engine.knobs(), "engine").defaults.policy
    policies = [p if p.name else PolicyConfig(name=default, **p.knobs()) for p in c.policy]
    out: list[Candidate] = []
    for hardware in c.hardware:
        for tp in c.tp:
            for pp in c.pp:
                for dp in c.dp:
                    for ep in c.ep:
                        for policy in policies:
                            if "colocated" in c.kind:
                                for replicas in c.replicas:
                                    out.append(Candidate(len(out), hardware, tp, policy, replicas,
                                                         pp=pp, dp=dp, ep=ep))
                            if "disaggregated" in c.kind:
                                for split in c.splits:
                                    out.append(Candidate(len(out), hardware, tp, policy, sum(split), split,
                                                         pp=pp, dp=dp, ep=ep))
    return out


def experiment_for(config: CapacityConfig, candidate: Candidate, sets: int = 1) -> ExperimentConfig:
    """The experiment that simulates ``sets`` replica sets of ``candidate`` behind the router (its
    workload is replaced at every rate)."""
    slo = {k: v for k, v in config.slo.limits().items()}
    deployment: dict[str, Any] = {**config.deployment.model_dump(exclude_none=True), "tp": candidate.tp,
                                  **candidate.layout}
    if candidate.split is None:
        deployment["replicas"] = sets * candidate.replicas
    else:
        prefill, decode = candidate.split
        deployment.update(kind="disaggregated", prefill={"replicas": sets * prefill},
                          decode={"replicas": sets * decode},
                          link=config.candidates.link.model_dump(exclude_none=True))
    document = {
        "name": f"{config.name}-{candidate.index}", "seed": config.seed, "model": config.model,
        "hardware": candidate.hardware, "engine": config.engine.model_dump(),
        "deployment": deployment,
        "precision": config.precision.model_dump(), "policy": candidate.policy.model_dump(),
        "router": config.router.model_dump(), "workload": config.workload, "slo": slo,
        "output": "summary",
    }
    return validate_document(document, "capacity")


CAPACITY_NAMES = {"deployment.tp": "candidates.tp", "deployment.pp": "candidates.pp",
                  "deployment.dp": "candidates.dp", "deployment.ep": "candidates.ep",
                  "deployment.replicas": "candidates.replicas"}
"""A candidate's experiment keys as the capacity plan spells them."""


def capacity_names(error: ServesimError) -> ServesimError:
    """``error`` with the candidate experiment's keys named as the capacity plan writes them."""
    return relabel(error, CAPACITY_NAMES)


def analyse_candidate(config: CapacityConfig, candidate: Candidate, base_dir: Path | None) -> dict[str, Any]:
    record: dict[str, Any] = {"index": candidate.index, "candidate": candidate.label,
                              "hardware": candidate.hardware, "tp": candidate.tp,
                              "policy": candidate.policy.model_dump(), "replicas": candidate.replicas,
                              "kind": candidate.kind}
    if candidate.split is not None:
        record["split"] = {"prefill": candidate.split[0], "decode": candidate.split[1]}
    if candidate.layout:
        record.update(candidate.layout, gpus_per_replica=candidate.gpus_per_replica)
    experiment = experiment_for(config, candidate)
    try:
        topology = resolve_topology(experiment)
    except ServesimError as exc:
        record.update(feasible=False, infeasible_reason=str(capacity_names(exc)))
        return record
    group = topology.kv_group
    record["feasible"] = True
    record["hardware"] = group.hardware.name
    record["deployment"] = topology.describe()
    record["memory_per_gpu"] = group.memory.to_dict()
    sample = sample_workload(config, base_dir)
    context = config.decode_context or sample.decode_context()
    record["decode_batch_limits"] = decode_batch_limits(group, context, config.slo.tpot_s)

    guess = topology_saturation_rate(topology, sample.mean_prompt_tokens, sample.mean_output_tokens)
    result, stopped = search_with_stops(config, experiment, topology, sample, guess)
    record["search"] = {"status": result.status, "max_rate": result.rate,
                        "max_rate_per_replica": result.rate / candidate.replicas,
                        "failing_rate": result.failing_rate, "first_guess": guess,
                        "simulations": sum(e["replications"] for e in result.evaluations),
                        "evaluations": result.evaluations}
    if config.search.early_stop or config.search.saturation_stop:
        record["search"]["stopped_early"] = stopped
    record["knee"] = diagnose(config, result, group)
    warning = short_run_warning(config, result.rate, len(sample.tables[0]))
    if warning:
        record["warnings"] = [warning]
    record["mean_output_tokens"] = sample.mean_output_tokens
    if config.target_rate is not None:
        record["target"] = size_for_target(config, candidate, result, sample, base_dir)
    if config.gpu_budget is not None:
        record["budget"] = size_for_budget(config, candidate, result, sample, base_dir)
    return record


def search_with_stops(config: CapacityConfig, experiment: ExperimentConfig, topology: Topology,
                      sample: WorkloadSample, guess: float) -> tuple[SearchResult, int]:
    """:func:`search_rate` over probes that stop once their failure is certain (``probe.py``);
    returns the result and how many of its probes stopped early. The knee's own failing probe,
    which :func:`diagnose` reads, is always run to its end: its stopped simulations are kept
    and resumed, so its record is the one a full run gives."""
    paused: dict[float, list[Replication]] = {}
    """The simulations of the latest failing rate, if stopped early: each failure of the search
    is below every earlier one, so it is the knee unless a lower rate fails too."""

    def evaluate(rate: float) -> dict[str, Any]:
        replications = [Replication(table, [Part(SlicedSimulation(prepare(experiment, workload=table,
                                                                          topology=topology)))])
                        for table in (sample.at_rate(k, rate) for k in range(len(sample.tables)))]
        stopped = run_together(replications, config, config.search.early_stop, config.search.saturation_stop)
        if stopped is not None:
            paused.clear()
            paused[rate] = replications
            return stopped_record(config, replications, stopped, rate)
        evaluation = finish(replications, rate)
        if not evaluation["passed"]:
            paused.clear()
        return evaluation

    def finish(replications: list[Replication], rate: float) -> dict[str, Any]:
        run_together(replications, config, early_stop=False)
        runs = [measure(rep.parts[0].sim.result(), rep.table, config) for rep in replications]
        return judge(config, runs, rate)

    s = config.search
    result = search_rate(evaluate, guess, s.precision, s.max_doublings, s.max_halvings)
    stopped = sum(1 for e in result.evaluations if "stopped_early" in e)
    knee = result.failing
    if knee is not None and "stopped_early" in knee:
        full = finish(paused.pop(knee["rate"]), knee["rate"])
        if not knee["stopped_early"]["certain"]:  # the search went on as if it failed: say why
            full["passed"] = False
            full["saturated"] = knee["stopped_early"]["reason"]
        result.evaluations[result.evaluations.index(knee)] = full
        stopped -= 1
    return result, stopped


def short_run_warning(config: CapacityConfig, rate: float, requests: int) -> str | None:
    """A warning when the runs at ``rate`` are too short to judge it (see :data:`SHORT_RUN_FACTOR`)."""
    limits = config.slo.limits()
    longest = max((limits[k] for k in ("ttft_s", "e2e_s") if k in limits), default=None)
    if rate <= 0 or longest is None:
        return None
    span = requests / rate
    if span >= SHORT_RUN_FACTOR * longest:
        return None
    return (f"runs too short to judge {rate:.3g} req/s: {requests} requests arrive in {span:.2g} s, under "
            f"{SHORT_RUN_FACTOR:g}x the {longest:g} s latency limit, so a queue has no time to build and the "
            "highest rate is overestimated; raise search.requests_per_run (--requests)")


def diagnose(config: CapacityConfig, result: SearchResult, group: ReplicaGroup) -> dict[str, Any]:
    """Why the rate cannot go higher: which SLO breaks first, what bounds the steps, whether the
    KV cache is the limit, and how fast the queue grows just past the knee."""
    passing, failing = result.passing, result.failing
    knee: dict[str, Any] = {"passing": _brief(passing), "failing": _brief(failing)}
    if failing is not None:
        margins = failing["margins"]
        first = min(margins, key=margins.__getitem__)
        if first == "attainment":
            misses = failing["miss_fractions"]
            worst = max(misses, key=misses.__getitem__)
            knee["breaks_first"] = f"attainment ({_name(worst)} misses most)"
        else:
            knee["breaks_first"] = _name(first)
        knee["breaks_first_key"] = first
    else:
        knee["breaks_first"] = None
    where = passing or failing
    if where is not None:
        shares = where["bound_shares"]
        knee["step_bound"] = max(shares, key=shares.__getitem__)
        knee["bound_shares"] = shares
    at = failing or passing
    if at is not None:
        kv_limited = at["preemptions"] > 0 or at["peak_kv_use"] >= KV_FULL
        knee["kv_limited"] = bool(kv_limited)
        knee["peak_kv_use"] = at["peak_kv_use"]
        knee["preemptions"] = at["preemptions"]
        knee["queue_growth_per_s"] = at["queue_growth_per_s"]
        # ``max_running`` is the most requests one replica ran in a step: compare with its seats
        knee["slot_limited"] = at["max_running"] >= group.limits.max_num_seqs
    knee["summary"] = _knee_text(knee, result)
    return knee


def _brief(evaluation: dict[str, Any] | None) -> dict[str, Any] | None:
    if evaluation is None:
        return None
    keys = ("rate", "metrics", "attainment", "margins", "miss_fractions", "preemptions", "peak_kv_use",
            "queue_growth_per_s", "mean_batch")
    return {k: evaluation[k] for k in keys}


_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", "attainment": "attainment"}


def _name(key: str) -> str:
    return _NAMES.get(key, key)


def _knee_text(knee: dict[str, Any], result: SearchResult) -> str:
    parts = []
    if result.status == "unattainable":
        parts.append(f"misses the SLOs even at {result.failing_rate:.3g} req/s")
    if knee.get("breaks_first"):
        parts.append(f"{knee['breaks_first']} breaks first at {result.failing_rate:.3g} req/s")
    elif result.status == "ceiling":
        parts.append(f"still within the SLOs at {result.rate:.3g} req/s (search ceiling)")
    if "step_bound" in knee:
        share = knee["bound_shares"][knee["step_bound"]]
        parts.append(f"steps {share:.0%} {knee['step_bound']}-bound")
    if "kv_limited" in knee:
        kv = "KV-cache limited" if knee["kv_limited"] else "not KV-limited"
        parts.append(f"{kv} (peak {knee['peak_kv_use']:.0%}, {knee['preemptions']:.0f} preemptions)")
        parts.append(f"queue grows {max(0.0, knee['queue_growth_per_s']):.2f} req/s")
        if knee.get("slot_limited"):
            parts.append("batch at max_num_seqs")
    return "; ".join(parts)


def size_for_target(config: CapacityConfig, candidate: Candidate, result: SearchResult,
                    sample: WorkloadSample, base_dir: Path | None) -> dict[str, Any]:
    """Replica sets for the target rate, checked by simulating the whole fleet at that rate.

    Sets = ceil(target / sustainable rate of one set); the fleet (sets x replicas replicas behind
    the configured router) then serves ``requests_per_run x sets`` requests at the target rate
    (one replication, seed ``seed``), so each replica sees about as many requests as in the
    search. If that misses the SLOs, one more set is tried, up to :data:`VERIFY_ATTEMPTS` sizes."""
    target = config.target_rate
    assert target is not None
    if result.rate <= 0:
        return {"sets": None, "replicas": None, "gpus": None, "verified": False,
                "note": "the SLOs are not met at any rate searched", "rate": target}
    sets = max(1, math.ceil(target / result.rate * (1 - 1e-12)))
    computed = sets
    attempts = []
    for _ in range(VERIFY_ATTEMPTS):
        replicas = sets * candidate.replicas
        experiment = experiment_for(config, candidate, sets)
        table = _fleet_table(config, sample, sets, target, base_dir)
        evaluation = fleet_verdict(config, experiment, table, target)
        attempts.append({"sets": sets, "replicas": replicas, "passed": evaluation["passed"],
                         "margins": evaluation["margins"], "metrics": evaluation["metrics"],
                         "attainment": evaluation["attainment"]})
        if evaluation["passed"]:
            break
        sets += 1
    verified = attempts[-1]["passed"]
    final = attempts[-1]
    return {"sets": final["sets"], "computed_sets": computed, "replicas": final["replicas"],
            "gpus": final["replicas"] * candidate.gpus_per_replica, "verified": bool(verified),
            "router": config.router.name, "attempts": attempts,
            "margins": final["margins"], "rate": target}


def size_for_budget(config: CapacityConfig, candidate: Candidate, result: SearchResult,
                    sample: WorkloadSample, base_dir: Path | None) -> dict[str, Any]:
    """The highest rate a fleet on the GPU budget sustains, checked by simulating it.

    The fleet is as many whole replica sets as fit: ``floor(budget / GPUs per set)`` (GPUs left
    over are reported as idle, never split into a smaller replica). Its first estimate is that
    many times the rate one set sustains; the whole fleet is then simulated at that rate (one
    replication, ``requests_per_run x sets`` requests, as for a target) and, if it misses the
    SLOs, at rates lowered by the search precision each time, up to :data:`VERIFY_ATTEMPTS`."""
    budget = config.gpu_budget
    assert budget is not None
    sets = budget // candidate.gpus_per_set
    gpus = sets * candidate.gpus_per_set
    base = {"gpu_budget": budget, "sets": sets, "gpus": gpus, "idle_gpus": budget - gpus}
    if sets == 0:
        return {**base, "rate": None, "verified": False,
                "note": f"one replica set needs {candidate.gpus_per_set} GPUs, more than the budget"}
    if result.rate <= 0:
        return {**base, "rate": None, "verified": False, "note": "the SLOs are not met at any rate searched"}
    estimate = sets * result.rate
    rate = estimate
    experiment = experiment_for(config, candidate, sets)
    attempts = []
    for _ in range(VERIFY_ATTEMPTS):
        table = _fleet_table(config, sample, sets, rate, base_dir)
        evaluation = fleet_verdict(config, experiment, table, rate)
        attempts.append({"rate": rate, "passed": evaluation["passed"], "margins": evaluation["margins"],
                         "metrics": evaluation["metrics"], "attainment": evaluation["attainment"]})
        if evaluation["passed"]:
            break
        rate *= 1 - config.search.precision
    final = attempts[-1]
    return {**base, "replicas": sets * candidate.replicas, "estimated_rate": estimate,
            "rate": final["rate"], "verified": bool(final["passed"]), "router": config.router.name,
            "attempts": attempts, "margins": final["margins"]}


def fleet_verdict(config: CapacityConfig, experiment: ExperimentConfig, table: RequestTable,
                  rate: float) -> dict[str, Any]:
    """The verdict on a whole fleet serving ``table`` (one replication; a round-robin fleet is
    simulated replica by replica, with the same latencies: ``fleet.py``)."""
    replication = fleet_replication(experiment, table)
    run_together([replication], config, early_stop=False)
    values, done = replication.values()
    return verdict(config, [latency_metrics(values, done, config)], rate)


def _fleet_table(config: CapacityConfig, sample: WorkloadSample, sets: int, rate: float,
                 base_dir: Path | None):
    workload = config.workload
    if workload.trace is not None or sets == 1:
        return sample.at_rate(0, rate)
    sized = workload.model_copy(update={"num_requests": config.requests_per_run * sets, "duration_s": None})
    table = build_workload(sized, config.seed, base_dir)
    return WorkloadSample((table,), sample.base_rate).at_rate(0, rate)
