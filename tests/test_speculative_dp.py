"""Speculative decoding on data-parallel attention ranks (DeepSeek's MTP with attention DP, the
SGLang and TensorRT-LLM high-throughput recipe): each rank verifies its own proposals and runs its
own proposer passes, and the slowest rank, proposer included, sets the step."""

from __future__ import annotations

import pytest
from engine_helpers import experiment, run, table

from servesim.cost import BatchShape
from servesim.cost.speculative import SpeculativeCost
from servesim.errors import ServesimError
from servesim.pipeline import prepare
from servesim.topology.resolve import resolve_topology

ALWAYS = {"method": "eagle", "num_speculative_tokens": 1, "acceptance": {"rate": 1.0}}
"""One proposal per step, always accepted: every verify step emits exactly two tokens."""
DP2 = {"tp": 1, "dp": 2, "ep": 2}


def dp_config(speculative: dict | None = ALWAYS, **deployment: int) -> object:
    extra = {} if speculative is None else {"speculative": speculative}
    return experiment({**DP2, **deployment}, engine="vllm-v0", model="mixtral-8x7b",
                      policy={"name": "continuous"}, **extra)


def test_each_rank_verifies_its_own_proposals() -> None:
    """Two requests at t = 0, one per rank (round robin), 100-token prompts and 9 output tokens:
    the prefill emits the first token and, with every proposal accepted, 4 verify steps of 2 tokens
    emit the other 8, on each rank, in the same (synchronised) steps."""
    result = run(dp_config(), table([0.0, 0.0], 100, 9))
    steps = result.steps
    decodes = steps[steps["num_decodes"] > 0]
    assert sorted(decodes["replica"].unique()) == [0, 1]
    for _, rank in decodes.groupby("replica"):
        assert len(rank) == 4
        assert (rank["proposed_tokens"] == 1).all() and (rank["accepted_tokens"] == 1).all()
        assert (rank["decode_tokens"] == 2).all()
        assert (rank["op_proposal_s"] > 0).all()
        assert int((rank["num_decodes"] + rank["accepted_tokens"]).sum()) == 8
    assert decodes.groupby("start_s")["duration_s"].nunique().eq(1).all()  # the ranks step together
    requests = result.requests
    assert (requests["output_tokens"] == 9).all()
    # TPOT: 8 tokens after the first, emitted by 4 steps (vLLM's definition divides by the tokens)
    decode_time = decodes[decodes["replica"] == 0]["duration_s"].sum()
    assert requests["tpot_s"].iloc[0] == pytest.approx(decode_time / 8)
    summary = result.summary.to_dict()["speculation"]
    assert summary["accepted_tokens"] == summary["proposed_tokens"] == 8


def test_the_slowest_rank_sets_the_step_with_its_proposer_passes() -> None:
    """A verify micro-batch of 8 decodes on one rank and 2 on the other: each rank's record is its
    own target pass plus proposer passes (the single-group speculative price of its batch), and the
    stage takes the slower of the two plus the routed experts over both ranks' tokens (proposals
    included: 16 + 4 rows)."""
    group = resolve_topology(dp_config()).groups[0]
    cost = group.parallel_cost_model()
    stage = cost.stages[0]
    big = BatchShape.build(decode_context=[1000] * 8, decode_tokens=[2] * 8)
    small = BatchShape.build(decode_context=[300] * 2, decode_tokens=[2] * 2)
    priced = cost.price([big, small])
    assert group.speculation is not None
    alone = SpeculativeCost(stage, group.speculation.proposer.passes, group.speculation.step_overhead_s,
                            group.speculation.pass_overhead_s)
    a, b = alone.step_record(big), alone.step_record(small)
    assert a.proposal_s > 0 and a.time_s > b.time_s
    ops, comm = stage.moe_part(16 + 4)
    shared = sum(op.time_s for op in ops) + comm
    assert priced.stage_s[0] == pytest.approx(a.time_s + shared, rel=1e-12)
    slow, fast = priced.ranks
    assert slow is not None and fast is not None
    assert slow.proposal_s == pytest.approx(a.proposal_s) and fast.proposal_s == pytest.approx(b.proposal_s)
    assert slow.verify_extra_s == pytest.approx(a.verify_extra_s)
    # without speculation the same ranks decode one token each, and the step is shorter
    plain = resolve_topology(dp_config(None)).groups[0].parallel_cost_model()
    assert plain.price([BatchShape.decode(8, 1000), BatchShape.decode(2, 300)]).stage_s[0] < priced.stage_s[0]


def test_speculation_with_pipeline_stages_is_still_a_one_line_error() -> None:
    with pytest.raises(ServesimError, match=r"^speculative: is not modelled with pipeline stages"):
        prepare(experiment({"tp": 1, "pp": 2}, engine="vllm-v0", speculative=ALWAYS))
