"""Per-request state in the narrowest dtypes that hold it (issue #18): int32 cold counters unless
a request could pass int32's range, int32 event counters that refuse to wrap, disaggregated
columns only where a run uses them, and the ITL log moved (not copied) into its arrays."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.core.state import INT32_MAX, TOKEN_HEADROOM, ItlLog, RequestState, token_dtype
from servesim.errors import ServesimError
from servesim.workloads.requests import RequestTable


def table(prompt: list[int], output: list[int]) -> RequestTable:
    return RequestTable(np.arange(len(prompt), dtype=np.float64), np.asarray(prompt, dtype=np.int64),
                        np.asarray(output, dtype=np.int64))


def test_cold_counters_are_int32_unless_a_request_could_pass_it() -> None:
    """Counters written at admission or preemption are int32; those every step updates stay in the
    batches' int64 (narrowing them cost CPU in mixed-dtype casts)."""
    state = RequestState(table([100, 8000], [10, 4000]))
    assert state.cached_tokens.dtype == np.int32
    for name in ("computed", "generated", "blocks_held"):
        assert getattr(state, name).dtype == np.int64, name
    for name in ("preemptions", "swaps_out", "swaps_in", "replica"):
        assert getattr(state, name).dtype == np.int32, name
    edge = INT32_MAX - TOKEN_HEADROOM
    assert token_dtype(np.array([edge - 2]), np.array([1])) is np.int32
    assert token_dtype(np.array([edge - 1]), np.array([1])) is np.int64  # refused as too long, never wraps
    huge = RequestState(table([3_000_000_000], [5]))
    assert huge.cached_tokens.dtype == np.int64
    huge.cached_tokens[0] = 3_000_000_000
    assert int(huge.cached_tokens[0]) == 3_000_000_000


def test_a_wrapped_event_counter_is_refused() -> None:
    state = RequestState(table([10, 10], [5, 5]))
    state.check_counters()
    state.preemptions[1] = INT32_MAX
    state.preemptions[[1]] += 1  # what a 2^31-th preemption does to an int32 counter
    with pytest.raises(ServesimError, match="preemptions: a request was counted more than 2,147,483,647"):
        state.check_counters()


def test_transit_columns_exist_only_when_used() -> None:
    state = RequestState(table([10, 10, 10], [5, 5, 5]))
    assert state._transit == {}
    state.transfer_end[1] = 2.5
    assert state.decode_replica.tolist() == [-1, -1, -1] and state.decode_replica.dtype == np.int32
    assert np.isnan(state.transfer_end[[0, 2]]).all() and state.transfer_end[1] == 2.5
    assert sorted(state._transit) == ["decode_replica", "transfer_end"]


def test_itl_arrays_move_out_and_merge_later_pairs_in_time_order() -> None:
    log = ItlLog()
    log.add(np.array([0.5, 0.5, 0.25]), 1.0)
    log.add_runs([0.3, 0.4], 2, [3.0, 4.0])  # a run's pairs, written late
    log.add(np.array([0.1]), 2.0)
    values, counts = log.arrays()
    assert values.tolist() == [0.25, 0.5, 0.1, 0.3, 0.4] and counts.tolist() == [1, 2, 1, 2, 2]
    assert not len(log.values) and not values.flags.writeable
    assert log.arrays()[0] is values  # held once: the same arrays again
    log.add(np.array([0.7]), 3.0)  # ties with the run's pair at 3.0: written after it
    log.add(np.array([0.9]), 2.5)
    values, counts = log.arrays()
    assert values.tolist() == [0.25, 0.5, 0.1, 0.9, 0.3, 0.7, 0.4]
    assert counts.tolist() == [1, 2, 1, 1, 2, 1, 2]


@pytest.mark.parametrize("distinct", [1, 2, 3])
def test_a_wide_steps_gaps_are_stored_as_their_distinct_values_and_counts(distinct: int) -> None:
    """A step of 100 requests (past the Python grouping of a few): its gaps are kept as
    ``np.unique``'s (value, count) pairs in sorted order, whether they take one value, two (the
    batch's gap and its new requests'; counted without a sort) or more."""
    rng = np.random.default_rng(7)
    choices = np.array([0.012, 0.031, 0.0205])[:distinct]
    gaps = rng.choice(choices, size=100)
    gaps[:distinct] = choices  # every value present
    log = ItlLog()
    log.add(gaps, 5.0)
    values, counts = np.unique(gaps, return_counts=True)
    assert list(log.values) == values.tolist()
    assert list(log.counts) == counts.tolist()
    assert list(log.at) == [5.0] * distinct
    assert sum(log.counts) == 100
