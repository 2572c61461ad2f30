"""Collective communication between the GPUs of one tensor-parallel group (ring model).

A ring all-reduce of ``n`` bytes over ``p`` GPUs moves ``2 (p-1)/p * n`` bytes through each GPU's
link (reduce-scatter then all-gather), so its time is that over the achieved link bandwidth plus
a fixed latency per call (launch, synchronisation, the first hop). An all-gather moves half of
that. Both latency and achieved bandwidth come from the hardware profile and are calibrated
against NCCL measurements.
"""

from __future__ import annotations

from servesim.hardware import Link


def ring_allreduce_s(message_bytes: float, world: int, link: Link) -> float:
    """Seconds for one all-reduce of ``message_bytes`` across ``world`` GPUs."""
    if world <= 1 or message_bytes <= 0:
        return 0.0
    wire_bytes = 2.0 * (world - 1) / world * message_bytes
    return link.latency_s + wire_bytes / (link.bandwidth_Bps * link.efficiency)


def ring_allgather_s(total_bytes: float, world: int, link: Link) -> float:
    """Seconds to gather ``total_bytes`` (the size of the gathered result) onto every GPU."""
    if world <= 1 or total_bytes <= 0:
        return 0.0
    wire_bytes = (world - 1) / world * total_bytes
    return link.latency_s + wire_bytes / (link.bandwidth_Bps * link.efficiency)
