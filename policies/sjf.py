"""``sjf``: shortest job first by predicted output length, with aging, over continuous batching.

Serving short requests first cuts mean latency when requests queue (the classic SJF result; for
LLMs with *predicted* lengths: Qiu et al., "Efficient Interactive LLM Serving with Proxy
Model-based Sequence Length Prediction", 2024; Fu et al., "Efficient LLM Scheduling by Learning to
Rank", NeurIPS 2024). Everything but the order of the waiting queue is
:class:`~servesim.policies.continuous.ContinuousBatching` (whole prompts, prefill-first steps, the same
token/seat/KV budgets, preemption by recompute of the latest admitted).

Predictors (``predictor:``), each fixed per request for its life:

- ``oracle``: the true output length (an upper bound on what any predictor achieves);
- ``noisy``: the true length times ``exp(sigma * z)``, ``z ~ N(0, 1)``, one draw per request from
  a generator seeded by the experiment's seed (``sigma: 1`` is roughly a poor proxy model);
- ``prompt``: the prompt length (shortest prompt first, needs no predictor at all).

Aging: a request's score is ``predicted - aging_tokens_per_s * waited_s`` and the lowest score is
admitted first. Because every waiting request ages at the same rate, the order of two scores
never changes with time, so the queue is keyed once, on ``predicted + rate * arrival_s``, and kept
in a heap (:class:`~servesim.policies.waiting.KeyedQueue`): O(log n) per arrival and admission.

Starvation bound (proved from the key): request ``j`` is admitted before every request ``i``
that arrives more than ``(p_j - p_min) / rate`` seconds after it, where ``p_min`` is the smallest
prediction, because then ``p_i + rate a_i >= p_min + rate a_i > p_j + rate a_j``. So after
``a_j + (p_j - p_min) / rate`` nothing new can overtake ``j``: it waits at most that long plus
the time to admit what had arrived by then (its FCFS wait, had it arrived at that moment). With
``rate = 0`` this is pure SJF, which can starve long requests for as long as short ones keep
coming.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from servesim.policies.base import register_policy
from servesim.policies.continuous import ContinuousBatching, ContinuousOptions

NOISE_STREAM = 0x5_1F
"""Mixed into the experiment seed so that the predictor's draws are their own stream."""


class SjfOptions(ContinuousOptions):
    """SJF's knobs plus continuous batching's ``order`` knobs (SJF only reorders the queue)."""

    predictor: Literal["oracle", "noisy", "prompt"] = "oracle"
    sigma: float = Field(1.0, ge=0, description="noisy: std of the log-normal multiplicative error")
    aging_tokens_per_s: float = Field(
        100.0, ge=0, description="predicted tokens forgiven per second waited (0: no aging)")


@register_policy
class ShortestJobFirst(ContinuousBatching):
    name = "sjf"
    Options = SjfOptions
    options: SjfOptions

    def admission_keys(self) -> np.ndarray:
        return self.predicted() + self.options.aging_tokens_per_s * self.replica.requests.arrival

    def predicted(self) -> np.ndarray:
        """Every request's predicted length (the same on every replica: one draw per request)."""
        r, options = self.replica.requests, self.options
        if options.predictor == "prompt":
            return r.prompt.astype(np.float64)
        if options.predictor == "oracle":
            return r.output.astype(np.float64)
        rng = np.random.default_rng([self.replica.seed, NOISE_STREAM])
        return r.output * np.exp(options.sigma * rng.standard_normal(len(r)))

    def overtake_window_s(self, request: int) -> float:
        """Seconds after ``request``'s arrival beyond which no arrival is admitted before it."""
        predicted = self.predicted()
        rate = self.options.aging_tokens_per_s
        return (predicted[request] - predicted.min()) / rate if rate > 0 else float("inf")
