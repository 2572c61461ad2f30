"""Routers: which replica an arriving request goes to.

The engine calls :meth:`Router.route` once per arrival with the replicas' states, so a router can
read their load (queued and running requests, KV blocks in use) and their prefix caches at that
instant (an idealised router: real ones see metrics a scrape interval old). Every router is
deterministic and breaks ties by the lowest replica index.

- ``round_robin``: replicas in turn, blind to load (a plain L4 load balancer).
- ``least_outstanding``: fewest queued + running requests (the "least request" balancing of
  Envoy and of llm-d's queue scorer, here exact rather than sampled as in power-of-two-choices).
- ``least_kv``: lowest KV demand fraction, (blocks in use + blocks the queue needs) / pool. vLLM's
  ``kv_cache_usage`` metric (what llm-d's kv-cache-utilization scorer reads) counts only blocks in
  use; the queue's demand is added so that a replica with a long queue of long prompts does not
  look idle while its running batch is small.
- ``prefix_affinity``: SGLang Model Gateway's ``cache_aware`` policy over the replicas' exact
  cache contents (as llm-d's precise prefix-cache scorer does from vLLM's KV events).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import Field

from servesim.policies.base import Choice, Component, Knobs, choose, lookup

if TYPE_CHECKING:  # the core runs routers; routers only name its types
    from servesim.core.replica_state import ReplicaState


class RouterOptions(Knobs):
    """A router's knobs (none by default); subclasses add fields."""


class Router(Component, ABC):
    Options: ClassVar[type[Knobs]] = RouterOptions
    needs_prefix_cache: ClassVar[bool] = False
    """Reads the replicas' prefix caches, so it needs prefix caching on."""

    def __init__(self, replicas: list[ReplicaState], options: Knobs) -> None:
        super().__init__(replicas, options)
        self.replicas = replicas

    @abstractmethod
    def route(self, request: int, now: float) -> int:
        """Index of the replica that serves ``request``."""


ROUTERS: dict[str, type[Router]] = {}

R = TypeVar("R", bound=type[Router])


def register_router(cls: R) -> R:
    ROUTERS[cls.name] = cls
    return cls


@register_router
class RoundRobin(Router):
    """Replicas in turn, regardless of load (what a plain L4 load balancer does)."""

    name = "round_robin"

    def __init__(self, replicas: list[ReplicaState], options: RouterOptions) -> None:
        super().__init__(replicas, options)
        self._next = 0

    def route(self, request: int, now: float) -> int:
        chosen = self._next
        self._next = (chosen + 1) % len(self.replicas)
        return chosen


def _least_loaded(loads: list[int] | list[float]) -> int:
    """Index of the smallest load, the lowest index among ties."""
    return min(range(len(loads)), key=loads.__getitem__)


@register_router
class LeastOutstanding(Router):
    """The replica with the fewest requests queued or running."""

    name = "least_outstanding"

    def route(self, request: int, now: float) -> int:
        return _least_loaded([replica.outstanding for replica in self.replicas])


@register_router
class LeastKv(Router):
    """The replica whose KV pool is least committed, counting its queue's demand (see module)."""

    name = "least_kv"

    def route(self, request: int, now: float) -> int:
        return _least_loaded([replica.kv_demand_blocks / replica.pool.total for replica in self.replicas])


class PrefixAffinityOptions(RouterOptions):
    """SGLang Model Gateway's ``cache_aware`` knobs, with its defaults."""

    cache_threshold: float = Field(0.3, ge=0, le=1, description=(
        "route by prefix only when the best replica holds at least this fraction of the prompt"))
    balance_abs_threshold: int = Field(64, ge=0, description=(
        "load is imbalanced when the most and least loaded replicas differ by more than this many "
        "outstanding requests ..."))
    balance_rel_threshold: float = Field(1.5, ge=1, description=(
        "... and the most loaded has more than this multiple of the least loaded's requests"))


@register_router
class PrefixAffinity(Router):
    """Route to the replica that has cached the longest prefix of the request, unless the load is
    imbalanced or no replica holds enough of it; then to the least loaded.

    As SGLang's ``cache_aware`` policy: (1) if max - min outstanding requests exceeds
    ``balance_abs_threshold`` and max exceeds ``balance_rel_threshold`` x min, the least loaded
    wins; (2) else, if the longest cached prefix covers at least ``cache_threshold`` of the prompt,
    the replica holding it wins (the least loaded of those holding that much, then the lowest
    index); (3) else the least loaded. Where SGLang keeps an approximate radix tree of what it
    routed, this reads each replica's cache exactly, so a burst of requests with a new prefix that
    arrives before the first is admitted is spread by load.
    """

    name = "prefix_affinity"
    Options = PrefixAffinityOptions
    needs_prefix_cache = True
    options: PrefixAffinityOptions

    def route(self, request: int, now: float) -> int:
        options = self.options
        loads = [replica.outstanding for replica in self.replicas]
        low, high = min(loads), max(loads)
        if high - low > options.balance_abs_threshold and high > options.balance_rel_threshold * low:
            return _least_loaded(loads)
        cached = [replica.prefix_cache.cached_prefix_tokens(request) if replica.prefix_cache else 0
                  for replica in self.replicas]
        best = max(cached)
        prompt = int(self.replicas[0].requests.prompt[request])
        if best > 0 and best >= options.cache_threshold * prompt:
            return min((i for i, c in enumerate(cached) if c == best), key=loads.__getitem__)
        return _least_loaded(loads)


RouterChoice = Choice[Router]
"""A router chosen by name with its validated knobs; ``make(replicas)`` builds it."""


def check_router(name: str, options: dict[str, Any]) -> tuple[type[Router], RouterOptions]:
    return lookup(ROUTERS, "router", name, options)


def choose_router(name: str, knobs: dict[str, Any], where: str = "router") -> RouterChoice:
    return choose(ROUTERS, "router", name, knobs, where)


def make_router(name: str, options: dict[str, Any], replicas: list[ReplicaState]) -> Router:
    return choose_router(name, options).make(replicas)
