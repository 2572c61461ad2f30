"""Collective communication between the GPUs of one tensor-parallel group.

A ring all-reduce of ``n`` bytes over ``p`` GPUs moves ``2 (p-1)/p * n`` bytes through each GPU's
link (reduce-scatter then all-gather), so its time is that over the achieved link bandwidth plus
a fixed latency per call (launch, synchronisation, the first hop). An all-gather moves half of
that. Both latency and achieved bandwidth come from the hardware profile and are calibrated
against NCCL measurements. That is servesim 0.1's model (``allreduce: ring``).

Serving engines choose among implementations by message size (:func:`allreduce_s`): a tensor-
parallel decode step all-reduces a few kilobytes per layer, where vLLM's custom all-reduce
takes about 5 us on H100 and NCCL 6-16 us, so the implementation, not the bandwidth, decides
the cost of communication there.

A TP group wider than one fast domain (multi-node TP) runs both hierarchically: inside each
domain over the fast link, across domains over the scale-out network (:func:`spanning_allreduce_s`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.hardware import CollectiveFit, HardwareProfile, Link

if TYPE_CHECKING:
    from servesim.engines.base import RuntimeCosts


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


# ---------------------------------------------------------------------- as serving engines run them
def ring_wire_bytes(message_bytes: float, world: int) -> float:
    """Bytes each GPU moves for a ring (or two-shot) all-reduce: reduce-scatter + all-gather."""
    return 2.0 * (world - 1) / world * message_bytes


def oneshot_wire_bytes(message_bytes: float, world: int) -> float:
    """Bytes each GPU reads for a one-shot all-reduce: every peer's whole buffer."""
    return (world - 1) * message_bytes


def fitted_collective_s(fit: CollectiveFit, wire_bytes: float, world: int, link: Link) -> float:
    """One call of a measured implementation (:class:`~servesim.hardware.CollectiveFit`)."""
    return (fit.latency_s + fit.latency_per_peer_s * (world - 1)
            + wire_bytes / (link.bandwidth_Bps * fit.efficiency_at(wire_bytes, world)))


def allreduce_kind(message_bytes: float, world: int, runtime: RuntimeCosts,
                   capability: str | None = None) -> str:
    """Which implementation the engine runs for this message on GPUs of compute ``capability``:
    ``oneshot`` or ``twoshot`` (its custom all-reduce, below the custom limit), ``symm_mem``
    (PyTorch's symmetric-memory all-reduce, up to its limit, where the engine's tables name this
    GPU and group) or ``nccl``."""
    if runtime.allreduce != "custom":
        return "nccl"
    custom_below, symm_max = runtime.allreduce_limits_at(capability, world)
    if message_bytes < custom_below:
        return "oneshot" if message_bytes < runtime.oneshot_limit(world) else "twoshot"
    if message_bytes <= symm_max:
        return "symm_mem"
    return "nccl"


def domains_spanned(world: int, hardware: HardwareProfile) -> tuple[int, int] | None:
    """(GPUs per domain, domains) when a ``world``-GPU group spans several fast domains (a TP
    group over nodes), else None. :func:`servesim.parallelism.check_parallelism` makes such a
    group hold whole domains and the profile name a scale-out network."""
    domain = hardware.fast_domain_gpus
    if domain is None or world <= domain or hardware.scale_out is None:
        return None
    return domain, world // domain


def _nccl_allreduce_s(message_bytes: float, world: int, runtime: RuntimeCosts,
                      hardware: HardwareProfile) -> float:
    """An all-reduce inside one domain by NCCL (or the ring model, as the runtime says)."""
    fit = hardware.collectives.nccl if hardware.collectives is not None else None
    if fit is None or runtime.allreduce == "ring":
        return ring_allreduce_s(message_bytes, world, hardware.interconnect)
    return fitted_collective_s(fit, ring_wire_bytes(message_bytes, world), world, hardware.interconnect)


def spanning_allreduce_s(message_bytes: float, domain: int, domains: int, runtime: RuntimeCosts,
                         hardware: HardwareProfile) -> float:
    """An all-reduce over ``domains`` whole domains of ``domain`` GPUs, as NCCL runs it across
    nodes: a reduce-scatter and an all-gather inside each domain (together one intra-domain
    all-reduce's traffic, over the fast link) around an all-reduce of each GPU's ``1/domain``
    shard with its peers in the other domains, every GPU on its own scale-out NIC. Engines turn
    their custom all-reduce off across nodes (vLLM: custom all-reduce is single-node), so the
    intra-domain part is NCCL's."""
    assert hardware.scale_out is not None
    inside = _nccl_allreduce_s(message_bytes, domain, runtime, hardware)
    return inside + ring_allreduce_s(message_bytes / domain, domains, hardware.scale_out)


def allreduce_s(message_bytes: float, world: int, runtime: RuntimeCosts,
                hardware: HardwareProfile) -> float:
    """Seconds for one all-reduce as the engine runs it on this hardware.

    vLLM's custom all-reduce (``csrc/custom_all_reduce.cuh``, used below its 8 MiB buffer, or
    below the smaller limit its tables give the GPU and group) runs a one-shot kernel for 2 GPUs
    and for small messages (each GPU reads all peers' buffers over NVLink and reduces locally: one
    synchronisation, ``(w-1) n`` bytes in) and a two-shot kernel otherwise (reduce-scatter then
    all-gather through peer memory: ``2 (w-1)/w n`` bytes). On Hopper and Blackwell, messages
    from there up to a second limit run PyTorch's symmetric-memory all-reduce (``symm_mem``,
    priced on ``2 (w-1)/w n`` bytes: its fitted bandwidth fraction absorbs what the NVSwitch's
    in-switch reduction saves); larger messages go to NCCL. Each implementation's latency and
    achieved bandwidth come from the profile's ``collectives`` section (measured); a profile
    without it uses the interconnect's ring model, and one without a ``symm_mem`` fit prices
    those messages as NCCL's."""
    if world <= 1 or message_bytes <= 0:
        return 0.0
    spans = domains_spanned(world, hardware)
    if spans is not None:
        return spanning_allreduce_s(message_bytes, *spans, runtime, hardware)
    link = hardware.interconnect
    fits = hardware.collectives
    kind = allreduce_kind(message_bytes, world, runtime, hardware.compute_capability)
    if kind == "symm_mem" and (fits is None or fits.symm_mem is None):
        kind = "nccl"
    fit = getattr(fits, kind) if fits is not None else None
    if fit is None:
        return ring_allreduce_s(message_bytes, world, link)
    wire = (oneshot_wire_bytes if kind == "oneshot" else ring_wire_bytes)(message_bytes, world)
    return fitted_collective_s(fit, wire, world, link)


def allgather_s(total_bytes: float, world: int, runtime: RuntimeCosts, hardware: HardwareProfile) -> float:
    """Seconds for one all-gather (the logits): NCCL, priced with the profile's measured NCCL
    latency and bandwidth when it has them (an all-gather moves half a ring all-reduce's bytes)."""
    if world <= 1 or total_bytes <= 0:
        return 0.0
    spans = domains_spanned(world, hardware)
    if spans is not None:  # gather each domain's part across domains, then inside each domain
        domain, domains = spans
        assert hardware.scale_out is not None
        return (ring_allgather_s(total_bytes / domain, domains, hardware.scale_out)
                + allgather_s(total_bytes, domain, runtime, hardware))
    fit = hardware.collectives.nccl if hardware.collectives is not None else None
    if fit is None or runtime.allreduce == "ring":
        return ring_allgather_s(total_bytes, world, hardware.interconnect)
    return fitted_collective_s(fit, (world - 1) / world * total_bytes, world, hardware.interconnect)
