"""The inlined pricing paths give the general path's floats, bit for bit.

``CostModel._gemm`` and ``_elementwise`` evaluate :func:`~servesim.cost.roofline.roofline`'s
expressions inline (the GEMM tokens curve and depth factor remembered), ``_OpColumns.of`` reads
each operator's ``roofline_s``, ``time_s`` and ``bound`` without the properties, and
``DecodeRunPricer._price_one`` (now used for up to ``SCALAR_ROWS`` missing rows) reads each
attention kind's constants from a tuple. Each is compared here with the general formula it
replaces on random shapes over dense, MoE, MLA, TP > 1 and FP8 deployments. Tolerance zero.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost.roofline import OpCost, padded_rows, roofline
from servesim.cost.step_cost import IO_BYTES, OP_CLASS_OF, _OpColumns
from servesim.dtypes import DType, Precision
from servesim.engines import make_engine

FP8 = Precision(weight=DType.FP8, activation=DType.FP8, kv_cache=DType.FP8)
DEPLOYMENTS = [
    ("llama-3-8b", "h100-sxm-80gb", 1, "vllm", None),  # dense
    ("codellama-34b", "a100-sxm-80gb", 2, "vllm", None),  # the core benchmark's, TP 2
    ("llama-3-8b", "h100-sxm-80gb", 2, "vllm", FP8),  # FP8: input quantisation
    ("llama-3-8b", "l4", 1, "vllm", None),  # KV tiles of one key
    ("gemma-3-27b", "a100-sxm-80gb", 2, "vllm", None),  # sliding and full layers
    ("qwen3-30b-a3b", "h200-sxm-141gb", 2, "sglang", FP8),  # MoE, FP8
    ("deepseek-v3", "h200-sxm-141gb", 8, "sglang", None),  # MLA, MoE, TP 8
]
IDS = [f"{d[0]}-{d[1]}-tp{d[2]}-{'fp8' if d[4] else 'bf16'}" for d in DEPLOYMENTS]


def cost_model(model: str, hardware: str, tp: int, engine: str, precision: Precision | None
               ) -> CostModel:
    hw = load_hardware(hardware)
    runtime = make_engine(engine, {}).runtime(hw.name, tp=tp, hbm_bytes=hw.memory.capacity_bytes)
    return CostModel(load_model(model), hw, tp, precision, runtime=runtime)


def general_gemm(cost: CostModel, name: str, m: float, k: int, n: int, repeat: float,
                 weight_bytes: float | None = None, sixteen_bit: bool = False) -> OpCost:
    """``CostModel._gemm`` as it was, through ``roofline``."""
    if m <= 0:
        return OpCost(name, 0.0, 0.0, 0.0, 0.0, 0.0)
    in_bytes = IO_BYTES if sixteen_bit else cost._act_bytes
    if weight_bytes is None:
        weight_bytes = k * n * (IO_BYTES if sixteen_bit else cost._weight_bytes)
    nbytes = weight_bytes + m * k * in_bytes + m * n * IO_BYTES
    eff = cost._gemm16_eff if sixteen_bit else cost._gemm_eff
    rows = padded_rows(m, eff.row_tile)  # the FP8 class pads to CUTLASS's 256-row granules
    op = roofline(name, 2.0 * m * k * n, nbytes,
                  peak_flops=cost.bf16_peak if sixteen_bit else cost.peak_flops,
                  bandwidth=cost.bandwidth, eff=eff, compute_axis=rows, outputs=rows * n, depth=k,
                  repeat=repeat, useful=m / rows if rows else 1.0)
    if in_bytes >= IO_BYTES:
        return op
    return replace(op, side_s=repeat * cost._quantise_s(m, k))


def general_elementwise(cost: CostModel, name: str, elements: float, tokens: float, kernels: float,
                        repeat: float) -> OpCost:
    """``CostModel._elementwise`` as it was, through ``roofline``."""
    return roofline(name, 0.0, elements * IO_BYTES, peak_flops=cost.bf16_peak,
                    bandwidth=cost.bandwidth, eff=cost._elem_eff, compute_axis=tokens,
                    repeat=repeat, kernels=kernels)


def same(a: OpCost, b: OpCost) -> None:
    assert a == b, (a, b)  # every field, floats compared exactly


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=IDS)
def test_inlined_operators_are_the_roofline_operators(deployment: tuple) -> None:
    cost = cost_model(*deployment)
    rng = np.random.default_rng(7)
    for _ in range(400):
        m = float(rng.integers(0, 20_000)) if rng.random() < 0.8 else float(rng.integers(1, 64))
        k, n = int(rng.integers(16, 30_000)), int(rng.integers(16, 160_000))
        repeat = float(rng.integers(1, 96))
        sixteen = bool(rng.random() < 0.3)
        weights = float(rng.integers(1, 1 << 30)) if rng.random() < 0.2 else None
        for _twice in range(2):  # the second time from the remembered curve values
            same(cost._gemm("mlp", m, k, n, repeat, weights, sixteen),
                 general_gemm(cost, "mlp", m, k, n, repeat, weights, sixteen))
        elements = float(rng.integers(0, 1 << 34)) * float(rng.random() < 0.95)
        tokens, kernels = float(rng.integers(1, 20_000)), float(rng.integers(1, 7))
        same(cost._elementwise("elementwise", elements, tokens, kernels, repeat),
             general_elementwise(cost, "elementwise", elements, tokens, kernels, repeat))


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=IDS)
def test_columns_are_the_operators_properties(deployment: tuple) -> None:
    cost = cost_model(*deployment)
    for tokens in (1, 7, 64, 333, 2048, 8191):
        ops = tuple(cost._token_ops(float(tokens), float(max(1, tokens // 3))))
        ops += (OpCost("attn_decode", 1.0, 2.0, 3.0, 3.0, 0.5), OpCost("o_proj", 0.0, 0.0, -0.0, 0.0, 0.0))
        columns = _OpColumns.of(ops)
        assert columns.times == tuple(op.time_s for op in ops)
        assert columns.compute == tuple(op.roofline_s for op in ops if op.bound == "compute")
        assert columns.memory == tuple(op.roofline_s for op in ops if op.bound == "memory")
        assert columns.side == tuple(op.side_s for op in ops)
        assert columns.fixed == tuple(op.fixed_s for op in ops)
        assert columns.flops == tuple(op.flops for op in ops)
        assert columns.nbytes == tuple(op.bytes for op in ops)
        assert columns.gemm == tuple(op.time_s for op in ops if OP_CLASS_OF[op.name] == "gemm")
        assert columns.elementwise == tuple(op.time_s for op in ops
                                            if OP_CLASS_OF[op.name] == "elementwise")


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=IDS)
def test_scalar_run_rows_are_the_vectorised_rows(deployment: tuple) -> None:
    cost = cost_model(*deployment)
    rng = np.random.default_rng(11)
    for n in (1, 3, 17, 64, 300):
        pricer = cost._decode_run_pricer(n)
        kinds = len(pricer._kinds)
        keys = [rng.integers(n, n * 9000, 40).astype(np.float64) for _ in range(kinds)]
        vectorised = pricer._price(keys, 40)
        scalar = np.array([pricer._price_one(tuple(float(k[j]) for k in keys)) for j in range(40)])
        assert vectorised.tobytes() == scalar.tobytes()


KEY_BY_KEY = [
    ("llama-3-8b", "l4", 1, "vllm", None),  # KV tiles of one key
    ("qwen3-30b-a3b", "l4", 2, "sglang", FP8),
    ("codellama-34b", "l40s", 2, "vllm-v0", None),
]


@pytest.mark.parametrize("deployment", KEY_BY_KEY, ids=[f"{d[0]}-{d[1]}-tp{d[2]}" for d in KEY_BY_KEY])
def test_key_by_key_runs_are_the_per_step_records(deployment: tuple) -> None:
    """Runs of one full-attention kind read key by key count their keys in Python ints
    (``DecodeRunPricer._sum_keys``): each row is the step's own record, memo hit or not."""
    cost = cost_model(*deployment)
    assert cost.hardware.efficiency.attention_decode.key_tile == 1
    rng = np.random.default_rng(5)
    for _ in range(60):
        n = int(rng.integers(1, 80))
        context = rng.integers(0, 12_000, n)
        first, steps = int(rng.integers(0, 40)), int(rng.integers(1, 60))
        runs = cost.decode_run_records(context, steps, first)
        assert runs is not None
        assert cost._run_pricers[n]._sum_keys
        per_step = np.array([cost.step_record(BatchShape.decodes_only(context + j))
                             for j in range(first, first + steps)])
        assert runs.tobytes() == per_step.tobytes()
