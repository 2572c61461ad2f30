"""Routers for fleets of replica groups on different GPUs (``deployment.kind: fleet``).

A fleet's router sees only its *live* replicas (an autoscaled replica joins when its cold start
ends and leaves when it starts draining), and these routers also read which group each replica
belongs to and how fast that group is (:class:`FleetView`, bound by the fleet topology):

- ``speed_weighted``: the replica with the least work for its speed, ``(outstanding + 1) / speed``.
  ``speed`` is the group's relative decode throughput (the fleet prices one decode step of 32
  requests over 1,024 tokens on each group's GPUs; the fastest group is 1). On one kind of GPU it
  is ``least_outstanding``; with H100s beside L40Ss (3.9x less HBM bandwidth) the H100s take
  about that many more requests before an L40S gets the next.
- ``prompt_length``: prompts of at least ``threshold_tokens`` go to group ``long``, shorter ones to
  group ``short`` (long prompts to the GPUs with the most compute and KV memory, short chat turns
  to cheaper ones), the least loaded live replica of that group; when it has none live, any
  live replica. As llm-d's and SGLang's routers can filter by request size before scoring.

Ties go to the lowest replica index, as for every router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pydantic import Field

from servesim.policies.routers import Router, RouterOptions, register_router

if TYPE_CHECKING:
    from servesim.core.replica_state import ReplicaState


class FleetView(Protocol):
    """What a fleet router may ask the fleet about a replica."""

    def group_of(self, replica: ReplicaState) -> str: ...
    def speed_of(self, replica: ReplicaState) -> float: ...
    def group_names(self) -> list[str]: ...


class FleetRouter(Router):
    """A router that needs the fleet's view (:meth:`bind` is called right after it is made)."""

    fleet: FleetView

    def bind(self, fleet: FleetView) -> None:
        self.fleet = fleet


@register_router
class SpeedWeighted(FleetRouter):
    """Least outstanding work per unit of speed (see the module docstring)."""

    name = "speed_weighted"

    def route(self, request: int, now: float) -> int:
        fleet = self.fleet
        scores = [(replica.outstanding + 1) / fleet.speed_of(replica) for replica in self.replicas]
        return min(range(len(scores)), key=scores.__getitem__)


class PromptLengthOptions(RouterOptions):
    threshold_tokens: int = Field(..., ge=1, description="prompts at least this long are 'long'")
    long: str = Field(..., description="the group that serves long prompts")
    short: str = Field(..., description="the group that serves short prompts")


@register_router
class PromptLength(FleetRouter):
    """Long prompts to one group, short ones to another (see the module docstring)."""

    name = "prompt_length"
    Options = PromptLengthOptions
    options: PromptLengthOptions

    def route(self, request: int, now: float) -> int:
        replicas = self.replicas
        prompt = int(replicas[0].requests.prompt[request])
        target = self.options.long if prompt >= self.options.threshold_tokens else self.options.short
        group_of = self.fleet.group_of
        candidates = [i for i, replica in enumerate(replicas) if group_of(replica) == target] \
            or list(range(len(replicas)))
        return min(candidates, key=lambda i: replicas[i].outstanding)
