"""Pipeline parallelism: the layout keys and their checks, stage costs that add up to the model, a
lone request that sees the sum of its stages plus the sends, and micro-batches that overlap."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import experiment, run, table

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.engines import RuntimeCosts
from servesim.errors import ServesimError
from servesim.parallelism import Parallelism, default_partition, stages_of
from servesim.pipeline import prepare
from servesim.topology.resolve import resolve_topology

LLAMA = load_model("llama-3-8b")
H100 = load_hardware("h100-sxm-80gb")


def pipelined(deployment: dict, **top: object):
    return experiment({"tp": 1, "pp": 2, **deployment}, engine="vllm-v0", **top)


# ---------------------------------------------------------------------- layout and checks
def test_vllm_splits_layers_evenly_and_gives_the_remainder_to_the_stages_before_the_last() -> None:
    assert default_partition(32, 2) == (16, 16)
    assert default_partition(61, 2) == (31, 30)  # DeepSeek-V3: vLLM's get_pp_indices
    assert default_partition(61, 4) == (15, 15, 16, 15)
    assert default_partition(126, 4) == (31, 32, 32, 31)
    stages = stages_of(LLAMA, Parallelism(pp=2, pp_layers=(20, 12)))
    assert [(s.start, s.stop, s.first, s.last) for s in stages] == [(0, 20, True, False),
                                                                    (20, 32, False, True)]


@pytest.mark.parametrize(("deployment", "message"), [
    ({"pp": 40}, r"^deployment\.pp: 40 stages exceed llama-3-8b's 32 layers; use at most 32"),
    ({"pp_layers": [10, 10]}, r"^deployment\.pp_layers: \[10, 10\] must be positive and sum to llama-3-8b's "
                              r"32 layers; e\.g\. \[16, 16\]"),
    ({"pp_layers": [32]}, r"^deployment\.pp_layers: lists 1 stages but pp is 2"),
    ({"tp": 64, "pp": 1}, r"^deployment\.tp: 64 does not divide llama-3-8b's 32 attention heads"),
    ({"dp": 2}, r"^deployment\.dp: llama-3-8b is dense: .* use deployment\.replicas"),
    ({"ep": 2}, r"^deployment\.ep: llama-3-8b has no experts to split"),
])
def test_layouts_are_checked_up_front_with_one_line_that_suggests_a_fix(deployment: dict,
                                                                     message: str) -> None:
    with pytest.raises(ServesimError, match=message):
        resolve_topology(pipelined(deployment))


def test_a_replica_counts_tp_x_pp_x_dp_gpus_and_one_scheduling_unit_per_virtual_engine() -> None:
    topology = resolve_topology(pipelined({"tp": 2, "pp": 2, "replicas": 3}))
    group = topology.groups[0]
    assert group.parallelism.gpus_per_replica == 4 and topology.num_gpus == 12
    assert group.units == 6 and topology.group_of_replica() == ["replicas"] * 6
    described = group.describe()
    assert described["pp"] == 2 and described["stage_layers"] == [16, 16]
    single = resolve_topology(experiment({"tp": 2}, engine="vllm-v0")).groups[0].describe()
    assert "pp" not in single  # one TP group reports what it always did


def test_each_stage_holds_its_layers_and_each_virtual_engine_half_the_blocks() -> None:
    two = resolve_topology(experiment({"tp": 1, "pp": 2}, engine="vllm-v0", model="llama-3-70b",
                                      hardware="h200-sxm-141gb")).groups[0]
    model = two.model
    h, vocab = model.hidden_size, model.vocab_size * model.hidden_size
    # Llama-3-70B's 80 layers split 40 + 40: stage 0 holds the embedding, stage 1 the final norm
    # and the LM head, so stage 1 is the tighter by one norm (h 16-bit weights) and binds
    layers = 40 * (model.attention_params_per_layer + model.dense_mlp_params) * 2.0
    stage1 = layers + (40 * 2 * h + h + vocab) * 2.0
    assert two.memory.weight_bytes == pytest.approx(stage1, rel=1e-12)
    assert two.memory.kv_bytes_per_token == model.kv_bytes_per_token("bf16") / 2
    # each of the two virtual engines gets half the blocks (vLLM V0: num_gpu_blocks // pp)
    assert two.limits.num_blocks == two.memory.num_blocks(two.limits.block_size) // 2


# ---------------------------------------------------------------------- stage costs and sends
def test_the_stages_add_up_to_the_whole_model() -> None:
    kernels = RuntimeCosts.none()
    whole = CostModel(LLAMA, H100, 1, runtime=kernels)
    p = Parallelism(pp=2)
    stages = [CostModel(LLAMA, H100, 1, runtime=kernels, parallelism=p, stage=s) for s in stages_of(LLAMA, p)]
    for batch in (BatchShape.prefill(1000), BatchShape.decode(32, 700),
                  BatchShape.build([300], [200], [100] * 8)):
        assert sum(s.step_time(batch) for s in stages) == pytest.approx(whole.step_time(batch), rel=1e-12)
    # the embedding runs on the first stage only, the LM head on the last only
    first, last = (s.step(BatchShape.decode(8, 100)).breakdown for s in stages)
    assert first["embedding"] > 0 and first["lm_head"] == 0
    assert last["embedding"] == 0 and last["lm_head"] > 0


def test_a_lone_request_sees_the_sum_of_its_stages_plus_one_send() -> None:
    config = pipelined({})
    plan = prepare(config, workload=table([0.0], 1000, 2))
    cost = plan.topology.groups[0].parallel_cost_model()
    s0, s1 = cost.stages
    # the send: hidden states and residual, 2 x 1000 x 4096 x 2 bytes over one NVLink (tp 1)
    link = H100.interconnect
    send = link.latency_s + 2 * 1000 * 4096 * 2.0 / (link.bandwidth_Bps * link.efficiency)
    assert cost.send_links == [link]
    prefill = BatchShape.prefill(1000)
    priced = cost.price([prefill])
    assert priced.send_s == (pytest.approx(send, rel=1e-12),)
    overhead = cost.overhead_s
    assert overhead == 0.0006  # vLLM V0's per-step CPU cost on H100 (engines/vllm_v0.py)
    ttft = overhead + s0.step_time(prefill) + send + s1.step_time(prefill)
    decode = BatchShape.decode(1, 1000)
    tpot = overhead + s0.step_time(decode) + s1.step_time(decode) + link.latency_s \
        + 2 * 4096 * 2.0 / (link.bandwidth_Bps * link.efficiency)
    result = run(config, table([0.0], 1000, 2))
    request = result.requests.iloc[0]
    assert request["ttft_s"] == pytest.approx(ttft, rel=1e-9)
    assert request["e2e_s"] - request["ttft_s"] == pytest.approx(tpot, rel=1e-9)
    steps = result.steps
    assert steps["extra_s"].max() == 0.0  # nothing else in flight: no stage was ever busy
    op_sum = steps[[c for c in steps.columns if c.startswith("op_")]].sum(axis=1)
    assert np.allclose(op_sum, steps["duration_s"] - steps["extra_s"])


def test_two_micro_batches_in_flight_double_decode_throughput_at_the_same_tpot() -> None:
    """One GPU holding all 32 layers decodes a batch of 32; two pipeline stages of 16 layers with
    a batch of 32 per virtual engine decode twice as many tokens per second, while each request
    still waits for both stages (and one send) per token."""
    arrivals = np.zeros(64)
    whole = run(experiment({"tp": 1, "max_num_seqs": 64}, engine="vllm-v0"), table(arrivals[:32], 16, 300))
    config = pipelined({"max_num_seqs": 64})
    piped = run(config, table(arrivals, 16, 300))

    def decode_rate(requests) -> float:
        tokens = float((requests["output_tokens"] - 1).sum())
        return tokens / float((requests["finish_s"] - requests["first_token_s"]).max())

    assert piped.steps["replica"].nunique() == 2  # both virtual engines ran
    assert decode_rate(piped.requests) / decode_rate(whole.requests) == pytest.approx(2.0, rel=0.02)
    assert piped.requests["tpot_s"].mean() == pytest.approx(whole.requests["tpot_s"].mean(), rel=0.02)
    # each micro-batch takes overhead + stage + send + stage per token, so the pipeline delivers
    # 2 x 32 tokens per such cycle: every stage busy, none waiting
    cost = prepare(config, workload=table([0.0], 16, 2)).topology.groups[0].parallel_cost_model()
    cycle = cost.price([BatchShape.decode(32, 166)]).time_s  # the run's mean context
    assert decode_rate(piped.requests) == pytest.approx(64 / cycle, rel=0.02)
    # the bubble: stage 1 also runs the LM head (128256 x 4096: about 2.4 layers' weights), so
    # stage 0 idles for the difference every cycle: 1 - (s0 + s1) / (2 s1)
    s0, s1 = cost.price([BatchShape.decode(32, 166)]).stage_s
    section = piped.summary.sections["parallelism"]
    assert s1 > s0 and section["bubble_fraction"] == pytest.approx(1 - (s0 + s1) / (2 * s1), abs=0.005)


def test_a_pipeline_over_two_nodes_sends_over_the_scale_out_network() -> None:
    model = load_model("llama-3-70b")
    p = Parallelism(tp=8, pp=2)
    from servesim.parallelism import placement
    where = placement(H100, p)
    assert where.stage_send_link(p, 0) == H100.scale_out  # GPUs 0-7 send to 8-15: other node
    inside = Parallelism(tp=4, pp=2)
    assert placement(H100, inside).stage_send_link(inside, 0) == H100.interconnect
    from servesim.cost.parallel_step import ParallelCostModel
    from servesim.dtypes import Precision
    cost = ParallelCostModel(model, H100, p, Precision(), RuntimeCosts.none())
    ib = H100.scale_out
    assert ib is not None
    tokens = 4096
    total = 2 * tokens * model.hidden_size * 2.0
    copy = ib.latency_s + total / 8 / (ib.bandwidth_Bps * ib.efficiency)
    nv = H100.interconnect
    gather = nv.latency_s + 7 / 8 * total / (nv.bandwidth_Bps * nv.efficiency)
    assert cost.price([BatchShape.prefill(tokens)]).send_s[0] == pytest.approx(copy + gather, rel=1e-12)


def test_the_fast_domain_decides_which_sends_leave_the_node() -> None:
    from servesim.parallelism import placement
    h100, gb200 = load_hardware("h100-sxm-80gb"), load_hardware("gb200-nvl72")
    # TP4 x PP4 on 8-GPU nodes: two stages per node, so only the middle send crosses InfiniBand
    p = Parallelism(tp=4, pp=4)
    links = [placement(h100, p).stage_send_link(p, s).kind for s in range(3)]
    assert links == ["nvlink", "infiniband", "nvlink"]
    # the same pipeline inside one NVL72 rack never leaves NVLink, and TP16 is one domain there
    assert {placement(gb200, p).stage_send_link(p, s).kind for s in range(3)} == {"nvlink"}
    resolve_topology(experiment({"tp": 16, "pp": 1}, engine="vllm-v0", model="llama-3.1-405b",
                                hardware="gb200-nvl72"))
    # TP16 over two 8-GPU nodes runs (multi-node TP, all-reduces over InfiniBand); without a
    # scale-out network it cannot
    resolve_topology(experiment({"tp": 16, "pp": 1}, engine="vllm-v0", model="llama-3.1-405b",
                                hardware="h100-sxm-80gb"))
    from servesim.parallelism import check_parallelism
    island = h100.model_copy(update={"scale_out": None})
    with pytest.raises(ServesimError, match=r"^deployment\.tp: tp 16 spans 2 nvlink domains of 8 GPUs on "
                                            r"h100-sxm-80gb and h100-sxm-80gb names no scale_out network"):
        check_parallelism(load_model("llama-3.1-405b"), island, Parallelism(tp=16))


@pytest.mark.parametrize(("name", "overrides", "gpus"), [
    ("deepseek-v3-h200", [], 8),
    ("deepseek-v3-h200", ["deployment.tp=1", "deployment.dp=8", "deployment.ep=8"], 8),
    ("deepseek-v3-h200", ["deployment.pp=2"], 16),
    ("deepseek-v3-h200", ["deployment.tp=1", "deployment.dp=16", "deployment.ep=16",
                          "deployment.all2all_backend=deepep_low_latency"], 16),
    ("llama-405b-h100", [], 16),
])
def test_the_readme_what_ifs_resolve(name: str, overrides: list[str], gpus: int) -> None:
    from servesim.config import load_experiment
    from servesim.resources import configs_dir
    config = load_experiment(configs_dir() / f"{name}.yaml", overrides)
    assert resolve_topology(config).num_gpus == gpus


@pytest.mark.parametrize("overlap", [True, False])
def test_data_parallel_ranks_pay_the_slowest_ranks_cpu_as_the_engine_runs_it(overlap: bool) -> None:
    """One stage, two DP ranks: each rank's CPU time follows its own batch (10 and 40 sequences at
    1 ms + 0.5 ms each: 6 ms and 21 ms); an overlapping engine hides it under the GPU step
    (``max(GPU, 21 ms)``), a serial one adds it (``GPU + 21 ms``), and the serial part is added
    last."""
    from servesim.cost.parallel_step import ParallelCostModel
    from servesim.dtypes import Precision
    model = load_model("qwen3-30b-a3b")
    runtime = RuntimeCosts(step_overhead_s=1e-3, cpu_per_seq_s=5e-4, overlap=overlap, serial_fixed_s=5e-5)
    p = Parallelism(tp=1, dp=2, ep=2)
    cost = ParallelCostModel(model, H100, p, Precision(), runtime)
    shapes = [BatchShape.decode(10, 500), BatchShape.decode(40, 500)]
    priced = cost.price(shapes)
    gpu = priced.stage_s[0]
    cpu = 1e-3 + 5e-4 * 40
    expected = (max(gpu, cpu) if overlap else gpu + cpu) + 5e-5
    assert priced.time_s == pytest.approx(expected, rel=1e-12)
    assert cpu > gpu  # the CPU bound case, so overlap shows
    kernels_only = ParallelCostModel(model, H100, p, Precision(), RuntimeCosts.none()).price(shapes)
    assert kernels_only.time_s == pytest.approx(gpu, rel=1e-12)
