"""Turn a :class:`WorkloadConfig` and a seed into the :class:`RequestTable` the engine replays.

Randomness: the seed feeds a ``numpy.random.SeedSequence`` that is split into independent
streams, one for arrivals, one for prompt lengths, one for output lengths, one for priority
classes and one for the shared system prompt each request draws (``spawn(5)``'s first children
are ``spawn(3)``'s, so adding priorities or shared prefixes changes no arrival or length). Same
config and seed give an identical table; and changing only the length distribution keeps the very
same arrival times (common random numbers), so two runs that differ in one knob stay comparable.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from servesim.errors import ServesimError
from servesim.workloads.arrivals import arrival_times
from servesim.workloads.config import VllmRandomLengths, WorkloadConfig
from servesim.workloads.length_dists import LengthDist, sample_lengths
from servesim.workloads.lengths import resample_pairs
from servesim.workloads.presets import get_preset
from servesim.workloads.requests import MAX_CLOCK_S, PrefixBlocks, RequestTable


def build_workload(config: WorkloadConfig, seed: int, base_dir: Path | None = None) -> RequestTable:
    """The requests of ``config``; relative paths in it resolve against ``base_dir``.

    A trace reader, the sessions, workflows and rate profiles are imported by the branch that
    uses them (a generated workload loads none of them)."""
    if config.trace is not None:
        from servesim.workloads.rate_profile import shape_of, warp
        from servesim.workloads.trace_sessions import chain_sessions
        from servesim.workloads.traces import read_trace

        trace = config.trace
        table = read_trace(_resolve(trace.path, base_dir), trace.format, rate_scale=trace.rate_scale,
                           start_s=trace.start_s, end_s=trace.end_s, max_requests=trace.max_requests,
                           model=trace.model)
        if trace.rate_profile is not None:
            shape = shape_of(trace.rate_profile, base_dir, "workload.trace.rate_profile")
            table = replace(table, arrival_s=warp(table.arrival_s, shape),
                            source=f"{table.source}; replayed under {shape.label}")
        return chain_sessions(table) if trace.sessions else table
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
        assert arrival.rate is not None
        burstiness = arrival.burstiness if arrival.burstiness is not None else 1.0
        if config.sessions is not None:
            from servesim.workloads.sessions import build_sessions

            count = config.sessions.count
            return build_sessions(config, seed, base_dir, _arrivals(config, count, arrival_rng, base_dir))
        if config.workflow is not None:
            from servesim.workloads.workflows import build_workflows

            starts = _arrivals(config, config.workflow.count, arrival_rng, base_dir)
            return build_workflows(config, seed, starts)
        arrivals = _arrivals(config, config.num_requests, arrival_rng, base_dir)
        n = arrivals.size
        if n and not arrivals[-1] <= MAX_CLOCK_S:
            raise ServesimError("workload.arrival.rate", f"at {arrival.rate:g} requests/s request {n - 1} "
                                f"arrives at {arrivals[-1]:.3g} s, beyond the {MAX_CLOCK_S:.0e} s the "
                                "simulated clock resolves to a microsecond", "raise the rate or ask for "
                                "fewer requests")
        parts = [f"{arrival.process} {arrival.rate:g} req/s"
                 + (f" burstiness {burstiness:g}" if arrival.process == "gamma" else "")]
        if arrival.profile is not None:
            from servesim.workloads.rate_profile import shape_of

            parts.append(f"rate x {shape_of(arrival.profile, base_dir).label}")
    n = arrivals.size
    prompt = output = None
    prefix_len = 0  # vLLM random's shared prefix
    if config.lengths is not None:
        lengths = config.lengths
        if lengths.preset is not None:
            prompt, output = get_preset(lengths.preset).sample(n, prompt_rng, output_rng)
            parts.append(f"lengths preset {lengths.preset}")
        elif lengths.random is not None:
            prompt, output, label = vllm_random_lengths(lengths.random, n, prompt_rng, output_rng)
            parts.append(label)
            if lengths.random.prefix_len:
                prefix_len = lengths.random.prefix_len
        else:
            from servesim.workloads.traces import read_lengths

            assert lengths.trace is not None and lengths.format is not None
            sample = read_lengths(_resolve(lengths.trace, base_dir), lengths.format, model=lengths.model,
                                  tokenizer=lengths.tokenizer)
            prompt, output = resample_pairs(sample.prompt_tokens, sample.output_tokens, n, prompt_rng)
            parts.append(f"lengths resampled from {sample.source}")
    if config.prompt is not None:
        prompt = sample_lengths(config.prompt, n, prompt_rng)
        parts.append(f"prompt {_label(config.prompt)}")
    if config.output is not None:
        output = sample_lengths(config.output, n, output_rng)
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
    if prefix_len:  # one prefix before every prompt (already counted in the prompt lengths)
        prefixes = {"prefix_block_offsets": np.arange(n + 1, dtype=np.int64),
                    "prefix_block_ids": np.zeros(n, dtype=np.int64), "prefix_block_size": prefix_len}
    if config.shared_prefix is not None:
        shared = config.shared_prefix
        prompt, prefixes = with_shared_prefix(prompt, shared.tokens, shared.groups, prefix_rng)
        parts.append(f"shared prefix {shared.tokens} tokens x {shared.groups} groups")
    parts.append(f"seed {seed}")
    return RequestTable(arrivals, prompt, output, priority=priority, source="generated: " + ", ".join(parts),
                        **prefixes)


def _arrivals(config: WorkloadConfig, count: int | None, rng: np.random.Generator,
              base_dir: Path | None) -> np.ndarray:
    """Arrival (or session start) times of the generator: the renewal process at ``rate``, under
    the rate profile if there is one (:mod:`servesim.workloads.rate_profile`)."""
    arrival = config.arrival
    assert arrival is not None and arrival.rate is not None
    burstiness = arrival.burstiness if arrival.burstiness is not None else 1.0
    if arrival.profile is None:
        return arrival_times(arrival.process, arrival.rate, rng, num_requests=count,
                             duration_s=config.duration_s, burstiness=burstiness)
    from servesim.workloads.rate_profile import shape_of, shaped_arrival_times

    shape = shape_of(arrival.profile, base_dir, "workload.arrival.profile")
    return shaped_arrival_times(arrival.process, arrival.rate, shape, rng, num_requests=count,
                                duration_s=config.duration_s, burstiness=burstiness)


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


def vllm_random_lengths(spec: VllmRandomLengths, n: int, prompt_rng: np.random.Generator,
                        output_rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, str]:
    """vLLM bench's random dataset (see :class:`~servesim.workloads.config.VllmRandomLengths`)."""
    r = spec.range_ratio
    input_low, input_high = math.floor(spec.input_len * (1 - r)), math.ceil(spec.input_len * (1 + r))
    output_low = max(math.floor(spec.output_len * (1 - r)), 1)
    output_high = max(math.ceil(spec.output_len * (1 + r)), 1)
    prompt = spec.prefix_len + prompt_rng.integers(input_low, input_high + 1, size=n, dtype=np.int64)
    output = output_rng.integers(output_low, output_high + 1, size=n, dtype=np.int64)
    if spec.prefix_len == 0:
        prompt = np.maximum(prompt, 1)
    label = (f"vLLM random: input {input_low}..{input_high}, output {output_low}..{output_high}"
             + (f", shared prefix {spec.prefix_len}" if spec.prefix_len else ""))
    return prompt, output, label


def _label(dist: LengthDist) -> str:
    fields = dist.model_dump(exclude={"dist"}, exclude_none=True)
    return f"{dist.dist}(" + ", ".join(f"{k}={v:g}" for k, v in fields.items()) + ")"


def _resolve(path: Path, base_dir: Path | None) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() or base_dir is None else Path(base_dir) / path
