"""Speculative decoding through the whole engine: several tokens per step, TPOT and ITL as vLLM's
benchmark defines them, KV of rejected proposals freed, the batch cap, the token budget, the
memory plan, reproducibility, and the batch size at which speculation stops paying."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from engine_helpers import experiment, run, table, tabulate

from servesim.cost import BatchShape
from servesim.errors import ServesimError
from servesim.pipeline import prepare
from servesim.speculative import iid_length

EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 4, "acceptance": {"rate": 0.8}}


def spec_run(deployment: dict[str, Any], speculative: dict[str, Any] | None, workload: Any,
             policy: str = "continuous", **top: Any) -> Any:
    extra = {} if speculative is None else {"speculative": speculative}
    config = experiment(deployment, policy={"name": policy}, engine="vllm-v0", **extra, **top)
    return tabulate(run(config, workload))


def test_one_request_emits_its_tokens_in_chunks_of_one_plus_accepted() -> None:
    """One request, 2,001 output tokens, k = 4 at alpha = 0.8: the decode steps emit exactly the
    2,000 tokens after the first (none beyond the output), about (1 - 0.8^5)/0.2 = 3.36 per step;
    TPOT divides the decode time by 2,000 tokens (vLLM's definition) while ITL has one gap per
    step (vLLM's benchmark appends one ITL per streamed chunk), so mean ITL = mean step time and
    TPOT = ITL x steps / 2000."""
    tables = spec_run({"max_num_seqs": 1}, EAGLE3, table([0.0], 256, 2001))
    steps, request = tables.steps, tables.requests.iloc[0]
    decodes = steps[steps["num_decodes"] > 0]
    emitted = decodes["num_decodes"] + decodes["accepted_tokens"]
    assert int(emitted.sum()) == 2000
    assert emitted.mean() == pytest.approx(iid_length(0.8, 4), rel=0.06)
    assert (decodes["proposed_tokens"] <= 4).all()
    assert (decodes["decode_tokens"] == 1 + decodes["proposed_tokens"]).all()
    assert decodes["proposed_tokens"].iloc[-1] <= 4  # the last steps propose no more than is left
    decode_time = float(decodes["duration_s"].sum())
    assert request["finish_s"] - request["first_token_s"] == pytest.approx(decode_time)
    assert request["tpot_s"] == pytest.approx(decode_time / 2000)
    assert int(tables.itl["count"].sum()) == len(decodes)
    assert tables.summary["itl_s"]["mean"] == pytest.approx(decodes["duration_s"].mean())
    assert tables.summary["itl_s"]["mean"] / request["tpot_s"] == pytest.approx(2000 / len(decodes))
    spec = tables.summary["speculation"]
    assert spec["drafts"] == int((decodes["proposed_tokens"] > 0).sum())
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["accepted_tokens"] / spec["drafts"])
    assert spec["acceptance_per_position"][0] == pytest.approx(0.8, abs=0.04)
    assert spec["acceptance_per_position"][3] == pytest.approx(0.8**4, abs=0.04)


def test_batch1_speculation_divides_tpot_by_about_the_acceptance_length() -> None:
    """At batch 1 the step is memory-bound: verifying 4 proposals costs little more than decoding
    one, so TPOT falls by the acceptance length, less the proposer's passes (an EAGLE-3 head of one
    layer: about a tenth of the target's step) and the engine's speculative overheads."""
    workload = table([0.0], 256, 1001)
    plain = spec_run({"max_num_seqs": 1}, None, workload)
    spec = spec_run({"max_num_seqs": 1}, EAGLE3, workload)
    speedup = plain.requests["tpot_s"].iloc[0] / spec.requests["tpot_s"].iloc[0]
    decodes = spec.steps[spec.steps["num_decodes"] > 0]
    plain_step = plain.steps.loc[plain.steps["num_decodes"] > 0, "duration_s"].mean()
    length = (decodes["num_decodes"] + decodes["accepted_tokens"]).mean()
    assert speedup == pytest.approx(length * plain_step / decodes["duration_s"].mean(), rel=0.01)
    assert 2.0 < speedup < length
    assert decodes["verify_extra_s"].max() < 0.01 * plain_step  # the 4 extra rows are almost free


def test_compute_bound_batch_speculation_loses_below_the_break_even() -> None:
    """256 requests decoding at once (past the H100's ridge) with n-gram lookup (no proposer pass):
    the engine's own step prices give R = speculative step / plain step, and the break-even
    acceptance rate a* solves (1 - a^3)/(1 - a) = R for k = 2. Run at a* - 0.15, mean TPOT is worse
    than without speculation; at a* + 0.15 it is better."""
    deployment = {"max_num_seqs": 256}
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    config = experiment(deployment, speculative={**ngram, "acceptance": {"rate": 0.5}}, engine="vllm-v0")
    plan = prepare(config)
    pricer = plan.topology.groups[0].step_pricer()
    context = np.full(256, 256 + 32)
    plain_s = pricer.step_record(BatchShape.decodes_only(context)).time_s
    spec_s = pricer.step_record(BatchShape.build(decode_context=context, decode_tokens=[3] * 256)).time_s
    ratio = spec_s / plain_s
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if iid_length(middle, 2) < ratio else (low, middle)
    alpha = low
    assert 1.3 < ratio < 3.0 and 0.3 < alpha < 0.85
    workload = table([0.0] * 256, 256, 65)
    plain_tpot = spec_run(deployment, None, workload).requests["tpot_s"].mean()
    worse = spec_run(deployment, {**ngram, "acceptance": {"rate": alpha - 0.15}}, workload)
    better = spec_run(deployment, {**ngram, "acceptance": {"rate": min(1.0, alpha + 0.15)}}, workload)
    assert worse.requests["tpot_s"].mean() > plain_tpot > better.requests["tpot_s"].mean()


def test_rejected_proposals_give_their_blocks_back() -> None:
    """Block size 1 (a block per token): a step's KV use is the request's cached tokens plus the
    1 + k it computes; had the rejected proposals' slots stayed allocated it would be more."""
    tables = spec_run({"max_num_seqs": 1, "block_size": 1}, EAGLE3, table([0.0], 100, 200))
    decodes = tables.steps[tables.steps["num_decodes"] > 0]
    generated = 1 + np.concatenate(([0], np.cumsum(1 + decodes["accepted_tokens"].to_numpy())[:-1]))
    cached = 100 + generated - 1
    computing = cached + 1 + decodes["proposed_tokens"].to_numpy()
    assert np.array_equal(decodes["kv_blocks_used"].to_numpy(), computing)
    assert (decodes["accepted_tokens"] < decodes["proposed_tokens"]).any()  # some were rejected
    assert tables.summary["kv"]["blocks_in_use_at_end"] == 0


def test_batch_cap_turns_speculation_off_above_it() -> None:
    """disable_by_batch_size 2 with 4 requests: no proposals while more than 2 run."""
    tables = spec_run({"max_num_seqs": 4}, {**EAGLE3, "disable_by_batch_size": 2},
                      table([0.0, 0.0, 0.0, 0.0], 64, [20, 40, 200, 300]))
    decodes = tables.steps[tables.steps["num_decodes"] > 0]
    assert (decodes.loc[decodes["running"] > 2, "proposed_tokens"] == 0).all()
    assert (decodes.loc[decodes["running"] <= 2, "proposed_tokens"] > 0).all()


def test_proposal_tokens_count_against_the_step_budget() -> None:
    """chunked_prefill with a 64-token budget and 40 decodes speculating k = 4: the decodes' tokens
    (1 + proposals each) plus the prompt chunks never exceed 64, and proposals are shortened in
    request order when they would."""
    workload = table(np.linspace(0, 0.5, 60), 100, 50)
    tables = spec_run({"max_num_seqs": 40, "max_num_batched_tokens": 64}, EAGLE3, workload,
                      policy="chunked_prefill")
    steps = tables.steps
    assert (steps["prefill_tokens"] + steps["decode_tokens"] <= 64).all()
    assert (steps["decode_tokens"] == steps["num_decodes"] + steps["proposed_tokens"]).all()
    assert (steps["proposed_tokens"] < 4 * steps["num_decodes"]).any()
    assert tables.summary["completed"] == 60


def test_same_seed_same_run_and_the_seed_matters() -> None:
    workload = table(np.linspace(0, 1, 20), 200, 100)
    a = spec_run({"max_num_seqs": 8}, EAGLE3, workload, seed=3)
    b = spec_run({"max_num_seqs": 8}, EAGLE3, workload, seed=3)
    c = spec_run({"max_num_seqs": 8}, EAGLE3, workload, seed=4)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert not a.steps["accepted_tokens"].equals(c.steps["accepted_tokens"])


def test_zero_speculative_tokens_is_no_speculation() -> None:
    workload = table(np.linspace(0, 1, 20), 200, 100)
    off = spec_run({"max_num_seqs": 8}, {**EAGLE3, "num_speculative_tokens": 0}, workload)
    none = spec_run({"max_num_seqs": 8}, None, workload)
    pd.testing.assert_frame_equal(off.steps, none.steps)
    assert off.summary == none.summary and "speculation" not in none.summary


def test_a_draft_model_shares_the_pool_by_hand() -> None:
    """Llama-3.2-1B beside Llama-3-8B on one H100: the draft's 2.47 GB of weights come off the KV
    budget, and each block holds both models' KV (128 + 32 KiB per token), so the pool has
    (budget - 2.47 GB - extra logits) / (160 KiB x 16) blocks."""
    base = prepare(experiment(engine="vllm-v0")).topology.groups[0]
    draft = prepare(experiment(engine="vllm-v0", speculative={
        "method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 3,
        "acceptance": {"rate": 0.6}})).topology.groups[0]
    assert draft.memory.weight_bytes - base.memory.weight_bytes == 1_235_814_400 * 2
    assert draft.memory.kv_bytes_per_token == 131_072 + 32_768
    limits = base.limits
    rows = min(limits.max_num_seqs * 4, limits.max_num_batched_tokens) - limits.max_num_seqs
    assert draft.memory.activation_bytes - base.memory.activation_bytes == rows * 128_256 * 4
    kv_bytes = base.memory.kv_cache_bytes - 1_235_814_400 * 2 - rows * 128_256 * 4
    assert draft.limits.num_blocks == int(kv_bytes // (163_840 * 16))
    assert draft.limits.num_blocks < 0.8 * base.limits.num_blocks


@pytest.mark.parametrize(("top", "message"), [
    ({"policy": {"name": "static"}}, "speculative: is not modelled for policy 'static'"),
    ({"deployment": {"kind": "disaggregated"}}, "speculative: is not modelled for deployment kind "
                                                "'disaggregated'"),
])
def test_unsupported_combinations_are_one_line_errors(top: dict[str, Any], message: str) -> None:
    deployment = top.pop("deployment", None)
    with pytest.raises(ServesimError, match=message):
        prepare(experiment(deployment, speculative=EAGLE3, engine="vllm-v0", **top))



def test_an_engine_states_its_speculation_defaults() -> None:
    """An SGLang-like engine: speculating lowers max_num_seqs to 48 (SGLang's max_running_requests
    while speculating) unless the deployment sets it, caps speculation above 16 running requests,
    and charges its own software time; the experiment's keys override each."""
    from typing import ClassVar

    from servesim.engines import ENGINES, Engine, SpeculationDefaults, register_engine

    @register_engine
    class SglangLike(Engine):
        name = "sglang-like"
        title = "a test engine"
        versions = ("1",)
        speculation: ClassVar[SpeculationDefaults] = SpeculationDefaults(
            disable_by_batch_size=16, max_num_seqs=48, step_overhead_s=2e-4, pass_overhead_s=1e-4)

    try:
        group = prepare(experiment(engine="sglang-like", speculative=EAGLE3)).topology.groups[0]
        assert group.limits.max_num_seqs == 48 and group.speculation is not None
        assert group.speculation.disable_by_batch_size == 16
        assert (group.speculation.step_overhead_s, group.speculation.pass_overhead_s) == (2e-4, 1e-4)
        plain = prepare(experiment(engine="sglang-like")).topology.groups[0]
        assert plain.limits.max_num_seqs == 256  # only while speculating
        own = prepare(experiment({"max_num_seqs": 100}, engine={"name": "sglang-like",
                                                                "proposal_pass_overhead_s": 0.0},
                                 speculative={**EAGLE3, "disable_by_batch_size": 64})).topology.groups[0]
        assert own.limits.max_num_seqs == 100 and own.speculation is not None
        assert own.speculation.disable_by_batch_size == 64 and own.speculation.pass_overhead_s == 0.0
    finally:
        del ENGINES["sglang-like"]
