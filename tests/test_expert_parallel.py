"""Expert parallelism and data-parallel attention: the bytes of a dispatch, the links it crosses,
the busiest expert rank under skew, the slowest data-parallel rank, and their memory."""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_helpers import experiment, run, table

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost.expert_parallel import (
    ExpertLayer,
    all_to_all_bytes,
    remote_ranks_per_token,
    zipf_imbalance,
)
from servesim.dtypes import Precision
from servesim.engines import RuntimeCosts
from servesim.errors import ServesimError
from servesim.parallelism import Parallelism, placement
from servesim.topology.resolve import resolve_topology

DEEPSEEK = load_model("deepseek-v3")
MIXTRAL = load_model("mixtral-8x7b")
H200 = load_hardware("h200-sxm-141gb")
H100 = load_hardware("h100-sxm-80gb")
FP8 = Precision.from_names("fp8", "fp8", "fp8")
KERNELS = RuntimeCosts.none()


def layer(model, hardware, precision: Precision = FP8, **degrees: object) -> ExpertLayer:
    p = Parallelism(**degrees)  # type: ignore[arg-type]
    return ExpertLayer(model, hardware, p, placement(hardware, p), precision, precision.expert_weight_bytes)


# ---------------------------------------------------------------------- bytes of a dispatch
def test_an_all_to_all_sends_the_routed_rows_bound_for_other_gpus() -> None:
    # 1,000 (token, expert) pairs leave a GPU; with 8 expert ranks 7/8 of them go elsewhere, each a
    # 7168-wide fp8 row: 1000 x 7/8 x 7168 x 1 B
    assert all_to_all_bytes(1000, 7168, 1.0, 8) == 6_272_000
    assert all_to_all_bytes(1000, 7168, 1.0, 1) == 0
    # DeepEP's low-latency kernels send exactly that per GPU: DP8 x EP8, 800 tokens in all, each
    # GPU dispatches 100 tokens x top-8 = 800 pairs
    ll = layer(DEEPSEEK, H200, tp=1, dp=8, ep=8, all2all_backend="deepep_low_latency")
    dispatch, combine = ll.dispatch_bytes(800)
    assert dispatch == all_to_all_bytes(800, 7168, 1.0, 8) == 800 * 7 / 8 * 7168
    assert combine == 2 * dispatch  # outputs come back in 16 bits


def test_high_throughput_kernels_send_a_token_once_per_remote_gpu_holding_its_experts() -> None:
    # a rank (32 of 256 experts) misses all 8 of a token's experts with probability
    # C(224, 8) / C(256, 8) = 0.33817, so 7 x (1 - 0.33817) = 4.633 remote ranks get a copy
    assert remote_ranks_per_token(256, 8, 8) == pytest.approx(4.632820500, rel=1e-9)
    assert remote_ranks_per_token(256, 8, 8) == pytest.approx(7 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    ht = layer(DEEPSEEK, H200, tp=1, dp=8, ep=8, all2all_backend="deepep_high_throughput")
    assert ht.dispatch_bytes(800)[0] == pytest.approx(100 * 4.632820500 * 7168, rel=1e-9)


def test_vllms_default_gathers_every_token_onto_every_gpu() -> None:
    # allgather_reducescatter: each of 8 GPUs receives the other 7 GPUs' 100 tokens with their
    # hidden states (bf16) and router logits (256 x fp32), and reduce-scatters the outputs back
    ag = layer(DEEPSEEK, H200, tp=1, dp=8, ep=8)
    assert ag.dispatch_bytes(800) == (700 * (7168 * 2 + 256 * 4), 700 * 7168 * 2)
    link = H200.interconnect
    seconds = ag.exchange_s(700 * 7168 * 2)
    assert seconds == pytest.approx(link.latency_s + 700 * 7168 * 2 / (link.bandwidth_Bps * link.efficiency))


def test_a_dispatch_over_two_nodes_pays_infiniband_for_the_peers_outside() -> None:
    # DP16 x EP16 on two 8-GPU nodes: of a GPU's 15 peers 7 share its NVLink domain, 8 do not;
    # the two paths run at once and the slower (InfiniBand, 50 GB/s) sets the time
    two_nodes = layer(DEEPSEEK, H200, tp=1, dp=16, ep=16, all2all_backend="deepep_low_latency")
    nbytes = 1e8
    nv, ib = H200.all_to_all, H200.scale_out  # NVLink as NCCL's alltoall achieves it (fitted)
    assert ib is not None and nv is not None
    inside = nv.latency_s + nbytes * 7 / 15 / (nv.bandwidth_Bps * nv.efficiency)
    outside = ib.latency_s + nbytes * 8 / 15 / (ib.bandwidth_Bps * ib.efficiency)
    assert two_nodes.exchange_s(nbytes) == pytest.approx(max(inside, outside))
    assert inside < outside
    one_node = layer(DEEPSEEK, H200, tp=1, dp=8, ep=8, all2all_backend="deepep_low_latency")
    alone = nv.latency_s + nbytes / (nv.bandwidth_Bps * nv.efficiency)
    assert one_node.exchange_s(nbytes) == pytest.approx(alone)


# ---------------------------------------------------------------------- the busiest expert rank
def test_zipf_skew_with_one_expert_per_rank_is_the_top_experts_share() -> None:
    # 4 experts on 4 ranks, top-1, popularity 1/j: the busiest rank holds expert 1 with share
    # 1 / (1 + 1/2 + 1/3 + 1/4) = 12/25, against a mean of 1/4: imbalance 48/25
    assert zipf_imbalance(4, 1, 4, 1.0) == pytest.approx(48 / 25)
    assert zipf_imbalance(256, 8, 8, 1e-9) == pytest.approx(1.0, abs=1e-6)  # no skew
    skewed = zipf_imbalance(256, 8, 8, 1.0)
    assert 1.0 < skewed < 8.0 and zipf_imbalance(256, 8, 8, 1.0) == skewed  # same on every call
    assert skewed == pytest.approx(1.90, abs=0.005)  # the README's figure for DeepSeek-V3 at EP8
    config = experiment({"tp": 1, "dp": 8, "ep": 8, "expert_routing": {"zipf": 1.0}}, engine="vllm-v0",
                        model="deepseek-v3", hardware="h200-sxm-141gb",
                        precision={"weights": "fp8", "activations": "fp8"})
    group = resolve_topology(config).groups[0]
    assert group.parallelism.expert_imbalance == skewed
    assert group.describe()["expert_imbalance"] == skewed


def test_the_busiest_rank_sets_the_expert_time() -> None:
    uniform = layer(DEEPSEEK, H200, tp=1, dp=8, ep=8)
    skewed = layer(DEEPSEEK, H200, tp=1, dp=8, ep=8, expert_imbalance=1.5)
    tokens = 8 * 512
    assert uniform.assignments(tokens) == tokens * 8 / 8
    assert skewed.assignments(tokens) == 1.5 * uniform.assignments(tokens)
    eff = H200.efficiency.gemm
    a, b = uniform.gemms(tokens, 58, eff), skewed.gemms(tokens, 58, eff)
    assert b.flops == pytest.approx(1.5 * a.flops)
    # every one of the 32 local experts is hit at 4,096 tokens, so the busiest rank runs
    # 6,144 rows = 192 per expert through 58 layers of (7168 x 6144 up, 2048 x 7168 down) GEMMs,
    # each on the fp8 peak at the GEMM curve's efficiency for 192 rows
    flops = 2 * 6144 * 7168 * (2 * 2048 + 2048) * 58
    assert b.flops == pytest.approx(flops)
    assert b.compute_s == pytest.approx(flops / (H200.peak_flops[FP8.math] * eff.compute.at(192)))
    assert b.time_s > a.time_s  # bigger GEMMs run closer to peak, so less than 1.5x


def test_expert_parallelism_inside_a_tp_group_changes_shapes_not_traffic() -> None:
    tp8 = CostModel(MIXTRAL, H100, 8, runtime=KERNELS)
    ep8 = CostModel(MIXTRAL, H100, 8, runtime=KERNELS, parallelism=Parallelism(tp=8, ep=8))
    batch = BatchShape.decode(64, 1000)
    a, b = tp8.step(batch), ep8.step(batch)
    assert a.breakdown["communication"] == b.breakdown["communication"]  # the same all-reduces
    assert a.flops == pytest.approx(b.flops, rel=1e-9)  # same arithmetic, split differently
    assert a.breakdown["moe"] != b.breakdown["moe"]


# ---------------------------------------------------------------------- data-parallel attention
def test_the_slowest_rank_sets_the_stage_and_the_others_wait_in_communication() -> None:
    config = experiment({"tp": 1, "dp": 2, "ep": 2}, engine="vllm-v0", model="mixtral-8x7b")
    group = resolve_topology(config).groups[0]
    cost = group.parallel_cost_model()
    long, short = BatchShape.prefill(2000), BatchShape.decode(8, 500)
    priced = cost.price([long, short])
    stage = cost.stages[0]
    a, b = stage.step_record(long), stage.step_record(short)
    ops, comm = stage.moe_part(2000 + 8)  # the experts see both ranks' tokens
    shared = sum(op.time_s for op in ops) + comm
    assert priced.stage_s[0] == pytest.approx(max(a.time_s, b.time_s) + shared, rel=1e-12)
    fast = priced.ranks[1]
    assert fast is not None and fast.time_s == pytest.approx(priced.time_s)
    assert fast.communication_s == pytest.approx(b.communication_s + comm + a.time_s - b.time_s)
    # an idle rank runs nothing of its own, and the step still waits for the busy one
    alone = cost.price([long, None])
    assert alone.ranks[1] is None and alone.stage_s[0] < priced.stage_s[0]


def test_dp_ranks_step_together_with_their_own_queues_and_kv() -> None:
    config = experiment({"tp": 1, "dp": 2, "ep": 2}, engine="vllm-v0", model="mixtral-8x7b")
    result = run(config, table([0.0, 0.0], [2000, 100], 3))
    steps = result.steps
    assert sorted(steps["replica"].unique()) == [0, 1]  # round robin: one request per rank
    first = steps.groupby("start_s")
    # the first step runs both prefills together; both ranks log the same (synchronised) duration
    durations = first["duration_s"].nunique()
    assert (durations == 1).all()
    requests = result.requests
    assert requests["ttft_s"].iloc[0] == pytest.approx(requests["ttft_s"].iloc[1])
    states = result.replica_states
    assert states[0].pool is not states[1].pool and states[0].pool.total == states[1].pool.total


def test_dp_attention_gives_each_rank_a_kv_pool_while_tp_replicates_mla_latents() -> None:
    """DeepSeek's reason for DP attention: MLA caches one latent per token that every TP rank
    replicates, so TP8 holds one GPU's worth of KV; DP8 holds eight independent pools."""
    base = {"max_model_len": 16384, "max_num_batched_tokens": 16384}
    precision = {"weights": "fp8", "activations": "fp8", "kv_cache": "fp8"}
    tp8 = resolve_topology(experiment({**base, "tp": 8}, engine="vllm-v0", model="deepseek-v3",
                                      hardware="h200-sxm-141gb", precision=precision)).groups[0]
    dp8 = resolve_topology(experiment({**base, "tp": 1, "dp": 8, "ep": 8}, engine="vllm-v0",
                                      model="deepseek-v3", hardware="h200-sxm-141gb",
                                      precision=precision)).groups[0]
    assert tp8.memory.kv_bytes_per_token == dp8.memory.kv_bytes_per_token == 576 * 61  # fp8 latent
    # DP8 replicates the attention and dense weights on every GPU, EP8 splits the experts
    m = DEEPSEEK
    experts = m.routed_expert_params / 8
    others = m.param_count - m.routed_expert_params - m.embedding_params - m.lm_head_params \
        - m.norm_params - m.num_moe_layers * m.router_params
    sixteen_bit = m.embedding_params + m.lm_head_params + m.norm_params + m.num_moe_layers * m.router_params
    assert dp8.memory.weight_bytes == pytest.approx(experts + others + 2 * sixteen_bit, rel=1e-9)
    assert dp8.units == 8 and tp8.units == 1
    total_dp8 = dp8.units * dp8.limits.num_blocks
    assert total_dp8 > 2 * tp8.limits.num_blocks


def test_expert_layouts_are_checked_with_one_line_that_suggests_values() -> None:
    cases = [
        ({"tp": 1, "dp": 8, "ep": 4}, r"^deployment\.ep: 4 with tp 1 x dp 8: .* use ep 1 or 8"),
        ({"tp": 8, "ep": 3}, r"^deployment\.ep: 3 does not divide tp 8.*use one of 1, 2, 4, 8"),
        ({"tp": 8, "all2all_backend": "deepep_low_latency"},
         r"^deployment\.all2all_backend: deepep_low_latency dispatches tokens .* no data-parallel ranks"),
        ({"tp": 8, "expert_routing": {"imbalance": 1.3}}, r"^deployment\.expert_routing: load imbalance"),
        ({"tp": 1, "dp": 8, "ep": 8, "expert_routing": {"imbalance": 1.3, "zipf": 1.0}},
         r"^deployment\.expert_routing: gives both"),
    ]
    for deployment, message in cases:
        with pytest.raises(ServesimError, match=message):
            resolve_topology(experiment(deployment, engine="vllm-v0", model="deepseek-v3",
                                        hardware="h200-sxm-141gb",
                                        precision={"weights": "fp8", "activations": "fp8"}))


def test_tensorrt_llm_and_sglang_split_the_stage_into_expert_groups_of_tp_gpus() -> None:
    """DP 8 attention with ep 2: two expert-parallel groups of 4 GPUs (TensorRT-LLM's
    moe_expert_parallel_size 2 x moe_tensor_parallel_size 4). Each GPU holds 128 of 256 experts,
    each sliced 4 ways (2,048 / 4 = 512 intermediate columns), and runs every one of its group's
    routed rows: 4,096 tokens x top-8 / 2 = 16,384 rows over 58 MoE layers."""
    hybrid = layer(DEEPSEEK, H200, tp=1, dp=8, ep=2)
    assert (hybrid.parallelism.moe_tp, hybrid.local_experts, hybrid.local_intermediate) == (4, 128, 512)
    tokens = 4096
    assert hybrid.assignments(tokens) == tokens * 8 / 2
    flops = 2 * 16384 * 7168 * (2 * 512 + 512) * 58  # up (gate and up fused) and down, per row
    assert hybrid.gemms(tokens, 58, H200.efficiency.gemm).flops == pytest.approx(flops)
    # the tokens still reach every GPU by all-gather: the traffic of the all-expert-parallel layout
    assert hybrid.dispatch_bytes(800) == layer(DEEPSEEK, H200, tp=1, dp=8, ep=8).dispatch_bytes(800)
    for engine in ("trtllm", "sglang"):
        group = resolve_topology(experiment({"tp": 1, "dp": 8, "ep": 2}, engine=engine, model="deepseek-v3",
                                            hardware="h200-sxm-141gb",
                                            precision={"weights": "fp8", "activations": "fp8"})).groups[0]
        assert group.parallelism.moe_tp == 4
    fp8 = {"weights": "fp8", "activations": "fp8"}
    with pytest.raises(ServesimError, match=r"^deployment\.ep: 3 does not divide the stage's 8 GPUs"):
        resolve_topology(experiment({"tp": 1, "dp": 8, "ep": 3}, engine="trtllm", model="deepseek-v3",
                                    hardware="h200-sxm-141gb", precision=fp8))
    with pytest.raises(ServesimError, match=r"^deployment\.all2all_backend: deepep_low_latency sends each "
                                            r"token .* slices every expert 4 ways"):
        resolve_topology(experiment({"tp": 1, "dp": 8, "ep": 2, "all2all_backend": "deepep_low_latency"},
                                    engine="sglang", model="deepseek-v3", hardware="h200-sxm-141gb",
                                    precision=fp8))


def test_data_parallel_steps_log_their_op_classes_summing_to_the_duration() -> None:
    config = experiment({"tp": 1, "dp": 2, "ep": 2, "max_num_seqs": 16}, engine="vllm-v0",
                        model="mixtral-8x7b")
    rng = np.random.default_rng(0)
    result = run(config, table(np.sort(rng.uniform(0, 2, 30)), rng.integers(50, 800, 30), 20))
    steps = result.steps
    op_sum = steps[[c for c in steps.columns if c.startswith("op_")]].sum(axis=1)
    assert np.allclose(op_sum, steps["duration_s"] - steps["extra_s"])
    assert result.summary.completed == 30
    assert 0 <= result.summary.sections["parallelism"]["dp_wait_fraction"] < 1


def test_a_disaggregated_decode_group_can_run_data_parallel_attention() -> None:
    """DeepSeek's production layout in miniature: prompts on a TP group, decodes on DP ranks."""
    config = experiment({"kind": "disaggregated", "prefill": {"replicas": 1, "tp": 1},
                         "decode": {"replicas": 1, "tp": 1, "dp": 2, "ep": 2}, "link": {"kind": "nvlink"}},
                        engine="vllm-v0", model="mixtral-8x7b", hardware="h200-sxm-141gb")
    topology = resolve_topology(config)
    assert topology.num_gpus == 3 and topology.group_of_replica() == ["prefill", "decode", "decode"]
    result = run(config, table(np.zeros(12), 300, 8))  # together, so least_kv spreads them
    assert result.summary.completed == 12
    decode_steps = result.steps[result.steps["pool"] == "decode"]
    assert sorted(decode_steps["replica"].unique()) == [1, 2]
    assert (decode_steps["num_prefills"] == 0).all()
