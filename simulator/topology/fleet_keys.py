"""The YAML keys of a fleet (``deployment.kind: fleet``): replica groups on possibly different GPUs
behind one router, each optionally autoscaled.

Only schemas and the cold-start arithmetic live here; :mod:`servesim.topology.fleet` resolves and
builds the fleet, :mod:`servesim.topology.autoscaler` scales it.

Cold start (:func:`cold_start_s`): a new replica is billed from the moment it is asked for, and
serves only after ``provision_s`` (a node or pod to start; 0 means a warm node pool) +
``engine_start_s`` (the serving engine's own start: imports, memory profiling, CUDA-graph
capture, compilation) + the replica's weight bytes / the storage bandwidth. Every default is an
estimate, said so in :data:`STORAGE` and :class:`ColdStartKeys`; set your own measurements.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, model_validator

from servesim.inputs.schema import FrozenModel
from servesim.topology.keys import GroupKeys

NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]

STORAGE: dict[str, tuple[float, str]] = {
    "io2-streamer": (2.0e9, "AWS io2 SSD with the Run:ai Model Streamer: 7.53 s for a ~15 GB model"),
    "gp3-streamer": (1.05e9, "AWS gp3 SSD with the Run:ai Model Streamer: 14.34 s for a ~15 GB model"),
    "gp3-safetensors": (0.31e9, "AWS gp3 SSD with vLLM's default safetensors loader: 47.99 s for ~15 GB"),
}
"""Bytes per second a replica reads its weights at. Load times published for the Run:ai Model
Streamer benchmark (Run:ai whitepaper, Oct 2024; NVIDIA developer blog "Reducing cold start latency
for LLM inference with NVIDIA Run:ai Model Streamer", 2025), divided into ~15 GB (an 8B model in
bf16, the benchmark's model class): estimates of an order of magnitude, not measurements of ours."""

ENGINE_START_S = 60.0
"""A serving engine's start besides loading weights: an estimate from one published breakdown of
vLLM serving Llama-3.1-8B on an L40S with warm caches (dynamo 10 s + compile 13 s + CUDA-graph
capture 7 s + engine init and imports 34 s = 64 s; Tensorfuse, "Reducing GPU cold start")."""


class ColdStartKeys(FrozenModel):
    """How long a new replica takes to serve (see the module docstring)."""

    provision_s: NonNegative = Field(0.0, description="node/pod start before the engine (0: warm pool)")
    engine_start_s: NonNegative = Field(ENGINE_START_S, description="engine start besides weights")
    storage: Literal["io2-streamer", "gp3-streamer", "gp3-safetensors"] = "io2-streamer"
    bandwidth_Bps: PositiveFloat | None = Field(None, description="weights read rate; overrides storage")
    total_s: NonNegative | None = Field(None, description="the whole cold start, measured: overrides "
                                        "all of the above")


class AutoscalingKeys(FrozenModel):
    """A group's autoscaler (:mod:`servesim.topology.autoscaler`): every ``interval_s`` it reads
    ``signal`` (sampled every ``sample_s``, averaged over ``window_s``) and asks for
    ``ceil(ready x value / target)`` replicas (Kubernetes HPA), or ``ceil(total / target)`` for
    ``in_flight`` (Knative/KServe KPA's concurrency), clamped to ``[min_replicas, max_replicas]``."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(..., ge=1)
    signal: Literal["queue", "kv", "in_flight", "ttft"] = Field(
        "in_flight", description="queue: waiting requests per replica; kv: KV-cache use (0-1); "
        "in_flight: waiting + running requests per replica; ttft: a TTFT percentile (s) over the window")
    target: PositiveFloat = Field(..., description="the signal's target value per replica")
    ttft_percentile: Annotated[float, Field(gt=0, le=100)] = 90.0
    interval_s: PositiveFloat = Field(15.0, description="between decisions (HPA's sync period)")
    window_s: PositiveFloat = Field(60.0, description="signal averaged over (KPA's stable window)")
    sample_s: PositiveFloat = Field(1.0, description="how often the signal is sampled")
    tolerance: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.1, description="no change while |value / target - 1| <= tolerance (HPA's default)")
    scale_down_delay_s: NonNegative = Field(
        300.0, description="scale down to the highest recommendation of this long (HPA's stabilization)")
    cold_start: ColdStartKeys = ColdStartKeys()

    @model_validator(mode="after")
    def _check(self) -> AutoscalingKeys:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas "
                             f"({self.min_replicas})")
        if self.window_s < self.sample_s:
            raise ValueError("window_s must be at least sample_s")
        return self


class FleetGroupKeys(GroupKeys):
    """One group of a fleet: a :class:`GroupKeys` (replicas, tp, hardware, policy, engine keys)
    with an optional autoscaler and price."""

    replicas: int = Field(1, ge=0, description="replicas (autoscaled: at the start; default min_replicas)")
    autoscaling: AutoscalingKeys | None = None
    cost_per_gpu_hour: PositiveFloat | None = Field(
        None, description="USD per GPU-hour (default: the hardware profile's, with its source)")


def cold_start_s(keys: ColdStartKeys, weight_bytes: float) -> tuple[float, str]:
    """Seconds from asking for a replica to its first step, and how that was computed."""
    if keys.total_s is not None:
        return keys.total_s, f"{keys.total_s:g} s as given"
    bandwidth, source = (keys.bandwidth_Bps, "given") if keys.bandwidth_Bps is not None \
        else STORAGE[keys.storage]
    load = weight_bytes / bandwidth
    return (keys.provision_s + keys.engine_start_s + load,
            f"provision {keys.provision_s:g} s + engine {keys.engine_start_s:g} s + weights "
            f"{weight_bytes / 1e9:.1f} GB / {bandwidth / 1e9:.2f} GB/s = {load:.1f} s ({source})")
