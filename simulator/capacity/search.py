"""The highest arrival rate a deployment sustains within the SLOs.

1. **First guess from physics** (:func:`saturation_rate`): the requests per second one replica
   completes when it runs flat out, from the cost model alone: a mean prompt's prefill plus its
   share of decode steps at the largest batch the engine would run (``max_num_seqs``, or what
   the KV pool holds at the mean prompt + output), times the replicas. No SLO is met at
   saturation, so the first guess is usually a failing upper end. A disaggregated set saturates
   at the lower of its prefill group's rate (prompts per second, one after another) and its
   decode group's (the decode steps alone at that largest batch).
2. **Bracket** by halving (if the guess fails) or doubling (if it passes) until one rate passes
   and the next fails; at most ``max_halvings`` / ``max_doublings`` steps.
3. **Bisect** geometrically (``sqrt(pass * fail)``) until ``(fail - pass) / pass <= precision``.

The answer is the highest *passing* rate simulated, so it errs low by at most ``precision``
(5% by default). Each rate costs ``replications`` simulations: typically one guess, one or two
halvings and five bisections, so about 8 x 3 = 24 simulations per candidate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servesim.cost import BatchShape
from servesim.topology.base import Topology
from servesim.topology.group import ReplicaGroup

Evaluate = Callable[[float], dict[str, Any]]
"""Judges one rate: returns :func:`servesim.capacity.evaluate.judge`'s record."""


def saturation_rate(group: ReplicaGroup, mean_prompt: float, mean_output: float) -> float:
    """Requests/s the group's replicas complete when always busy (see the module docstring)."""
    limits = group.limits
    prompt = max(1, round(mean_prompt))
    output = max(1.0, mean_output)
    blocks_each = math.ceil((prompt + output) / limits.block_size)
    batch = max(1, min(limits.max_num_seqs, limits.num_blocks // max(1, blocks_each)))
    context = max(0, round(prompt + output / 2))
    if group.runs_pipeline:
        # every scheduling unit keeps one micro-batch in flight; the pp virtual engines overlap
        ranks = group.parallelism.dp
        pipeline = group.parallel_cost_model()
        decode_s = pipeline.step_time([BatchShape.decode(batch, context)] * ranks)
        prefill_s = pipeline.step_time([BatchShape.prefill(prompt)] * ranks)
        per_request_s = prefill_s + (output - 1) * decode_s / batch
        return group.units / per_request_s
    cost = group.cost_model()
    decode_s = cost.step_time(BatchShape.decode(batch, context))
    prefill_s = cost.step_time(BatchShape.prefill(prompt))
    per_request_s = prefill_s + (output - 1) * decode_s / batch
    return group.replicas / per_request_s


def _largest_batch(group: ReplicaGroup, prompt: int, output: float) -> int:
    limits = group.limits
    blocks_each = math.ceil((prompt + output) / limits.block_size)
    return max(1, min(limits.max_num_seqs, limits.num_blocks // max(1, blocks_each)))


def topology_saturation_rate(topology: Topology, mean_prompt: float, mean_output: float) -> float:
    """Requests/s the topology completes when always busy: :func:`saturation_rate` of its one
    group, or the slower of a prefill group and a decode group (see the module docstring)."""
    if len(topology.groups) == 1:
        return saturation_rate(topology.groups[0], mean_prompt, mean_output)
    prefill, decode = topology.groups[0], topology.groups[-1]
    prompt = max(1, round(mean_prompt))
    output = max(1.0, mean_output)
    prefill_rate = prefill.replicas / prefill.cost_model().step_time(BatchShape.prefill(prompt))
    if output <= 1:
        return prefill_rate
    batch = _largest_batch(decode, prompt, output)
    decode_s = decode.cost_model().step_time(BatchShape.decode(batch, max(0, round(prompt + output / 2))))
    decode_rate = decode.replicas * batch / ((output - 1) * decode_s)
    return min(prefill_rate, decode_rate)


@dataclass
class SearchResult:
    status: str
    """``found``; ``unattainable`` (fails even at the lowest rate tried); ``ceiling`` (passes
    even at the highest rate tried: the answer is a lower bound)."""
    rate: float
    """Highest passing rate (0 when unattainable)."""
    failing_rate: float | None
    first_guess: float
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passing(self) -> dict[str, Any] | None:
        return _at(self.evaluations, self.rate)

    @property
    def failing(self) -> dict[str, Any] | None:
        return _at(self.evaluations, self.failing_rate)


def _at(evaluations: list[dict[str, Any]], rate: float | None) -> dict[str, Any] | None:
    return next((e for e in evaluations if rate is not None and e["rate"] == rate), None)


def search_rate(evaluate: Evaluate, first_guess: float, precision: float,
                max_doublings: int = 8, max_halvings: int = 7) -> SearchResult:
    """Bracket, then bisect (see the module docstring)."""
    evaluations: list[dict[str, Any]] = []

    def passes(rate: float) -> bool:
        record = evaluate(rate)
        evaluations.append(record)
        return bool(record["passed"])

    rate = first_guess
    low: float | None
    high: float | None
    if passes(rate):
        low, high = rate, None
        for _ in range(max_doublings):
            rate *= 2
            if passes(rate):
                low = rate
            else:
                high = rate
                break
        if high is None:
            return SearchResult("ceiling", low, None, first_guess, evaluations)
    else:
        low, high = None, rate
        for _ in range(max_halvings):
            rate /= 2
            if passes(rate):
                low = rate
                break
            high = rate
        if low is None:
            return SearchResult("unattainable", 0.0, high, first_guess, evaluations)
    assert low is not None and high is not None  # both branches return without a bracket
    while (high - low) / low > precision:
        middle = math.sqrt(low * high)
        if passes(middle):
            low = middle
        else:
            high = middle
    return SearchResult("found", low, high, first_guess, evaluations)
