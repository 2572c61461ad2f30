"""The table of requests every workload becomes, and the engine replays.

Columnar on purpose: a simulation of 100k requests keeps one NumPy array per field, never a
Python object per request, so readers, generators and the engine all work on whole columns.

Conventions (the engine and every reader rely on them):

- ``arrival_s`` is seconds from the start of the workload, non-decreasing, >= 0.
- ``prompt_tokens`` >= 1 and ``output_tokens`` >= 1; ``output_tokens`` counts every generated
  token, the first one (sampled by the prefill) included, as vLLM's ``max_tokens`` does.
- ``priority``: lower values are served first (vLLM's convention); 0 for everyone by default.
- Prefix blocks (Mooncake's ``hash_ids``): request ``i`` holds
  ``prefix_block_ids[prefix_block_offsets[i]:prefix_block_offsets[i + 1]]``, each id naming one
  ``prefix_block_size``-token block of its prompt, in order. ``None`` when the workload has none.
- ``links`` (sessions, agent chains; :class:`~servesim.workloads.links.RequestLinks`): which
  requests each one waits for, whose prompt + output its prompt extends, and its session. A
  linked request's ``arrival_s`` is the earliest it may be sent (its session's start, or a trace's
  send time); the simulation records when it was actually sent. ``None``: independent requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypedDict, Unpack

import numpy as np

from servesim.errors import ServesimError
from servesim.workloads.links import RequestLinks

if TYPE_CHECKING:
    import pandas as pd


class PrefixBlocks(TypedDict, total=False):
    """:class:`RequestTable`'s prefix-block fields, as keyword arguments."""

    prefix_block_offsets: np.ndarray | None
    prefix_block_ids: np.ndarray | None
    prefix_block_size: int


class RequestFields(PrefixBlocks, total=False):
    """:class:`RequestTable`'s optional fields, as keyword arguments."""

    priority: np.ndarray | None
    source: str
    links: RequestLinks | None


MAX_CLOCK_S = 1e9
"""The latest arrival a run accepts. The clock is a float64 of seconds, whose resolution at 1e9 s is
0.1 us; much later, a millisecond step would no longer move it (now + dt == now) and every
latency would read 0."""


@dataclass(frozen=True, eq=False)
class RequestTable:
    """Requests sorted by arrival, one array per field (see the module docstring)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray | None = None
    prefix_block_offsets: np.ndarray | None = None
    prefix_block_ids: np.ndarray | None = None
    prefix_block_size: int = 512
    source: str = field(default="", compare=False)
    links: RequestLinks | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "arrival_s", np.ascontiguousarray(self.arrival_s, dtype=np.float64).reshape(-1))
        set_(self, "prompt_tokens", np.ascontiguousarray(self.prompt_tokens, dtype=np.int64).reshape(-1))
        set_(self, "output_tokens", np.ascontiguousarray(self.output_tokens, dtype=np.int64).reshape(-1))
        n = self.arrival_s.size
        priority = (np.zeros(n, dtype=np.int64) if self.priority is None
                    else np.ascontiguousarray(self.priority, dtype=np.int64).reshape(-1))
        set_(self, "priority", priority)
        self._validate()

    def _validate(self) -> None:
        n = self.arrival_s.size
        where = f" ({self.source})" if self.source else ""
        for name in ("prompt_tokens", "output_tokens", "priority"):
            if getattr(self, name).size != n:
                raise ServesimError(name, f"has {getattr(self, name).size} rows for {n} arrivals{where}",
                                    "give one value per request")
        if n and not np.all(np.isfinite(self.arrival_s)):
            raise ServesimError("arrival_s", f"not finite{where}", "give finite arrival times")
        if n and self.arrival_s.max() > MAX_CLOCK_S:
            late = int(np.argmax(self.arrival_s > MAX_CLOCK_S))
            raise ServesimError("arrival_s", f"request {late} arrives at {self.arrival_s[late]:.4g} s, "
                                f"beyond the {MAX_CLOCK_S:.0e} s (31 years) the simulated clock resolves "
                                f"to a microsecond{where}",
                                "shorten the timeline (a higher rate, or rate_scale and start_s for a trace)")
        if n and self.arrival_s.min() < 0:
            raise ServesimError("arrival_s", f"negative arrival time{where}", "start the trace at 0 or later")
        if n > 1 and np.any(np.diff(self.arrival_s) < 0):
            raise ServesimError("arrival_s", f"arrivals are not sorted{where}",
                                "sort requests by arrival (RequestTable.sorted())")
        for name in ("prompt_tokens", "output_tokens"):
            values = getattr(self, name)
            if n and values.min() < 1:
                row = int(np.argmin(values))
                raise ServesimError(name, f"request {row} has {int(values[row])} tokens{where}",
                                    "every request needs at least 1 prompt and 1 output token")
        if (self.prefix_block_offsets is None) != (self.prefix_block_ids is None):
            raise ServesimError("prefix_block_ids", "offsets and ids must be given together",
                                "give both or neither")
        if self.prefix_block_offsets is not None:
            offsets = np.asarray(self.prefix_block_offsets, dtype=np.int64)
            ids = np.asarray(self.prefix_block_ids, dtype=np.int64)
            valid = (offsets.size == n + 1 and offsets[0] == 0 and offsets[-1] == ids.size
                     and not np.any(np.diff(offsets) < 0))
            if not valid:
                raise ServesimError("prefix_block_offsets", f"not a valid CSR index over {n} requests",
                                    "offsets start at 0, never decrease and end at len(ids)")
            object.__setattr__(self, "prefix_block_offsets", offsets)
            object.__setattr__(self, "prefix_block_ids", ids)
        if self.prefix_block_size < 1:
            raise ServesimError("prefix_block_size", "must be >= 1", "use the trace's block size")
        if self.links is not None:
            self.links.validate(self.prompt_tokens, self.output_tokens, self.source)

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def has_prefixes(self) -> bool:
        """Whether any request can share KV blocks with another (prefix block ids, or a prompt
        that extends an earlier request's prompt and output)."""
        return self.prefix_block_ids is not None or (self.links is not None and self.links.has_prefix_parents)

    def prefix_blocks(self, index: int) -> np.ndarray:
        """Block ids of request ``index`` (empty when the workload has none)."""
        if self.prefix_block_offsets is None or self.prefix_block_ids is None:
            return np.empty(0, dtype=np.int64)
        return self.prefix_block_ids[self.prefix_block_offsets[index]:self.prefix_block_offsets[index + 1]]

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over the span of arrivals (0 for fewer than two requests)."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else 0.0

    def describe(self) -> str:
        """One line for the CLI: count, span, mean rate, prompt/output mean and median, source."""
        if not len(self):
            return f"0 requests ({self.source})" if self.source else "0 requests"
        prompt, output = self.prompt_tokens, self.output_tokens
        text = (f"{len(self)} requests over {self.duration_s:.1f} s ({self.mean_rate:.2f} req/s); "
                f"prompt mean {prompt.mean():.0f} / p50 {np.median(prompt):.0f}, "
                f"output mean {output.mean():.0f} / p50 {np.median(output):.0f} tokens")
        if self.prefix_block_ids is not None:
            text += f"; {self.prefix_block_ids.size} prefix blocks of {self.prefix_block_size} tokens"
        if self.links is not None:
            text += (f"; {self.links.num_sessions:,} sessions, {int(np.count_nonzero(self.links.waits)):,} "
                     "requests released by earlier ones")
        return f"{text} [{self.source}]" if self.source else text

    # ------------------------------------------------------------------ transforms
    def take(self, rows: np.ndarray) -> RequestTable:
        """The requests at ``rows`` (indices or a boolean mask), prefix blocks carried along."""
        rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, dtype=np.int64)
        assert self.priority is not None  # __post_init__ fills it in
        offsets = ids = None
        if self.prefix_block_offsets is not None and self.prefix_block_ids is not None:
            starts, ends = self.prefix_block_offsets[rows], self.prefix_block_offsets[rows + 1]
            lengths = ends - starts
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            gather = (np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1]))
            ids = self.prefix_block_ids[gather]
        links = None if self.links is None else self.links.take(rows)
        return replace(self, arrival_s=self.arrival_s[rows], prompt_tokens=self.prompt_tokens[rows],
                       output_tokens=self.output_tokens[rows], priority=self.priority[rows],
                       prefix_block_offsets=offsets, prefix_block_ids=ids, links=links)

    @classmethod
    def unsorted(cls, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                 **kwargs: Unpack[RequestFields]) -> RequestTable:
        """Build from columns in any order: sorted by arrival (stable, so ties keep file order)."""
        arrivals = np.asarray(arrival_s, dtype=np.float64).reshape(-1)
        order = np.argsort(arrivals, kind="stable")
        scratch = cls(np.zeros(arrivals.size), prompt_tokens, output_tokens, **kwargs)
        return replace(scratch.take(order), arrival_s=arrivals[order])

    def to_frame(self) -> pd.DataFrame:
        """One row per request (prefix blocks as a count, not the ids)."""
        import pandas as pd  # here, not at import: config validation loads this module
        frame = pd.DataFrame({"request_id": np.arange(len(self), dtype=np.int64),
                              "arrival_s": self.arrival_s, "prompt_tokens": self.prompt_tokens,
                              "output_tokens": self.output_tokens, "priority": self.priority})
        if self.prefix_block_offsets is not None:
            frame["prefix_blocks"] = np.diff(self.prefix_block_offsets)
        if self.links is not None:
            frame["session"] = self.links.session
            frame["turn"] = self.links.turn
        return frame
