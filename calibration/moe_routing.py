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

ROUTINGS = ("uniform", "balanced", "power_law_1.01")
POWER_LAW_SAMPLES = 256
"""Routings drawn per (tokens, experts, top-k) to average the power-law generator's experts hit."""


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


@cache
def power_law_hits(tokens: int, experts: int, top_k: int, alpha: float = 1.01) -> float:
    """Expected experts with at least one token under AIConfigurator's power-law routing
    (``collector/helper.py::power_law_logits_v3``, described, not copied): every expert draws a
    load from a power law of exponent ``alpha`` on ``[1, 0.8 T]`` (on ``[0.01, 2]`` when the
    ``T k`` assignments are fewer than the experts), the loads are scaled to ``T k`` assignments
    and rounded, and the rounding's surplus or shortfall is settled one assignment at a time on
    the busiest (surplus) or least busy non-empty (shortfall) experts. Averaged over
    :data:`POWER_LAW_SAMPLES` draws of a fixed seed, so the same call gives the same number."""
    total = tokens * top_k
    low, high = (1.0, 0.8 * tokens) if total > experts else (0.01, 2.0)
    if high <= low:  # one token with many assignments: every draw is the same load
        return float(min(experts, total))
    u = np.random.default_rng(0).random((POWER_LAW_SAMPLES, experts))
    power = 1.0 - alpha
    loads = ((high**power - low**power) * u + low**power) ** (1.0 / power)
    counts = np.round(loads / loads.sum(axis=1, keepdims=True) * total).astype(np.int64)
    hits = np.empty(POWER_LAW_SAMPLES)
    for i, row in enumerate(counts):
        delta = total - int(row.sum())
        order = np.argsort(-row, kind="stable")
        if delta > 0:  # the surplus goes to the busiest experts, one each, in turn
            np.add.at(row, order[np.arange(delta) % experts], 1)
        while delta < 0:  # the shortfall comes off the least busy experts that have any
            busy = order[row[order] > 0][::-1]
            take = busy[:min(-delta, busy.size)]
            row[take] -= 1
            delta += take.size
        hits[i] = np.count_nonzero(row)
    return float(hits.mean())


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
    skewed = np.flatnonzero(routing == "power_law_1.01")
    if (ep[skewed] != 1).any():
        raise ValueError("power-law routing is modelled without expert parallelism only")
    for row in skewed:
        hit[row] = power_law_hits(int(tokens[row]), int(experts[row]), int(top_k[row]))
    return hit, assignments
