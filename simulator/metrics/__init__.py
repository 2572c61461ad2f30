"""Metrics of a run: the per-request and per-step tables, the summary, and writing them out."""

from servesim.metrics.outputs import RunTables, tabulate, write_run
from servesim.metrics.stats import describe, describe_weighted, weighted_percentile

__all__ = ["RunTables", "describe", "describe_weighted", "tabulate", "weighted_percentile", "write_run"]
