"""Timing one kernel properly: warm-up, synchronisation, repetitions, median.

On CUDA each repetition is bracketed by CUDA events after a synchronisation, and a short spin
kernel (``torch.cuda._sleep``) is queued first: while the GPU spins, the host enqueues the start
event and the kernel, so the events time the kernel and not Python's launch latency (what a
profiler such as kineto reports, and what Vidur's public timings are). On CPU, ``perf_counter``
brackets each call (torch CPU ops are synchronous). The median of the
repetitions is reported because a CPU shared with other processes, or a GPU changing clocks,
gives a long upper tail that a mean would chase.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servesim.errors import ServesimError


def import_torch() -> Any:
    """torch, or the one-line error that says how to install it."""
    try:
        import torch
    except ImportError:
        raise ServesimError("torch", "not installed (the benchmarks run real kernels with torch)",
                            "pip install torch --index-url https://download.pytorch.org/whl/cpu (a CPU "
                            "wheel; plain pip install torch on a GPU machine; tested: 2.13.0)") from None
    return torch


SPIN_CYCLES = 1_000_000
"""About 0.5 ms at GPU clocks: far longer than the host needs to enqueue one call."""


@dataclass(frozen=True)
class Timing:
    warmup: int
    reps: int

    @classmethod
    def for_run(cls, device: str, quick: bool, reps: int | None = None) -> Timing:
        """The defaults per device and grid, or ``reps`` repetitions after a fifth as many warm-ups
        (at least 2): a short GPU lease cannot afford 50 repetitions of 5,000 GEMMs."""
        if reps is not None:
            if reps < 1:
                raise ServesimError("--reps", f"must be at least 1, got {reps}", "e.g. --reps 15")
            return cls(warmup=max(2, reps // 5), reps=reps)
        if device == "cuda":
            return cls(warmup=5, reps=15) if quick else cls(warmup=10, reps=50)
        return cls(warmup=1, reps=5) if quick else cls(warmup=3, reps=15)


def median_seconds(fn: Callable[[], object], device: str, timing: Timing) -> float:
    """Median seconds of one call of ``fn`` on ``device``."""
    torch = import_torch()
    for _ in range(timing.warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        spin = getattr(torch.cuda, "_sleep", None)
        times = []
        for _ in range(timing.reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if spin is not None:
                spin(SPIN_CYCLES)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)
    times = []
    for _ in range(timing.reps):
        start_s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start_s)
    return statistics.median(times)


ROTATE_BYTES = 256 * 2**20
"""Inputs rotated per repetition add up to at least this (well past any GPU L2 or CPU LLC)."""
MAX_COPIES = 16


class Rotating:
    """Hands out copies of a kernel's inputs in turn, so that each repetition reads operands that
    are not cache-resident, as in a serving step where every layer reads its own weights and KV."""

    def __init__(self, items: list[Any]) -> None:
        self.items, self.i = items, 0

    def next(self) -> Any:
        self.i = (self.i + 1) % len(self.items)
        return self.items[self.i]

    def call_next(self) -> Any:
        """Call the next item, when the items are the kernels themselves."""
        return self.next()()


def copies_for(nbytes: float) -> int:
    """How many copies of ``nbytes`` of inputs make up the rotation."""
    return int(min(MAX_COPIES, max(1, ROTATE_BYTES // max(nbytes, 1))))
