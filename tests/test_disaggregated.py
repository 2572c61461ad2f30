"""Disaggregated prefill/decode: the ITL benefit, the link's cost checked by hand, contention,
conservation under random workloads, and one-line errors for a bad pool layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import experiment, run, table, tabulate
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import servesim

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.core.state import DECODE_KV_NEVER_FITS, DONE, REJECT_REASONS, REJECTED
from servesim.errors import ServesimError
from servesim.memory import plan_memory
from servesim.topology.resolve import resolve_topology

H100 = load_hardware("h100-sxm-80gb")
LLAMA = load_model("llama-3-8b")
KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2
"""Llama-3-8B: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes (bf16) = 128 KiB."""


def disaggregated(**policy: object) -> dict[str, object]:
    return {"name": "disaggregated", **policy}


def test_kv_bytes_per_token_is_the_model_shape() -> None:
    deployment = resolve_topology(experiment(policy=disaggregated()))
    assert deployment.kv_bytes_per_token == KV_PER_TOKEN == 131_072
    # Different TP per pool: the bytes crossing the link are the same in total.
    split = resolve_topology(experiment(policy=disaggregated(prefill={"tp": 2}, decode={"tp": 4})))
    assert split.kv_bytes_per_token == KV_PER_TOKEN
    assert split.link.lanes == 2 and split.num_gpus == 6


def test_disaggregation_lowers_p99_itl_at_equal_gpu_count() -> None:
    """Two H100s either way: 2 colocated continuous replicas, or 1 prefill + 1 decode replica.
    Prefill-heavy traffic (2,048-token prompts, 32-token outputs) at 60% of one GPU's prefill
    capacity. Colocated, every decode that shares a replica with a new prompt waits out the whole
    prefill step (vLLM v0 runs it alone), so its p99 ITL is at least one prefill step; the decode
    replica never prefills, so its ITL is one or two of its own decode steps (two when a KV lands
    mid-step), whatever the prefill load. That is Splitwise's and DistServe's case for splitting."""
    prompt, output = 2048, 32
    prefill_step = CostModel(LLAMA, H100).step_time(BatchShape.prefill(prompt))
    assert prefill_step == pytest.approx(0.0466, rel=0.02)  # 47.6 ms before the GEMM shape factors
    rate = 0.6 / prefill_step
    arrivals = np.cumsum(np.random.default_rng(0).exponential(1 / rate, 2000))
    workload = table(arrivals, prompt, output)
    colocated = tabulate(run(experiment({"replicas": 2}), workload))
    split = tabulate(run(experiment(policy=disaggregated()), workload))
    for tables in (colocated, split):
        assert tables.summary["completed"] == 2000
    co_p99, split_p99 = colocated.summary["itl_s"]["p99"], split.summary["itl_s"]["p99"]
    decode_steps = split.steps[split.steps["pool"] == "decode"]
    assert decode_steps["num_prefills"].sum() == 0  # the decode replica never prefilled
    assert co_p99 >= prefill_step
    assert split_p99 <= 2 * decode_steps["duration_s"].max()
    assert split_p99 < co_p99 / 4  # measured: 54.8 ms colocated vs 9.9 ms disaggregated
    # The price: one GPU does all prefills, and TTFT includes the copy, so TTFT rises.
    assert split.summary["ttft_s"]["p50"] > colocated.summary["ttft_s"]["p50"]


@pytest.mark.parametrize("tp", [1, 2])
def test_isolated_request_ttft_is_prefill_plus_latency_plus_bytes_over_bandwidth(tp: int) -> None:
    """One 2,000-token prompt, nothing else running: TTFT = its prefill step + the link's latency
    + prompt x 128 KiB / (bandwidth x efficiency x TP lanes), to the float, on every link kind.
    100 GbE: 262,144,000 B / 12.5 GB/s = 20.97 ms; NVLink (450 GB/s x 0.673, fitted to
    nccl-tests): 0.87 ms."""
    prompt = 2000
    nbytes = prompt * KV_PER_TOKEN
    assert nbytes == 262_144_000
    prefill = CostModel(LLAMA, H100, tp).step_time(BatchShape.prefill(prompt))
    ttft = {}
    for kind in ("nvlink", "pcie", "infiniband", "ethernet"):
        config = experiment({"tp": tp}, policy=disaggregated(link={"kind": kind}))
        link = resolve_topology(config).link
        result = tabulate(run(config, table([0.0], prompt, 8)))
        ttft[kind] = float(result.requests["ttft_s"].iloc[0])
        expected = prefill + link.latency_s + nbytes / (link.bandwidth_Bps * link.efficiency * tp)
        assert ttft[kind] == pytest.approx(expected, rel=1e-12), kind
        transfer = result.summary["disaggregation"]["transfer_s"]["max"]
        assert transfer == pytest.approx(link.seconds(nbytes), rel=1e-12)
    nv = H100.interconnect
    hand = (nbytes / 12.5e9 + 10e-6) - (nbytes / (nv.bandwidth_Bps * nv.efficiency) + nv.latency_s)
    assert ttft["ethernet"] - ttft["nvlink"] == pytest.approx(hand / tp, rel=1e-3 if tp == 1 else 1e-2)
    assert ttft["nvlink"] < ttft["pcie"] < ttft["infiniband"] < ttft["ethernet"]
    if tp == 1:
        assert ttft["ethernet"] - ttft["nvlink"] == pytest.approx(0.02011, rel=1e-3)


def test_engine_handoff_latency_adds_to_an_isolated_requests_ttft_and_frees_the_prefill_side_first() -> None:
    """``engine.handoff_latency_s`` (the transfer's set-up and completion notice): one 2,000-token
    prompt's TTFT is its prefill + the link's time + the hand-off, to the float; the prefill
    replica releases the prompt's KV when its last byte leaves (the transfer's start + its link
    time), not when the decode side learns of it; every later token keeps its decode-step gaps."""
    prompt, handoff = 2000, 0.075
    prefill = CostModel(LLAMA, H100).step_time(BatchShape.prefill(prompt))
    ttft, itl = {}, {}
    for latency in (0.0, handoff):
        config = experiment(policy=disaggregated(link={"kind": "infiniband"}),
                            engine={"name": "vllm-v0", "handoff_latency_s": latency})
        link = resolve_topology(config).link
        result = tabulate(run(config, table([0.0], prompt, 8)))
        ttft[latency] = float(result.requests["ttft_s"].iloc[0])
        itl[latency] = result.itl["itl_s"].to_numpy()
        transfer = result.summary["disaggregation"]["transfer_s"]["max"]
        assert transfer == pytest.approx(link.seconds(prompt * KV_PER_TOKEN), rel=1e-12)
        assert ttft[latency] == pytest.approx(prefill + link.seconds(prompt * KV_PER_TOKEN) + latency,
                                              rel=1e-12)
    assert ttft[handoff] - ttft[0.0] == pytest.approx(handoff, rel=1e-9)
    np.testing.assert_allclose(itl[handoff], itl[0.0], rtol=1e-12)


def test_each_engine_ships_a_fitted_handoff_latency() -> None:
    """The serving engines' hand-off latencies come from their fit (configs/engines/*.yaml, with
    provenance); vLLM V0 and the bare cost model have none."""
    from servesim.engines import make_engine

    for name in ("sglang", "trtllm"):
        cpu = make_engine(name, {}).cpu("b200")
        assert 0.0 < cpu.handoff_s <= 0.3, name
        assert "hand-off" in cpu.provenance, name
    assert make_engine("vllm-v0", {}).cpu("h100-sxm-80gb").handoff_s == 0.0


@pytest.mark.parametrize("channels", [1, 2])
def test_two_transfers_share_a_one_channel_link_in_turn(channels: int) -> None:
    """Two identical prompts arriving together are prefilled in one step and both ask the link
    for a channel at the same instant. With one channel the second waits out the first: its copy
    ends at 2T after the prefill, T = latency + bytes / bandwidth; with two they end together."""
    prompt = 4000
    config = experiment(policy=disaggregated(link={"kind": "ethernet", "channels": channels}))
    result = run(config, table([0.0, 0.0], prompt, 4))
    r = result.request_state
    copy = resolve_topology(config).link.seconds(prompt * KV_PER_TOKEN)
    assert copy == pytest.approx(4000 * 131072 / 12.5e9 + 10e-6)  # 41.95 ms
    assert r.prefill_end[0] == r.prefill_end[1] == r.transfer_queued[0] == r.transfer_queued[1]
    after = np.sort(r.transfer_end - r.prefill_end)
    waits = np.sort(r.transfer_start - r.transfer_queued)
    if channels == 1:
        assert after == pytest.approx([copy, 2 * copy], rel=1e-12)
        assert waits == pytest.approx([0.0, copy], abs=1e-12)
    else:
        assert after == pytest.approx([copy, copy], rel=1e-12)
        assert waits == pytest.approx([0.0, 0.0], abs=1e-12)
    summary = tabulate(result).summary["disaggregation"]
    assert summary["link"]["busy_s"] == pytest.approx(2 * copy, rel=1e-12)
    assert summary["link"]["bytes"] == 2 * prompt * KV_PER_TOKEN


def test_decode_side_waits_for_room_before_the_copy() -> None:
    """The decode replica reserves blocks before the copy starts. Its 80 blocks hold one request
    at a time (1,000 + 199 tokens = 75 blocks at the end; a second prompt's 63 do not fit beside
    it), so each copy is queued exactly when the previous request finishes decoding, and the
    prefill replica holds the waiting KV meanwhile: the third prompt's prefill step, at 0.5 s,
    finds 63 blocks of the second's still in use beside its own 63."""
    config = experiment(policy=disaggregated(decode={"num_gpu_blocks": 80}))
    result = run(config, table([0.0, 0.0, 0.5], 1000, 200))
    r = result.request_state
    order = np.argsort(r.transfer_queued)
    first, second, third = order
    assert r.transfer_queued[first] == r.prefill_end[first]
    assert r.transfer_queued[second] == r.finish[first] > 0.5
    assert r.transfer_queued[third] == r.finish[second]
    tables = tabulate(result)
    assert tables.summary["completed"] == 3
    assert tables.summary["disaggregation"]["decode_wait_s"]["max"] == pytest.approx(
        r.finish[second] - r.prefill_end[third], rel=1e-12)
    prefill_steps = tables.steps[tables.steps["pool"] == "prefill"]
    assert list(prefill_steps["kv_blocks_used"]) == [126, 126]
    assert list(prefill_steps["start_s"])[1] == 0.5


def test_per_pool_hardware_prices_each_pool_on_its_own_gpu() -> None:
    """Splitwise's split: prefill on H100, decode on A100. Each pool's KV pool comes from its own
    memory plan, and each step is priced by its own pool's cost model."""
    a100 = load_hardware("a100-sxm-80gb")
    config = experiment(policy=disaggregated(decode={"hardware": "a100-sxm-80gb"}, link={"kind": "pcie"}))
    deployment = resolve_topology(config)
    assert deployment.decode.limits.num_blocks == plan_memory(LLAMA, a100, 1, max_num_batched_tokens=8192
                                                              ).num_blocks(16)
    assert deployment.link.bandwidth_Bps == min(H100.host_link.bandwidth_Bps, a100.host_link.bandwidth_Bps)
    tables = tabulate(run(config, table([0.0], 500, 3)))
    steps = tables.steps
    assert list(steps["pool"]) == ["prefill", "decode", "decode"]
    assert steps["duration_s"].iloc[0] == CostModel(LLAMA, H100).step_time(BatchShape.prefill(500))
    a100_cost = CostModel(LLAMA, a100)
    assert list(steps["duration_s"].iloc[1:]) == [a100_cost.step_time(BatchShape.decode(1, 500 + k))
                                                  for k in range(2)]
    pools = tables.summary["disaggregation"]["pools"]
    assert pools["decode"]["hardware"] == "a100-sxm-80gb" and pools["prefill"]["hardware"] == "h100-sxm-80gb"
    assert tables.summary["deployment"]["gpus"] == 2


def test_one_token_output_completes_when_its_kv_lands() -> None:
    config = experiment(policy=disaggregated())
    result = run(config, table([0.0], 300, 1))
    r = result.request_state
    assert r.status[0] == DONE and r.finish[0] == r.first_token[0] == r.transfer_end[0]
    assert all(s.pool.free == s.pool.total for s in result.replica_states)


def test_request_that_never_fits_the_decode_pool_is_rejected() -> None:
    """The prefill pool holds only the prompt (40 blocks of 16 fit 600 tokens); the decode pool
    must hold prompt + all outputs but the last: 600 + 99 tokens need 44 blocks > 40."""
    config = experiment(policy=disaggregated(decode={"num_gpu_blocks": 40}))
    result = run(config, table([0.0, 0.0], [600, 600], [100, 41]))
    r = result.request_state
    assert list(r.status) == [REJECTED, DONE]
    assert REJECT_REASONS[r.reject_reason[0]].endswith("a decode replica's pool holds")
    assert r.reject_reason[0] == DECODE_KV_NEVER_FITS


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 40), prefill_replicas=st.integers(1, 2),
       decode_replicas=st.integers(1, 2), prefill_blocks=st.integers(20, 200),
       decode_blocks=st.integers(20, 200), channels=st.integers(1, 2),
       max_num_seqs=st.integers(1, 8), router=st.sampled_from(["least_kv", "round_robin"]))
def test_conservation_every_request_completes_or_is_rejected(
        seed: int, n: int, prefill_replicas: int, decode_replicas: int, prefill_blocks: int,
        decode_blocks: int, channels: int, max_num_seqs: int, router: str) -> None:
    """Small KV pools force decode-side waits, preemptions and rejections; still every request
    completes with all its tokens or is rejected, every block on both sides is free at the end,
    and each request's timestamps run in order: prefill, reservation, copy, first token."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 2, n))
    prompts, outputs = rng.integers(1, 2000, n), rng.integers(1, 300, n)
    config = experiment({"max_num_seqs": max_num_seqs}, policy=disaggregated(
        prefill={"replicas": prefill_replicas, "num_gpu_blocks": prefill_blocks},
        decode={"replicas": decode_replicas, "num_gpu_blocks": decode_blocks, "router": router},
        link={"kind": "ethernet", "channels": channels}))
    result = run(config, table(arrivals, prompts, outputs))
    r = result.request_state
    assert np.all((r.status == DONE) | (r.status == REJECTED))
    assert all(s.pool.free == s.pool.total for s in result.replica_states)
    assert all(s.running.size == 0 and not s.waiting for s in result.replica_states)
    done = r.status == DONE
    assert np.array_equal(r.generated[done], r.output[done])
    assert np.all(r.prefill_end[done] <= r.transfer_queued[done])
    assert np.all(r.transfer_queued[done] <= r.transfer_start[done])
    assert np.all(r.transfer_start[done] < r.transfer_end[done])
    assert np.array_equal(r.first_token[done], r.transfer_end[done])
    assert np.all(r.replica[done] < prefill_replicas) and np.all(r.decode_replica[done] >= prefill_replicas)
    tables = tabulate(result)
    assert tables.summary["unfinished"] == 0
    assert tables.summary["disaggregation"]["link"]["transfers"] == int(done.sum())


@pytest.mark.parametrize(("policy", "field", "fix"), [
    (disaggregated(prefill={"tpp": 2}), "policy.prefill.tpp", "use one of: replicas, tp"),
    (disaggregated(decode={"replicas": 0}), "policy.decode.replicas", "fix the value"),
    (disaggregated(link={"kind": "smoke-signals"}), "policy.link.kind", "fix the value"),
    (disaggregated(decode={"policy": "fastest"}), "policy.decode.policy.name", "continuous"),
    (disaggregated(decode={"policy": {"name": "continuous", "speed": 2}}), "policy.decode.policy.speed",
     "remove it"),
    (disaggregated(prefill={"policy": "disaggregated"}), "policy.prefill.policy", "per-replica"),
    (disaggregated(decode={"router": "psychic"}), "policy.decode.router", "least_kv"),
    (disaggregated(decode={"tp": 3}), "policy.decode.tp", "TP degree"),
    (disaggregated(decode={"num_gpu_blocks": 10**9}), "policy.decode.num_gpu_blocks", "use at most"),
    (disaggregated(decode={"hardware": "tpu-v9"}), "policy.decode.hardware", ""),
    (disaggregated(link={"bandwidth_Bps": -1}), "policy.link.bandwidth_Bps", "fix the value"),
    (disaggregated(unknown=1), "policy.unknown", "use one of: prefill, decode, link"),
])
def test_bad_pool_layout_is_one_line_naming_the_key(policy: dict, field: str, fix: str) -> None:
    with pytest.raises(ServesimError) as error:
        resolve_topology(experiment(policy=policy))
    message = str(error.value)
    assert message.startswith(f"{field}:"), message
    assert fix in message and "\n" not in message


def test_pools_are_sized_by_the_policy_not_deployment_replicas() -> None:
    with pytest.raises(ServesimError, match=r"^deployment.replicas: .*policy.prefill.replicas"):
        resolve_topology(experiment({"replicas": 2}, policy=disaggregated()))
    with pytest.raises(ServesimError, match=r"^policy.link.kind: l40s.* has no NVLink"):
        resolve_topology(experiment(policy=disaggregated(link={"kind": "nvlink"}), hardware="l40s"))
    with pytest.raises(ServesimError, match=r"^policy.name: unknown policy .*disaggregated"):
        resolve_topology(experiment(policy={"name": "disagregated"}))


def test_cli_runs_quickstart_disaggregated_with_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = servesim("run", "quickstart", "--set",
                      "policy={name: disaggregated, prefill: {replicas: 1}, decode: {replicas: 1}}",
                      "--set", "workload.num_requests=200", "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    assert "KV transfers: 200" in result.stdout and "decode: 1 x 1" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 200 and summary["deployment"]["gpus"] == 2
    assert summary["disaggregation"]["pools"]["prefill"]["kv"]["blocks_in_use_at_end"] == 0
    assert summary["kv"]["blocks_in_use_at_end"] == 0
    assert (out / "report.html").stat().st_size > 10_000
    assert "replica 1 (decode)" in (out / "report.html").read_text()
    again = servesim("run", str(out / "config.resolved.yaml"), "--out", str(tmp_path / "again"), "--quiet")
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["ttft_s"] == summary["ttft_s"]


def test_a_hybrid_models_recurrent_state_crosses_the_link_with_its_kv() -> None:
    """Qwen3-Next: a prompt's KV (12 full-attention layers x 2 x 2 heads x 256 x 2 bytes = 24 KiB
    per token) plus the request's recurrent state (36 linear layers x (32 x 128 x 128 + 8,192 x 3)
    x 2 bytes, all shards) cross the link, timed by the link's own formula."""
    model = load_model("qwen3-next-80b-a3b")
    state = 36 * (32 * 128 * 128 + 8192 * 3) * 2
    assert model.linear_state_bytes(1) == state
    config = experiment({"tp": 4}, model="qwen3-next-80b-a3b",
                        policy=disaggregated(link={"kind": "ethernet"}))
    deployment = resolve_topology(config)
    assert deployment.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2
    prompt = 1000
    result = tabulate(run(config, table([0.0], prompt, 8)))
    transfer = result.summary["disaggregation"]["transfer_s"]["max"]
    assert transfer == pytest.approx(deployment.link.seconds(prompt * 24_576 + state), rel=1e-12)
