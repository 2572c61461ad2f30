"""The SimPy serving engine: request state, KV-cache pool, replica loop, and the run itself."""

from simulator.engine.deployment import Deployment, resolve_deployment
from simulator.engine.simulation import SimulationResult, simulate

__all__ = ["Deployment", "SimulationResult", "resolve_deployment", "simulate"]
