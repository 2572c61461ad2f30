"""Opt-in: declare a probe saturated when its queue keeps growing (``search.saturation_stop``).

The exact stop (``bounds.py``) waits until requests have *certainly* missed a limit. A rate past
what the deployment can serve fails sooner in fact: its backlog (requests arrived but neither
finished nor refused) grows without bound, and with it the queue of requests not yet scheduled.
This test watches that queue in each replication at the end of every window of
``WINDOW_SLICES`` slices while requests still arrive (after the warm-up), and declares the
probe saturated when the last ``RUN`` window-end values rise strictly (``RUN - 1`` rises in a row).

**Confidence.** If the deployment keeps up, its queue is a stable process; sampled at windows
longer than it takes to forget its state, the window-end values are exchangeable, and every
order of ``RUN`` distinct values is equally likely, so ``RUN`` strictly rising values have
probability ``1 / RUN!`` (ties, such as an empty queue, never rise strictly). With ``RUN = 7``
that is 1 in 5,040 per test; a probe makes at most ``SLICES / WINDOW_SLICES - RUN + 1 = 14`` tests per
replication, so a stable probe is declared saturated with probability at most 14 x 2 / 5,040 =
0.56% over two replications (``FALSE_POSITIVE_BOUND`` per replication and test: the union
bound). The assumption fails for windows shorter than the queue's memory, and near the knee a
stable queue drifts slowly, so this test *can* change an answer: a rate whose queue rose
through six windows in a row but whose run would still have met the SLOs (a slowly growing queue that
the finite run ends before it hurts) fails. That is why it is off by default; on the shipped
example it is checked against the exact answer in ``benchmarks/bench_capacity.py``.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np

from servesim.core.state import DONE, REJECTED, RequestState

WINDOW_SLICES = 5
"""Slices of the probe (``probe.SLICES`` per arrival span) per window: 20 windows per run."""

RUN = 7
"""Window-end queue lengths in a row, each above the one before, that declare saturation."""

FALSE_POSITIVE_BOUND = 1 / math.factorial(RUN)
"""Probability of a strictly rising run of ``RUN`` exchangeable values (1 / 7! = 1 / 5,040)."""


def waiting(r: RequestState, now: float) -> int:
    """Requests arrived by ``now`` and not yet scheduled (nor refused): the waiting queue. Not the
    requests in the system: those rise while a replica fills its batch from empty, a transient
    that says nothing about keeping up; a queue that keeps up is mostly empty, and its ties
    never rise strictly."""
    status = r.status
    return int(np.count_nonzero((r.arrival <= now) & np.isnan(r.first_scheduled) & (status != DONE)
                                & (status != REJECTED)))


class BacklogTrend:
    """One replication's window-end queue lengths, and whether the last ``RUN`` rise strictly."""

    def __init__(self) -> None:
        self.samples: list[int] = []

    def add(self, value: int) -> bool:
        """Record a window's end; True when the last ``RUN`` values rise strictly."""
        self.samples.append(value)
        tail = self.samples[-RUN:]
        return len(tail) == RUN and all(a < b for a, b in pairwise(tail))
