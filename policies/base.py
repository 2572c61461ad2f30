"""The policy interface: one small class per scheduling policy over a shared core.

Each iteration the replica asks its policy for a :class:`Batch`: which requests run and how many
new tokens each computes (the unified token-budget view, ``docs/architecture.md``). The policy
makes every decision (admission, token budget, KV allocation, preemption) through
:class:`~servesim.core.replica_state.ReplicaState`, which carries them out identically for all
policies (``try_admit`` / ``commit``, ``preempt_tail_until``); the replica then prices the batch
with the cost model, advances the clock by one SimPy event, and credits the step.

A policy registers under a name (``policy: {name: continuous}`` in the YAML), declares its knobs
as a pydantic model (an unknown or misspelt knob is an error naming it), and states what it can
do as class attributes (:attr:`Policy.chunks_prefills`, :attr:`Policy.supports_prefix_caching`),
so the rest of servesim asks the class instead of keeping lists of names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from servesim.cost.batch import BatchShape
from servesim.errors import ServesimError
from servesim.inputs.schema import FrozenModel, parse_model

if TYPE_CHECKING:  # the core runs policies; policies only name its types
    from servesim.core.replica_state import EngineLimits, ReplicaState
    from servesim.core.speculation import Proposals

_ONES = np.ones(1 << 16, dtype=np.int64)
_ONES.flags.writeable = False
_NO_TOKENS = np.empty(0, dtype=np.int64)
_NO_EMITS = np.empty(0, dtype=bool)


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
    speculation: Proposals | None = None
    """Speculative decoding: which members verify proposals (counted in their ``new_tokens``),
    and how many the target accepts (:class:`~servesim.core.speculation.Proposals`)."""

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
           preempted: int = 0, speculation: Proposals | None = None) -> Batch:
        """Any mix of prefill chunks and decodes, classified by the token-budget rule; with
        ``speculation``, the decodes at its rows also verify their proposals."""
        if speculation is None:
            return cls(ids, new_tokens, BatchShape.from_requests(new_tokens, computed, total), preempted)
        proposed = np.zeros(ids.size, dtype=np.int64)
        proposed[speculation.rows] = speculation.proposed
        shape = BatchShape.from_requests(new_tokens, computed, total, proposed)
        return cls(ids, new_tokens, shape, preempted, speculation=speculation)

    @classmethod
    def of_one(cls, ids: np.ndarray, new_tokens: np.ndarray, computed: int, new: int) -> Batch:
        """:meth:`of` of one request (``ids``, ``new_tokens``: one element each) that computes
        ``new`` tokens after ``computed`` and then has computed all it has (a whole prompt, or the
        rest of one after a prefix-cache hit): classified from Python ints without the
        array round trip (the same shape: ``tests/test_core_fast_paths.py``)."""
        return cls(ids, new_tokens, BatchShape._from_few_requests([new], [computed], [computed + new]))

    @classmethod
    def speculative_decodes(cls, ids: np.ndarray, context: np.ndarray, proposed: np.ndarray,
                            speculation: Proposals, preempted: int = 0) -> Batch:
        """Every request decodes, ``ids[i]`` verifying ``proposed[i]`` proposals (0: a plain
        decode) over ``context[i]`` cached tokens."""
        new = 1 + proposed
        shape = BatchShape(_NO_TOKENS, _NO_TOKENS, _NO_EMITS, context, new)
        return cls(ids, new, shape, preempted, speculation=speculation)


class Knobs(FrozenModel):
    """A policy's or router's knobs (none by default); subclasses add fields."""


PolicyOptions = Knobs
"""The knobs of a policy (the name policies subclass)."""


class Component:
    """A registered policy or router: built over what it runs on, with its knobs."""

    name: ClassVar[str]
    Options: ClassVar[type[Knobs]] = Knobs

    def __init__(self, target: Any, options: Knobs) -> None:
        self.options = options


class Policy(Component, ABC):
    """Decides each iteration's batch on one replica."""

    chunks_prefills: ClassVar[bool] = False
    """Splits prompts across steps, so its token budget may be below ``max_model_len`` (and the
    engine's chunked default budget applies)."""
    supports_prefix_caching: ClassVar[bool] = True
    """Admits through :meth:`ReplicaState.prefill_need` / ``admit``, so prefix-cache hits count."""
    prefix_caching_note: ClassVar[str] = ""
    """Why not, when it does not (shown in the error)."""
    fast_forwards_decodes: ClassVar[bool] = False
    """The policy promises what fast-forward (``servesim.core.fast_forward``) relies on: when it
    schedules a pure-decode batch (``Batch.decodes``) without preempting, having tried its waiting
    queue and admitted nobody, it would schedule the same requests again each step until a
    request finishes, a block shortfall preempts or something arrives; and :meth:`after_run` keeps
    its own state as that many :meth:`after_step` calls would. Off by default, so a policy that
    says nothing runs step by step."""
    supports_speculation: ClassVar[bool] = False
    """Lets its decodes verify speculative proposals: asks ``ReplicaState.proposals_for`` for them
    and builds speculative batches (``speculative:`` in the experiment)."""

    def __init__(self, replica: ReplicaState, options: Knobs) -> None:
        super().__init__(replica, options)
        self.replica = replica

    def fast_forward_ready(self) -> bool:
        """Whether this instance keeps the :attr:`fast_forwards_decodes` promise (its knobs may
        rule it out)."""
        return self.fast_forwards_decodes

    @classmethod
    def check_limits(cls, options: Any, limits: EngineLimits) -> None:
        """Raise a one-line ServesimError when a knob contradicts the deployment's engine limits
        (called by ``servesim validate`` and ``run`` once the limits are known)."""
        return None

    @abstractmethod
    def schedule(self, now: float) -> Batch | None:
        """The next iteration's batch, or None when nothing can run now."""

    def after_step(self, batch: Batch, finished: np.ndarray, now: float) -> None:
        """Hook after a step is credited (``finished`` emitted their last token)."""

    def run_limit(self, batch: Batch) -> Callable[[int, np.ndarray], int] | None:
        """A bound on the fast-forwarded run that continues ``batch`` beyond the core's (finishes,
        block shortfalls, arrivals), for a policy whose decisions may change within a run: called
        with the steps certain so far and the free KV blocks when each step ``j >= 1`` is scheduled
        (before its growth), it returns how many steps from the start it promises. None (the
        default): the :attr:`fast_forwards_decodes` promise holds for the whole run."""
        return None

    def after_run(self, batch: Batch, steps: int, finished: np.ndarray, now: float) -> None:
        """Hook after a fast-forwarded run of ``steps`` copies of the pure-decode ``batch`` (only
        the last can finish requests); a policy that keeps per-step state overrides it."""
        self.after_step(batch, finished, now)

    def wake_at(self, now: float) -> float | None:
        """When idle with work queued, a time to ask again (e.g. a batching timeout)."""
        return None


POLICIES: dict[str, type[Policy]] = {}

P = TypeVar("P", bound=type[Policy])


def register_policy(cls: P) -> P:
    POLICIES[cls.name] = cls
    return cls


TOPOLOGY_NOT_POLICY = "disaggregated"
"""Was a policy name in servesim 0.1; it is a deployment topology now (``deployment.kind``)."""


def lookup(registry: dict[str, Any], kind: str, name: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """The class registered as ``name`` and its validated knobs; a one-line error naming
    ``<kind>.name`` or ``<kind>.<knob>`` otherwise. Shared by policies and routers."""
    cls = registry.get(name)
    if cls is None:
        hint = ""
        if kind == "policy":
            hint = " (prefill and decode on separate replicas is a deployment, not a policy: " \
                   "set deployment.kind: disaggregated)"
        if name == TOPOLOGY_NOT_POLICY:
            raise ServesimError(kind, f"{name} is a deployment topology, not a per-replica "
                                f"{kind}", "set deployment.kind: disaggregated and give each group a "
                                "per-replica policy such as continuous")
        raise ServesimError(f"{kind}.name", f"unknown {kind} {name!r}",
                            f"use one of: {', '.join(sorted(registry))}{hint}")
    return cls, parse_model(cls.Options, options, at=kind)


C = TypeVar("C", bound=Component)


@dataclass(frozen=True)
class Choice(Generic[C]):
    """A registered component (a policy, a router) chosen by name, with its validated knobs, ready
    to build over what it runs on (a replica's state, a group's replicas)."""

    name: str
    cls: type[C]
    options: Knobs
    knobs: dict[str, Any]
    """The knobs as written (for descriptions and resolved configs)."""

    def make(self, target: Any) -> C:
        return self.cls(target, self.options)


def choose(registry: dict[str, Any], kind: str, name: str, knobs: dict[str, Any],
           where: str | None = None) -> Choice[Any]:
    """:func:`lookup` as a :class:`Choice`; errors name ``where`` (``deployment.decode.policy``)
    instead of ``kind`` when given."""
    try:
        cls, options = lookup(registry, kind, name, knobs)
    except ServesimError as exc:
        field = exc.field if where is None else exc.field.replace(kind, where, 1)
        raise ServesimError(field, exc.problem, exc.fix) from None
    return Choice(name, cls, options, knobs)


def choose_policy(name: str, knobs: dict[str, Any], where: str = "policy") -> Choice[Policy]:
    """The policy ``name`` with its knobs checked; errors name ``where`` (``policy``,
    ``deployment.decode.policy``)."""
    return choose(POLICIES, "policy", name, knobs, where)


def speculating_policies() -> list[str]:
    """The registered policies that let their decodes verify speculative proposals."""
    return sorted(name for name, cls in POLICIES.items() if cls.supports_speculation)


def prefix_caching_policies() -> list[str]:
    """The registered policies that admit through the prefix cache."""
    return sorted(name for name, cls in POLICIES.items() if cls.supports_prefix_caching)


def check_policy(name: str, options: dict[str, Any]) -> tuple[type[Policy], Knobs]:
    """The policy class and its validated knobs; a one-line error for an unknown name or knob."""
    return lookup(POLICIES, "policy", name, options)


def make_policy(name: str, options: dict[str, Any], replica: ReplicaState) -> Policy:
    cls, parsed = check_policy(name, options)
    return cls(replica, parsed)
