"""The YAML keys of a deployment's replica groups and links (``deployment.prefill`` etc.).

Only schemas live here (the experiment schema in :mod:`servesim.config` embeds them); resolving
them is :mod:`servesim.topology.disaggregated`'s job.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from servesim.inputs.schema import FrozenModel

GROUP_ENGINE_KEYS = ("tp", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "watermark",
                     "num_gpu_blocks", "pp", "dp", "ep")
"""Keys a group may set to override the deployment's own (``block_size`` and ``max_model_len`` are
always the deployment's: one service)."""


class GroupKeys(FrozenModel):
    """One group of identical replicas. Unset engine keys take the deployment's values."""

    replicas: int = Field(1, ge=1, description="replicas in this group")
    tp: int | None = Field(None, ge=1, description="tensor-parallel degree of each replica")
    hardware: str | None = Field(None, description="GPU of this group (default: the experiment's)")
    policy: str | dict[str, Any] | None = Field(
        None, description="this group's scheduling policy: a name or {name: ..., knobs} (default: the "
        "experiment's policy section)")
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    watermark: float | None = Field(None, ge=0, lt=1)
    num_gpu_blocks: int | None = Field(None, ge=1)
    pp: int | None = Field(None, ge=1, description="pipeline stages of each replica")
    dp: int | None = Field(None, ge=1, description="data-parallel attention ranks of each replica")
    ep: int | None = Field(None, ge=1, description="expert-parallel degree of each replica's MoE layers")

    def policy_section(self, default: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        """(name, knobs) of this group's policy; ``default`` when it sets none."""
        if self.policy is None:
            return default
        if isinstance(self.policy, str):
            return self.policy, {}
        knobs = dict(self.policy)
        return str(knobs.pop("name", default[0])), knobs


class DecodeGroupKeys(GroupKeys):
    router: str = Field("least_kv", description="which decode replica takes a prefilled request: "
                        "least_kv, or any router's name")


LinkKind = Literal["nvlink", "pcie", "infiniband", "ethernet"]

AllToAllBackend = Literal["allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency"]
"""vLLM's ``--all2all-backend`` values that are modelled (:mod:`servesim.cost.expert_parallel`)."""


class ExpertRoutingKeys(FrozenModel):
    """How unevenly routed tokens load the expert-parallel ranks: ``imbalance`` gives the busiest
    rank's load over the mean directly (a measurement), ``zipf`` an exponent of Zipf-distributed
    expert popularity from which it is computed. Neither: uniform routing."""

    imbalance: float | None = Field(None, ge=1, description="busiest expert rank's load / mean")
    zipf: float | None = Field(None, gt=0, description="exponent s of expert popularity ~ rank^-s")

    def describe(self) -> dict[str, float]:
        return {k: v for k, v in (("imbalance", self.imbalance), ("zipf", self.zipf)) if v is not None}


class LinkKeys(FrozenModel):
    """The KV path between the groups; ``kind`` picks a preset (see
    :func:`servesim.core.kv_link.resolve_link`), the other keys override it."""

    kind: LinkKind = "infiniband"
    bandwidth_Bps: float | None = Field(None, gt=0, description="per GPU, one direction")
    latency_s: float | None = Field(None, ge=0, description="per transfer")
    efficiency: float | None = Field(None, gt=0, le=1, description="achieved / peak bandwidth")
    channels: int = Field(1, ge=1, description="transfers the link carries at once; more wait")
