"""Conservation with speculative decoding on, over random workloads, small KV pools, proposers,
k and acceptance: every request completes with exactly its output tokens, each emitted once (a
step's chunk of 1 + accepted tokens is one inter-token gap, so gaps = outputs - 1 - accepted
proposals), KV blocks never exceed the pool and are all free at the end (rejected proposals'
blocks included), and the tokens computed are the tokens needed plus the rejected proposals (plus
what preemption threw away)."""

from __future__ import annotations

from typing import Any

import numpy as np
from engine_helpers import assert_conserved, experiment, run, table, tabulate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

workloads = st.integers(min_value=1, max_value=24).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 1.0), min_size=n, max_size=n),
    st.lists(st.integers(1, 300), min_size=n, max_size=n),
    st.lists(st.integers(1, 120), min_size=n, max_size=n)))

speculations = st.fixed_dictionaries({
    "method": st.sampled_from(["eagle", "eagle3", "ngram"]),
    "num_speculative_tokens": st.integers(1, 6),
    "acceptance": st.one_of(st.builds(lambda a: {"rate": a}, st.floats(0.0, 1.0)),
                            st.just({"preset": "eagle3-llama-3.1-8b-mtbench"})),
    "disable_by_batch_size": st.sampled_from([None, 2, 6]),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads, speculative=speculations,
       policy=st.sampled_from([{"name": "continuous"}, {"name": "chunked_prefill"},
                               {"name": "sjf"}, {"name": "priority", "preemption_mode": "swap"}]),
       blocks=st.integers(8, 100), block_size=st.sampled_from([1, 4, 16]), max_num_seqs=st.integers(1, 12),
       budget=st.sampled_from([None, 48, 256]), caching=st.booleans())
def test_conservation_with_speculation(workload: tuple[list[float], list[int], list[int]],
                                       speculative: dict[str, Any], policy: dict[str, Any], blocks: int,
                                       block_size: int, max_num_seqs: int, budget: int | None,
                                       caching: bool) -> None:
    arrivals, prompts, outputs = workload
    if speculative["num_speculative_tokens"] > 7:
        speculative = {**speculative, "num_speculative_tokens": 7}
    deployment: dict[str, Any] = {"num_gpu_blocks": blocks, "block_size": block_size,
                                  "max_num_seqs": max_num_seqs, "watermark": 0.0}
    if policy["name"] == "chunked_prefill":
        if budget is not None:
            deployment["max_num_batched_tokens"] = max(budget, max_num_seqs)
        deployment["enable_prefix_caching"] = caching
    config = experiment(deployment, policy=policy, speculative=speculative, engine="vllm-v0")
    result = run(config, table(np.sort(arrivals), prompts, outputs))
    tables = tabulate(result)
    requests, steps, itl = tables.requests, tables.steps, tables.itl
    prompt, output = requests["prompt_tokens"].to_numpy(), requests["output_tokens"].to_numpy()
    never_fits = -(-(prompt + output - 1) // block_size) > blocks
    assert (requests["status"] == "rejected").to_numpy().tolist() == never_fits.tolist()
    done = (requests["status"] == "completed").to_numpy()
    assert done.sum() + never_fits.sum() == len(requests) and tables.summary["unfinished"] == 0
    assert (steps["kv_blocks_used"] <= blocks).all() and (steps["running"] <= max_num_seqs).all()
    for state in result.replica_states:
        assert state.pool.free == state.pool.total and not state.pool.held.any()
    state = result.request_state
    assert (state.generated[done] == output[done]).all()  # no token beyond the output
    assert (state.computed[done] == (prompt + output - 1)[done]).all()
    accepted = int(steps["accepted_tokens"].sum())
    assert int(itl["count"].sum()) == int((output[done] - 1).sum()) - accepted
    assert (steps["accepted_tokens"] <= steps["proposed_tokens"]).all()
    assert (steps["decode_tokens"] == steps["num_decodes"] + steps["proposed_tokens"]).all()
    computed = int(steps["prefill_tokens"].sum() + steps["decode_tokens"].sum())
    rejected = int((steps["proposed_tokens"] - steps["accepted_tokens"]).sum())
    needed = int((prompt + output - 1)[done].sum()) - int(requests.loc[done, "cached_tokens"].sum())
    recomputed = int(requests["preemptions"].sum() - requests["swaps_out"].sum())  # swaps keep the KV
    if recomputed == 0:
        assert computed == needed + rejected
    else:
        assert computed > needed + rejected
    spec = tables.summary["speculation"]
    assert spec["accepted_tokens"] == accepted
    assert spec["proposed_tokens"] == int(steps["proposed_tokens"].sum())
    if speculative["disable_by_batch_size"] is not None:
        # the cap counts the requests running when the step is planned, before its admissions:
        # the logged ``running`` when the step admitted nobody (no prefill chunk in it)
        cap = speculative["disable_by_batch_size"]
        planned = steps[steps["num_prefills"] == 0]
        assert (planned.loc[planned["running"] > cap, "proposed_tokens"] == 0).all()
    timed = requests[done]
    assert (timed["finish_s"] >= timed["first_token_s"]).all()
    if policy["name"] == "chunked_prefill":
        limit = result.plan.topology.kv_group.limits.max_num_batched_tokens
        assert (steps["prefill_tokens"] + steps["decode_tokens"] <= limit).all()


def test_conservation_helper_still_holds_without_speculation() -> None:
    """The shared invariant helper (one token per chunk) is unchanged for plain runs."""
    config = experiment({"num_gpu_blocks": 40, "block_size": 4, "max_num_seqs": 4}, engine="vllm-v0")
    result = run(config, table([0.0, 0.1, 0.2], [30, 40, 50], [10, 20, 30]))
    assert_conserved(result, tabulate(result), 40, 4, 4)
