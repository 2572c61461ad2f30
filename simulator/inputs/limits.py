"""How big a user's document may be, checked before anything walks it.

servesim's inputs are small (an experiment is a few dozen keys; the largest shipped sweep a few
hundred values), so these limits sit far above any real file and far below what would exhaust
memory or time:

- a YAML or JSON document of at most :data:`MAX_DOCUMENT_BYTES` (a trace, which is data rather
  than configuration, may be up to :data:`MAX_TRACE_BYTES`);
- at most :data:`MAX_VALUES` values once every YAML alias is expanded: PyYAML builds an alias as a
  second reference to one object, so a "billion laughs" document loads in microseconds and only
  explodes later, when it is validated, copied, hashed or written back. Counting the expanded
  size on the parsed node graph (each node once, memoised) refuses it before that;
- at most :data:`MAX_DEPTH` levels of nesting (configs use fewer than ten), so no later
  recursive walk (pydantic, ``copy.deepcopy``, ``json.dumps``) can hit Python's recursion limit;
- no recursive alias (``&a [*a]``), which would expand forever.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from servesim.errors import ServesimError

MAX_DOCUMENT_BYTES = 16 * 2**20
"""Experiment, sweep, capacity, hardware-profile and ``config.json`` files."""
MAX_TRACE_BYTES = 2 * 2**30
"""Trace files (CSV, JSONL), which are read whole into memory."""
MAX_VALUES = 1_000_000
"""Values (mapping keys, entries, scalars) in one document, aliases expanded."""
MAX_DEPTH = 64
"""Levels of nesting in one document."""


class DocumentTooLarge(Exception):
    """A document beyond a limit; ``problem`` and ``fix`` word it for the user."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def check_shape(root: Any, children: Callable[[Any], Iterable[Any]], *, shared: bool) -> None:
    """Refuse a document whose expanded size or depth exceeds the limits, or that contains
    itself. ``children(node)`` lists a node's children; ``shared`` says whether nodes may be
    reached twice (YAML aliases), in which case the expanded size is what is counted.

    Iterative and memoised by node identity: linear in the number of distinct nodes however deep
    or however aliased the document is."""
    measured: dict[int, tuple[int, int]] = {}  # id -> (expanded values, depth)
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    distinct = 0
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = list(children(node))
            size = 1 + sum(measured[id(k)][0] for k in kids)
            depth = 1 + max((measured[id(k)][1] for k in kids), default=0)
            measured[key] = (size, depth)
            on_path.discard(key)
            if depth > MAX_DEPTH:
                raise DocumentTooLarge(f"is nested more than {MAX_DEPTH} levels deep",
                                       "flatten the document (a config needs a few levels)")
            if size > MAX_VALUES:
                if shared and distinct <= MAX_VALUES:
                    raise DocumentTooLarge(
                        f"its aliases (*name) expand to more than {MAX_VALUES:,} values",
                        "write the values out, or reuse anchors fewer times")
                raise DocumentTooLarge(f"holds more than {MAX_VALUES:,} values",
                                       "split it into smaller files")
            continue
        if key in measured:
            continue
        if key in on_path:
            raise DocumentTooLarge("an alias refers to a node that contains it, so it never ends",
                                   "remove the recursive alias")
        on_path.add(key)
        distinct += 1
        stack.append((node, True))
        for kid in children(node):
            kid_key = id(kid)
            if kid_key in on_path:
                raise DocumentTooLarge("an alias refers to a node that contains it, so it never ends",
                                       "remove the recursive alias")
            if kid_key not in measured:
                stack.append((kid, False))


def plain_children(value: Any) -> Iterable[Any]:
    """The children of a parsed JSON value (a dict's keys are strings: leaves)."""
    if isinstance(value, dict):
        return value.values()
    if isinstance(value, list):
        return value
    return ()


# ---------------------------------------------------------------------- memory before a run
BYTES_PER_REQUEST = {"full": 4_500, "summary": 2_500}
"""Peak memory per simulated request (measured: request state, the step log it causes and, for
``output: full``, the tables and files built from them), so that a run that cannot fit is refused
with the figure before anything is allocated, instead of being killed by the kernel midway."""
BYTES_PER_REPLICA = 4_500
"""Peak memory per replica (its queues, KV pool and SimPy process), all built before the run."""


def machine_memory_bytes() -> int:
    """This machine's physical memory (a fixed figure, unlike the free memory of the moment, so the
    same config is accepted or refused alike on every run here)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no refusal
        return 2**63


def check_memory(need_bytes: float, field: str, what: str, fix: str) -> None:
    """Refuse work that needs more memory than the machine has, naming the figures."""
    have = machine_memory_bytes()
    if need_bytes > have:
        raise ServesimError(field, f"{what} need about {need_bytes / 1e9:,.1f} GB of memory but this "
                            f"machine has {have / 1e9:,.1f} GB", fix)
