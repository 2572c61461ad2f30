"""The roofline cost model: (model, hardware, parallelism, precision, engine runtime, batch) -> seconds."""

from servesim.cost.attention import AttentionShape, causal_pairs
from servesim.cost.batch import BatchShape
from servesim.cost.communication import ring_allgather_s, ring_allreduce_s
from servesim.cost.roofline import OpCost, roofline
from servesim.cost.step_cost import (
    BOUNDS,
    BREAKDOWN_KEYS,
    IDLE_RECORD,
    OP_CLASS_OF,
    OP_CLASSES,
    CostModel,
    StepCost,
    StepRecord,
)

__all__ = [
    "BOUNDS",
    "BREAKDOWN_KEYS",
    "IDLE_RECORD",
    "OP_CLASSES",
    "OP_CLASS_OF",
    "AttentionShape",
    "BatchShape",
    "CostModel",
    "OpCost",
    "StepCost",
    "StepRecord",
    "causal_pairs",
    "ring_allgather_s",
    "ring_allreduce_s",
    "roofline",
]
