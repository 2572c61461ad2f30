"""``colocated``: N identical replicas behind a router, each running prefill and decode.

The experiment's ``deployment`` keys are the one group's (``replicas``, ``tp``, engine
arguments), ``policy`` its scheduling policy, ``router`` the router in front of it. With prefix
caching on, the replicas share one prefix index of the workload (each keeps its own cache).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.core.prefix_index import PrefixIndex
from servesim.core.replica_state import ReplicaState, rejection_codes
from servesim.dtypes import Precision
from servesim.engines import Engine
from servesim.errors import ServesimError
from servesim.hardware_io import load_hardware
from servesim.metrics.parallel_usage import pipeline_usage
from servesim.model_config import load_model
from servesim.parallelism import stages_of
from servesim.policies.base import choose_policy
from servesim.policies.routers import RouterChoice, choose_router
from servesim.topology.base import Built, Topology, build_group, register_topology
from servesim.topology.group import GroupKeys, ReplicaGroup, resolve_group

if TYPE_CHECKING:
    from servesim.config import ExperimentConfig
    from servesim.core.sim import Sim


def deployment_keys(config: ExperimentConfig, **overrides: Any) -> GroupKeys:
    """The deployment section's group keys, with ``overrides`` (a group's own) laid over them."""
    d = config.deployment
    values = {key: getattr(d, key) for key in GroupKeys.__dataclass_fields__}
    if d.expert_routing is not None:
        values["expert_routing"] = d.expert_routing.describe()
    values.update({k: v for k, v in overrides.items() if v is not None})
    return GroupKeys(**values)


def experiment_policy(config: ExperimentConfig, engine: Engine) -> tuple[str, dict[str, Any]]:
    """(name, knobs) of the experiment's ``policy`` section, the engine's default policy when it
    names none."""
    return config.policy.name or engine.defaults.policy, config.policy.knobs()


def router_of(config: ExperimentConfig, engine: Engine) -> RouterChoice:
    """The experiment's router, refused in one line when it routes by prefix caches that are off."""
    router = choose_router(config.router.name, config.router.knobs())
    requested = config.deployment.enable_prefix_caching
    caching = engine.defaults.enable_prefix_caching if requested is None else requested
    if router.cls.needs_prefix_cache and not caching:
        raise ServesimError("router.name", f"{router.name} routes by what the replicas' prefix "
                            "caches hold, and prefix caching is off",
                            "set deployment.enable_prefix_caching: true or pick another router")
    return router


def precision_of(config: ExperimentConfig) -> Precision:
    p = config.precision
    return Precision.from_names(p.weights, p.activations, p.kv_cache, p.group_size, p.expert_weights)


@register_topology
class Colocated(Topology):
    kind = "colocated"
    fast_forward = True

    def __init__(self, group: ReplicaGroup, router: RouterChoice) -> None:
        super().__init__((group,))
        self.group = group
        self.router = router

    @classmethod
    def resolve(cls, config: ExperimentConfig, engine: Engine) -> Colocated:
        d = config.deployment
        for key in ("prefill", "decode", "link"):
            if getattr(d, key) is not None:
                raise ServesimError(f"deployment.{key}", "applies to deployment.kind disaggregated only",
                                    "set deployment.kind: disaggregated or remove it")
        name, knobs = experiment_policy(config, engine)
        policy = choose_policy(name, knobs)
        router = router_of(config, engine)
        model = load_model(config.model, "model")
        hardware = load_hardware(config.hardware, "hardware")
        group = resolve_group("replicas", deployment_keys(config), model, hardware, precision_of(config),
                              engine, policy, config.speculative)
        return cls(group, router)

    def describe(self) -> dict[str, Any]:
        return self.group.describe()

    def rejection_codes(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        return rejection_codes(prompt, output, self.group.limits)

    def build(self, sim: Sim, reject_codes: np.ndarray) -> Built:
        limits = self.group.limits
        prefixes = PrefixIndex(sim.workload, limits.block_size) if limits.enable_prefix_caching else None
        make_state = partial(_state, sim, limits, prefixes, reject_codes)
        run = build_group(sim, self.group, 0, make_state, fast_forward=self.fast_forward, sole_group=True)
        router = self.router.make(run.states)
        replicas = run.replicas

        def entry(request: int, now: float) -> None:
            replicas[router.route(request, now)].accept(request)

        return Built(entry, [run])

    def summary_sections(self, sim: Sim, built: Built, requests: Any, steps: Any,
                         span: float) -> dict[str, Any]:
        """``parallelism`` (pipelined replicas only): how busy each pipeline stage was, the
        bubble (stage time left idle while another stage works), and the share of stage time the
        data-parallel ranks spent waiting for the slowest one."""
        run = built.groups[0]
        if not run.pipelines:
            return {}
        group = self.group
        layers = [stage.layers for stage in stages_of(group.model, group.parallelism)]
        return {"parallelism": pipeline_usage(group.parallelism.label(), layers, run.pipelines, span)}

    def summary_lines(self, sections: dict[str, Any]) -> list[str]:
        section = sections.get("parallelism")
        if section is None:
            return []
        busy = ", ".join(f"{b:.0%}" for b in section["stage_busy_fraction"])
        return [f"pipeline: {section['label']}; stage busy {busy}; bubble {section['bubble_fraction']:.0%} "
                f"of the busiest stage's time; DP ranks waited {section['dp_wait_fraction']:.0%} of "
                "stage time for the slowest rank"]


def _state(sim: Sim, limits: Any, prefixes: PrefixIndex | None, reject_codes: np.ndarray,
           index: int) -> ReplicaState:
    return ReplicaState(index, sim.requests, limits, seed=sim.seed, prefixes=prefixes,
                        reject_codes=reject_codes)
