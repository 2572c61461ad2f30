"""Sessions recovered from a trace's prefix block ids (``trace: {format: mooncake, sessions: true}``).

Mooncake's conversation trace has no session column, but its ``hash_ids`` chain the turns of a
conversation: a turn's prompt is the previous turn's prompt, its answer and a new message, so its
block ids start with every *full* 512-token block of the previous turn's prompt (the previous
turn's last, partial block differs: in the next turn it is filled with answer tokens, so its hash
changes). In the 1-hour conversation trace (12,031 requests) 3,899 requests continue an earlier
one this way; the median gap between turns is 126 s and the median new text 37 tokens (over the
3,560 turns whose history is whole).

:func:`chain_sessions` walks the requests in arrival order through a trie of block ids and makes
request ``j`` the next turn of the latest earlier request ``i`` whose full prompt blocks (at least
``MIN_BLOCKS``, so that the system prompt every request shares does not chain them all) are a
prefix of ``j``'s ids and whose prompt is shorter than ``j``'s. Then:

- ``j`` is sent at its trace time, or when ``i``'s answer ends if that is later (the trace's gap
  already holds the original answer time and the user's think time; a turn cannot be sent before
  the answer it follows);
- ``j``'s prompt repeats ``i``'s prompt and answer (``prefix_shared = prompt_i + output_i``) when it
  is longer than both; otherwise (339 turns of the trace, whose history was cut) only the matched
  full blocks;
- a request that continues none starts a new session; a request may have several continuations
  (a regenerated answer), each its own branch of the session.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from servesim.errors import ServesimError
from servesim.workloads.links import RequestLinks
from servesim.workloads.requests import RequestTable

MIN_BLOCKS = 2
"""Full blocks a previous turn must share: block 0 is the system prompt of every Mooncake request."""


def chain_sessions(table: RequestTable) -> RequestTable:
    """``table`` with links that chain each request to the turn it continues (module docstring)."""
    if table.prefix_block_offsets is None or table.prefix_block_ids is None:
        raise ServesimError("trace.sessions", "needs prefix block ids to find the sessions",
                            "use it with a mooncake trace (hash_ids), or remove sessions")
    n = len(table)
    size = int(table.prefix_block_size)
    bounds = table.prefix_block_offsets.tolist()
    ids = table.prefix_block_ids.tolist()
    prompts = table.prompt_tokens.tolist()
    outputs = table.output_tokens.tolist()
    children: dict[tuple[int, int], int] = {}  # (trie node, block id) -> trie node
    ends: dict[int, int] = {}  # trie node -> latest request whose full prompt blocks end there
    full_blocks = [0] * n  # full prompt blocks named by each request's ids
    parent = np.full(n, -1, dtype=np.int64)
    shared = np.zeros(n, dtype=np.int64)
    session = np.zeros(n, dtype=np.int64)
    turn = np.zeros(n, dtype=np.int64)
    sessions = 0
    for j in range(n):
        blocks = ids[bounds[j]:bounds[j + 1]]
        node, best = 0, -1
        for k, block in enumerate(blocks):  # the deepest earlier prompt that j's ids extend
            node = children.get((node, block), -1)
            if node < 0:
                break
            i = ends.get(node, -1)
            if i >= 0 and k + 1 >= MIN_BLOCKS and prompts[i] < prompts[j]:
                best = i
        if best >= 0:
            parent[j] = best
            history = prompts[best] + outputs[best]
            shared[j] = history if prompts[j] > history else full_blocks[best] * size
            session[j], turn[j] = session[best], turn[best] + 1
        else:
            session[j] = sessions
            sessions += 1
        full = full_blocks[j] = min(prompts[j] // size, len(blocks))
        node = 0
        for k in range(full):
            key = (node, blocks[k])
            nxt = children.get(key)
            if nxt is None:
                nxt = children[key] = len(children) + 1
            node = nxt
        if full >= MIN_BLOCKS:
            ends[node] = j
    links = RequestLinks.chains(parent, np.zeros(n), shared, session, turn)
    chained = int(np.count_nonzero(parent >= 0))
    return replace(table, links=links,
                   source=f"{table.source}; sessions from hash_ids: {sessions:,} sessions, {chained:,} "
                          "requests continue an earlier one")

