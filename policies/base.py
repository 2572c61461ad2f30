"""The policy interface: one small class per scheduling policy over a shared core.

Each iteration the replica asks its policy for a :class:`Batch`: which requests run and how many
new tokens each computes (DESIGN.md's unified token-budget view). The policy makes every
decision (admission, token budget, KV allocation, preemption) through
:class:`~servesim.engine.replica_state.ReplicaState`, which carries them out identically for all
policies; the replica then prices the batch with the cost model, advances the clock by one SimPy
event, and credits the step (:meth:`~servesim.engine.state.RequestState.complete_step`).

A policy is registered under a name (``policy: {name: continuous}`` in the YAML) and declares
its knobs as a pydantic model, so an unknown or misspelt knob is an error naming it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError
from servesim.cost.batch import BatchShape
from servesim.errors import ServesimError

if TYPE_CHECKING:  # the engine imports policies, so only the type is imported here
    from servesim.engine.replica_state import EngineLimits, ReplicaState

_ONES = np.ones(1 << 16, dtype=np.int64)
_ONES.flags.writeable = False


@dataclass(frozen=True, slots=True)
class Batch:
    """One iteration: request ``ids[i]`` computes ``new_tokens[i]`` tokens; ``shape`` is what the
    cost model prices; ``preempted`` counts requests preempted to make room for it; ``extra_s``
    is time the step spends beyond the priced model pass (e.g. KV copies to or from host memory
    issued before it on the same stream)."""

    ids: np.ndarray
    new_tokens: np.ndarray
    shape: BatchShape
    preempted: int = 0
    decode_only: bool = False
    extra_s: float = 0.0

    @classmethod
    def decodes(cls, ids: np.ndarray, context: np.ndarray, preempted: int = 0) -> Batch:
        """Every request decodes one token over ``context`` cached tokens (the fast path).

        Only for requests past their first token: a request recomputed after preemption is a
        prefill again, whatever its length."""
        shape = BatchShape.decodes_only(context)
        ones = _ONES[:ids.size] if ids.size <= _ONES.size else np.ones(ids.size, dtype=np.int64)
        return cls(ids, ones, shape, preempted, decode_only=True)

    @classmethod
    def of(cls, ids: np.ndarray, new_tokens: np.ndarray, computed: np.ndarray, total: np.ndarray,
           preempted: int = 0) -> Batch:
        """Any mix of prefill chunks and decodes, classified by the token-budget rule."""
        return cls(ids, new_tokens, BatchShape.from_requests(new_tokens, computed, total), preempted)


class PolicyOptions(BaseModel):
    """A policy's knobs (none by default); subclasses add fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Policy(ABC):
    """Decides each iteration's batch on one replica."""

    name: ClassVar[str]
    Options: ClassVar[type[PolicyOptions]] = PolicyOptions

    def __init__(self, replica: ReplicaState, options: PolicyOptions) -> None:
        self.replica = replica
        self.options = options

    @classmethod
    def check_limits(cls, options: PolicyOptions, limits: EngineLimits) -> None:
        """Raise a one-line ServesimError when a knob contradicts the deployment's engine limits
        (called by ``servesim validate`` and ``run`` once the limits are known)."""
        return None

    @abstractmethod
    def schedule(self, now: float) -> Batch | None:
        """The next iteration's batch, or None when nothing can run now."""

    def after_step(self, batch: Batch, finished: np.ndarray, now: float) -> None:  # noqa: B027 (optional hook)
        """Hook after a step is credited (``finished`` emitted their last token)."""

    def wake_at(self, now: float) -> float | None:
        """When idle with work queued, a time to ask again (e.g. a batching timeout)."""
        return None


POLICIES: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    POLICIES[cls.name] = cls
    return cls


def parse_options(options_model: type[BaseModel], options: dict[str, Any], where: str) -> Any:
    """Validate a component's knobs; the first problem becomes a one-line error naming the key."""
    try:
        return options_model.model_validate(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(p) for p in error["loc"])
        field = f"{where}.{key}" if key else where
        if error["type"] == "extra_forbidden":
            known = ", ".join(options_model.model_fields) or "none"
            raise ServesimError(field, "unknown option", f"remove it (options: {known})") from None
        raise ServesimError(field, error["msg"], "fix the value") from None


def lookup(registry: dict[str, Any], kind: str, name: str, options: dict[str, Any],
           also: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """The class registered as ``name`` and its validated knobs; a one-line error naming
    ``<kind>.name`` or ``<kind>.<knob>`` otherwise. Shared by policies and routers; ``also``
    names valid choices resolved elsewhere, listed in the error."""
    cls = registry.get(name)
    if cls is None:
        raise ServesimError(f"{kind}.name", f"unknown {kind} {name!r}",
                            f"use one of: {', '.join(sorted({*registry, *also}))}")
    return cls, parse_options(cls.Options, options, kind)


def check_policy(name: str, options: dict[str, Any]) -> tuple[type[Policy], PolicyOptions]:
    """The policy class and its validated knobs; a one-line error for an unknown name or knob."""
    return lookup(POLICIES, "policy", name, options, also=POOL_POLICIES)


POOL_POLICIES = ("disaggregated",)
"""Policies over pools of replicas rather than one replica's batches: the engine resolves them
(:mod:`servesim.policies.disaggregated`, :mod:`servesim.engine.disaggregated`)."""


def make_policy(name: str, options: dict[str, Any], replica: ReplicaState) -> Policy:
    cls, parsed = check_policy(name, options)
    return cls(replica, parsed)
