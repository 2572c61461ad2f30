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
"""

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
