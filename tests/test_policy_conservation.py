"""Conservation invariants of every batching policy over random workloads and small KV pools:
nothing is lost, blocks stay within the pool and are all free at the end, every output token is
emitted once, and the tokens the steps computed are exactly the tokens the requests needed (plus
static batching's padding, plus what preemption threw away)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from engine_helpers import assert_conserved, experiment, run, table, tabulate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

workloads = st.integers(min_value=1, max_value=30).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 2.0), min_size=n, max_size=n),
    st.lists(st.integers(1, 400), min_size=n, max_size=n),
    st.lists(st.integers(1, 200), min_size=n, max_size=n)))

policies = st.sampled_from([
    {"name": "continuous"},
    {"name": "continuous", "order": "decode_first", "waiting_served_ratio": 1.2, "max_waiting_steps": 5},
    {"name": "chunked_prefill"},
    {"name": "static", "reserve": "exact"},
    {"name": "static", "max_output_tokens": 200, "timeout_s": 0.05},
    {"name": "static", "max_output_tokens": 50, "pad_prompts": False},
])


def static_padding(requests: pd.DataFrame, padded: bool) -> int:
    """Tokens a static batch computes beyond its members' needs. Members of one batch were
    admitted together (same first_scheduled_s). With the default budget (8192) and at most 16
    members of 400 tokens, each batch's prompts run in one prefill step, padded to the longest;
    then the batch decodes max(output) - 1 steps with every member a row."""
    extra = 0
    for _, batch in requests.groupby("first_scheduled_s"):
        prompts, outputs = batch["prompt_tokens"].to_numpy(), batch["output_tokens"].to_numpy()
        if padded:
            extra += int(prompts.size * prompts.max() - prompts.sum())
        extra += int((outputs.max() - outputs).sum())
    return extra


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads, policy=policies, blocks=st.integers(8, 120),
       block_size=st.sampled_from([1, 8, 16, 32]), max_num_seqs=st.integers(1, 16),
       budget=st.sampled_from([None, 64, 512]), watermark=st.sampled_from([0.0, 0.1, 0.4]))
def test_conservation(workload: tuple[list[float], list[int], list[int]], policy: dict[str, Any],
                      blocks: int, block_size: int, max_num_seqs: int, budget: int | None,
                      watermark: float) -> None:
    arrivals, prompts, outputs = workload
    deployment: dict[str, Any] = {"num_gpu_blocks": blocks, "block_size": block_size,
                                  "max_num_seqs": max_num_seqs, "watermark": watermark}
    if policy["name"] == "chunked_prefill" and budget is not None:
        deployment["max_num_batched_tokens"] = max(budget, max_num_seqs)  # small budgets: many chunks
    config = experiment(deployment, policy=policy)
    result = run(config, table(np.sort(arrivals), prompts, outputs))
    tables = tabulate(result)
    requests, steps = tables.requests, tables.steps
    prompt, output = requests["prompt_tokens"].to_numpy(), requests["output_tokens"].to_numpy()
    done = assert_conserved(result, tables, blocks, block_size, max_num_seqs)
    assert (result.request_state.computed[done] == (prompt + output - 1)[done]).all()
    computed = steps["prefill_tokens"].sum() + steps["decode_tokens"].sum()
    needed = (prompt + output - 1)[done].sum()
    if policy["name"] == "static":
        assert requests["preemptions"].sum() == 0
        assert computed == needed + static_padding(requests[done], policy.get("pad_prompts", True))
    elif requests["preemptions"].sum() == 0:
        assert computed == needed
    else:
        assert computed > needed
    if policy["name"] == "chunked_prefill":
        assert (steps["prefill_tokens"] + steps["decode_tokens"]
                <= result.plan.topology.kv_group.limits.max_num_batched_tokens).all()
