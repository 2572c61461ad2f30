"""The fast paths that price mixed prefill + decode steps give the general path's figures, bit
for bit.

``CostModel._token_part`` assembles a new (tokens, logits) pair from its token half and its logits
half, each memoised on its own (``_body_part``, ``_head_part``), and must give the part that
summing all ``_token_ops`` at once gives; ``one_chunk_attention`` prices a step's only prefill
chunk in Python floats and must give what the NumPy path (``chunks_attention``) gives. Each is
compared here with the general computation on many shapes of every kind of deployment the cost
model prices differently (pipeline stages without the LM head or the embedding, expert
parallelism's all-reduce, a QK-norm across heads, FP8 side kernels, windows). Tolerance zero.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
from test_cost_runs import DEPLOYMENTS, cost_model

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost import step_cost
from servesim.cost.attention import (
    chunks_attention,
    decode_attention,
    decode_attention_of,
    one_chunk_attention,
    prefill_attention,
)
from servesim.cost.step_cost import OP_CLASS_OF
from servesim.dtypes import Precision
from servesim.engines import RuntimeCosts
from servesim.parallelism import Parallelism, StageLayers


def other_cost_model(name: str) -> CostModel:
    """Layouts the core benchmark's deployments do not cover."""
    llama, h100 = load_model("llama-3-8b"), load_hardware("h100-sxm-80gb")
    kernels = RuntimeCosts.none()
    if name == "first-stage":
        return CostModel(llama, h100, 2, stage=StageLayers(0, 0, 16, True, False))
    if name == "last-stage":
        return CostModel(llama, h100, 2, stage=StageLayers(1, 16, 32, False, True))
    if name == "ep-in-tp":
        return CostModel(load_model("mixtral-8x7b"), h100, 8, runtime=kernels,
                         parallelism=Parallelism(tp=8, ep=8))
    if name == "qk-norm-across-heads":
        return CostModel(replace(load_model("qwen3-30b-a3b"), qk_norm_across_heads=True), h100, 4)
    if name == "fp8":
        return CostModel(llama, h100, 2, precision=Precision.from_names("fp8", "fp8", "fp8"))
    assert name == "flat-runtime"
    return CostModel(llama, h100, 1, runtime=kernels)


NAMES = [f"{d[0]}-{d[1]}-tp{d[2]}-{d[3]}" for d in DEPLOYMENTS] + [
    "first-stage", "last-stage", "ep-in-tp", "qk-norm-across-heads", "fp8", "flat-runtime"]


def named_cost_model(name: str) -> CostModel:
    """The cost model a test's parameter names (built when the test runs)."""
    for deployment, named in zip(DEPLOYMENTS, NAMES, strict=False):
        if named == name:
            return cost_model(*deployment)
    return other_cost_model(name)


def reference_part(cost: CostModel, tokens: int, logits: int) -> tuple[object, ...]:
    """The token part summed from all its operators at once (the general computation)."""
    ops = tuple(cost._token_ops(float(tokens), float(logits)))
    comm_s = cost._communication_s(float(tokens), float(logits))
    step_s = cost._step_overhead_s
    return (ops, comm_s, sum(op.time_s for op in ops) + comm_s + step_s,
            sum(op.roofline_s for op in ops if op.bound == "compute"),
            sum(op.roofline_s for op in ops if op.bound == "memory") + sum(op.side_s for op in ops),
            sum(op.fixed_s for op in ops) + step_s, sum(op.flops for op in ops),
            sum(op.bytes for op in ops),
            sum(op.time_s for op in ops if OP_CLASS_OF[op.name] == "gemm"),
            sum(op.time_s for op in ops if OP_CLASS_OF[op.name] == "elementwise"),
            sum(op.time_s for op in ops if OP_CLASS_OF[op.name] == "attn_prefill"),
            sum(op.time_s for op in ops if OP_CLASS_OF[op.name] == "attn_decode"))


@pytest.mark.parametrize("name", NAMES)
def test_a_token_part_from_its_halves_is_the_part_of_all_its_operators(name: str) -> None:
    """Pairs that share a token count or a logits count with earlier ones (their halves come
    from the memo) and fresh ones, in random order, some asked twice."""
    cost = named_cost_model(name)
    rng = np.random.default_rng(11)
    tokens = rng.integers(1, 4096, 60)
    pairs = [(int(t), int(rng.integers(0, t + 1))) for t in tokens for _ in range(3)]
    pairs += [(int(t), 17) for t in tokens[:20]] + [(2048, int(v)) for v in rng.integers(0, 300, 20)]
    pairs += pairs[:30]
    for index in rng.permutation(len(pairs)):
        t, v = pairs[int(index)]
        part = cost._token_part(t, v)
        assert tuple(getattr(part, f.name) for f in fields(part)) == reference_part(cost, t, v), \
            (name, t, v)


@pytest.mark.parametrize("name", NAMES)
def test_one_chunk_is_priced_as_the_array_path_prices_it(name: str) -> None:
    """Chunks short and long, over no context, a long one, and contexts around each window."""
    cost = named_cost_model(name)
    rng = np.random.default_rng(5)
    for shape, layers in cost._attention_groups:
        if shape.chunk is not None:  # chunked attention always takes the array path
            continue
        args = (shape, cost.hardware, cost.bf16_peak, cost._kv_bytes, layers)
        contexts = [0, 1, 15, 100_000, *rng.integers(0, 40_000, 40).tolist()]
        if shape.window is not None:
            w = shape.window
            contexts += [w - 2, w - 1, w, w + 1, w + 500, max(0, w - 700)]
        for context in contexts:
            for new in (1, 2, 7, 64, 2048, *rng.integers(1, 9000, 4).tolist()):
                fast = one_chunk_attention(new, context, *args)
                general = chunks_attention(np.array([new]), np.array([context]), *args)
                assert fast == general, (name, new, context)


def test_a_mixed_step_with_one_chunk_takes_the_one_chunk_path() -> None:
    """``prefill_attention`` of a step with decodes and one chunk is the array path's op."""
    cost = cost_model("codellama-34b", "a100-sxm-80gb", 2, "vllm")
    (shape, layers), = cost._attention_groups
    args = (shape, cost.hardware, cost.bf16_peak, cost._kv_bytes, layers)
    batch = BatchShape.build(prefill_tokens=[1500], prefill_context=[3000], decode_context=[40, 900],
                             prefill_emits=[False])
    assert prefill_attention(batch, *args) == chunks_attention(np.array([1500]), np.array([3000]), *args)


@pytest.mark.parametrize("name", NAMES)
def test_remembered_chunk_kernels_are_the_kernels_priced_afresh(name: str) -> None:
    """Mixed steps whose one chunk repeats (the memo) or not, with decodes or without: the batch's
    operators are those ``prefill_attention`` and ``decode_attention`` give it directly."""
    cost = named_cost_model(name)
    rng = np.random.default_rng(3)
    # chunks sharing their token count or their context with others
    chunks = [(new, context) for new in (1, 64, 2000) for context in (0, 512, 9000)]
    for _ in range(60):
        new, context = chunks[int(rng.integers(len(chunks)))]
        decodes = rng.integers(1, 30_000, int(rng.integers(0, 40))).tolist()
        batch = BatchShape.build(prefill_tokens=[new], prefill_context=[context],
                                 decode_context=decodes, prefill_emits=[bool(rng.integers(2))])
        direct = []
        for (shape, layers), peak in zip(cost._attention_groups, cost._kind_peaks, strict=True):
            args = (shape, cost.hardware, peak, cost._kv_bytes, layers)
            direct.append(prefill_attention(batch, *args))
            if decodes:
                direct.append(decode_attention(batch, *args))
        assert cost._batch_ops(batch)[:len(direct)] == direct, (name, new, context)


@pytest.mark.parametrize("tile", [1, 16, 64, 256])
def test_whole_tiles_are_counted_as_the_general_branch_counts_them(tile: int) -> None:
    """Full attention over KV tiles: ``c // tile + 1`` tiles per request, the general branch's
    ``ceil((c + 1) / tile)``, on contexts on and around tile boundaries."""
    cost = cost_model("codellama-34b", "a100-sxm-80gb", 2, "vllm")
    hardware = cost.hardware
    decode = hardware.efficiency.attention_decode.model_copy(update={"key_tile": tile})
    hardware = hardware.model_copy(update={"efficiency": hardware.efficiency.model_copy(
        update={"attention_decode": decode})})
    (shape, layers), = cost._attention_groups
    rng = np.random.default_rng(9)
    for _ in range(50):
        context = rng.integers(0, 5000, int(rng.integers(1, 50)))
        context[: context.size // 2] = (context[: context.size // 2] // tile) * tile - rng.integers(0, 2)
        context = np.maximum(context, 0)
        seen = context + 1
        keys = float((-(-seen // tile) * tile).sum())
        args = (hardware, cost.bf16_peak, cost._kv_bytes, layers)
        assert decode_attention(BatchShape.decodes_only(context), shape, *args) == \
            decode_attention_of(float(context.size), keys, shape, *args)


def test_the_memos_stay_bounded_and_price_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past their bounds the halves, parts and chunk kernels are priced afresh, the same floats."""
    monkeypatch.setattr(step_cost, "BODY_MEMO_ENTRIES", 5)
    monkeypatch.setattr(step_cost, "TOKEN_MEMO_ENTRIES", 7)
    monkeypatch.setattr(step_cost, "CHUNK_MEMO_ENTRIES", 3)
    cost = cost_model("codellama-34b", "a100-sxm-80gb", 2, "vllm")
    for tokens in range(100, 140):
        part = cost._token_part(tokens, tokens % 9)
        assert tuple(getattr(part, f.name) for f in fields(part)) == \
            reference_part(cost, tokens, tokens % 9)
        batch = BatchShape.build(prefill_tokens=[tokens], prefill_context=[tokens * 3], decode_context=[50])
        (shape, layers), = cost._attention_groups
        args = (shape, cost.hardware, cost.bf16_peak, cost._kv_bytes, layers)
        assert cost._batch_ops(batch)[0] == prefill_attention(batch, *args)
    assert (len(cost._body_cache), len(cost._head_cache), len(cost._token_cache),
            len(cost._chunk_ops)) == (5, 7, 7, 3)
