"""A disaggregated deployment: a prefill pool, a decode pool and the KV link between them.

Each pool is resolved exactly as a colocated deployment is (:func:`resolve_deployment` on the
experiment with the pool's keys laid over ``deployment``), so its memory plan, KV pool and engine
limits come from its own hardware and TP and every check applies to it; an error is reported
under the pool's key (``policy.decode.tp``) when the pool set that key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servesim.config import DeploymentConfig, ExperimentConfig, PolicyConfig
from servesim.cost import CostModel
from servesim.dtypes import Precision
from servesim.engine.deployment import Deployment, policy_knobs, resolve_deployment
from servesim.engine.kv_link import KvLinkSpec, resolve_link
from servesim.errors import ServesimError
from servesim.model_spec import ModelSpec
from servesim.policies.disaggregated import DisaggregatedOptions, PoolOptions, check_disaggregated

POOLS = ("prefill", "decode")
ENGINE_KEYS = ("tp", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "watermark",
               "num_gpu_blocks")
"""Pool keys that override the experiment's ``deployment`` section."""


@dataclass(frozen=True)
class DisaggregatedDeployment:
    prefill: Deployment
    decode: Deployment
    options: DisaggregatedOptions
    link: KvLinkSpec

    @property
    def model(self) -> ModelSpec:
        return self.prefill.model

    @property
    def precision(self) -> Precision:
        return self.prefill.precision

    @property
    def replicas(self) -> int:
        return self.prefill.replicas + self.decode.replicas

    @property
    def num_gpus(self) -> int:
        return self.prefill.num_gpus + self.decode.num_gpus

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes of one token over all TP shards (what crosses the link), at the KV dtype."""
        p = self.precision
        return float(self.model.kv_bytes_per_token(p.kv_cache, 1, p.group_size))

    def pool(self, name: str) -> Deployment:
        return self.prefill if name == "prefill" else self.decode

    def pool_policy(self, name: str) -> tuple[str, dict[str, Any]]:
        return getattr(self.options, name).policy_section()

    def cost_model(self) -> CostModel:
        """The prefill pool's cost model (each pool prices its own steps; see ``pool``)."""
        return self.prefill.cost_model()

    def describe(self) -> dict[str, object]:
        p, d = self.prefill, self.decode
        same_hw = p.hardware.name == d.hardware.name
        out = p.describe()
        out.update({
            "hardware": p.hardware.name if same_hw else f"{p.hardware.name} (prefill) / "
                                                        f"{d.hardware.name} (decode)",
            "tp": p.tp if p.tp == d.tp else f"{p.tp} (prefill) / {d.tp} (decode)",
            "replicas": self.replicas, "gpus": self.num_gpus,
            "kv_blocks_per_replica": d.limits.num_blocks,
            "max_num_seqs": d.limits.max_num_seqs,
            "max_num_batched_tokens": d.limits.max_num_batched_tokens,
            "pools": {name: self._describe_pool(name) for name in POOLS},
            "link": self.link.describe(),
        })
        return out

    def _describe_pool(self, name: str) -> dict[str, object]:
        pool = self.pool(name)
        described = pool.describe()
        policy, knobs = self.pool_policy(name)
        keep = ("hardware", "tp", "replicas", "gpus", "kv_blocks_per_replica", "max_num_seqs",
                "max_num_batched_tokens")
        out = {key: described[key] for key in keep}
        out["policy"] = policy
        if knobs:
            out["policy_options"] = knobs
        if name == "decode":
            out["router"] = self.options.decode.router
        return out


def resolve_disaggregated(config: ExperimentConfig) -> DisaggregatedDeployment:
    options = check_disaggregated(policy_knobs(config.policy))
    if config.deployment.replicas != 1:
        raise ServesimError("deployment.replicas", "a disaggregated deployment sizes its pools itself",
                            "set policy.prefill.replicas and policy.decode.replicas instead")
    prefill = _resolve_pool(config, "prefill", options.prefill)
    decode = _resolve_pool(config, "decode", options.decode)
    if prefill.model.name != decode.model.name:  # pragma: no cover (one model key per experiment)
        raise ServesimError("model", "pools must serve the same model", "use one model")
    link = options.link
    spec = resolve_link(link.kind, link.bandwidth_Bps, link.latency_s, link.efficiency, link.channels,
                        min(prefill.tp, decode.tp), [prefill.hardware, decode.hardware])
    return DisaggregatedDeployment(prefill, decode, options, spec)


def _resolve_pool(config: ExperimentConfig, name: str, pool: PoolOptions) -> Deployment:
    overrides = {key: getattr(pool, key) for key in ENGINE_KEYS if getattr(pool, key) is not None}
    deployment = DeploymentConfig(**{**config.deployment.model_dump(), **overrides,
                                     "replicas": pool.replicas})
    policy, knobs = pool.policy_section()
    derived = config.model_copy(update={
        "hardware": pool.hardware or config.hardware, "deployment": deployment,
        "policy": PolicyConfig(name=policy, **knobs)})
    try:
        return resolve_deployment(derived)
    except ServesimError as exc:
        raise ServesimError(_pool_field(exc.field, name, pool, overrides), exc.problem, exc.fix) from None


def _pool_field(field: str, name: str, pool: PoolOptions, overrides: dict[str, Any]) -> str:
    """The key a user set that an error is about: the pool's own, or the shared one."""
    head, _, rest = field.partition(".")
    key = rest if head == "deployment" else head
    if key in overrides or (key == "hardware" and pool.hardware):
        return f"policy.{name}.{key}"
    if head == "policy":
        return f"policy.{name}.policy" + (f".{rest}" if rest else "")
    if head == "deployment" and key == "":
        return f"policy.{name}"
    return f"{field} (pool {name})"
