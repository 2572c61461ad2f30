"""A time window of a built workload: the requests (or whole sessions) that start in it.

Used to size a fleet for the busiest part of a day without simulating the whole day: a session
is kept whole (all its turns, even those sent after the window ends) when it starts inside the
window, so no kept request waits for one left out.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from servesim.workloads.requests import RequestTable

HOUR_S = 3600.0


def starts(table: RequestTable) -> np.ndarray:
    """Per request, when its session started (its own arrival when it belongs to none)."""
    arrival = table.arrival_s
    links = table.links
    if links is None or not np.any(links.session >= 0):
        return arrival
    session = links.session
    first = np.full(int(session.max()) + 1, np.inf)
    mine = session >= 0
    np.minimum.at(first, session[mine], arrival[mine])
    return np.where(mine, first[np.maximum(session, 0)], arrival)


def window(table: RequestTable, start_s: float, end_s: float) -> RequestTable:
    """The requests whose session starts in ``[start_s, end_s)``, re-timed so ``start_s`` is 0."""
    begin = starts(table)
    rows = np.flatnonzero((begin >= start_s) & (begin < end_s))
    part = table.take(rows)
    return replace(part, arrival_s=np.maximum(part.arrival_s - start_s, 0.0),
                   source=f"{table.source}; sessions starting in [{start_s:g}, {end_s:g}) s")


def busiest(table: RequestTable, length_s: float = HOUR_S) -> float:
    """Start of the ``length_s`` stretch (on multiples of it: whole hours by default) in which the
    most requests arrive (the earliest of equals)."""
    arrival = table.arrival_s
    if not arrival.size:
        return 0.0
    bins = np.floor(arrival / length_s).astype(np.int64)
    return float(np.argmax(np.bincount(bins)) * length_s)
