"""One name per setting in each place a user gives it: a YAML key, or a ``servesim step`` flag.

Errors are raised with the YAML key (``precision.weights``, ``deployment.tp``), the spelling of
experiments, sweeps and capacity plans, and their fixes spell the YAML form
(``precision.weights: int4``). Where the user typed flags instead, :func:`as_flags` rewrites the
line into the flags they typed (``--weight-dtype int4``), so a hint never names a key the user
never saw."""

from __future__ import annotations

import re

from servesim.errors import ServesimError

STEP_FLAGS = {
    "precision.weights": "--weight-dtype",
    "precision.activations": "--act-dtype",
    "precision.kv_cache": "--kv-dtype",
    "precision.group_size": "--group-size",
    "deployment.tp": "--tp",
    "deployment.gpu_memory_utilization": "--gpu-memory-utilization",
}
"""YAML key -> ``servesim step`` flag."""


def _rewrite(text: str, names: dict[str, str]) -> str:
    for key, flag in names.items():
        text = re.sub(rf"\b{re.escape(key)}: (\S+?)([,;)]|\s|$)", rf"{flag} \1\2", text)
        text = re.sub(rf"\b{re.escape(key)}\b", flag, text)
    return text


def as_flags(error: ServesimError, names: dict[str, str] | None = None) -> ServesimError:
    """``error`` with its YAML keys written as ``servesim step``'s flags (or ``names``)."""
    mapping = STEP_FLAGS if names is None else names
    return ServesimError(_rewrite(error.field, mapping), _rewrite(error.problem, mapping),
                         _rewrite(error.fix, mapping))


def relabel(error: ServesimError, names: dict[str, str]) -> ServesimError:
    """``error`` with YAML keys renamed to other YAML keys (``deployment.tp`` -> ``candidates.tp``
    for a capacity plan), values left as written (``candidates.tp: 2``)."""

    def rename(text: str) -> str:
        for key, other in names.items():
            text = re.sub(rf"\b{re.escape(key)}\b", other, text)
        return text

    return ServesimError(rename(error.field), rename(error.problem), rename(error.fix))
