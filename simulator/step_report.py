"""One iteration, fully explained: the API behind ``servesim step``.

:func:`analyse_step` prices one batch on one deployment and checks that it fits: the weights and
workspace in HBM (else the deployment is impossible) and the batch's KV cache in the pool that
remains (else this batch cannot run there). Notebooks call it directly; the CLI only prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servesim.cost import BatchShape, CostModel, StepCost
from servesim.dtypes import Precision
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.memory import MemoryPlan, plan_memory
from servesim.model_spec import ModelSpec


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
                 precision: Precision | None = None, gpu_memory_utilization: float = 0.9,
                 check_kv_fits: bool = True) -> StepReport:
    """Price ``batch`` on the deployment and check that it fits in GPU memory."""
    precision = precision or Precision()
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
    memory = plan_memory(model, hardware, tp, precision, gpu_memory_utilization,
                         max_num_batched_tokens=max(8192, batch.num_new_tokens),
                         max_num_seqs=max(256, batch.num_prefills + batch.num_decodes))
    report = StepReport(model, hardware, tp, precision, batch,
                        CostModel(model, hardware, tp, precision).step(batch), memory)
    if check_kv_fits and report.batch_kv_tokens > memory.kv_token_capacity:
        raise ServesimError(
            "batch",
            f"holds {report.batch_kv_tokens:,} tokens of KV cache but {hardware.name} at tp {tp} "
            f"has room for {memory.kv_token_capacity:,}",
            "use a smaller batch or context, a larger --tp, or --kv-dtype fp8")
    return report
