"""SGLang's ``--scheduler-recv-interval n``: the scheduler reads new requests only when its
counter reaches ``n``; every pure-decode step adds 1 to it, a prefill step enough to read at
once, and an idle scheduler reads whatever has come. So an arrival during a long decode run waits
for the next read (``servesim.core.replica``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from engine_helpers import PLACEHOLDER_WORKLOAD, run, table

from servesim.config import validate_document
from servesim.engines import make_engine
from servesim.errors import ServesimError
from servesim.pipeline import prepare, simulate

LONG = 60


def _experiment(interval: int) -> Any:
    return validate_document({"model": "llama-3-8b", "hardware": "h100-sxm-80gb",
                              "engine": {"name": "sglang", "frontend_latency_s": 0.0,
                                         "scheduler_recv_interval": interval},
                              "workload": PLACEHOLDER_WORKLOAD})


def _first_step_of_late_arrival(interval: int, during: int = 10) -> int:
    """Request 0 arrives at t = 0 (prefilled in step 0, then decoding alone); request 1 arrives
    in the middle of step ``during``. The index of the step request 1 first runs in."""
    config = _experiment(interval)
    alone = run(config, table([0.0], 128, LONG)).steps
    start, duration = float(alone["start_s"].iloc[during]), float(alone["duration_s"].iloc[during])
    both = run(config, table([0.0, start + duration / 2], 128, [LONG, 4]))
    first = float(both.requests.loc[1, "first_scheduled_s"])
    index = int(np.flatnonzero(both.steps["start_s"].to_numpy() == first)[0])
    assert both.steps["start_s"].iloc[:index].tolist() == alone["start_s"].iloc[:index].tolist()
    return index


def test_the_knob_reaches_the_runtime() -> None:
    assert make_engine("sglang", {}).runtime("h100-sxm-80gb").recv_interval == 1
    assert make_engine("sglang", {"scheduler_recv_interval": 30}).runtime("h100-sxm-80gb").recv_interval == 30


@pytest.mark.parametrize(("interval", "expected"), [(1, 11), (4, 13), (30, 31)])
def test_an_arrival_waits_for_the_next_read(interval: int, expected: int) -> None:
    """After the prefill of step 0 the engine reads at step 1, then every ``interval`` decode
    steps: at steps 1 + k x interval. An arrival during step 10 is read at the first of those
    after it (4: 13; 30: 31) and runs in that step; with 1, in step 11."""
    assert _first_step_of_late_arrival(interval) == expected


def test_an_idle_engine_reads_at_once() -> None:
    config = _experiment(30)
    result = run(config, table([0.0, 5.0], 128, [8, 8]))
    assert result.requests.loc[0, "finish_s"] < 5.0
    assert result.requests.loc[1, "first_scheduled_s"] == 5.0


def test_a_deployment_with_dp_ranks_is_refused_in_one_line() -> None:
    """SGLang 0.5 refuses the interval with data-parallel attention; so does servesim, naming the
    knob, rather than ignoring it."""
    config = validate_document({"model": "mixtral-8x7b", "hardware": "h100-sxm-80gb",
                                "engine": {"name": "sglang", "scheduler_recv_interval": 30},
                                "deployment": {"tp": 1, "dp": 2, "ep": 2}, "workload": PLACEHOLDER_WORKLOAD})
    with pytest.raises(ServesimError) as caught:
        simulate(prepare(config, workload=table([0.0], 128, 4)))
    assert "engine.scheduler_recv_interval" in str(caught.value)
    assert "\n" not in str(caught.value)
