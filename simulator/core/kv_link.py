"""The link that carries KV caches from prefill to decode replicas, with its queue.

A transfer of ``b`` bytes holds one of the link's ``channels`` for
``latency_s + b / (bandwidth_Bps * efficiency * lanes)`` seconds
(:meth:`~servesim.hardware.Link.transfer_s`); transfers beyond ``channels``
wait in FIFO order (a SimPy ``Resource``), so contention shows up as link waiting time, not as a
silently shared bandwidth. ``lanes`` = min(prefill TP, decode TP): each GPU holds its shard of
every layer's KV heads and sends it over its own port in parallel (one 400 Gb/s NIC per GPU on a
DGX H100; one NVLink or PCIe port per GPU), so the bytes are the same in total at any TP and the
time shrinks with the narrower side's TP.

Presets (``link.kind``), one direction, per GPU:

- ``nvlink``: the hardware profile's ``interconnect`` (H100 SXM: NVLink 4, 450 GB/s per
  direction, 0.78 achieved and 29 us latency fitted to Vidur's all-reduce profiles); both pools in
  one NVLink domain, as DistServe places them when it can.
- ``pcie``: the profile's ``host_link`` (PCIe 5.0 x16: 64 GB/s, 0.86 achieved per nvbandwidth).
- ``infiniband``: InfiniBand NDR, 400 Gb/s per port = 50 GB/s (NVIDIA ConnectX-7 / Quantum-2
  spec), 2 us per transfer (one-sided RDMA write latency as perftest ``ib_write_lat`` reports on
  NDR, rounded up), efficiency 1: Splitwise's setting (DGX H100 / A100 machines on InfiniBand).
- ``ethernet``: 100 GbE = 12.5 GB/s, 10 us per transfer (RoCE v2 through one switch, order of
  magnitude), efficiency 1: a commodity cluster.

With pools on different hardware the slower side's profile link is used (the lower bandwidth and
the higher latency). ``bandwidth_Bps``, ``latency_s`` and ``efficiency`` override the preset.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import simpy

from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile, Link

NETWORK_PRESETS = {
    "infiniband": Link(kind="infiniband-ndr", bandwidth_Bps=50e9, latency_s=2e-6, efficiency=1.0),
    "ethernet": Link(kind="ethernet-100g", bandwidth_Bps=12.5e9, latency_s=10e-6, efficiency=1.0),
}


@dataclass(frozen=True)
class KvLinkSpec:
    """The resolved link: one GPU's path (``link``), the transfers it carries at once
    (``channels``) and the GPUs that send their shards in parallel per transfer (``lanes``)."""

    link: Link
    channels: int
    lanes: int

    @property
    def kind(self) -> str:
        return self.link.kind

    @property
    def bandwidth_Bps(self) -> float:
        return self.link.bandwidth_Bps

    @property
    def latency_s(self) -> float:
        return self.link.latency_s

    @property
    def efficiency(self) -> float:
        return self.link.efficiency

    def seconds(self, nbytes: float) -> float:
        """Time on the link (once a channel is free) for one transfer of ``nbytes``."""
        return self.link.transfer_s(nbytes, self.lanes)

    def describe(self) -> dict[str, object]:
        link = self.link
        return {"kind": link.kind, "bandwidth_Bps": link.bandwidth_Bps, "latency_s": link.latency_s,
                "efficiency": link.efficiency, "channels": self.channels, "lanes_per_transfer": self.lanes}


def _profile_link(kind: str, hardware: list[HardwareProfile], field: str) -> Link:
    links = [h.interconnect if kind == "nvlink" else h.host_link for h in hardware]
    if kind == "nvlink":
        for h, link in zip(hardware, links, strict=True):
            if "nvlink" not in link.kind.lower():
                raise ServesimError(field, f"{h.name} has no NVLink (its GPU link is "
                                    f"{link.kind})", "use kind: pcie, infiniband or ethernet")
    slowest = min(links, key=lambda link: link.bandwidth_Bps * link.efficiency)
    return slowest.model_copy(update={"latency_s": max(link.latency_s for link in links)})


def resolve_link(kind: str, bandwidth_Bps: float | None, latency_s: float | None,
                 efficiency: float | None, channels: int, lanes: int,
                 hardware: list[HardwareProfile], field: str = "deployment.link.kind") -> KvLinkSpec:
    """The link a disaggregated deployment uses (see the module docstring for the presets)."""
    base = NETWORK_PRESETS[kind] if kind in NETWORK_PRESETS else _profile_link(kind, hardware, field)
    link = Link(kind=base.kind if bandwidth_Bps is None else f"{kind} (custom)",
                bandwidth_Bps=base.bandwidth_Bps if bandwidth_Bps is None else bandwidth_Bps,
                latency_s=base.latency_s if latency_s is None else latency_s,
                efficiency=base.efficiency if efficiency is None else efficiency)
    return KvLinkSpec(link, channels=channels, lanes=lanes)


class KvLink:
    """The link as a SimPy resource; accumulates its busy channel-seconds and bytes."""

    def __init__(self, env: simpy.Environment, spec: KvLinkSpec) -> None:
        self.env = env
        self.spec = spec
        self.channels = simpy.Resource(env, capacity=spec.channels)
        self.busy_s = 0.0
        self.bytes = 0.0
        self.transfers = 0
        self.last_end_s = 0.0

    def transfer(self, nbytes: float) -> Generator[simpy.Event, object, tuple[float, float]]:
        """Wait for a channel, hold it for the copy; returns (start, end)."""
        with self.channels.request() as granted:
            yield granted
            start = self.env.now
            seconds = self.spec.seconds(nbytes)
            yield self.env.timeout(seconds)
            self.busy_s += seconds
            self.bytes += nbytes
            self.transfers += 1
            self.last_end_s = self.env.now
            return start, self.env.now
