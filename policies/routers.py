"""Routers: which replica an arriving request goes to.

The engine calls :meth:`Router.route` once per arrival with the replicas' states, so a router can
read their load (queued and running requests, KV blocks in use). ``round_robin`` is the baseline;
the cluster issue adds load-aware and prefix-affine routers as further small classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from policies.base import PolicyOptions, lookup

if TYPE_CHECKING:  # the engine imports policies, so only the type is imported here
    from simulator.engine.replica_state import ReplicaState


class Router(ABC):
    name: ClassVar[str]
    Options: ClassVar[type[PolicyOptions]] = PolicyOptions

    def __init__(self, replicas: list[ReplicaState], options: PolicyOptions) -> None:
        self.replicas = replicas
        self.options = options

    @abstractmethod
    def route(self, request: int, now: float) -> int:
        """Index of the replica that serves ``request``."""


ROUTERS: dict[str, type[Router]] = {}


def register_router(cls: type[Router]) -> type[Router]:
    ROUTERS[cls.name] = cls
    return cls


@register_router
class RoundRobin(Router):
    """Replicas in turn, regardless of load (what a plain L4 load balancer does)."""

    name = "round_robin"

    def __init__(self, replicas: list[ReplicaState], options: PolicyOptions) -> None:
        super().__init__(replicas, options)
        self._next = 0

    def route(self, request: int, now: float) -> int:
        chosen = self._next
        self._next = (chosen + 1) % len(self.replicas)
        return chosen


def check_router(name: str, options: dict[str, Any]) -> tuple[type[Router], PolicyOptions]:
    return lookup(ROUTERS, "router", name, options)


def make_router(name: str, options: dict[str, Any], replicas: list[ReplicaState]) -> Router:
    cls, parsed = check_router(name, options)
    return cls(replicas, parsed)
