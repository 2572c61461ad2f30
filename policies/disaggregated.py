"""``disaggregated``: prefill and decode on separate pools of replicas, KV cache sent between them.

Follows Splitwise (Patel et al., ISCA 2024), DistServe (Zhong et al., OSDI 2024) and vLLM's
disaggregated prefill (a proxy in front of a prefill and a decode instance, KV moved by the NIXL
connector). A prompt runs on a prefill replica, under that pool's own policy, and emits nothing
there; its KV stays in the prefill replica's blocks until it has been copied out. A decode
replica, chosen when the prefill finishes, pulls the KV when it has room for it (DistServe's
decode instances pull; vLLM's decode scheduler allocates the blocks of a request in state
``WAITING_FOR_REMOTE_KVS`` before the connector loads into them): blocks are reserved on the decode
side first, then the copy goes over the link, then the request joins the decode replica's running
set with no prefill compute and decodes the rest under that pool's policy. The engine side (the
link, the landing) is :mod:`servesim.engine.disaggregated`.

This module holds the decisions: the YAML schema of the pools and the link
(:class:`DisaggregatedOptions`), which decode replica gets a request (:class:`LeastKvLoad`), and
when a decode replica takes in a transfer (:class:`KvReceiver`). The admission rule for
transfers is continuous batching's rule for a new prompt: first come first served, within
``max_num_seqs`` (counting transfers in flight as seats) and keeping the free-block watermark
(waived when nothing runs or lands), and never ahead of a request that was preempted here (vLLM
keeps both in one waiting queue, preempted requests at its front).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from servesim.errors import ServesimError
from servesim.policies.base import Batch, Policy, check_policy
from servesim.policies.routers import ROUTERS

if TYPE_CHECKING:
    from servesim.engine.replica_state import ReplicaState

DISAGGREGATED = "disaggregated"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolOptions(_Strict):
    """One pool of identical replicas. Unset engine keys take the experiment's ``deployment``
    value (``block_size`` and ``max_model_len`` are always the deployment's: one service)."""

    replicas: int = Field(1, ge=1, description="replicas in this pool")
    tp: int | None = Field(None, ge=1, description="tensor-parallel degree of each replica")
    hardware: str | None = Field(None, description="GPU of this pool (default: the experiment's)")
    policy: str | dict[str, Any] = Field(
        "continuous", description="this pool's scheduling policy: a name or {name: ..., knobs}")
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    watermark: float | None = Field(None, ge=0, lt=1)
    num_gpu_blocks: int | None = Field(None, ge=1)

    def policy_section(self) -> tuple[str, dict[str, Any]]:
        """(name, knobs) of this pool's policy."""
        if isinstance(self.policy, str):
            return self.policy, {}
        knobs = dict(self.policy)
        return str(knobs.pop("name", "continuous")), knobs


class DecodePoolOptions(PoolOptions):
    router: str = Field("least_kv", description="which decode replica takes a prefilled request: "
                        "least_kv, or any router's name")


LinkKind = Literal["nvlink", "pcie", "infiniband", "ethernet"]


class LinkOptions(_Strict):
    """The KV path between the pools; ``kind`` picks a preset (see
    :func:`servesim.engine.kv_link.resolve_link`), the other keys override it."""

    kind: LinkKind = "infiniband"
    bandwidth_Bps: float | None = Field(None, gt=0, description="per GPU, one direction")
    latency_s: float | None = Field(None, ge=0, description="per transfer")
    efficiency: float | None = Field(None, gt=0, le=1, description="achieved / peak bandwidth")
    channels: int = Field(1, ge=1, description="transfers the link carries at once; more wait")


class DisaggregatedOptions(_Strict):
    prefill: PoolOptions = PoolOptions()
    decode: DecodePoolOptions = DecodePoolOptions()
    link: LinkOptions = LinkOptions()


def check_disaggregated(options: dict[str, Any]) -> DisaggregatedOptions:
    """Validate the ``policy`` section of a disaggregated experiment; the first problem becomes
    one line naming the key (``policy.decode.tp``) and the fix."""
    try:
        parsed = DisaggregatedOptions.model_validate(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(p) for p in error["loc"] if not str(p).startswith(("function-", "str", "dict["))]
        field = ".".join(["policy", *loc])
        if error["type"] == "extra_forbidden":
            known = ", ".join(_fields_at(loc[:-1]))
            raise ServesimError(field, "unknown key", f"remove it (keys here: {known})") from None
        got = error.get("input")
        shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
        raise ServesimError(field, f"{error['msg']}{shown}", "fix the value") from None
    for pool in ("prefill", "decode"):
        name, knobs = getattr(parsed, pool).policy_section()
        where = f"policy.{pool}.policy"
        if name == DISAGGREGATED:
            raise ServesimError(where, "a pool cannot itself be disaggregated",
                                "use a per-replica policy such as continuous")
        try:
            check_policy(name, knobs)
        except ServesimError as exc:
            field = exc.field.replace("policy", where, 1)
            raise ServesimError(field, exc.problem, exc.fix) from None
    router = parsed.decode.router
    if router != "least_kv" and router not in ROUTERS:
        raise ServesimError("policy.decode.router", f"unknown router {router!r}",
                            f"use one of: {', '.join(sorted({'least_kv', *ROUTERS}))}")
    return parsed


def _fields_at(loc: list[str]) -> list[str]:
    model: Any = DisaggregatedOptions
    for part in loc:
        model = model.model_fields[part].annotation
    return list(model.model_fields)


# ---------------------------------------------------------------------- decode side
class KvReceiver(Policy):
    """A decode replica's policy, wrapped: it takes in prefilled requests as blocks allow.

    ``offer`` queues a request whose prefill finished elsewhere; at each of the replica's
    scheduling points, after its own policy has formed the step (so the running requests' growth
    is served first, as in vLLM), the head of that queue gets the blocks for its prompt's KV and
    ``start_transfer`` is called for it. It joins ``running`` when the engine lands it.
    """

    name = "kv_receiver"

    def __init__(self, replica: ReplicaState, inner: Policy,
                 start_transfer: Callable[[int, float], None]) -> None:
        super().__init__(replica, inner.options)
        self.inner = inner
        self.start_transfer = start_transfer
        self.incoming: deque[int] = deque()
        self.incoming_blocks = 0
        """KV blocks the queued (not yet reserved) requests will need: load for the router."""
        self.in_flight = 0
        """Requests with blocks reserved here whose KV has not landed yet."""

    def offer(self, request: int) -> None:
        self.incoming.append(request)
        self.incoming_blocks += self._need(request)

    def landed(self, count: int = 1) -> None:
        self.in_flight -= count

    def schedule(self, now: float) -> Batch | None:
        batch = self.inner.schedule(now)
        if self.incoming and not self.replica.waiting:
            self._reserve(now)
        return batch

    def after_step(self, batch: Batch, finished, now: float) -> None:  # type: ignore[no-untyped-def]
        self.inner.after_step(batch, finished, now)

    def wake_at(self, now: float) -> float | None:
        return self.inner.wake_at(now)

    def _need(self, request: int) -> int:
        return self.replica.pool.blocks_for(int(self.replica.requests.prompt[request]))

    def _reserve(self, now: float) -> None:
        replica, pool = self.replica, self.replica.pool
        # Transfers in flight hold seats and blocks like running requests (the watermark applies).
        room = replica.admission_room()
        room.seats -= self.in_flight
        if self.in_flight:
            room.reserve = room.watermark
        while self.incoming and room.seats > 0:
            request = self.incoming[0]
            need = self._need(request)
            if not room.blocks_fit(need):
                return
            self.incoming.popleft()
            self.incoming_blocks -= need
            pool.grow(request, need)
            self.in_flight += 1
            room.take(0, need)
            self.start_transfer(request, now)


class LeastKvLoad:
    """The decode replica with the smallest fraction of KV blocks taken, counting blocks
    reserved for transfers in flight and those its queued transfers will need; ties go to the
    lowest index. KV, not request count, is what limits a decode replica's batch (DistServe
    places decode work by memory)."""

    def __init__(self, receivers: list[KvReceiver]) -> None:
        self.receivers = receivers

    def route(self, request: int, now: float) -> int:
        best, best_load = 0, float("inf")
        for i, receiver in enumerate(self.receivers):
            pool = receiver.replica.pool
            load = (pool.total - pool.free + receiver.incoming_blocks) / pool.total
            if load < best_load:
                best, best_load = i, load
        return best
