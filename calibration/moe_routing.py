"""Which experts a measured fused-MoE call read: the routing its benchmark generated.

A fused MoE layer reads the weights of every expert at least one token picked, so in a small
batch (``tokens * top_k`` below the expert count) its time follows the number of experts hit.
The cost model assumes uniform random routing, ``E (1 - (1 - k/E)^T)`` experts hit
(:func:`servesim.cost.routing.experts_hit`). AIConfigurator's ``balanced`` rows
do not route that way: its collector (``collector/vllm/collect_moe.py::balanced_logits``) spreads
the tokens as far as they go, token ``i``'s ``j``-th expert being ``(i + j * s) mod E`` with
``s = ceil(E / k)`` once ``T >= s``, and ``(floor(i * s / T) + j * s) mod E`` below it, so about
``min(E, T * k)`` experts are hit (:func:`balanced_rank0` counts them exactly). At 16 tokens of
top-8 over 256 experts that is 128 experts where uniform routing hits 102; priced as uniform, a
balanced row looked 1.26x slower than its bytes, and the fitted expert curve carried that
slowness into every simulated decode step of 8-64 sequences.

:func:`routed_work` gives, per row, the experts hit and the (token, expert) assignments of the
rank whose time was measured (rank 0 of an expert-parallel layout: vLLM places experts
``[0, E / ep)`` on it), for the routing that produced the row: ``balanced`` exactly, by enumerating
the collector's assignment; ``uniform`` by the cost model's own expectation. Power-law rows (the
collector's ``power_law_*`` distributions: random loads, five routings averaged) have no closed
form here and are priced as uniform, as before.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from servesim.cost.routing import experts_hit

ROUTINGS = ("uniform", "balanced")


@cache
def balanced_rank0(tokens: int, experts: int, top_k: int, ep: int) -> tuple[int, int]:
    """(experts hit on rank 0, its assignments) under AIConfigurator's balanced routing."""
    stride = math.ceil(experts / top_k)
    i = np.arange(tokens, dtype=np.int64)[:, None]
    j = np.arange(top_k, dtype=np.int64)[None, :]
    base = i if tokens >= stride else (i * stride) // tokens  # the collector's float, floored
    ids = (base + j * stride) % experts
    local = ids[ids < experts // ep]
    return int(np.unique(local).size), int(local.size)


def routed_work(tokens: np.ndarray, experts: np.ndarray, top_k: np.ndarray, ep: np.ndarray,
                routing: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(experts hit, assignments) of the measured rank of each row; ``routing`` per row is one of
    :data:`ROUTINGS` (None: uniform everywhere, the cost model's assumption)."""
    hit = experts_hit(experts / ep, top_k / experts, tokens)
    assignments = tokens * top_k / ep
    if routing is None:
        return hit, assignments
    unknown = set(np.unique(routing)) - set(ROUTINGS)
    if unknown:
        raise ValueError(f"moe routing {sorted(unknown)} not modelled; use one of {ROUTINGS}")
    hit, assignments = hit.copy(), assignments.copy()
    for row in np.flatnonzero(routing == "balanced"):
        hit[row], assignments[row] = balanced_rank0(int(tokens[row]), int(experts[row]), int(top_k[row]),
                                                    int(ep[row]))
    return hit, assignments
