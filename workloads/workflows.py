"""Agentic workflows as a request table (``workload.workflow``, see
:mod:`servesim.workloads.workflow_config` for the template and its rules).

Every run of the template is the same block of rows, one per call (steps in template order, a
step's ``fan_out`` calls consecutive), so the links are the template's, offset by the block's
first row; only lengths and tool latencies are drawn per call. Rows are run-major and every row's
``arrival_s`` is its run's start. ``session`` is the run and ``turn`` the step's position in the
template, so the per-session metrics report each run's duration (its end-to-end latency as the
user who asked sees it) and the TTFT of each step.

Randomness: child 0 of the seed draws the run starts (as for plain requests and sessions); each
step's input tokens, answers and tool latencies come from their own children, in template order,
so adding a step at the end changes no earlier draw.
"""

from __future__ import annotations

import numpy as np

from servesim.workloads.config import WorkloadConfig
from servesim.workloads.length_dists import sample_lengths
from servesim.workloads.links import RequestLinks
from servesim.workloads.requests import PrefixBlocks, RequestTable
from servesim.workloads.sessions import sample_seconds

BASE_STREAMS = 5
"""Children 0-4 as in build.py (arrivals, -, -, priority, system prompt); then three per step."""


def build_workflows(config: WorkloadConfig, seed: int, starts: np.ndarray) -> RequestTable:
    """The request table of ``config``'s workflow runs starting at ``starts``."""
    workflow = config.workflow
    assert workflow is not None
    steps = list(workflow.steps.items())
    rngs = [np.random.default_rng(s)
            for s in np.random.SeedSequence(seed).spawn(BASE_STREAMS + 3 * len(steps))]
    runs = starts.size
    calls = [step.fan_out for _, step in steps]
    per_run = sum(calls)
    first_call = np.concatenate([[0], np.cumsum(calls)[:-1]]).astype(np.int64)
    index = {name: k for k, (name, _) in enumerate(steps)}
    n = runs * per_run
    # per call of the template (the block of one run): step, copy, draws per run
    step_of = np.repeat(np.arange(len(steps)), calls)
    inputs = np.zeros((runs, per_run), dtype=np.int64)
    outputs = np.zeros((runs, per_run), dtype=np.int64)
    delays = np.zeros((runs, per_run))
    for k, (_, step) in enumerate(steps):
        cols = slice(first_call[k], first_call[k] + calls[k])
        base, size, shape = BASE_STREAMS + 3 * k, runs * calls[k], (runs, calls[k])
        inputs[:, cols] = sample_lengths(step.input_tokens, size, rngs[base]).reshape(shape)
        outputs[:, cols] = sample_lengths(step.output, size, rngs[base + 1]).reshape(shape)
        if step.tool_s is not None:
            delays[:, cols] = sample_seconds(step.tool_s, size, rngs[base + 2]).reshape(shape)
    system = config.shared_prefix.tokens if config.shared_prefix is not None else 0
    prompts = np.zeros((runs, per_run), dtype=np.int64)
    parent_call = np.full(per_run, -1, dtype=np.int64)
    after: list[list[int]] = [[] for _ in range(per_run)]
    extra_answers: list[list[int]] = [[] for _ in range(per_run)]
    for k, (_, step) in enumerate(steps):
        for copy in range(calls[k]):
            call = int(first_call[k]) + copy
            followed = [int(first_call[index[d]]) + c for d in step.after for c in range(calls[index[d]])]
            after[call] = followed
            if followed:
                parent_call[call] = followed[0]
                extra_answers[call] = followed[1:]
    # prompts in template order: a call's context is its parent's prompt + answer, plus the other
    # answers it collects, plus its own input (vectorised over runs)
    for call in range(per_run):
        parent = parent_call[call]
        if parent < 0:
            prompts[:, call] = system + inputs[:, call]
        else:
            collected = outputs[:, extra_answers[call]].sum(axis=1) if extra_answers[call] else 0
            prompts[:, call] = prompts[:, parent] + outputs[:, parent] + collected + inputs[:, call]
    prompts = np.maximum(prompts, 1)
    per_call = np.asarray([len(a) for a in after], dtype=np.int64)
    after_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.tile(per_call, runs), out=after_offsets[1:])
    ids_block = np.asarray([d for a in after for d in a], dtype=np.int64)
    row0 = np.arange(runs, dtype=np.int64) * per_run
    after_ids = (ids_block[None, :] + row0[:, None]).ravel()
    parent = np.where(parent_call[None, :] >= 0, parent_call[None, :] + row0[:, None], -1).ravel()
    shared = np.zeros((runs, per_run), dtype=np.int64)
    has = parent_call >= 0
    shared[:, has] = prompts[:, parent_call[has]] + outputs[:, parent_call[has]]
    links = RequestLinks(after_offsets, after_ids, np.where(has[None, :], delays, 0.0).ravel(), parent,
                         shared.ravel(), np.repeat(np.arange(runs, dtype=np.int64), per_run),
                         np.tile(step_of, runs).astype(np.int64))
    prefixes: PrefixBlocks = {}
    if config.shared_prefix is not None:
        roots = np.tile(~has, runs)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(roots, out=offsets[1:])
        groups = rngs[4].integers(0, config.shared_prefix.groups, size=runs, dtype=np.int64)
        prefixes = {"prefix_block_offsets": offsets,
                    "prefix_block_ids": np.repeat(groups, int((~has).sum())),
                    "prefix_block_size": int(system)}
    priority = None
    if config.priority is not None:
        classes = np.asarray(config.priority.classes, dtype=np.int64)
        weights = np.ones(classes.size) if config.priority.weights is None else np.asarray(
            config.priority.weights, dtype=np.float64)
        priority = np.repeat(rngs[3].choice(classes, size=runs, p=weights / weights.sum()), per_run)
    arrival = config.arrival
    assert arrival is not None
    names = " -> ".join(f"{name}" + (f" x{step.fan_out}" if step.fan_out > 1 else "") for name, step in steps)
    source = (f"generated: {arrival.process} {arrival.rate:g} workflows/s, {runs:,} runs of {per_run} calls "
              f"({names}), seed {seed}")
    return RequestTable(np.repeat(starts, per_run), prompts.ravel(), outputs.ravel(), priority=priority,
                        source=source, links=links, **prefixes)
