"""The SimPy serving engine: request state, KV-cache pool, replica loop, and the run itself."""

from servesim.engine.deployment import Deployment, resolve_deployment
from servesim.engine.simulation import SimulationResult, simulate

__all__ = ["Deployment", "SimulationResult", "resolve_deployment", "simulate"]
