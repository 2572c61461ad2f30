"""One iteration, fully explained: the API behind ``servesim step``.

:func:`analyse_step` prices one batch on one deployment, as its serving engine runs it, and checks
that it fits: the weights and workspace in HBM (else the deployment is impossible) and the batch's
KV cache in the pool that remains (else this batch cannot run there). The memory plan is the one
``servesim run`` makes for the same deployment (the engine's defaults, resolved by
:func:`~servesim.topology.group.resolve_group`), with the step budget and seats raised to hold this
batch if it is larger. Notebooks call it directly; the CLI only prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servesim.cost import BatchShape, StepCost
from servesim.dtypes import Precision
from servesim.engines import DEFAULT_ENGINE, Engine, RuntimeCosts, make_engine
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.memory import MemoryPlan
from servesim.model_spec import ModelSpec
from servesim.policies.base import choose_policy
from servesim.topology.group import GroupKeys, ReplicaGroup, resolve_group


@dataclass(frozen=True)
class StepReport:
    model: ModelSpec
    hardware: HardwareProfile
    tp: int
    precision: Precision
    batch: BatchShape
    cost: StepCost
    memory: MemoryPlan

    @property
    def batch_kv_tokens(self) -> int:
        """Tokens in the KV cache once this step has run."""
        b = self.batch
        return int(b.prefill_context.sum() + b.prefill_tokens.sum() + b.decode_context.sum()
                   + b.num_decodes)

    @property
    def tokens_per_s(self) -> float:
        """New tokens (prefill and decode) processed per second by this step."""
        return self.batch.num_new_tokens / self.cost.time_s if self.cost.time_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.batch.num_decodes / self.cost.time_s if self.cost.time_s else 0.0

    def operator_bounds(self) -> dict[str, str]:
        """Bound of each operator class: that of its most expensive kernel."""
        bounds: dict[str, tuple[float, str]] = {}
        for op in self.cost.ops:
            if op.time_s > bounds.get(op.name, (-1.0, ""))[0]:
                bounds[op.name] = (op.time_s, op.bound)
        result = {name: bound for name, (_, bound) in bounds.items()}
        result["communication"] = "communication"
        result["overhead"] = "overhead"
        return result

    def to_dict(self) -> dict[str, Any]:
        b = self.batch
        return {
            **self.cost.to_dict(),
            "tokens_per_s": self.tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "ridge_flop_per_byte": self.hardware.ridge_point(self.precision.math),
            "deployment": {"model": self.model.name, "hardware": self.hardware.name,
                           "tp": self.tp, "weight_dtype": self.precision.weight.value,
                           "act_dtype": self.precision.activation.value,
                           "kv_dtype": self.precision.kv_cache.value,
                           "spec_only_profile": self.hardware.spec_only},
            "batch": {"prefill_tokens": b.prefill_tokens.tolist(),
                      "prefill_context": b.prefill_context.tolist(),
                      "decode_batch": b.num_decodes,
                      "decode_context_total": int(b.decode_context.sum()),
                      "new_tokens": b.num_new_tokens, "sampled_tokens": b.num_logits,
                      "kv_tokens_after_step": self.batch_kv_tokens},
            "memory": self.memory.to_dict(),
        }


def analyse_step(model: ModelSpec, hardware: HardwareProfile, batch: BatchShape, tp: int = 1,
                 precision: Precision | None = None, gpu_memory_utilization: float | None = None,
                 check_kv_fits: bool = True, engine: Engine | None = None,
                 runtime: RuntimeCosts | None = None) -> StepReport:
    """Price ``batch`` on the deployment (run by ``engine``, the default engine unless given;
    ``runtime`` overrides its step cost, e.g. :meth:`RuntimeCosts.none` for the kernels alone) and
    check that it fits in GPU memory."""
    precision = precision or Precision()
    engine = engine or make_engine(DEFAULT_ENGINE, {})
    if batch.is_empty:
        raise ServesimError("batch", "the step has no tokens",
                            "give --prefill-tokens and/or --decode-batch")
    for length in batch.prefill_context + batch.prefill_tokens:
        if length > model.max_context:
            raise ServesimError("prefill_tokens",
                                f"a sequence of {int(length)} tokens exceeds {model.name}'s "
                                f"context of {model.max_context}", "use shorter prompts")
    if batch.num_decodes and int(batch.decode_context.max()) + 1 > model.max_context:
        raise ServesimError("decode_context",
                            f"{int(batch.decode_context.max())} tokens exceeds {model.name}'s "
                            f"context of {model.max_context}", "use a shorter context")
    group = _group(model, hardware, batch, tp, precision, gpu_memory_utilization, engine)
    cost = group.cost_model() if runtime is None else group.cost_model(runtime)
    report = StepReport(model, hardware, tp, precision, batch, cost.step(batch), group.memory)
    memory = report.memory
    if check_kv_fits and report.batch_kv_tokens > memory.kv_token_capacity:
        raise ServesimError(
            "batch",
            f"holds {report.batch_kv_tokens:,} tokens of KV cache but {hardware.name} at tp {tp} "
            f"has room for {memory.kv_token_capacity:,}",
            "use a smaller batch or context, a larger --tp, or --kv-dtype fp8")
    return report


def _group(model: ModelSpec, hardware: HardwareProfile, batch: BatchShape, tp: int, precision: Precision,
           gpu_memory_utilization: float | None, engine: Engine) -> ReplicaGroup:
    """One replica of the deployment as ``servesim run`` would resolve it, its step budget and
    seats at least what ``batch`` needs."""
    policy = choose_policy(engine.defaults.policy, {})
    defaults = engine.scheduler_defaults(hardware.name, hardware.memory.capacity_bytes, tp)
    budget = defaults.max_num_batched_tokens(model.max_context, policy.cls.chunks_prefills)
    seqs = batch.num_prefills + batch.num_decodes
    keys = GroupKeys(tp=tp, replicas=1, gpu_memory_utilization=gpu_memory_utilization, block_size=None,
                     max_num_seqs=max(defaults.max_num_seqs, seqs),
                     max_num_batched_tokens=max(budget, batch.num_new_tokens, seqs), max_model_len=None,
                     watermark=None, num_gpu_blocks=None, enable_prefix_caching=None)
    return resolve_group("replicas", keys, model, hardware, precision, engine, policy)
