"""Speculative decoding in the token-budget core: how many proposals each decode verifies, and
how many of them the target accepts.

In the unified token-budget view (docs/architecture.md) a decoding request that speculates asks
for ``1 + k`` tokens in a step: its last sampled token plus ``k`` proposals (from a draft model,
an EAGLE head, MTP layers or an n-gram lookup). The target computes all of them in one pass; the
first ``a`` proposals that match what it would have sampled are accepted, and the step emits
``1 + a`` tokens (the accepted proposals and the target's own next token). The KV of the ``k - a``
rejected proposals is thrown away.

:class:`Speculator` makes the one decision every policy asks for (:meth:`Speculator.proposals`)
and draws the acceptance outcome (:meth:`Speculator.accept`). Both are pure functions of the
experiment's seed, the request and how many tokens it has generated, so a policy may plan a step
several times (after a preemption) and a run is reproducible bit for bit whatever the order of
calls. The acceptance model is one array, ``survival[i]`` = P(the first ``i + 1`` proposals are
all accepted) (vLLM's "acceptance at token i"), built from the experiment's ``speculative``
section by :mod:`servesim.speculative`; chain verification accepts a prefix, so with one uniform
draw ``u`` per request and step the accepted count is ``#{i < k : survival[i] > u}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_ACCEPT, _PROPOSE = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)
"""Stream constants: the acceptance draw and the n-gram match draw of one (request, step) are
independent."""


def _uniform(seed_key: np.uint64, stream: np.uint64, requests: np.ndarray,
             generated: np.ndarray) -> np.ndarray:
    """A uniform in [0, 1) per (request, generated tokens), from SplitMix64's finaliser of a key
    that mixes the seed, the stream, the request id and its generated count (a counter-based
    generator: the same inputs give the same draw, in any order)."""
    with np.errstate(over="ignore"):
        x = (seed_key ^ stream
             ^ (requests.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93))
             ^ (generated.astype(np.uint64) * np.uint64(0xA0761D6478BD642F)))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True, slots=True)
class Proposals:
    """The speculation of one step: the batch members at ``rows`` (indices into the batch's ids)
    verify ``proposed[i]`` proposal tokens each, and the target accepts ``accepted[i]`` of them."""

    rows: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray

    @property
    def proposed_total(self) -> int:
        return int(self.proposed.sum())

    @property
    def accepted_total(self) -> int:
        return int(self.accepted.sum())


@dataclass
class SpeculationCounts:
    """What one replica's speculation did over a run (the summary's ``speculative`` section)."""

    drafts: int = 0
    """(request, step) pairs that verified at least one proposal (vLLM's ``num_drafts``)."""
    proposed: int = 0
    accepted: int = 0
    accepted_per_position: np.ndarray | None = None
    """How often proposal ``i`` was accepted (vLLM's ``num_accepted_tokens_per_pos``)."""


class Speculator:
    """One replica's speculative decoding: the decision and the draws, with its counters."""

    def __init__(self, num_tokens: int, survival: np.ndarray, seed: int,
                 propose_rate: float = 1.0, disable_above: int | None = None) -> None:
        """``num_tokens`` proposals per step (``k``); ``survival`` the acceptance model (at least
        ``k`` positions, non-increasing); ``propose_rate`` the share of a request's steps in which
        the proposer finds something to propose (n-gram lookup: below 1); ``disable_above``: no
        speculation in a step whose running requests exceed it (vLLM's
        ``disable_by_batch_size``, TensorRT-LLM's ``max_concurrency``)."""
        if num_tokens < 1 or survival.size < num_tokens:
            raise ValueError("the acceptance model must cover every proposal position")
        self.num_tokens = num_tokens
        self.survival = np.ascontiguousarray(survival[:num_tokens], dtype=np.float64)
        self._negated = -self.survival
        self.propose_rate = propose_rate
        self.disable_above = disable_above
        self._seed = np.uint64((seed * 0x9FB21C651E98DF25 + 1) & 0xFFFF_FFFF_FFFF_FFFF)
        self.counts = SpeculationCounts(accepted_per_position=np.zeros(num_tokens, dtype=np.int64))

    def proposals(self, running: int, requests: np.ndarray, generated: np.ndarray,
                  remaining: np.ndarray, budget: int | None = None) -> np.ndarray | None:
        """Proposal tokens each decoding request ``requests[i]`` verifies this step, or None when
        none does (the batch cap is exceeded, or nothing is proposed).

        A request proposes ``k``, at most ``remaining[i] - 1`` (its output tokens still to
        generate, minus the one the target samples: a proposal past the end could never be
        emitted, and the request never holds KV beyond ``prompt + output - 1`` tokens); with n-gram
        lookup, nothing in the steps its lookup misses. ``budget`` caps the proposals of the
        step, in request order (vLLM v1 shortens the proposals of requests the token budget no
        longer covers). Pure: the same arguments give the same answer."""
        if self.disable_above is not None and running > self.disable_above:
            return None
        proposed = np.minimum(remaining - 1, self.num_tokens)
        if self.propose_rate < 1.0:
            hit = _uniform(self._seed, _PROPOSE, requests, generated) < self.propose_rate
            proposed = np.where(hit, proposed, 0)
        if budget is not None:
            before = np.cumsum(proposed) - proposed
            proposed = np.clip(budget - before, 0, proposed)
        return proposed if proposed.any() else None

    def accept(self, requests: np.ndarray, generated: np.ndarray, proposed: np.ndarray) -> np.ndarray:
        """How many of its ``proposed[i]`` proposals the target accepts for ``requests[i]``: the
        longest accepted prefix, drawn from the acceptance model (one uniform per request)."""
        u = _uniform(self._seed, _ACCEPT, requests, generated)
        return np.minimum(np.searchsorted(self._negated, -u, side="left"), proposed)

    def plan(self, requests: np.ndarray, generated: np.ndarray, proposed: np.ndarray,
             rows: np.ndarray | None = None) -> Proposals:
        """The step's :class:`Proposals` for the batch members at ``rows`` (default: all), which
        are ``requests`` with ``generated`` tokens and propose ``proposed`` (only those that
        propose at least one are kept)."""
        keep = proposed > 0
        if rows is None:
            rows = np.arange(proposed.size)
        if not keep.all():
            rows, requests, generated, proposed = rows[keep], requests[keep], generated[keep], proposed[keep]
        return Proposals(rows, proposed, self.accept(requests, generated, proposed))

    def record(self, proposals: Proposals) -> None:
        """Count a credited step's speculation."""
        counts = self.counts
        counts.drafts += int(proposals.rows.size)
        counts.proposed += proposals.proposed_total
        counts.accepted += proposals.accepted_total
        assert counts.accepted_per_position is not None
        accepted = proposals.accepted[proposals.accepted > 0]
        if accepted.size:
            # position i is accepted by every draft that accepted more than i proposals
            hist = np.bincount(accepted, minlength=self.num_tokens + 1)
            counts.accepted_per_position += np.cumsum(hist[::-1])[::-1][1:self.num_tokens + 1]
