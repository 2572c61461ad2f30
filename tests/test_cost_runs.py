"""The vectorised run pricing gives each step's per-step price, bit for bit.

A fast-forwarded run of pure-decode steps is priced in one NumPy computation
(``CostModel.decode_run_records``, a ``DecodeRunPricer`` per batch size): ``Curve.at_many`` /
``at``, ``decode_run_keys`` / ``decode_attention``'s key count, and the pricer's element-wise
twins of ``decode_attention_of``, ``EngineRuntime.time`` and ``CostModel._record``.
Here they are compared on random batches over every kind of deployment the cost model prices
differently: KV tiles, sliding windows, chunked attention, MoE, TP collectives, engine runtimes
with CUDA-graph padding and overlapped or serial host time, eager steps. Tolerance zero: each
element goes through the same operations in the same order as the scalar code, and the
logarithm of the efficiency curves is ``math.log`` on both sides.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost.attention import decode_attention, decode_run_keys
from servesim.engines import make_engine
from servesim.hardware import Curve

DEPLOYMENTS = [
    ("llama-3-8b", "h100-sxm-80gb", 1, "vllm-v0"),
    ("llama-3-8b", "a100-sxm-80gb", 1, "vllm"),  # KV tiles of 64
    ("codellama-34b", "a100-sxm-80gb", 2, "vllm"),  # the core benchmark's deployment
    ("llama-3-8b", "b200", 1, "sglang"),  # KV tiles of 128
    ("mistral-7b", "h100-sxm-80gb", 1, "trtllm"),  # a sliding window
    ("gemma-3-27b", "a100-sxm-80gb", 2, "vllm"),  # sliding and full layers, tiles
    ("qwen3-30b-a3b", "h200-sxm-141gb", 2, "sglang"),  # MoE
    ("llama-4-scout", "h100-sxm-80gb", 4, "vllm"),  # chunked attention, MoE
    ("deepseek-v3", "h200-sxm-141gb", 8, "sglang"),  # MLA (absorbed decode), MoE, TP 8
    ("qwen3-next-80b-a3b", "h200-sxm-141gb", 2, "vllm"),  # linear-attention layers in the token part
    ("deepseek-v3.2", "h200-sxm-141gb", 8, "vllm"),  # DSA: MLA over the top-k and the FP8 indexer
    ("nemotron-3-nano-30b-a3b", "h100-sxm-80gb", 2, "trtllm"),  # Nemotron-H: Mamba2, attention, MoE blocks
]


def cost_model(model: str, hardware: str, tp: int, engine: str, **knobs: object) -> CostModel:
    hw = load_hardware(hardware)
    runtime = make_engine(engine, knobs).runtime(hw.name, tp=tp, hbm_bytes=hw.memory.capacity_bytes)
    return CostModel(load_model(model), hw, tp, runtime=runtime)


def per_step(cost: CostModel, context: np.ndarray, first: int, steps: int) -> np.ndarray:
    return np.array([cost.step_record(BatchShape.decodes_only(context + j))
                     for j in range(first, first + steps)])


@pytest.mark.parametrize("deployment", DEPLOYMENTS,
                         ids=[f"{d[0]}-{d[1]}-tp{d[2]}-{d[3]}" for d in DEPLOYMENTS])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_run_records_are_the_per_step_records(deployment: tuple[str, str, int, str],
                                               data: st.DataObject) -> None:
    model, hardware, tp, engine = deployment
    knobs = data.draw(st.sampled_from([{}, {"enforce_eager": True}, {"async_scheduling": False},
                                       {"serial_overhead_s": 2e-4, "serial_per_seq_s": 3e-6}]
                                      if engine == "vllm" else [{}]))
    cost = cost_model(model, hardware, tp, engine, **knobs)
    n = data.draw(st.integers(1, 600))
    seed = data.draw(st.integers(0, 2**32 - 1))
    context = np.random.default_rng(seed).integers(1, data.draw(st.sampled_from([40, 3000, 20_000])), n)
    first = data.draw(st.integers(0, 5))
    steps = data.draw(st.integers(1, 300))
    fast = cost.decode_run_records(context, steps, first)
    assert fast is not None
    np.testing.assert_array_equal(fast, per_step(cost, context, first, steps))
    # Priced again from a later step: the steps already priced come from the memo, the rest fresh.
    later = first + data.draw(st.integers(0, steps))
    again = cost.decode_run_records(context, steps, later)
    np.testing.assert_array_equal(again, per_step(cost, context, later, steps))


@pytest.mark.parametrize("deployment", DEPLOYMENTS,
                         ids=[f"{d[0]}-{d[1]}-tp{d[2]}-{d[3]}" for d in DEPLOYMENTS])
@pytest.mark.parametrize("knobs", [{}, {"enforce_eager": True}, {"serial_overhead_s": 2e-4}],
                         ids=["graphs", "eager", "serial"])
def test_a_row_priced_alone_is_the_vectorised_row(deployment: tuple[str, str, int, str],
                                                  knobs: dict[str, object]) -> None:
    """``DecodeRunPricer._price_one`` (a few rows missing from the memo, in Python floats) gives
    the row ``_price`` gives, bit for bit, on random key counts of every kind of deployment."""
    model, hardware, tp, engine = deployment
    cost = cost_model(model, hardware, tp, engine, **(knobs if engine == "vllm" else {}))
    rng = np.random.default_rng(7)
    for n in (1, 3, 24, 200):
        context = rng.integers(1, 20_000, n)
        assert cost.decode_run_records(context, 1) is not None
        pricer = cost._run_pricers[n]
        kinds = len(cost._attention_groups)
        keys = [rng.integers(n, 60 * 20_000, 50).astype(np.float64) for _ in range(kinds)]
        vectorised = pricer._price(keys, 50)
        alone = np.array([pricer._price_one(tuple(k[j] for k in keys)) for j in range(50)])
        np.testing.assert_array_equal(alone, vectorised)
        ints = np.array([pricer._price_one(tuple(int(k[j]) for k in keys)) for j in range(50)])
        np.testing.assert_array_equal(ints, vectorised)  # a memo key may be an int (tile_run_keys)


def test_run_pricing_remembers_each_key_count_once() -> None:
    """With KV tiles of 64 (A100) key counts repeat: the pricer keeps one row per distinct count,
    serves repeats from it (the same rows as pricing afresh), and past its budget remembers
    nothing more while still pricing exactly."""
    cost = cost_model("codellama-34b", "a100-sxm-80gb", 2, "vllm")
    context = np.array([100, 160, 1000, 4000])
    first = cost.decode_run_records(context, 200)
    pricer = cost._run_pricers[4]
    keys = decode_run_keys(context, 0, 200, cost._attention_groups[0][0], 64)
    assert len(pricer._memo) == np.unique(keys).size < 200  # tiles make consecutive steps alike
    shifted = cost.decode_run_records(context + 37, 200)  # partly the same key counts
    np.testing.assert_array_equal(shifted, per_step(cost, context + 37, 0, 200))
    np.testing.assert_array_equal(cost.decode_run_records(context, 200), first)
    broke = cost_model("codellama-34b", "a100-sxm-80gb", 2, "vllm")
    broke._run_memo.rows = 0
    np.testing.assert_array_equal(broke.decode_run_records(context, 200), first)
    assert not broke._run_pricers[4]._memo


def test_kv_tiles_count_whole_tiles_per_request() -> None:
    """By hand: tiles of 4 over contexts 3 and 6: step 0 reads ceil(4/4) + ceil(7/4) = 1 + 2 tiles,
    step 1 (contexts 4, 7: 5 and 8 keys) 2 + 2, step 2 (6 and 9 keys) 2 + 3."""
    shape = cost_model("llama-3-8b", "h100-sxm-80gb", 1, "vllm-v0").attention
    keys = decode_run_keys(np.array([3, 6]), 0, 3, shape, tile=4)
    np.testing.assert_array_equal(keys, [12.0, 16.0, 20.0])
    windowed = replace(shape, window=5)
    window = decode_run_keys(np.array([3, 6]), 0, 3, windowed, tile=4)
    np.testing.assert_array_equal(window, [4 + 8, 8 + 8, 8 + 8])  # min(c + 1, 5) keys, whole tiles


def test_run_pricing_folds_the_engine_around_the_kernels() -> None:
    """A run's kernel time grows with the context, the engine's host time does not: with async
    scheduling the step takes max(GPU, CPU), serial it takes GPU + CPU (one step checked by hand
    against the engine's own CPU formula)."""
    overlapped = cost_model("llama-3-8b", "h100-sxm-80gb", 1, "vllm")
    serial = cost_model("llama-3-8b", "h100-sxm-80gb", 1, "vllm", async_scheduling=False)
    context = np.full(8, 1000)
    a = overlapped.decode_run_records(context, 50)
    b = serial.decode_run_records(context, 50)
    assert a is not None and b is not None
    cpu = serial.runtime.cpu_s(8, 8, 8)
    kernels = b[:, 0] - b[:, 9]  # duration minus the engine's exposed time
    np.testing.assert_allclose(b[:, 0], kernels + cpu, rtol=1e-12)
    np.testing.assert_allclose(a[:, 0], np.maximum(kernels, cpu), rtol=1e-12)
    assert (np.diff(kernels) >= 0).all()  # longer contexts, never cheaper kernels
    # a serial host term adds after the overlap, the same in every step: 0.2 ms + 8 x 3 us
    unhidden = cost_model("llama-3-8b", "h100-sxm-80gb", 1, "vllm", serial_overhead_s=2e-4,
                          serial_per_seq_s=3e-6)
    c = unhidden.decode_run_records(context, 50)
    assert c is not None
    np.testing.assert_allclose(c[:, 0], np.maximum(a[:, 0], cpu) + 2e-4 + 8 * 3e-6, rtol=1e-12)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0.0, 1e13, allow_nan=False), min_size=1, max_size=50))
def test_curve_at_many_is_at(values: list[float]) -> None:
    curve = load_hardware("a100-sxm-80gb").efficiency.attention_decode.memory
    flat = Curve.constant(0.5, "bytes")
    for c in (curve, flat, Curve(axis="bytes", x=(1e3, 1e6, 1e9), y=(0.1, 0.5, 0.8))):
        many = c.at_many(np.array(values))
        assert many.tolist() == [c.at(v) for v in values]


def test_decode_attention_of_a_run_step_is_the_batch_formula() -> None:
    """Step 7 of a run is the batch of contexts + 7, as decode_attention prices it."""
    cost = cost_model("gemma-3-27b", "a100-sxm-80gb", 2, "vllm")
    context = np.array([5, 900, 4097, 12])
    records = cost.decode_run_records(context, 10)
    assert records is not None
    batch = BatchShape.decodes_only(context + 7)
    ops = [decode_attention(batch, shape, cost.hardware, cost.bf16_peak, cost.precision.kv_bytes, count)
           for shape, count in cost._attention_groups]
    assert len(ops) == 2  # sliding and full layers, each its own kernel
    assert records[7, 6] == 0.0 + ops[0].time_s + ops[1].time_s


def test_prefill_records_are_remembered_by_their_chunks() -> None:
    """A prefill-only step's record is memoised by its chunks (tokens, earlier context, emits):
    asked again, it is the record a fresh cost model prices; a batch that differs in any of them
    is priced on its own (a later chunk of the same length reads more keys, so costs more)."""
    cost = cost_model("codellama-34b", "a100-sxm-80gb", 2, "vllm")
    prompt = BatchShape.build(prefill_tokens=[700, 300])
    chunk = BatchShape.build(prefill_tokens=[700, 300], prefill_context=[1000, 0])
    silent = BatchShape.build(prefill_tokens=[700, 300], prefill_emits=[False, True])
    first = [cost.step_record(b) for b in (prompt, chunk, silent)]
    fresh = cost_model("codellama-34b", "a100-sxm-80gb", 2, "vllm")
    assert [cost.step_record(b) for b in (prompt, chunk, silent)] == first
    assert first == [fresh.step_record(b) for b in (prompt, chunk, silent)]
    assert len(cost._prefill_records) == 3
    assert first[1].time_s > first[0].time_s  # the chunk attends to 1,000 earlier tokens
    assert first[2].gemm_s < first[0].gemm_s  # one fewer LM-head row
