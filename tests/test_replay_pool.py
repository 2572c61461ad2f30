"""Replaying serving rows in order, in worker processes, telling the progress hook after each."""

from __future__ import annotations

import pytest

from servesim.calibration.replay_pool import replay_map, reporting


def square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_in_job_order_and_progress_counts_every_job(workers: int) -> None:
    told: list[tuple[str, int, int]] = []
    with reporting(lambda stage, done, total: told.append((stage, done, total))):
        assert replay_map(square, [3, 1, 2, 5], workers, "squaring") == [9, 1, 4, 25]
    assert told == [("squaring", 1, 4), ("squaring", 2, 4), ("squaring", 3, 4), ("squaring", 4, 4)]


def test_the_hook_is_told_only_inside_its_block_and_the_outer_one_comes_back() -> None:
    outer: list[int] = []
    inner: list[int] = []
    assert replay_map(square, [1, 2]) == [1, 4]  # nobody to tell
    with reporting(lambda _s, done, _t: outer.append(done)):
        with reporting(lambda _s, done, _t: inner.append(done)):
            replay_map(square, [1, 2, 3])
        replay_map(square, [4])
    replay_map(square, [5])
    assert inner == [1, 2, 3] and outer == [1]


def test_no_jobs_tell_nothing() -> None:
    told: list[int] = []
    with reporting(lambda _s, done, _t: told.append(done)):
        assert replay_map(square, [], 2) == []
    assert told == []
