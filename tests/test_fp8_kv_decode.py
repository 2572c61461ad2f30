"""Decode attention over an 8-bit KV cache has its own efficiency class.

NVIDIA AIConfigurator times vLLM's decode kernel over bf16 and fp8 caches on the same grid: the fp8
kernel dequantises every tile it loads, so it runs at the bf16 kernel's time (1.0-1.1x) below a
few MB of cache, 0.9x at 16-256 MB and only approaches half (0.52-0.59x) at several GB. Priced by
the bf16 class with half the bytes, fp8-cache decode was 20-38% fast on H100 and H200 (held-out
median error 19-24%); the profiles now carry ``attention_decode_fp8`` fitted on those rows, and
every path that prices decode attention (a step, a memoised decode op, a fast-forwarded run,
speculative verification) reads the class through ``Efficiency.decode_for``.
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost.attention import ATTENTION_IO_BYTES
from servesim.dtypes import Precision

FP8_KV = Precision.from_names("bf16", "bf16", "fp8")


def test_an_8_bit_cache_reads_the_fp8_class_and_every_other_cache_the_16_bit_one() -> None:
    h100 = load_hardware("h100-sxm-80gb").efficiency
    assert h100.attention_decode_fp8 is not None
    assert h100.decode_for(1.0) is h100.attention_decode_fp8
    assert h100.decode_for(2.0) is h100.attention_decode
    assert h100.decode_for(0.515625) is h100.attention_decode  # int4 with its scales: not measured apart
    l4 = load_hardware("l4").efficiency  # never measured with an fp8 cache: the 16-bit class, as before
    assert l4.attention_decode_fp8 is None and l4.decode_for(1.0) is l4.attention_decode


def test_an_fp8_cache_decode_step_is_priced_by_the_fp8_class_by_hand() -> None:
    """Llama-3-8B on one H100, 32 decodes at 1,000 cached tokens over an fp8 cache: each request
    reads ceil(1,001 / tile) whole tiles of the fp8 class's tile, 8 KV heads x 128 x (K, V) one byte
    each per layer, plus Q and O; memory-bound, so the time is those bytes at the class's memory
    efficiency for them, per layer, plus its launch floor."""
    model, h100 = load_model("llama-3-8b"), load_hardware("h100-sxm-80gb")
    fp8 = h100.efficiency.attention_decode_fp8
    assert fp8 is not None
    cost = CostModel(model, h100, precision=FP8_KV)
    op = next(op for op in cost.step(BatchShape.decode(32, 1000)).ops if op.name == "attn_decode")
    tile = fp8.key_tile
    keys = 32 * -(-1001 // tile) * tile
    per_layer = (keys + 32) * 8 * 128 * 2 * 1.0 + 32 * (32 * 128 * 2) * ATTENTION_IO_BYTES
    memory_s = per_layer / (h100.memory.bandwidth_Bps * fp8.memory.at(per_layer))
    assert op.bytes == pytest.approx(per_layer * 32)
    assert op.memory_s == pytest.approx(memory_s * 32, rel=1e-12)
    assert op.time_s == pytest.approx(memory_s * 32 + fp8.fixed_s * 32, rel=1e-12)
    # the bf16 class with half the bytes, as before the class: faster than the fitted fp8 kernel
    bf16 = h100.efficiency.attention_decode
    before = per_layer / (h100.memory.bandwidth_Bps * bf16.memory.at(per_layer)) * 32
    assert before < op.memory_s


@pytest.mark.parametrize("hardware", ["h100-sxm-80gb", "b200"])
def test_a_fast_forwarded_fp8_cache_run_is_the_per_step_records(hardware: str) -> None:
    """The run pricer reads the same class (and its tile) as each step's own price: bit for bit."""
    cost = CostModel(load_model("llama-3-8b"), load_hardware(hardware), precision=FP8_KV)
    rng = np.random.default_rng(7)
    for n, high, steps in ((5, 40, 300), (48, 3000, 200), (300, 20_000, 60)):
        context = rng.integers(1, high, n)
        fast = cost.decode_run_records(context, steps, 2)
        assert fast is not None
        slow = np.array([cost.step_record(BatchShape.decodes_only(context + j)) for j in range(2, 2 + steps)])
        np.testing.assert_array_equal(fast, slow)
