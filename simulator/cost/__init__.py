"""The roofline cost model: (model, hardware, parallelism, precision, batch) -> seconds."""

from servesim.cost.attention import AttentionShape, causal_pairs
from servesim.cost.batch import BatchShape
from servesim.cost.communication import ring_allgather_s, ring_allreduce_s
from servesim.cost.roofline import OpCost, roofline
from servesim.cost.step_cost import BOUNDS, BREAKDOWN_KEYS, OP_CLASS_OF, OP_CLASSES, CostModel, StepCost

__all__ = [
           "BOUNDS",
           "BREAKDOWN_KEYS",
           "OP_CLASSES",
           "OP_CLASS_OF",
           "AttentionShape",
           "BatchShape",
           "CostModel",
           "OpCost",
           "StepCost",
           "causal_pairs",
           "ring_allgather_s",
           "ring_allreduce_s",
           "roofline",
]
