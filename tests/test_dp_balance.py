"""TensorRT-LLM's attention-DP balancing (``attention_dp_config.enable_balance``): a new prompt
waits until every DP rank has one to start, counting iterations, and starts anyway after
``timeout_iters`` of them or as soon as some rank has nothing to decode; when every rank has one
and all decode, they wait ``batching_wait_iters`` iterations more. The count runs on every
iteration that fails the test, so a prompt alone on its rank starts at the next multiple of the
timeout, counted from the last iteration that started prompts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from engine_helpers import PLACEHOLDER_WORKLOAD, run, table

from servesim.config import validate_document
from servesim.engines import make_engine

LONG = 80
"""Output tokens of the requests that keep both ranks decoding."""


def _experiment(**knobs: Any) -> Any:
    return validate_document({
        "model": "mixtral-8x7b", "hardware": "h100-sxm-80gb",
        "engine": {"name": "trtllm", "frontend_latency_s": 0.0, **knobs},
        "deployment": {"tp": 1, "dp": 2, "ep": 2}, "workload": PLACEHOLDER_WORKLOAD})


def _balanced(timeout: int, wait: int = 0) -> Any:
    return _experiment(attention_dp_balance=True, attention_dp_timeout_iters=timeout,
                       attention_dp_batching_wait_iters=wait)


def _iteration_of(result: Any, request: int) -> int:
    """The iteration (0 = the first) in which ``request`` first ran: ranks form each micro-batch
    together, so the iterations are the distinct step start times."""
    starts = np.unique(result.steps["start_s"].to_numpy())
    first = float(result.requests.loc[request, "first_scheduled_s"])
    return int(np.flatnonzero(starts == first)[0])


def _arrival_in_iteration(config: Any, iteration: int) -> float:
    """The middle of the ``iteration``-th step of two requests decoding, one per rank."""
    alone = run(config, table([0.0, 0.0], 128, LONG)).steps
    starts = np.unique(alone["start_s"].to_numpy())
    return float((starts[iteration] + starts[iteration + 1]) / 2)


def test_the_knobs_reach_the_runtime() -> None:
    assert make_engine("trtllm", {}).runtime("h100-sxm-80gb").dp_balance is None
    runtime = make_engine("trtllm", {"attention_dp_balance": True}).runtime("h100-sxm-80gb")
    assert runtime.dp_balance is not None
    assert (runtime.dp_balance.timeout_iters, runtime.dp_balance.batching_wait_iters) == (50, 10)


def test_a_prompt_alone_on_its_rank_waits_for_the_timeout() -> None:
    """Requests 0 and 1 start together in iteration 0 (one on each rank) and decode; request 2
    arrives during iteration 10 and is queued on one rank. Unbalanced it runs in iteration 11;
    balanced with an 8-iteration timeout it waits for the count, which failed in iterations
    1-8 (restarting there) and 9-16: iteration 16; with a 5-iteration timeout, 15."""
    plain = _experiment()
    arrival = _arrival_in_iteration(plain, 10)
    requests = table([0.0, 0.0, arrival], 128, [LONG, LONG, 4])
    result = run(plain, requests)
    assert sorted(result.requests.loc[[0, 1], "replica"]) == [0, 1]  # one per rank
    assert _iteration_of(result, 2) == 11
    for timeout, expected in ((8, 16), (5, 15), (20, 20)):
        config = _balanced(timeout)
        assert _arrival_in_iteration(config, 10) == arrival  # the same steps before it
        assert _iteration_of(run(config, requests), 2) == expected


def test_prompts_on_every_rank_start_together_after_the_batching_wait() -> None:
    """Requests 2 and 3 arrive together during iteration 10, one on each rank: every rank has a
    prompt and both decode, so they wait 3 batching iterations (11, 12, 13) and start in 14."""
    config = _balanced(timeout=50, wait=3)
    arrival = _arrival_in_iteration(config, 10)
    result = run(config, table([0.0, 0.0, arrival, arrival], 128, [LONG, LONG, 4, 4]))
    assert sorted(result.requests.loc[[2, 3], "replica"]) == [0, 1]
    assert _iteration_of(result, 2) == _iteration_of(result, 3) == 14
    assert _iteration_of(run(_balanced(timeout=50, wait=0), table([0.0, 0.0, arrival, arrival], 128,
                                                                  [LONG, LONG, 4, 4])), 2) == 11


def test_a_rank_with_nothing_to_decode_starts_prompts_at_once() -> None:
    """Only request 0 decodes (on one rank); request 1 arrives during iteration 10 and goes to the
    idle rank: not every rank decodes, so nothing is held."""
    config = _balanced(timeout=50)
    alone = run(config, table([0.0], 128, LONG)).steps
    starts = np.unique(alone["start_s"].to_numpy())
    arrival = float((starts[10] + starts[11]) / 2)
    result = run(config, table([0.0, arrival], 128, [LONG, 4]))
    assert result.requests.loc[1, "replica"] != result.requests.loc[0, "replica"]
    assert float(result.requests.loc[1, "first_scheduled_s"]) == pytest.approx(float(starts[11]))
