"""Prefix caching: block keys from Mooncake ``hash_ids``, hits counted by hand, LRU eviction,
hit rate against a trace's repeated-block fraction, and exact block accounting under random
traffic."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from engine_helpers import experiment, run, table, tabulate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import servesim

from servesim.core.prefix_index import PrefixIndex
from servesim.core.prefix_pool import PrefixBlockPool
from servesim.workloads.requests import RequestTable
from servesim.workloads.traces import read_trace


def write_mooncake(path: Path, rows: list[tuple[float, int, int, list[int]]]) -> Path:
    """Rows of (arrival s, prompt tokens, output tokens, hash_ids) as a Mooncake JSONL file."""
    with path.open("w") as handle:
        for at, prompt, output, ids in rows:
            handle.write(json.dumps({"timestamp": int(at * 1000), "input_length": prompt,
                                     "output_length": output, "hash_ids": ids}) + "\n")
    return path


def cached_run(trace: RequestTable, **deployment: object):
    config = experiment({"enable_prefix_caching": True, **deployment})
    return run(config, trace)


# ---------------------------------------------------------------------------------------- keys
def test_kv_block_keys_follow_the_chain_of_hash_blocks() -> None:
    """512-token hash blocks on 16-token KV blocks: 32 keyed KV blocks per hash block; a request
    ending 100 tokens into its third hash block keys 32 + 32 + 6 blocks (the 7th is partial). The
    same id after a different prefix is a different block (chained), and a truncated last block
    is not the whole block."""
    trace = RequestTable(np.zeros(4), [1124, 1124, 1024, 612], [1, 1, 1, 1],
                         prefix_block_offsets=np.array([0, 3, 6, 8, 10]),
                         prefix_block_ids=np.array([7, 8, 9, 7, 8, 5, 8, 9, 7, 8]))
    index = PrefixIndex(trace, 16)
    assert index.keyed_blocks.tolist() == [70, 70, 64, 38]
    a, b, c, d = (index.slots(r) for r in range(4))
    assert np.array_equal(a[:64], b[:64]) and not np.intersect1d(a[64:], b[64:]).size
    assert not np.intersect1d(c, a).size  # [8, 9] without 7 before them shares nothing
    assert np.array_equal(d[:32], a[:32]) and not np.intersect1d(d[32:], a).size  # 100-token "8"
    assert index.num_slots == 70 + 6 + 64 + 6
    # KV blocks straddling hash blocks (block_size 48 over 512): block 10 (tokens 480..527) ends
    # in hash block 1, so it is keyed by the chain [7, 8], not by 7 alone.
    straddle = PrefixIndex(trace, 48)
    assert straddle.keyed_blocks.tolist() == [1124 // 48, 1124 // 48, 1024 // 48, 612 // 48]
    sa, sb, sd = straddle.slots(0), straddle.slots(1), straddle.slots(3)
    assert np.array_equal(sa[:21], sb[:21]) and sa[21] != sb[21]  # block 21 ends in the third block
    assert np.array_equal(sd[:10], sa[:10]) and sd[10] != sa[10]   # block 10 ends in the 100-token 8


# ---------------------------------------------------------------------------------------- hits
def test_two_requests_sharing_two_of_three_blocks(tmp_path: Path) -> None:
    """A = [1, 2, 3] and B = [1, 2, 4], 1536 tokens each, one second apart: B finds 1024 tokens
    cached and prefills 512 over them. C = [1, 2] (1024 tokens) is wholly cached, but vLLM
    recomputes the last token, in whole blocks: C prefills its last 16-token block."""
    path = write_mooncake(tmp_path / "t.jsonl", [(0, 1536, 4, [1, 2, 3]), (1, 1536, 4, [1, 2, 4]),
                                                 (2, 1024, 4, [1, 2])])
    result = cached_run(read_trace(path, "mooncake"))
    tables = tabulate(result)
    requests, steps = tables.requests, tables.steps
    assert requests["cached_tokens"].tolist() == [0, 1024, 1008]
    assert steps.loc[steps["num_prefills"] > 0, "prefill_tokens"].tolist() == [1536, 512, 16]
    assert tables.summary["prefix_cache"]["hit_rate"] == pytest.approx((1024 + 1008) / (1536 * 2 + 1024))
    ttft = requests["ttft_s"].to_numpy()
    assert ttft[1] < ttft[0] / 2 and ttft[2] < ttft[1]
    # Without prefix caching every prompt is prefilled whole.
    plain = tabulate(run(experiment(), read_trace(path, "mooncake")))
    assert plain.summary["prefix_cache"] is None
    assert plain.steps.loc[plain.steps["num_prefills"] > 0, "prefill_tokens"].tolist() == [1536, 1536, 1024]


def test_lru_evicts_the_least_recently_released_block_tail_first(tmp_path: Path) -> None:
    """block_size 512 (one KV block per hash block), a 6-block pool, requests one at a time, each
    with a private 100-token tail and one output token. By hand:
    A [1,2] and B [3,4] leave 1,2,3,4 cached; C [1,5] hits 1 (so 1 is now younger than 2) and
    adds 5. D [6,7] needs 3 blocks with 1 empty: it evicts 2 (A's, older than C's 1) then 4
    (B's tail goes before B's head 3). E [3] hits 3; F [1,2] hits only 1 and evicts 5 (C's tail;
    C's 1 is referenced by F); G [1,5] hits only 1 and evicts 7 (D's tail). 4 evictions."""
    tail = 100
    rows = [(0, 1024 + tail, 1, [1, 2, 90]), (1, 1024 + tail, 1, [3, 4, 91]), (2, 1024 + tail, 1, [1, 5, 92]),
            (3, 1024 + tail, 1, [6, 7, 93]), (4, 512 + tail, 1, [3, 94]), (5, 1024 + tail, 1, [1, 2, 95]),
            (6, 1024 + tail, 1, [1, 5, 96])]
    path = write_mooncake(tmp_path / "lru.jsonl", rows)
    result = cached_run(read_trace(path, "mooncake"), block_size=512, num_gpu_blocks=6, watermark=0.0)
    tables = tabulate(result)
    assert tables.requests["cached_tokens"].tolist() == [0, 0, 512, 0, 512, 512, 512]
    assert tables.summary["prefix_cache"]["evicted_blocks"] == 4
    pool = result.replica_states[0].prefix_cache
    assert pool is not None
    # Left cached: 1 and 2 (F), 3 (E), 5 (G), 6 (D); in use: none.
    assert pool.cached_blocks == 5 and pool.evictable == 5 and pool.empty == 1 and pool.free == 6


def test_hit_rate_rises_with_cache_size_to_the_repeated_block_fraction(tmp_path: Path) -> None:
    """Multi-turn chats: 8 sessions share a 2-block system prompt; each turn resends the session's
    history and adds one or two new blocks. Requests run one at a time, so with a cache that never
    evicts every block seen before is hit: the hit rate equals the trace's repeated-block fraction
    (counted here by hand from the ids). Smaller pools evict, hit less, and prefill more (TTFT)."""
    rng = np.random.default_rng(3)
    history = {s: [1, 2] for s in range(8)}
    next_id, rows = 100, []
    order = rng.permutation(np.repeat(np.arange(8), 5))
    for i, session in enumerate(order.tolist()):
        for _ in range(int(rng.integers(1, 3))):
            history[session] = [*history[session], next_id]
            next_id += 1
        rows.append((2.0 * i, 512 * len(history[session]), 2, list(history[session])))
    seen: set[int] = set()
    repeated = total = 0
    for *_, ids in rows:
        repeated += sum(block in seen for block in ids)
        total += len(ids)
        seen.update(ids)
    fraction = repeated / total
    trace = read_trace(write_mooncake(tmp_path / "chats.jsonl", rows), "mooncake")
    largest_request = max(-(-(prompt + 1) // 16) for _, prompt, *_ in rows)
    sizes = [largest_request, 2 * largest_request, 3 * largest_request, 4 * largest_request, 20_000]
    hit_rates, ttfts = [], []
    for blocks in sizes:
        summary = tabulate(cached_run(trace, num_gpu_blocks=blocks, watermark=0.0)).summary
        assert summary["completed"] == len(rows)
        hit_rates.append(summary["prefix_cache"]["hit_rate"])
        ttfts.append(summary["ttft_s"]["mean"])
    assert fraction == pytest.approx(101 / 133)  # 101 of its 133 blocks were seen before
    assert all(a <= b for a, b in itertools.pairwise(hit_rates))
    assert hit_rates[-1] == pytest.approx(fraction, rel=1e-12)
    assert hit_rates[0] < fraction - 0.2
    assert all(a >= b for a, b in itertools.pairwise(ttfts))
    # Measured: hit rate 39% / 52% / 67% / 74% / 76%, mean TTFT 55 / 46 / 34 / 28 / 26 ms.
    assert ttfts[-1] < 0.6 * ttfts[0]


def test_a_workload_without_prefix_ids_runs_exactly_as_without_caching() -> None:
    trace = table(np.linspace(0, 2, 40), np.arange(40) * 37 % 900 + 5, np.arange(40) * 71 % 300 + 1)
    on = tabulate(run(experiment({"enable_prefix_caching": True, "num_gpu_blocks": 80}), trace))
    off = tabulate(run(experiment({"num_gpu_blocks": 80}), trace))
    assert on.summary["prefix_cache"]["hit_rate"] == 0.0 and on.summary["preemptions"] > 0
    assert on.steps.equals(off.steps)
    assert on.requests.drop(columns="cached_tokens").equals(off.requests.drop(columns="cached_tokens"))


def test_shared_system_prompts_are_hit_after_the_first_of_each_group() -> None:
    """workload.shared_prefix: 4 system prompts of 1000 tokens (62 full 16-token blocks = 992
    tokens shareable). Arrivals 2 s apart, one at a time: each group's first request misses, every
    later one hits exactly 992 tokens."""
    config = experiment({"enable_prefix_caching": True}, workload={
        "arrival": {"process": "constant", "rate": 0.5}, "num_requests": 30,
        "prompt": {"dist": "uniform", "low": 10, "high": 200}, "output": {"dist": "fixed", "value": 3},
        "shared_prefix": {"tokens": 1000, "groups": 4}})
    from servesim.pipeline import prepare, simulate
    result = simulate(prepare(config))
    requests = tabulate(result).requests
    groups = result.plan.workload.prefix_block_ids
    first_of_group = np.zeros(len(groups), dtype=bool)
    first_of_group[np.unique(groups, return_index=True)[1]] = True
    cached = requests["cached_tokens"].to_numpy()
    assert (cached[first_of_group] == 0).all() and (cached[~first_of_group] == 992).all()
    assert (requests["prompt_tokens"] >= 1010).all()


# ---------------------------------------------------------------------------------------- invariants
def _random_prefix_table(draw: st.DrawFn, n: int) -> RequestTable:
    arrivals = np.sort(np.array(draw(st.lists(st.floats(0, 2.0), min_size=n, max_size=n))))
    prompts = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    size = draw(st.sampled_from([8, 32, 100]))
    ids = [draw(st.lists(st.integers(0, 2), min_size=0, max_size=-(-p // size) + 1)) for p in prompts]
    offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])])
    flat = np.array([x for i in ids for x in i], dtype=np.int64)
    return RequestTable(arrivals, prompts, outputs, prefix_block_offsets=offsets, prefix_block_ids=flat,
                        prefix_block_size=size)


@st.composite
def prefix_workloads(draw: st.DrawFn) -> RequestTable:
    return _random_prefix_table(draw, draw(st.integers(1, 30)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=prefix_workloads(), blocks=st.integers(8, 120), block_size=st.sampled_from([1, 8, 16, 32]),
       max_num_seqs=st.integers(1, 16), watermark=st.sampled_from([0.0, 0.1]), replicas=st.integers(1, 2),
       router=st.sampled_from(["round_robin", "least_outstanding", "least_kv", "prefix_affinity"]),
       policy=st.sampled_from(["continuous", "chunked_prefill", "sjf", "priority"]))
def test_conservation_with_prefix_caching(trace: RequestTable, blocks: int, block_size: int,
                                          max_num_seqs: int, watermark: float, replicas: int,
                                          router: str, policy: str) -> None:
    """Whatever the traffic, sharing, pool and policy: no request is lost, blocks in use never exceed the
    pool, and at the end every block is empty or cached-unreferenced with every reference count
    at zero; without preemption the engine computes exactly the tokens needed minus the hits."""
    config = experiment({"enable_prefix_caching": True, "num_gpu_blocks": blocks, "block_size": block_size,
                         "max_num_seqs": max_num_seqs, "watermark": watermark, "replicas": replicas},
                        router={"name": router}, policy={"name": policy})
    result = run(config, trace)
    tables = tabulate(result)
    requests, steps = tables.requests, tables.steps
    prompt, output = trace.prompt_tokens, trace.output_tokens
    never_fits = -(-(prompt + output - 1) // block_size) > blocks
    assert (requests["status"] == "rejected").to_numpy().tolist() == never_fits.tolist()
    assert tables.summary["unfinished"] == 0
    assert (steps["kv_blocks_used"] <= blocks).all()
    done = (requests["status"] == "completed").to_numpy()
    assert (result.request_state.generated[done] == output[done]).all()
    for state in result.replica_states:
        pool = state.prefix_cache
        assert pool is not None
        audit = pool.audit(np.flatnonzero(result.request_state.replica == state.index))
        assert audit["in_use"] == 0 and audit["references"] == 0
        assert pool.empty + pool.evictable == pool.total == blocks and (pool.refs <= 0).all()
    assert not result.request_state.blocks_held.any()
    computed = steps["prefill_tokens"].sum() + steps["decode_tokens"].sum()
    needed = (prompt + output - 1)[done].sum() - requests["cached_tokens"].to_numpy()[done].sum()
    if requests["preemptions"].sum() == 0:
        assert computed == needed
    assert (requests["cached_tokens"] <= requests["prompt_tokens"] - 1).all()


@st.composite
def pool_operations(draw: st.DrawFn) -> tuple[RequestTable, int, int, list[tuple[int, int]]]:
    trace = _random_prefix_table(draw, draw(st.integers(1, 12)))
    ops = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 11)), max_size=80))
    return trace, draw(st.sampled_from([1, 4, 16])), draw(st.integers(4, 60)), ops


@settings(max_examples=150, deadline=None)
@given(case=pool_operations())
def test_pool_accounting_is_exact_after_every_operation(case: tuple[RequestTable, int, int, list]) -> None:
    """Drive the pool directly with random admissions, growth and releases (each only when the
    free count allows it, as a policy would): after every operation in use + cached-unreferenced
    + empty == pool, and free is exactly what the policy was told."""
    trace, block_size, total, ops = case
    n = len(trace)
    index = PrefixIndex(trace, block_size)
    pool = PrefixBlockPool(total, block_size, index)
    active: set[int] = set()
    for kind, pick in ops:
        r = pick % n
        free_before = pool.free
        if kind == 0 and r not in active:
            tokens = int(trace.prompt_tokens[r])
            hit, evictable_hits = pool.lookup(r, tokens)
            need = pool.blocks_for(tokens) - hit + evictable_hits
            if need <= pool.free:
                hits = pool.admit(np.array([r]), np.array([tokens]), np.array([need]))
                assert hits[0] == hit * block_size and pool.free == free_before - need
                active.add(r)
        elif kind == 1 and r in active and pool.free:
            pool.grow(r, 1)
            assert pool.free == free_before - 1
        elif kind == 2 and r in active:
            pool.release(r)
            active.discard(r)
        audit = pool.audit(np.array(sorted(active), dtype=np.int64))
        assert audit["in_use"] + audit["evictable"] + audit["empty"] == total
        assert pool.total - pool.free <= pool.peak_used <= total
    pool.release_many(np.array(sorted(active), dtype=np.int64))
    audit = pool.audit(np.empty(0, dtype=np.int64))
    assert audit["in_use"] == 0 and pool.free == total and not pool.held.any()


# ---------------------------------------------------------------------------------------- CLI
def test_cli_runs_quickstart_with_prefix_caching_and_prefix_affinity(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sets = ["deployment.enable_prefix_caching=true", "deployment.replicas=2", "router.name=prefix_affinity",
            "workload.num_requests=200", "workload.shared_prefix={tokens: 512, groups: 4}"]
    flags = [a for s in sets for a in ("--set", s)]
    result = servesim("run", "quickstart", *flags, "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    assert "prefix cache: hit rate" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    prefix = summary["prefix_cache"]
    assert 0.1 < prefix["hit_rate"] < 1 and prefix["cached_tokens"] % 16 == 0
    assert summary["deployment"]["enable_prefix_caching"] is True
    requests = pd.read_parquet(out / "requests.parquet")
    assert requests["cached_tokens"].sum() == prefix["cached_tokens"]
    assert (out / "report.html").is_file()


@pytest.mark.parametrize(("override", "message"), [
    ("router.name=prefix_affinity", r"^error: router.name: prefix_affinity .*\.enable_prefix_caching: true"),
    ("deployment.enable_prefix_caching=maybe", r"^error: deployment.enable_prefix_caching: .*boolean"),
    ("workload.shared_prefix={tokens: 0, groups: 2}", r"^error: workload.shared_prefix.tokens: "),
    ("workload.shared_prefix={tokens: 64}", r"^error: workload.shared_prefix.groups: is required"),
    ("policy.name=static", r"^error: deployment.enable_prefix_caching: is not modelled for policy 'static'"),
])
def test_cli_bad_values_give_one_line_errors(override: str, message: str) -> None:
    caching = ["--set", "deployment.enable_prefix_caching=true"]
    on = [] if override.startswith(("router", "deployment")) else caching
    result = servesim("validate", "quickstart", *on, "--set", override)
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert re.match(message, result.stderr.strip()), result.stderr
