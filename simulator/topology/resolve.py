"""From an experiment to its resolved topology: the engine, then the topology of its kind."""

from __future__ import annotations

from servesim.config import ExperimentConfig
from servesim.engines import make_engine
from servesim.errors import ServesimError
from servesim.policies.fleet_routers import FleetRouter
from servesim.policies.routers import ROUTERS
from servesim.topology import colocated, disaggregated, fleet  # noqa: F401  (register the built-in topologies)
from servesim.topology.base import TOPOLOGIES, Topology


def resolve_topology(config: ExperimentConfig) -> Topology:
    """Everything a run needs before the first event but the workload, every key checked: a bad
    knob or a model that does not fit fails here, in ``servesim validate`` as in ``servesim run``.
    Errors name the keys as the config spelt them."""
    try:
        engine = make_engine(config.engine.name, config.engine.knobs())
        router = ROUTERS.get(config.router.name)
        if router is not None and issubclass(router, FleetRouter) and config.deployment.kind != "fleet":
            raise ServesimError("router.name", f"{config.router.name} routes between the groups of a fleet",
                                "set deployment.kind: fleet with deployment.groups, or pick another router")
        cls = TOPOLOGIES[config.deployment.kind]
        return cls.resolve(config, engine)
    except ServesimError as exc:
        raise config.relabel(exc) from None
