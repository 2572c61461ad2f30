"""The core's Python fast paths give what the general paths give, exactly.

``BatchShape.from_requests`` classifies a few requests in Python (``_from_few_requests``), the
prefix pool remembers its lookups until the cache changes, and a step of one request is credited
with scalars (``RequestState._complete_one``): each must be invisible in every result, so each is
compared here with the general computation it replaces.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast_forward import assert_same, contended_plan, experiment

from servesim.config import validate_document
from servesim.core.prefix_index import PrefixIndex
from servesim.core.prefix_pool import PrefixBlockPool
from servesim.core.replica_state import ReplicaState
from servesim.core.state import RequestState
from servesim.cost.batch import SMALL_BATCH, BatchShape
from servesim.errors import ServesimError
from servesim.pipeline import prepare, simulate
from servesim.workloads.requests import RequestTable


def general_shape(new: np.ndarray, computed: np.ndarray, total: np.ndarray) -> BatchShape:
    """``from_requests``' NumPy classification, spelled out (the rule of docs/architecture.md)."""
    is_decode = (new == 1) & (computed + 1 == total) & (computed > 0)
    prefill = ~is_decode
    return BatchShape(new[prefill], computed[prefill], computed[prefill] + new[prefill] == total[prefill],
                      computed[is_decode])


FIELDS = ("num_prefills", "num_decodes", "num_prefill_tokens", "num_decode_tokens", "num_new_tokens",
          "decode_context_sum", "num_logits", "decode_tokens")
ARRAYS = ("prefill_tokens", "prefill_context", "prefill_emits", "decode_context")


def assert_classified_as_the_general_path(new: np.ndarray, computed: np.ndarray, total: np.ndarray) -> None:
    """``from_requests`` gives the NumPy rule's arrays (values and dtypes) and sums (values and types)."""
    fast = BatchShape.from_requests(new, computed, total)
    reference = general_shape(new, computed, total)
    for name in ARRAYS:
        a, b = getattr(fast, name), getattr(reference, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    for name in FIELDS:
        assert getattr(fast, name) == getattr(reference, name), name
        assert type(getattr(fast, name)) is type(getattr(reference, name)), name


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 3000), st.integers(0, 2)),
                min_size=0, max_size=SMALL_BATCH))
def test_a_few_requests_are_classified_as_the_general_path_does(requests: list[tuple[int, int, int]]) -> None:
    """Decodes (one token after the prompt), whole prompts, chunks and recomputes: the same arrays
    (values and dtypes) and the same sums as the NumPy path."""
    computed = np.array([c for c, _, _ in requests], dtype=np.int64)
    new = np.array([n for _, n, _ in requests], dtype=np.int64)
    total = computed + new + np.array([extra for _, _, extra in requests], dtype=np.int64)
    assert_classified_as_the_general_path(new, computed, total)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 3000), st.integers(0, 2)),
                min_size=SMALL_BATCH + 1, max_size=120), st.randoms(use_true_random=False))
def test_many_requests_are_classified_as_the_general_path_does(requests: list[tuple[int, int, int]],
                                                               rng: random.Random) -> None:
    """``_from_many_requests`` (a mixed step's running requests): mostly decodes, some chunks,
    whole prompts and recomputes, in any order; the same arrays and sums as the NumPy rule."""
    requests = [(c, 1, 1) if rng.random() < 0.6 else (c, n, extra) for c, n, extra in requests]
    computed = np.array([c for c, _, _ in requests], dtype=np.int64)
    new = np.array([n for _, n, _ in requests], dtype=np.int64)
    total = computed + new + np.array([extra for _, _, extra in requests], dtype=np.int64) - 1
    total = np.maximum(total, computed + new)
    assert_classified_as_the_general_path(new, computed, total)


@pytest.mark.parametrize(("new", "computed", "total"),
                         [([0] * 20, [0] * 20, [5] * 20), ([1] * 19 + [6], [3] * 19 + [0], [4] * 19 + [5])])
def test_many_bad_requests_are_refused_as_before(new: list[int], computed: list[int],
                                                 total: list[int]) -> None:
    with pytest.raises(ServesimError, match="new_tokens"):
        BatchShape.from_requests(np.array(new), np.array(computed), np.array(total))


def test_a_decode_among_a_few_requests_by_hand() -> None:
    """A prompt of 7 tokens, a decode over 12 cached tokens, a chunk of 5 of a 20-token prompt."""
    shape = BatchShape.from_requests(np.array([7, 1, 5]), np.array([0, 12, 10]), np.array([7, 13, 20]))
    assert shape.prefill_tokens.tolist() == [7, 5] and shape.prefill_context.tolist() == [0, 10]
    assert shape.prefill_emits.tolist() == [True, False] and shape.decode_context.tolist() == [12]
    assert (shape.num_new_tokens, shape.num_logits, shape.decode_context_sum) == (13, 2, 12.0)


@pytest.mark.parametrize(("new", "computed", "total"),
                         [([0], [0], [5]), ([6], [0], [5]), ([2, 3], [1, 0], [3, 2])])
def test_a_few_bad_requests_are_refused_as_before(new: list[int], computed: list[int],
                                                  total: list[int]) -> None:
    with pytest.raises(ServesimError, match="new_tokens"):
        BatchShape.from_requests(np.array(new), np.array(computed), np.array(total))


def shared_prefix_pool(blocks: int = 8) -> PrefixBlockPool:
    """Two requests with the same 64-token prompt prefix (4 blocks of 16), one with another."""
    table = RequestTable(np.zeros(3), np.array([80, 80, 80]), np.array([10, 10, 10]),
                         prefix_block_offsets=np.array([0, 1, 2, 3]), prefix_block_ids=np.array([7, 7, 9]),
                         prefix_block_size=64)
    return PrefixBlockPool(blocks, 16, PrefixIndex(table, 16))


def test_remembered_lookups_follow_the_cache() -> None:
    """A lookup is remembered until the cache changes: after the first request is admitted and
    its prefix cached, the second one's lookup finds the 4 cached blocks (not the 0 it found
    before); after an eviction it finds fewer again."""
    pool = shared_prefix_pool()
    assert pool.lookup(1, 81) == (0, 0)
    assert pool.lookup(1, 81) == (0, 0)  # remembered
    pool.admit(np.array([0]), np.array([81]), np.array([6]))
    assert pool.lookup(1, 81) == (4, 0)
    pool.release(0)  # the prefix stays cached, evictable
    assert pool.lookup(1, 81) == (4, 4)
    pool.grow(2, 6)  # takes the 4 empty blocks, then evicts 2 cached ones (the tail first)
    assert pool.lookup(1, 81) == (2, 2)


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill", "priority"])
def test_one_admission_is_admitted_as_several_are(monkeypatch: pytest.MonkeyPatch, prefix: bool,
                                                  policy: str) -> None:
    """``ReplicaState._admit_one`` against the general ``_admit_many`` on whole runs: a tight KV
    pool (preemptions, so recomputes are admitted again), with and without prefix caching (hits,
    evictions): every request's times, tokens and blocks and every step are the same."""
    plan = contended_plan(policy, prefix, seed=5)
    fast = simulate(plan, fast_forward=False)
    monkeypatch.setattr(ReplicaState, "_admit_one",
                        lambda self, request, blocks, now: self._admit_many([request], [blocks], now))
    general = simulate(plan, fast_forward=False)
    assert int(general.request_state.preemptions.sum()) > 0
    if prefix:
        assert int(general.request_state.cached_tokens.sum()) > 0
    assert_same(general, fast)


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_a_step_of_one_request_is_credited_as_several_are(monkeypatch: pytest.MonkeyPatch,
                                                          policy: str) -> None:
    """``RequestState._complete_one`` against the general ``_complete_many`` on whole runs: one
    prompt's prefill or chunk, one-token outputs that finish there, recomputes after preemption
    (a tight KV pool) that emit a token after a gap: every request's times, tokens, largest gap
    and ITL pairs and every step are the same."""
    document = experiment(seed=5, policy={"name": policy}, engine="vllm",
                          deployment={"num_gpu_blocks": 80, "block_size": 16})
    document["workload"]["arrival"]["rate"] = 40.0
    plan = prepare(validate_document(document))
    one = RequestState._complete_one
    calls = {"gaps": 0, "steps": 0}

    def counted(self: RequestState, ids: np.ndarray, new_tokens: int, now: float) -> np.ndarray:
        calls["steps"] += 1
        calls["gaps"] += int(not np.isnan(self.last_token[ids[0]]))
        return one(self, ids, new_tokens, now)

    monkeypatch.setattr(RequestState, "_complete_one", counted)
    fast = simulate(plan, fast_forward=False)
    assert calls["steps"] > 0
    assert calls["gaps"] > 0 or policy == "chunked_prefill"  # its recomputes share steps with others
    monkeypatch.setattr(RequestState, "_complete_one", lambda self, ids, new_tokens, now:
                        self._complete_many(ids, np.array([new_tokens], dtype=np.int64), now, None))
    general = simulate(plan, fast_forward=False)
    assert int(general.request_state.preemptions.sum()) > 0
    assert_same(general, fast)
