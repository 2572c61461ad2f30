"""Turn a :class:`WorkloadConfig` and a seed into the :class:`RequestTable` the engine replays.

Randomness: the seed feeds a ``numpy.random.SeedSequence`` that is split into independent
streams, one for arrivals, one for prompt lengths, one for output lengths, one for priority
classes and one for the shared system prompt each request draws (``spawn(5)``'s first children
are ``spawn(3)``'s, so adding priorities or shared prefixes changes no arrival or length). Same
config and seed give an identical table; and changing only the length distribution keeps the very
same arrival times (common random numbers), so two runs that differ in one knob stay comparable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servesim.workloads.arrivals import arrival_times
from servesim.workloads.config import (
    FixedLength,
    LengthDist,
    LognormalLength,
    UniformLength,
    WorkloadConfig,
)
from servesim.workloads.lengths import fixed_lengths, lognormal_lengths, resample_pairs, uniform_lengths
from servesim.workloads.presets import get_preset
from servesim.workloads.requests import PrefixBlocks, RequestTable
from servesim.workloads.traces import read_lengths, read_trace


def build_workload(config: WorkloadConfig, seed: int, base_dir: Path | None = None) -> RequestTable:
    """The requests of ``config``; relative paths in it resolve against ``base_dir``."""
    if config.trace is not None:
        trace = config.trace
        return read_trace(_resolve(trace.path, base_dir), trace.format, rate_scale=trace.rate_scale,
                          start_s=trace.start_s, end_s=trace.end_s, max_requests=trace.max_requests,
                          model=trace.model)
    assert config.arrival is not None
    arrival_rng, prompt_rng, output_rng, priority_rng, prefix_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5))
    arrival = config.arrival
    if arrival.is_closed:
        # Sent by the clients during the run (servesim.core.clients); zeros until then.
        assert config.num_requests is not None
        arrivals = np.zeros(config.num_requests, dtype=np.float64)
        parts = [f"closed loop: {arrival.concurrency} clients"
                 + (f", think {arrival.think_time_s:g} s" if arrival.think_time_s else "")]
    else:
        burstiness = arrival.burstiness if arrival.burstiness is not None else 1.0
        assert arrival.rate is not None
        arrivals = arrival_times(arrival.process, arrival.rate, arrival_rng,
                                 num_requests=config.num_requests, duration_s=config.duration_s,
                                 burstiness=burstiness)
        parts = [f"{arrival.process} {arrival.rate:g} req/s"
                 + (f" burstiness {burstiness:g}" if arrival.process == "gamma" else "")]
    n = arrivals.size
    prompt = output = None
    if config.lengths is not None:
        lengths = config.lengths
        if lengths.preset is not None:
            prompt, output = get_preset(lengths.preset).sample(n, prompt_rng, output_rng)
            parts.append(f"lengths preset {lengths.preset}")
        else:
            assert lengths.trace is not None and lengths.format is not None
            sample = read_lengths(_resolve(lengths.trace, base_dir), lengths.format, model=lengths.model)
            prompt, output = resample_pairs(sample.prompt_tokens, sample.output_tokens, n, prompt_rng)
            parts.append(f"lengths resampled from {sample.source}")
    if config.prompt is not None:
        prompt = _sample(config.prompt, n, prompt_rng)
        parts.append(f"prompt {_label(config.prompt)}")
    if config.output is not None:
        output = _sample(config.output, n, output_rng)
        parts.append(f"output {_label(config.output)}")
    assert prompt is not None and output is not None
    priority = None
    if config.priority is not None:
        classes = np.asarray(config.priority.classes, dtype=np.int64)
        weights = np.ones(classes.size) if config.priority.weights is None else np.asarray(
            config.priority.weights, dtype=np.float64)
        share = weights / weights.sum()
        priority = priority_rng.choice(classes, size=n, p=share)
        parts.append("priority " + "/".join(f"{c}:{p:.0%}" for c, p in zip(classes, share, strict=True)))
    prefixes: PrefixBlocks = {}
    if config.shared_prefix is not None:
        shared = config.shared_prefix
        prompt, prefixes = with_shared_prefix(prompt, shared.tokens, shared.groups, prefix_rng)
        parts.append(f"shared prefix {shared.tokens} tokens x {shared.groups} groups")
    parts.append(f"seed {seed}")
    return RequestTable(arrivals, prompt, output, priority=priority, source="generated: " + ", ".join(parts),
                        **prefixes)


def with_shared_prefix(prompt: np.ndarray, tokens: int, groups: int, rng: np.random.Generator
                       ) -> tuple[np.ndarray, PrefixBlocks]:
    """Prepend one of ``groups`` system prompts of ``tokens`` tokens (uniformly drawn) to each
    prompt. Each request gets one prefix block id, its group, naming a ``tokens``-token block, in
    the same CSR form as a Mooncake trace's ``hash_ids`` (``prefix_block_size = tokens``)."""
    n = prompt.size
    group = rng.integers(0, groups, size=n, dtype=np.int64)
    return np.asarray(prompt, dtype=np.int64) + tokens, {
        "prefix_block_offsets": np.arange(n + 1, dtype=np.int64), "prefix_block_ids": group,
        "prefix_block_size": int(tokens)}


def _sample(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(dist, FixedLength):
        return fixed_lengths(dist.value, n)
    if isinstance(dist, UniformLength):
        return uniform_lengths(dist.low, dist.high, n, rng)
    assert isinstance(dist, LognormalLength)
    return lognormal_lengths(dist.median, dist.sigma, n, rng, min_tokens=dist.min, max_tokens=dist.max)


def _label(dist: LengthDist) -> str:
    fields = dist.model_dump(exclude={"dist"}, exclude_none=True)
    return f"{dist.dist}(" + ", ".join(f"{k}={v:g}" for k, v in fields.items()) + ")"


def _resolve(path: Path, base_dir: Path | None) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() or base_dir is None else Path(base_dir) / path
