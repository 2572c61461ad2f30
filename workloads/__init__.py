"""Workloads: the requests a simulation serves, as one columnar :class:`RequestTable`.

A workload is either a replayed trace (``read_trace``: plain CSV, Azure LLM inference 2023/2024,
Mooncake JSONL with prefix-block hashes, BurstGPT; with rate scaling, a time window and a request
cap) or a seeded generator (``arrivals``: Poisson, Gamma with vLLM's burstiness, constant rate;
``lengths``: fixed, uniform, lognormal, or (prompt, output) pairs resampled from any trace,
including the ShareGPT/arXiv length statistics; ``presets``: lognormals fitted to public traces
so realistic traffic needs no data files; vLLM bench's random dataset; raw ShareGPT JSON). Traffic
that depends on itself is a table with ``links`` (:mod:`~servesim.workloads.links`): chat
sessions (:mod:`~servesim.workloads.sessions`), agentic workflows
(:mod:`~servesim.workloads.workflows`), Mooncake's sessions
(:mod:`~servesim.workloads.trace_sessions`). Any generator's arrivals can follow a rate profile
(:mod:`~servesim.workloads.rate_profile`). The experiment YAML's ``workload:`` section is a
:class:`WorkloadConfig`; :func:`build_workload` turns it and a seed into the table, identically
for the same seed. Everything is vectorised NumPy/pandas: 100k requests take milliseconds.

The names below are loaded on first use (PEP 562): the experiment schema
(:mod:`~servesim.workloads.config`) reads a ``workload:`` section without the generators and
trace readers that only building the table needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servesim.workloads.build import build_workload
    from servesim.workloads.config import WorkloadConfig, parse_workload_config
    from servesim.workloads.presets import PRESETS
    from servesim.workloads.requests import RequestTable
    from servesim.workloads.traces import TRACE_FORMATS, LengthSample, read_lengths, read_trace

__all__ = [
    "PRESETS",
    "TRACE_FORMATS",
    "LengthSample",
    "RequestTable",
    "WorkloadConfig",
    "build_workload",
    "parse_workload_config",
    "read_lengths",
    "read_trace",
]


def __getattr__(name: str) -> Any:
    if name == "build_workload":
        from servesim.workloads.build import build_workload

        return build_workload
    if name in ("WorkloadConfig", "parse_workload_config"):
        from servesim.workloads import config

        return getattr(config, name)
    if name == "PRESETS":
        from servesim.workloads.presets import PRESETS

        return PRESETS
    if name == "RequestTable":
        from servesim.workloads.requests import RequestTable

        return RequestTable
    if name in ("TRACE_FORMATS", "LengthSample", "read_lengths", "read_trace"):
        from servesim.workloads import traces

        return getattr(traces, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
