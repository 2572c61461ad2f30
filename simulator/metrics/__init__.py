"""Metrics of a run: the per-request and per-step tables, the typed summary, usage figures."""

from typing import TYPE_CHECKING, Any

from servesim.metrics.stats import describe, describe_weighted, weighted_percentile

if TYPE_CHECKING:
    from servesim.metrics.summary import Summary

__all__ = ["Summary", "describe", "describe_weighted", "weighted_percentile"]


def __getattr__(name: str) -> Any:
    """``Summary`` on first use: its module loads pandas, which resolving a deployment (``servesim
    validate``, which imports this package through the topologies) does not need."""
    if name == "Summary":
        from servesim.metrics.summary import Summary

        return Summary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
