"""The acceptance model: every way of writing it down, reduced to one array.

Chain verification (vLLM, SGLang with ``topk 1``, TensorRT-LLM's linear drafts) accepts a prefix
of the ``k`` proposals: the target checks them in order and stops at the first it would not have
sampled, then samples its own token there (or after the last proposal, the "bonus" token). So a
step emits ``1 + a`` tokens, ``a`` the accepted prefix, and all an acceptance model must say is
``survival[i] = P(a >= i + 1)``: the probability that the first ``i + 1`` proposals are all
accepted (vLLM calls it "acceptance at token i"). Then

    E[tokens per step] = 1 + sum(survival[:k])

and for i.i.d. acceptance at rate ``alpha`` (``survival[i] = alpha^(i+1)``) that is the geometric
sum ``(1 - alpha^(k+1)) / (1 - alpha)`` (Leviathan et al., ICML 2023, eq. 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.errors import ServesimError
from servesim.speculative.presets import preset
from servesim.speculative.schema import AcceptanceConfig

_WHERE = "speculative.acceptance"


@dataclass(frozen=True)
class AcceptanceModel:
    """``survival[i]``: probability that the first ``i + 1`` proposals are all accepted."""

    survival: np.ndarray
    propose_rate: float
    source: str

    def expected_accepted(self, k: int) -> float:
        """Mean proposals accepted per step that proposes ``k``."""
        return float(self.survival[:k].sum())

    def expected_length(self, k: int) -> float:
        """Mean tokens a step emits for a request that proposes ``k`` (vLLM's and EAGLE's
        "mean acceptance length")."""
        return 1.0 + self.expected_accepted(k)

    def conditional(self, k: int) -> np.ndarray:
        """Per position, the rate of acceptance given every earlier proposal was accepted
        (EAGLE's ``n-alpha``)."""
        s = self.survival[:k]
        before = np.concatenate(([1.0], s[:-1]))
        return np.divide(s, before, out=np.zeros_like(s), where=before > 0)


def iid_length(alpha: float, k: int) -> float:
    """Tokens per step with ``k`` proposals each accepted with probability ``alpha`` given the
    earlier ones were: ``(1 - alpha^(k+1)) / (1 - alpha)`` (``k + 1`` at ``alpha = 1``)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _positions(values: np.ndarray, k: int, key: str) -> np.ndarray:
    if values.size < k:
        raise ServesimError(f"{_WHERE}.{key}", f"covers {values.size} proposal positions but "
                            f"num_speculative_tokens is {k}",
                            f"give at least {k} or lower speculative.num_speculative_tokens")
    return values


def _probabilities(values: list[float], key: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(array)) or array.min() < 0 or array.max() > 1:
        raise ServesimError(f"{_WHERE}.{key}", "needs rates between 0 and 1", "fix the values")
    return array


def _non_increasing(survival: np.ndarray, key: str) -> np.ndarray:
    if np.any(np.diff(survival) > 1e-12):
        raise ServesimError(f"{_WHERE}.{key}", "must not increase along the positions (a "
                            "proposal is accepted only if every earlier one was)",
                            "give the unconditional rate per position, or use rates: for "
                            "conditional ones")
    return survival


def acceptance_model(config: AcceptanceConfig, k: int) -> AcceptanceModel:
    """The acceptance model of ``config`` for ``k`` proposals per step (errors name the key)."""
    form = config.form
    propose_rate = 1.0 if config.propose_rate is None else config.propose_rate
    if form == "rate":
        assert config.rate is not None
        survival = config.rate ** np.arange(1, k + 1, dtype=np.float64)
        source = f"i.i.d. acceptance at rate {config.rate}"
    elif form == "rates":
        assert config.rates is not None
        survival = np.cumprod(_positions(_probabilities(config.rates, form), k, form))
        source = f"conditional rates per position {config.rates}"
    elif form == "per_position":
        assert config.per_position is not None
        survival = _non_increasing(_positions(_probabilities(config.per_position, form), k, form), form)
        source = f"unconditional rates per position {config.per_position}"
    elif form == "distribution":
        assert config.distribution is not None
        counts = np.asarray(config.distribution, dtype=np.float64)
        if not np.all(np.isfinite(counts)) or counts.min() < 0 or counts.sum() <= 0:
            raise ServesimError(f"{_WHERE}.distribution", "needs non-negative counts, not all zero",
                                "give how often 0, 1, 2, ... proposals were accepted")
        tail = np.cumsum(counts[::-1])[::-1] / counts.sum()  # tail[j] = P(accepted >= j)
        survival = _positions(tail[1:], k, form)
        source = f"distribution of accepted proposals {config.distribution}"
    elif form == "measured":
        assert config.measured is not None
        m = config.measured
        per = np.asarray(m.accepted_per_position, dtype=np.float64) / m.num_drafts
        if per.max() > 1 or per.min() < 0:
            raise ServesimError(f"{_WHERE}.measured.accepted_per_position", "counts exceed num_drafts",
                                "give per-position accepted counts and the number of drafts")
        survival = _non_increasing(_positions(per, k, "measured.accepted_per_position"), form)
        source = f"measured: {m.num_drafts} drafts, accepted per position {m.accepted_per_position}"
    else:
        assert config.preset is not None
        found = preset(config.preset)
        survival = _positions(np.asarray(found.per_position, dtype=np.float64), k, "preset")
        if config.propose_rate is None:
            propose_rate = found.propose_rate
        source = f"preset {config.preset}: {found.source}"
    return AcceptanceModel(np.ascontiguousarray(survival[:k]), propose_rate, source)
