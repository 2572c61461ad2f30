"""How requests of one workload depend on each other: sessions, agent chains, fan-out and join.

Traffic is not always a list of independent requests. A chat session sends its next turn a think
time after the previous answer ends, and that turn's prompt is the whole conversation so far; an
agent sends its next LLM call when a tool returns, with the accumulated context; a planner fans
out parallel sub-requests and joins their answers. :class:`RequestLinks` says all of that in a
few columns beside a :class:`~servesim.workloads.requests.RequestTable`, and the simulation's
release mechanism (:mod:`servesim.core.release`) and prefix index read them:

- **Release.** Request ``r`` waits for the requests ``after(r)`` (a CSR list; empty: it is
  released by its arrival time alone). It is sent at ``max(arrival_s[r], end + delay_s[r])``
  where ``end`` is when the last of them finished (or was refused). For a generated session the
  table's ``arrival_s`` of a later turn is its session's start (a lower bound that keeps the
  column sorted), so the think time decides; for a replayed trace it is the trace's own send
  time, so a turn is never sent before the answer it follows.
- **Shared context.** ``prefix_parent[r]`` is the request whose prompt + output the first
  ``prefix_shared[r]`` tokens of ``r``'s prompt repeat (-1: none). The prefix index keys those
  tokens' KV blocks as the parent's, so turn ``i + 1`` finds turn ``i``'s prompt *and generated
  tokens* in the cache when they are still there (:mod:`servesim.core.prefix_index`).
- **Labels.** ``session[r]`` and ``turn[r]`` group requests for per-session metrics (a chat
  conversation or one run of an agent workflow; -1: none) and order them within it.

Every dependency and prefix parent has a smaller row index than its child (the table is in
topological order), so a workload can never deadlock on a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.errors import ServesimError

_INT = np.int64


@dataclass(frozen=True, eq=False)
class RequestLinks:
    """Per-request dependency, shared-context and session columns (see the module docstring)."""

    after_offsets: np.ndarray
    after_ids: np.ndarray
    delay_s: np.ndarray
    prefix_parent: np.ndarray
    prefix_shared: np.ndarray
    session: np.ndarray
    turn: np.ndarray

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("after_offsets", "after_ids", "prefix_parent", "prefix_shared", "session", "turn"):
            set_(self, name, np.ascontiguousarray(getattr(self, name), dtype=_INT).reshape(-1))
        set_(self, "delay_s", np.ascontiguousarray(self.delay_s, dtype=np.float64).reshape(-1))

    # ------------------------------------------------------------------ construction
    @classmethod
    def chains(cls, parent: np.ndarray, delay_s: np.ndarray, prefix_shared: np.ndarray,
               session: np.ndarray, turn: np.ndarray) -> RequestLinks:
        """Links where each request waits for at most one other, which is also its prefix
        parent (a session's turns): ``parent[r]`` (-1: none) shares its first ``prefix_shared[r]``
        tokens."""
        parent = np.asarray(parent, dtype=_INT)
        has = parent >= 0
        offsets = np.zeros(parent.size + 1, dtype=_INT)
        np.cumsum(has, out=offsets[1:])
        shared = np.where(has, np.asarray(prefix_shared, dtype=_INT), 0)
        return cls(offsets, parent[has], delay_s, parent, shared, session, turn)

    def validate(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray, where: str = "") -> None:
        """Check the columns against the table they describe (one line naming the problem)."""
        n = prompt_tokens.size
        suffix = f" ({where})" if where else ""
        for name in ("delay_s", "prefix_parent", "prefix_shared", "session", "turn"):
            if getattr(self, name).size != n:
                raise ServesimError(f"links.{name}", f"has {getattr(self, name).size} rows for {n} "
                                    f"requests{suffix}", "give one value per request")
        offsets, ids = self.after_offsets, self.after_ids
        if not (offsets.size == n + 1 and offsets[0] == 0 and offsets[-1] == ids.size
                and not np.any(np.diff(offsets) < 0)):
            raise ServesimError("links.after_offsets", f"not a valid CSR index over {n} requests{suffix}",
                                "offsets start at 0, never decrease and end at len(after_ids)")
        owner = np.repeat(np.arange(n, dtype=_INT), np.diff(offsets))
        if ids.size and (ids.min() < 0 or np.any(ids >= owner)):
            row = int(owner[np.argmax((ids < 0) | (ids >= owner))])
            raise ServesimError("links.after_ids", f"request {row} waits for itself, a later request or "
                                f"no request{suffix}", "a request may only wait for earlier rows")
        if n and (np.any(~np.isfinite(self.delay_s)) or self.delay_s.min() < 0):
            raise ServesimError("links.delay_s", f"negative or not finite{suffix}",
                                "give delays in seconds >= 0")
        parent = self.prefix_parent
        rows = np.arange(n, dtype=_INT)
        bad = (parent >= rows) | (parent < -1)
        if bad.any():
            row = int(np.argmax(bad))
            raise ServesimError("links.prefix_parent", f"request {row} extends itself or a later "
                                f"request{suffix}", "a prompt may only extend an earlier request")
        has = parent >= 0
        shared = self.prefix_shared
        limit = np.zeros(n, dtype=_INT)
        limit[has] = np.minimum(prompt_tokens[has], prompt_tokens[parent[has]] + output_tokens[parent[has]])
        bad = (shared < 0) | (shared > limit) | (~has & (shared != 0))
        if bad.any():
            row = int(np.argmax(bad))
            raise ServesimError("links.prefix_shared", f"request {row} shares {int(shared[row])} tokens, "
                                f"more than its prompt or its parent's prompt + output{suffix}",
                                "share at most min(prompt, parent prompt + output) tokens")

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return int(self.delay_s.size)

    @property
    def waits(self) -> np.ndarray:
        """Per request, how many requests must end before it is sent."""
        return np.diff(self.after_offsets)

    def children(self) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of ``after``: (offsets, ids) of the requests waiting for each request,
        each list in row order."""
        n = len(self)
        owner = np.repeat(np.arange(n, dtype=_INT), self.waits)
        order = np.argsort(self.after_ids, kind="stable")
        offsets = np.zeros(n + 1, dtype=_INT)
        np.cumsum(np.bincount(self.after_ids, minlength=n), out=offsets[1:])
        return offsets, owner[order]

    @property
    def has_prefix_parents(self) -> bool:
        return bool(np.any(self.prefix_shared > 0))

    @property
    def num_sessions(self) -> int:
        labelled = self.session[self.session >= 0]
        return int(np.unique(labelled).size) if labelled.size else 0

    # ------------------------------------------------------------------ transforms
    def take(self, rows: np.ndarray) -> RequestLinks:
        """The links of the requests at ``rows`` (increasing row indices that keep every request
        they wait for or extend), renumbered."""
        rows = np.asarray(rows, dtype=_INT)
        n = len(self)
        if rows.size > 1 and np.any(np.diff(rows) <= 0):
            raise ValueError("linked requests can only be taken in their own order")
        new = np.full(n, -1, dtype=_INT)
        new[rows] = np.arange(rows.size, dtype=_INT)
        starts, ends = self.after_offsets[rows], self.after_offsets[rows + 1]
        lengths = ends - starts
        offsets = np.zeros(rows.size + 1, dtype=_INT)
        np.cumsum(lengths, out=offsets[1:])
        gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        ids = new[self.after_ids[gather]]
        parent = self.prefix_parent[rows]
        mapped = np.where(parent >= 0, new[np.maximum(parent, 0)], -1)
        if np.any(ids < 0) or np.any((parent >= 0) & (mapped < 0)):
            raise ValueError("the rows leave out a request that a kept request waits for or extends")
        return RequestLinks(offsets, ids, self.delay_s[rows], mapped, self.prefix_shared[rows],
                            self.session[rows], self.turn[rows])
