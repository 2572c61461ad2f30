"""What moves between pipeline stages, and what it costs.

After its last layer a stage hands the next one the hidden states and the residual stream of
every token of the micro-batch (vLLM's ``IntermediateTensors``: two ``tokens x hidden`` tensors in
16 bits). Each of the stage's ``tp`` GPUs sends a ``1/tp`` slice to its counterpart in the next
stage over the link between them, and the receiving TP group all-gathers the slices (vLLM's
``send_tensor_dict(..., all_gather_group=tp_group)``); with data-parallel ranks each rank sends
its own tokens at the same time on its own GPUs, so the rank with the most tokens sets the time.

The link is the peer interconnect when both stages sit in one fast domain and the scale-out
network when the boundary crosses domains (:meth:`servesim.parallelism.Placement.stage_send_link`).
"""

from __future__ import annotations

from servesim.cost.communication import ring_allgather_s
from servesim.hardware import Link

ACTIVATION_TENSORS = 2
"""Hidden states and residual, as vLLM's decoder models pass them between stages."""
ACTIVATION_BYTES = 2.0


def activation_bytes(tokens: float, hidden: int) -> float:
    """Bytes a stage hands the next for ``tokens`` tokens (all TP slices together)."""
    return ACTIVATION_TENSORS * tokens * hidden * ACTIVATION_BYTES


def send_s(tokens: float, hidden: int, tp: int, link: Link, fast: Link) -> float:
    """Seconds from a stage's last kernel to the next stage holding the activations: the ``1/tp``
    slices cross ``link`` in parallel, then the next stage's TP group all-gathers them over its
    ``fast`` interconnect."""
    if tokens <= 0:
        return 0.0
    total = activation_bytes(tokens, hidden)
    copy = link.latency_s + total / tp / (link.bandwidth_Bps * link.efficiency)
    return copy + ring_allgather_s(total, tp, fast)
