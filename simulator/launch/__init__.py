"""Launch configurations: the serving commands that run a simulated deployment for real.

:func:`launch_configs` turns a resolved topology (:func:`servesim.topology.resolve.resolve_topology`)
into one :class:`~servesim.launch.command.LaunchConfig` per engine family (``vllm serve``, SGLang's
``launch_server``, TensorRT-LLM's ``trtllm-serve``), generated from each replica group's
parallelism, memory plan, engine limits, policy and precision, so a plan can be tried on a real
cluster as it was simulated. One function per family (:data:`FAMILIES`); a new family is one
module and one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servesim.launch.command import LaunchConfig, ServerCommand, served_model
from servesim.launch.sglang import sglang_launch
from servesim.launch.trtllm import trtllm_launch
from servesim.launch.vllm import vllm_launch
from servesim.topology.base import Topology

FAMILIES: dict[str, Callable[[Topology, str, str], LaunchConfig]] = {
    "vllm": vllm_launch,
    "sglang": sglang_launch,
    "trtllm": trtllm_launch,
}


def launch_plans(topology: Topology, router: str, model_arg: str | None = None) -> dict[str, LaunchConfig]:
    """Each engine family's launch configuration of ``topology`` behind ``router``."""
    model = served_model(topology.model, model_arg)
    return {family: build(topology, router, model) for family, build in FAMILIES.items()}


def launch_configs(topology: Topology, router: str, model_arg: str | None = None) -> dict[str, Any]:
    """:func:`launch_plans` as JSON-ready data: ``{"model": ..., "vllm": {...}, "sglang": {...}}``."""
    plans = launch_plans(topology, router, model_arg)
    return {"model": served_model(topology.model, model_arg),
            **{family: plan.to_dict() for family, plan in plans.items()}}


__all__ = ["FAMILIES", "LaunchConfig", "ServerCommand", "launch_configs", "launch_plans", "served_model"]
