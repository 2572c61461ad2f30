"""Building small experiments for the engine tests without YAML files."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.config import ExperimentConfig, validate_document
from simulator.engine import SimulationResult, simulate
from workloads.requests import RequestTable

PLACEHOLDER_WORKLOAD = {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 1,
                        "lengths": {"preset": "azure-conversation"}}


def experiment(deployment: dict[str, Any] | None = None, **top: Any) -> ExperimentConfig:
    document: dict[str, Any] = {"model": "llama-3-8b", "hardware": "h100-sxm-80gb",
                                "workload": PLACEHOLDER_WORKLOAD, **top}
    if deployment:
        document["deployment"] = deployment
    return validate_document(document)


def table(arrivals: list[float] | np.ndarray, prompts: list[int] | np.ndarray | int,
          outputs: list[int] | np.ndarray | int) -> RequestTable:
    n = len(arrivals)
    prompt = np.full(n, prompts) if np.isscalar(prompts) else np.asarray(prompts)
    output = np.full(n, outputs) if np.isscalar(outputs) else np.asarray(outputs)
    return RequestTable(np.asarray(arrivals, dtype=float), prompt, output)


def run(config: ExperimentConfig, workload: RequestTable) -> SimulationResult:
    return simulate(config, workload)
