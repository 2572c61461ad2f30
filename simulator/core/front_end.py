"""The engine's front end on a request's way in: the one place a request is held back by it.

A client's request reaches the scheduler a fixed latency after it was sent
(:attr:`servesim.engines.base.CpuCosts.frontend_s`). The arrival loop
(:func:`servesim.core.sim.arrivals`) shifts its table times by it, so that ``NextArrival`` holds
the entries; requests sent at run time (closed-loop clients, releases) go through
:func:`enter_after`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

if TYPE_CHECKING:
    from servesim.core.sim import NextArrival

Entry = Callable[[int, float], None]


def enter_after(env: simpy.Environment, latency_s: float, enter: Entry, request: int,
                upcoming: NextArrival | None = None) -> None:
    """``enter(request, now)`` once the request has crossed the engine's front end: at once
    without one, else ``latency_s`` later (one timeout). One timeout per request, none
    without a front end. ``upcoming``: the crossing is announced there when it starts (the clock
    value its timeout lands on) and withdrawn as the request enters, so that fast-forwarded runs
    end before it (:class:`~servesim.core.sim.NextArrival`)."""
    if latency_s <= 0:
        enter(request, env.now)
        return
    timer = env.timeout(latency_s)
    if upcoming is None:
        timer.callbacks.append(lambda _: enter(request, env.now))
        return
    upcoming.expect(env.now + latency_s)

    def cross(_: simpy.Event) -> None:
        upcoming.entered(env.now)
        enter(request, env.now)

    timer.callbacks.append(cross)
