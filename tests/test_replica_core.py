"""What every policy uses of a replica: ``try_admit`` / ``commit`` (vLLM v1's allocate-or-None)
and ``preempt_tail_until``, checked by hand; and a policy added by touching only its own class."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import experiment, run, table, tabulate

from servesim.core.replica_state import EngineLimits, ReplicaState
from servesim.core.state import RequestState
from servesim.policies.base import POLICIES
from servesim.policies.continuous import ContinuousBatching


def replica(blocks: int, seats: int = 8, budget: int = 4096, watermark: int = 0,
            prompts: tuple[int, ...] = (100, 200, 300, 400)) -> ReplicaState:
    requests = RequestState(table(np.zeros(len(prompts)), np.array(prompts), 10))
    limits = EngineLimits(max_num_seqs=seats, max_num_batched_tokens=budget, max_model_len=8192,
                          block_size=16, num_blocks=blocks, watermark_blocks=watermark)
    state = ReplicaState(0, requests, limits)
    for request in range(len(prompts)):
        state.enqueue(request)
    return state


def test_try_admit_grants_until_the_first_request_that_does_not_fit() -> None:
    """Prompts of 100, 200, 300, 400 tokens need 7, 13, 19, 25 blocks of 16. With 40 blocks the
    first two fit (20 blocks), the third would need 39 of the 40 and still fits, the fourth not."""
    state = replica(blocks=40)
    room = state.admission_room()
    granted = [state.try_admit(room, r) for r in list(state.waiting)]
    assert granted == [100, 200, 300, None]
    assert len(state.waiting) == 4 and state.pool.free == 40  # nothing changes before commit
    ids, new = state.commit(room, now=1.5)
    assert ids.tolist() == [0, 1, 2] and new.tolist() == [100, 200, 300]
    assert list(state.waiting) == [3] and state.running.tolist() == [0, 1, 2]
    assert state.pool.free == 40 - (7 + 13 + 19) and state.requests.first_scheduled[:3].tolist() == [1.5] * 3


def test_try_admit_counts_seats_budget_and_the_watermark() -> None:
    state = replica(blocks=1000, seats=2)
    room = state.admission_room()
    assert [state.try_admit(room, r) for r in range(3)] == [100, 200, None]  # two seats
    state = replica(blocks=1000, budget=250)
    room = state.admission_room()
    assert state.try_admit(room, 0) == 100 and state.try_admit(room, 1) is None  # 300 > 250 tokens
    chunked = replica(blocks=1000, budget=250)
    room = chunked.admission_room()
    assert chunked.try_admit(room, 0, max_new=room.budget) == 100
    assert chunked.try_admit(room, 1, max_new=room.budget) == 150  # a chunk of the rest of the budget
    assert chunked.try_admit(room, 2, max_new=room.budget) is None  # budget spent
    # The watermark (6 blocks) is waived while nothing runs, then kept free.
    state = replica(blocks=25, watermark=6)
    room = state.admission_room()
    assert state.try_admit(room, 0) == 100  # 7 of 25 blocks
    assert state.try_admit(room, 1) is None  # 13 of the 18 left would leave 5 < 6 free
    assert room.free == 18 and room.reserve == 6


def test_preempt_tail_until_frees_what_is_asked_counting_planned_growth() -> None:
    """Running [0, 1, 2, 3] hold 7, 13, 19, 25 blocks. Freeing 30 blocks takes the last two
    (25 + 19); with 10 blocks of planned growth for request 3, the last one alone (25 + 10 = 35)."""
    state = replica(blocks=100)
    room = state.admission_room()
    for request in range(4):
        state.try_admit(room, request)
    state.commit(room, 0.0)
    assert state.tail_relief_count(30) == 2
    assert state.tail_relief_count(30, planned=np.array([0, 0, 0, 10])) == 1
    assert state.tail_relief_count(1000) == 5  # more than there are: even all would not do
    assert state.tail_relief_count(20, among=1) == 1 and state.tail_relief_count(30, among=1) == 2
    assert state.preempt_tail_until(30) == 2
    assert state.running.tolist() == [0, 1] and list(state.waiting) == [2, 3]  # back at the front
    assert state.pool.free == 100 - 7 - 13 and state.requests.preemptions.tolist() == [0, 0, 1, 1]
    assert state.preempt_tail_until(10_000) == 2 and state.running.size == 0


@pytest.fixture
def lifo_policy():
    """A policy that exists only in this test: newest request first. Adding it is one class."""

    class NewestFirst(ContinuousBatching):
        name = "newest_first"

        def admission_keys(self) -> np.ndarray:
            return -self.replica.requests.arrival

    POLICIES[NewestFirst.name] = NewestFirst
    yield NewestFirst
    del POLICIES[NewestFirst.name]


def test_a_new_policy_needs_only_its_class(lifo_policy: type) -> None:
    """One request runs at a time (max_num_seqs 1); the three that arrive while the first runs are
    served newest first."""
    config = experiment({"max_num_seqs": 1}, policy={"name": "newest_first"})
    requests = tabulate(run(config, table([0.0, 0.01, 0.02, 0.03], 500, 20))).requests
    order = requests.sort_values("first_scheduled_s")["request_id"].tolist()
    assert order == [0, 3, 2, 1]
