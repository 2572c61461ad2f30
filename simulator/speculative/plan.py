"""A replica group's speculative decoding, resolved: proposer, acceptance model, engine caps, and
what it changes in the memory plan, the cost model and the replicas.

:func:`resolve_speculation` is called once per group by
:func:`~servesim.topology.group.resolve_group` (so ``servesim validate`` checks it exactly as
``run`` does); the group then asks the plan for its memory plan, the cost model of its steps
(:class:`~servesim.cost.speculative.SpeculativeCost`) and one
:class:`~servesim.core.speculation.Speculator` per replica.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from servesim.core.speculation import Speculator
from servesim.cost import CostModel
from servesim.cost.speculative import SpeculativeCost
from servesim.dtypes import Precision
from servesim.engines import Engine
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.memory import LOGIT_BYTES, MemoryPlan
from servesim.model_spec import ModelSpec
from servesim.speculative.acceptance import AcceptanceModel, acceptance_model
from servesim.speculative.proposer import Proposer, resolve_proposer
from servesim.speculative.schema import SpeculativeConfig


@dataclass(frozen=True)
class SpeculationPlan:
    config: SpeculativeConfig
    acceptance: AcceptanceModel
    proposer: Proposer
    disable_by_batch_size: int | None
    """The batch cap in force (the experiment's, else the engine's default)."""
    cap_source: str
    step_overhead_s: float
    pass_overhead_s: float
    overhead_source: str

    @property
    def num_tokens(self) -> int:
        return self.config.num_speculative_tokens

    def memory(self, plan: MemoryPlan, max_num_seqs: int, max_num_batched_tokens: int,
               vocab_size: int) -> MemoryPlan:
        """``plan`` with the proposer's weights and KV per token added, and the verification's
        extra fp32 logits (``k`` more rows per request, up to the step's token budget) in the
        activation workspace; one line naming ``speculative`` if the KV cache no longer fits."""
        rows = min(max_num_seqs * (1 + self.num_tokens), max_num_batched_tokens)
        extra_logits = max(0, rows - max_num_seqs) * vocab_size * LOGIT_BYTES
        proposer = self.proposer
        out = replace(plan, weight_bytes=plan.weight_bytes + proposer.weight_bytes,
                      activation_bytes=plan.activation_bytes + extra_logits,
                      kv_bytes_per_token=plan.kv_bytes_per_token + proposer.kv_bytes_per_token)
        if out.kv_cache_bytes <= 0:
            gib = 2**30
            raise ServesimError("speculative", f"the {proposer.method} proposer's "
                                f"{proposer.weight_bytes / gib:.1f} GiB of weights and "
                                f"{extra_logits / gib:.1f} GiB of verification logits per GPU leave "
                                "no room for the KV cache",
                                "use a smaller draft, a larger tp, or fewer num_speculative_tokens")
        return out

    def cost(self, target: CostModel) -> SpeculativeCost:
        return SpeculativeCost(target, self.proposer.passes, self.step_overhead_s, self.pass_overhead_s)

    def speculator(self, seed: int) -> Speculator:
        a = self.acceptance
        return Speculator(self.num_tokens, a.survival, seed, a.propose_rate, self.disable_by_batch_size)

    def describe(self) -> dict[str, Any]:
        """The summary's description of the speculation (method, proposer, acceptance model)."""
        k = self.num_tokens
        return {"method": self.config.method, "num_speculative_tokens": k,
                "model": self.config.model, "disable_by_batch_size": self.disable_by_batch_size,
                "disable_by_batch_size_source": self.cap_source,
                "proposer": self.proposer.describe(),
                "engine_overheads": {"step_s": self.step_overhead_s, "pass_s": self.pass_overhead_s,
                                     "source": self.overhead_source},
                "acceptance_model": {"source": self.acceptance.source,
                                     "per_position": self.acceptance.survival.tolist(),
                                     "propose_rate": self.acceptance.propose_rate,
                                     "expected_acceptance_length": self.acceptance.expected_length(k)}}


def resolve_speculation(config: SpeculativeConfig | None, target: ModelSpec, hardware: HardwareProfile,
                        tp: int, precision: Precision, engine: Engine) -> SpeculationPlan | None:
    """The group's speculation, or None when the experiment does not speculate (no section, or
    ``num_speculative_tokens: 0``, the sweep baseline)."""
    if config is None or not config.enabled:
        return None
    k = config.num_speculative_tokens
    acceptance = acceptance_model(config.acceptance, k)
    proposer = resolve_proposer(config, target, hardware, tp, precision)
    defaults = engine.speculation
    cap: int | None
    if config.disable_by_batch_size is not None:
        cap, source = config.disable_by_batch_size, "speculative.disable_by_batch_size"
    else:
        cap, source = defaults.disable_by_batch_size, f"{engine.name} default: {defaults.provenance}"
    step_s, pass_s, overhead_source = engine.speculation_overheads()
    return SpeculationPlan(config, acceptance, proposer, cap, source, step_s, pass_s, overhead_source)
