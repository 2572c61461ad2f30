"""Sessions: turns released by completions, prompts that repeat the conversation, the prefix
cache hitting the previous turn's prompt *and answer*, per-session metrics, Mooncake sessions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import experiment, run, tabulate

from servesim.core.prefix_index import PrefixIndex
from servesim.errors import ServesimError
from servesim.workloads import build_workload, parse_workload_config
from servesim.workloads.links import RequestLinks
from servesim.workloads.requests import RequestTable
from servesim.workloads.trace_sessions import chain_sessions
from servesim.workloads.traces import read_trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
MOONCAKE = SHARED / "mooncake_conversation_trace.jsonl"


def fixed(value: float) -> dict:
    return {"dist": "fixed", "value": value}


def two_turns(p0: int, o0: int, new: int, o1: int, think: float) -> RequestTable:
    """One session: turn 0 (``p0`` prompt, ``o0`` answer) and turn 1, whose prompt repeats both
    and adds ``new`` tokens, sent ``think`` s after turn 0 ends."""
    links = RequestLinks.chains(parent=[-1, 0], delay_s=[0.0, think], prefix_shared=[0, p0 + o0],
                                session=[0, 0], turn=[0, 1])
    return RequestTable(np.zeros(2), [p0, p0 + o0 + new], [o0, o1], links=links)


def cached(**deployment: object):
    return experiment({"enable_prefix_caching": True, **deployment}, engine="vllm-v0")


# ---------------------------------------------------------------------------------------- hits
@pytest.mark.parametrize(("p0", "o0", "hit"), [
    (100, 30, 128),  # 129 tokens of KV computed: 8 full blocks, all repeated by turn 1
    (100, 28, 112),  # 128-token history, but its last token's KV is never computed: 7 blocks
    (15, 1, 0),      # 16 tokens of history, but only 15 of them computed: no full block
])
def test_second_turn_hits_exactly_the_first_turns_blocks(p0: int, o0: int, hit: int) -> None:
    """Turn 0 computes the KV of its prompt and every answer token but the last (sampled, never
    fed back), so the cache holds floor((p0 + o0 - 1) / 16) full blocks of the conversation;
    turn 1 repeats p0 + o0 tokens and finds exactly those blocks (counted by hand)."""
    result = run(cached(), two_turns(p0, o0, new=20, o1=5, think=1.0))
    requests = tabulate(result).requests
    assert requests["cached_tokens"].tolist() == [0, hit]
    assert hit == (p0 + o0 - 1) // 16 * 16
    # The prompt KV it found is not prefilled again: turn 1's prefill step has p1 - hit tokens.
    steps = tabulate(result).steps
    assert steps.loc[steps["num_prefills"] > 0, "prefill_tokens"].tolist() == [p0, p0 + o0 + 20 - hit]


def test_second_turn_misses_when_the_cache_evicted_the_first() -> None:
    """A pool of 12 blocks: turn 0 (100 + 30) leaves 8 cached blocks; a 150-token stranger sent
    while the user thinks needs 10 blocks and evicts 6 of them (LRU, the tail first), so turn 1
    finds only the first 2 blocks."""
    links = RequestLinks.chains(parent=[-1, -1, 0], delay_s=[0.0, 0.0, 5.0], prefix_shared=[0, 0, 130],
                                session=[0, 1, 0], turn=[0, 0, 1])
    trace = RequestTable(np.array([0.0, 1.0, 1.0]), [100, 150, 150], [30, 2, 5], links=links)
    result = run(cached(num_gpu_blocks=12), trace)
    assert tabulate(result).requests["cached_tokens"].tolist() == [0, 0, 32]
    # and with no prefix caching at all, nothing is found
    off = run(experiment(engine="vllm-v0"), trace)
    assert tabulate(off).requests["cached_tokens"].tolist() == [0, 0, 0]


def test_prefix_index_of_a_session_shares_blocks_by_position() -> None:
    """Turn 1 takes turn 0's slots for its first 130 // 16 = 8 blocks (turn 0 keys 8: (130 - 1)
    // 16); turn 2 takes turn 1's for (150 + 10) // 16 = 10 blocks, 8 of them turn 0's, though
    turn 1 computes only (160 - 1) // 16 = 9 of them (its last answer token is never fed back)."""
    links = RequestLinks.chains(parent=[-1, 0, 1], delay_s=[0, 1, 1], prefix_shared=[0, 130, 160],
                                session=[0, 0, 0], turn=[0, 1, 2])
    trace = RequestTable(np.zeros(3), [100, 150, 200], [30, 10, 5], links=links)
    index = PrefixIndex(trace, 16)
    assert index.keyed_blocks.tolist() == [8, 9, 10]
    assert np.array_equal(index.slots(1)[:8], index.slots(0))
    assert index.slots(1)[8] not in index.slots(0)
    assert np.array_equal(index.slots(2)[:9], index.slots(1)) and index.slots(2)[9] not in index.slots(1)


# ---------------------------------------------------------------------------------------- release
def test_closed_loop_sends_each_turn_think_time_after_the_answer() -> None:
    """A session with think time Z sends turn j + 1 exactly R_j + Z after turn j was sent, where
    R_j is turn j's response time (its E2E latency)."""
    workload = parse_workload_config({
        "arrival": {"process": "constant", "rate": 1.0}, "sessions": {
            "count": 1, "turns": fixed(6), "user_tokens": fixed(50),
            "output": fixed(40), "think_time_s": fixed(2.0)}})
    table = build_workload(workload, 0)
    assert table.prompt_tokens.tolist() == [50, 140, 230, 320, 410, 500]
    requests = tabulate(run(experiment(engine="vllm-v0"), table)).requests
    sent, e2e = requests["arrival_s"].to_numpy(), requests["e2e_s"].to_numpy()
    assert sent[0] == 1.0
    assert np.diff(sent) == pytest.approx(e2e[:-1] + 2.0, abs=1e-12)
    assert (requests["status"] == "completed").all()


def test_closed_sessions_obey_the_interactive_response_time_law() -> None:
    """N users who each alternate a request and a think time Z: throughput X = N / (R + Z)
    (Little's law over the whole loop), with R the mean response time measured in the run."""
    n, think = 16, 1.0
    workload = parse_workload_config({
        "arrival": {"process": "constant", "rate": 1000.0}, "sessions": {
            "count": n, "turns": fixed(60), "user_tokens": fixed(64),
            "output": {"dist": "uniform", "low": 20, "high": 200},
            "think_time_s": {"dist": "exponential", "mean": think}, "max_context_tokens": 100_000}})
    requests = tabulate(run(experiment(engine="vllm-v0"), build_workload(workload, 3))).requests
    # In steady state (between the last session's start and the first session's end).
    last_start = requests.groupby("session")["arrival_s"].min().max()
    first_end = requests.groupby("session")["finish_s"].max().min()
    steady = requests[(requests["arrival_s"] >= last_start) & (requests["finish_s"] <= first_end)]
    throughput = len(steady) / (first_end - last_start)
    predicted = n / (steady["e2e_s"].mean() + think)
    assert throughput == pytest.approx(predicted, rel=0.05)


def test_a_refused_turn_releases_the_next() -> None:
    """A turn too long for max_model_len is refused at once; its client carries on, so the next
    turn is sent think time after the refusal (and is refused too, its prompt being longer)."""
    links = RequestLinks.chains(parent=[-1, 0, 1], delay_s=[0.0, 3.0, 3.0], prefix_shared=[0, 150, 0],
                                session=[0, 0, 0], turn=[0, 1, 2])
    trace = RequestTable(np.array([1.0, 1.0, 1.0]), [100, 3000, 10], [50, 10, 5], links=links)
    requests = tabulate(run(experiment({"max_model_len": 2048}, engine="vllm-v0"), trace)).requests
    assert requests["status"].tolist() == ["completed", "rejected", "completed"]
    finish0 = requests["finish_s"][0]
    assert requests["arrival_s"].tolist() == pytest.approx([1.0, finish0 + 3.0, finish0 + 6.0])


# ---------------------------------------------------------------------------------------- metrics
def test_session_metrics() -> None:
    """Per-session summary: counts, durations (first send to last answer) and TTFT per turn."""
    workload = parse_workload_config({
        "arrival": {"process": "poisson", "rate": 0.5}, "shared_prefix": {"tokens": 64, "groups": 2},
        "sessions": {"count": 30, "turns": {"dist": "uniform", "low": 1, "high": 5},
                     "user_tokens": fixed(100), "output": fixed(50),
                     "think_time_s": fixed(10)}})
    table = build_workload(workload, 0)
    result = run(experiment({"enable_prefix_caching": True}, engine="vllm-v0", slo={"ttft_s": 1.0}), table)
    tables = tabulate(result)
    section = tables.summary["sessions"]
    requests = tables.requests
    assert section["sessions"] == 30 and section["completed"] == 30 and section["requests"] == len(table)
    by_session = requests.groupby("session")
    durations = by_session["finish_s"].max() - by_session["arrival_s"].min()
    assert section["duration_s"]["max"] == pytest.approx(durations.max())
    first = section["ttft_by_turn"][0]
    assert first["turn"] == 0 and first["requests"] == 30 and first["mean_prompt_tokens"] == 164
    # turn 1 repeats 214 tokens of turn 0; 13 of its blocks (208 tokens) are computed KV
    assert section["ttft_by_turn"][1]["hit_rate"] == pytest.approx(208 / 314)
    assert section["slo_attainment"] == 1.0
    assert {"session", "turn"} <= set(requests.columns)


def test_max_context_ends_sessions() -> None:
    workload = parse_workload_config({
        "arrival": {"process": "constant", "rate": 1.0}, "sessions": {
            "count": 3, "turns": fixed(10), "user_tokens": fixed(100),
            "output": fixed(100), "think_time_s": fixed(1),
            "max_context_tokens": 500}})
    table = build_workload(workload, 0)
    # prompts 100, 300 (+100 = 400 fits), 500 (+100 = 600 does not): two turns per session
    assert table.prompt_tokens.tolist() == [100, 300] * 3


@pytest.mark.parametrize(("workload", "message"), [
    ({"arrival": {"process": "poisson", "rate": 1}, "num_requests": 5,
      "sessions": {"count": 2, "turns": fixed(2), "user_tokens": fixed(5),
                   "output": fixed(5), "think_time_s": fixed(1)}},
     "with sessions, num_requests do not apply"),
    ({"arrival": {"process": "poisson", "rate": 1},
      "sessions": {"turns": fixed(2), "user_tokens": fixed(5),
                   "output": fixed(5), "think_time_s": fixed(1)}},
     "give sessions.count"),
    ({"arrival": {"process": "poisson", "rate": 1}, "duration_s": 10,
      "sessions": {"turns": fixed(2), "think_time_s": fixed(1)}},
     "give user_tokens, output"),
    ({"trace": {"path": "x.csv", "format": "azure", "sessions": True}}, "only mooncake traces"),
])
def test_session_config_errors_are_one_line(workload: dict, message: str) -> None:
    with pytest.raises(ServesimError) as info:
        parse_workload_config(workload)
    assert message in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------- mooncake
def write_mooncake(path: Path, rows: list[tuple[float, int, int, list[int]]]) -> Path:
    with path.open("w") as handle:
        for at, prompt, output, ids in rows:
            handle.write(json.dumps({"timestamp": int(at * 1000), "input_length": prompt,
                                     "output_length": output, "hash_ids": ids}) + "\n")
    return path


def test_mooncake_sessions_chain_by_full_prompt_blocks(tmp_path: Path) -> None:
    """Request 1 starts with request 0's two full blocks [0, 1] (its third, partial block 2 is
    not repeated: filled with the answer it hashes differently) and is longer: it is 0's next
    turn and repeats 0's prompt + answer. Request 2 shares only the system block 0: a new
    session. Request 3 repeats 1's full blocks but is shorter than 1's history: it shares only
    those 3 blocks."""
    path = write_mooncake(tmp_path / "m.jsonl", [
        (0, 1200, 100, [0, 1, 2]), (10, 1800, 50, [0, 1, 5, 6]), (11, 700, 10, [0, 9]),
        (30, 1820, 10, [0, 1, 5, 7])])
    table = chain_sessions(read_trace(path, "mooncake"))
    links = table.links
    assert links is not None
    assert links.prefix_parent.tolist() == [-1, 0, -1, 1]
    assert links.prefix_shared.tolist() == [0, 1300, 0, 3 * 512]
    assert links.session.tolist() == [0, 0, 1, 0] and links.turn.tolist() == [0, 1, 0, 2]
    result = run(cached(), table)
    requests = tabulate(result).requests
    # Turn 1 is sent at its trace time (10 s, after turn 0 ended) and finds turn 0's computed
    # history: (1200 + 100 - 1) // 16 blocks.
    assert requests["arrival_s"][1] == 10.0
    assert requests["cached_tokens"][1] == (1299 // 16) * 16


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="needs ../shared/data (Mooncake conversation trace)")
def test_mooncake_conversation_trace_sessions() -> None:
    table = build_workload(parse_workload_config(
        {"trace": {"path": str(MOONCAKE), "format": "mooncake", "sessions": True}}), 0)
    links = table.links
    assert links is not None
    assert len(table) == 12_031
    assert int((links.prefix_parent >= 0).sum()) == 3_899 and links.num_sessions == 8_132
