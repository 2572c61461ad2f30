"""Metrics of a run: the per-request and per-step tables, the typed summary, usage figures."""

from servesim.metrics.stats import describe, describe_weighted, weighted_percentile
from servesim.metrics.summary import Summary

__all__ = ["Summary", "describe", "describe_weighted", "weighted_percentile"]
