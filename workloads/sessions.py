"""Multi-turn chat sessions as a request table (``workload.sessions``).

A session of ``T`` turns is ``T`` requests in a chain. Turn ``j``'s prompt is the whole
conversation so far: the session's system prompt (``shared_prefix``, if any), every earlier user
message and answer, and the new user message::

    prompt[0] = system + user[0]
    prompt[j] = prompt[j - 1] + output[j - 1] + user[j]

so its first ``prompt[j - 1] + output[j - 1]`` tokens repeat turn ``j - 1``'s prompt and answer
(the table's ``links.prefix_shared``), which the prefix cache can serve. Turn ``j`` is sent
``think[j]`` seconds after turn ``j - 1``'s answer ends (a closed loop per session: a slow answer
delays the rest of the session); turn 0 at the session's start, drawn from the workload's arrival
process. ``max_context_tokens`` ends a session before a turn whose prompt and answer would exceed
it (a chat client starts a new conversation then; sessions whose first turn is already too long
are left out, and counted).

Rows are session-major: a session's turns are consecutive, sessions in order of their start, and
every row's ``arrival_s`` is its session's start (the earliest any of its turns can be sent).

Randomness: the seed's ``SeedSequence`` is split as in :mod:`servesim.workloads.build` (child 0
draws the session starts, so sessions start when the same config's requests would arrive) and
further children draw turns, think times and conversations, each from its own stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servesim.workloads.arrivals import arrival_times
from servesim.workloads.config import WorkloadConfig
from servesim.workloads.length_dists import sample_lengths
from servesim.workloads.links import RequestLinks
from servesim.workloads.requests import PrefixBlocks, RequestTable
from servesim.workloads.session_config import (
    ExponentialSeconds,
    FixedSeconds,
    LognormalSeconds,
    SecondsDist,
    SessionsConfig,
)
from servesim.workloads.sharegpt import read_conversations

STREAMS = 10
"""Children of the seed: 0 arrivals, 1 user tokens, 2 output, 3 priority, 4 system prompt (as in
build.py), 5 turns, 6 think times, 7 conversation picks, 8 opening messages, 9 spare."""


def build_sessions(config: WorkloadConfig, seed: int, base_dir: Path | None,
                   starts: np.ndarray | None = None) -> RequestTable:
    """The request table of ``config``'s sessions (``starts``: the session start times, when the
    caller drew them, e.g. under a rate profile)."""
    sessions = config.sessions
    assert sessions is not None and config.arrival is not None
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(STREAMS)]
    arrival = config.arrival
    if starts is None:
        starts = arrival_times(arrival.process, arrival.rate, rngs[0], num_requests=sessions.count,
                               duration_s=config.duration_s,
                               burstiness=arrival.burstiness if arrival.burstiness is not None else 1.0)
    count = starts.size
    parts = [f"{arrival.process} {arrival.rate:g} sessions/s"]
    if arrival.profile is not None:
        parts.append("rate profile")
    if sessions.conversations is not None:
        source = sessions.conversations
        path = Path(source.path).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        conversations = read_conversations(path, source.tokenizer)
        pick = rngs[7].integers(0, len(conversations), size=count)
        turns = conversations.turns[pick]
        rows = _turn_rows(conversations.offsets[pick], turns)
        user = conversations.user_tokens[rows]
        output = np.maximum(conversations.output_tokens[rows], 1)  # an empty answer still ends a turn
        parts.append(f"conversations resampled from {conversations.source}")
    else:
        assert sessions.turns is not None and sessions.user_tokens is not None and sessions.output is not None
        turns = sample_lengths(sessions.turns, count, rngs[5])
        total = int(turns.sum())
        user = sample_lengths(sessions.user_tokens, total, rngs[1])
        if sessions.first_user_tokens is not None:
            user[_first_rows(turns)] = sample_lengths(sessions.first_user_tokens, count, rngs[8])
        output = sample_lengths(sessions.output, total, rngs[2])
    think = sample_seconds(sessions.think_time_s, int(turns.sum()), rngs[6])
    return _table(config, sessions, starts, turns, user, output, think, rngs, parts, seed)


def sample_seconds(dist: SecondsDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` durations in seconds (float64, >= 0) drawn from ``dist``."""
    if isinstance(dist, FixedSeconds):
        return np.full(n, float(dist.value))
    if isinstance(dist, ExponentialSeconds):
        return rng.exponential(dist.mean, size=n)
    if isinstance(dist, LognormalSeconds):
        draws = dist.median * np.exp(dist.sigma * rng.standard_normal(n))
        return draws if dist.max is None else np.minimum(draws, dist.max)
    return rng.uniform(dist.low, dist.high, size=n)


def _table(config: WorkloadConfig, sessions: SessionsConfig, starts: np.ndarray, turns: np.ndarray,
           user: np.ndarray, output: np.ndarray, think: np.ndarray, rngs: list[np.random.Generator],
           parts: list[str], seed: int) -> RequestTable:
    count = starts.size
    session = np.repeat(np.arange(count, dtype=np.int64), turns)
    first = _first_rows(turns)
    turn = np.arange(session.size, dtype=np.int64) - np.repeat(first, turns)
    system = 0
    group = None
    if config.shared_prefix is not None:
        system = config.shared_prefix.tokens
        group = rngs[4].integers(0, config.shared_prefix.groups, size=count, dtype=np.int64)
    user = np.asarray(user, dtype=np.int64)
    user[first] = np.maximum(user[first], 1)  # the opening message: at least one token
    output = np.asarray(output, dtype=np.int64)
    prompt = (system + _within(user, first, turns, inclusive=True)
              + _within(output, first, turns, inclusive=False))
    dropped = 0
    if sessions.max_context_tokens is not None:
        over = (prompt + output > sessions.max_context_tokens).astype(np.int64)
        keep = _within(over, first, turns, inclusive=True) == 0  # every turn up to this one fits
        kept_turns = np.bincount(session[keep], minlength=count)
        dropped = int(np.count_nonzero(kept_turns == 0))
        alive = kept_turns > 0
        session_map = np.cumsum(alive) - 1
        keep &= alive[session]
        starts, turns = starts[alive], kept_turns[alive]
        if group is not None:
            group = group[alive]
        session, turn = session_map[session[keep]], turn[keep]
        prompt, output, think = prompt[keep], output[keep], think[keep]
        first = _first_rows(turns)
        count = starts.size
    rows = np.arange(session.size, dtype=np.int64)
    parent = np.where(turn > 0, rows - 1, -1)
    shared = np.zeros(rows.size, dtype=np.int64)
    later = turn > 0
    shared[later] = prompt[rows[later] - 1] + output[rows[later] - 1]
    delay = np.where(later, think, 0.0)
    links = RequestLinks.chains(parent, delay, shared, session, turn)
    priority = None
    if config.priority is not None:
        classes = np.asarray(config.priority.classes, dtype=np.int64)
        weights = np.ones(classes.size) if config.priority.weights is None else np.asarray(
            config.priority.weights, dtype=np.float64)
        priority = rngs[3].choice(classes, size=count, p=weights / weights.sum())[session]
    prefixes: PrefixBlocks = {}
    if group is not None:
        offsets = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(turn == 0, out=offsets[1:])
        prefixes = {"prefix_block_offsets": offsets, "prefix_block_ids": group.copy(),
                    "prefix_block_size": int(system)}
        parts.append(f"system prompt {system} tokens x {config.shared_prefix.groups} groups"
                     if config.shared_prefix is not None else "")
    parts.append(f"{count:,} sessions, {rows.size:,} turns (mean {rows.size / max(count, 1):.2f})")
    if dropped:
        parts.append(f"{dropped} sessions left out (first turn over max_context_tokens "
                     f"{sessions.max_context_tokens})")
    parts.append(f"seed {seed}")
    return RequestTable(starts[session] if rows.size else np.zeros(0), prompt, output, priority=priority,
                        source="generated: " + ", ".join(p for p in parts if p), links=links, **prefixes)


def _first_rows(turns: np.ndarray) -> np.ndarray:
    """Row of each session's first turn (sessions of ``turns`` turns, consecutive)."""
    first = np.zeros(turns.size, dtype=np.int64)
    np.cumsum(turns[:-1], out=first[1:])
    return first


def _turn_rows(starts: np.ndarray, turns: np.ndarray) -> np.ndarray:
    """Rows ``starts[s], starts[s] + 1, ...`` (``turns[s]`` of them) for every session, in order."""
    first = _first_rows(turns)
    return np.repeat(starts - first, turns) + np.arange(int(turns.sum()), dtype=np.int64)


def _within(values: np.ndarray, first: np.ndarray, turns: np.ndarray, inclusive: bool) -> np.ndarray:
    """Cumulative sums of ``values`` restarting at every session's first row (inclusive: up to and
    including each row; else up to the row before it)."""
    total = np.cumsum(values)
    before = np.repeat(total[first] - values[first], turns)
    cumulative = total - before
    return cumulative if inclusive else cumulative - values
