"""Properties of the cost model that must hold for every batch (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost import causal_pairs

MODELS = {name: load_model(name) for name in ("llama-3-8b", "mixtral-8x7b", "deepseek-v3", "mistral-7b",
                                               "qwen3-next-80b-a3b")}
TP = {"llama-3-8b": 2, "mixtral-8x7b": 2, "deepseek-v3": 8, "mistral-7b": 1, "qwen3-next-80b-a3b": 2}
COSTS = {name: CostModel(model, load_hardware("h100-sxm-80gb"), TP[name]) for name, model in MODELS.items()}


@given(new=st.integers(1, 300), context=st.integers(0, 300),
       window=st.one_of(st.none(), st.integers(1, 400)))
def test_causal_pairs_closed_form_equals_brute_force(new: int, context: int, window: int | None) -> None:
    brute = sum(min(context + j, window) if window else context + j for j in range(1, new + 1))
    assert causal_pairs(np.array([new]), np.array([context]), window)[0] == brute


batches = st.builds(
    lambda chunks, decodes: BatchShape.build([c for c, _ in chunks], [x for _, x in chunks], decodes),
    st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=6),
    st.lists(st.integers(0, 16_000), max_size=64),
)


@settings(max_examples=60, deadline=None)
@given(batch=batches, model=st.sampled_from(sorted(MODELS)))
def test_breakdown_is_complete_and_positive(batch: BatchShape, model: str) -> None:
    cost = COSTS[model]
    step = cost.step(batch)
    if batch.is_empty:
        assert step.time_s == 0.0
        return
    assert step.time_s > 0
    assert all(v >= 0 for v in step.breakdown.values())
    assert np.isclose(sum(step.breakdown.values()), step.time_s, rtol=1e-12)
    assert cost.step_time(batch) == step.time_s


@settings(max_examples=60, deadline=None)
@given(batch=batches, extra_context=st.integers(0, 16_000), model=st.sampled_from(sorted(MODELS)))
def test_more_work_never_takes_less_time(batch: BatchShape, extra_context: int, model: str) -> None:
    cost = COSTS[model]
    more = BatchShape.build(batch.prefill_tokens, batch.prefill_context,
                            [*batch.decode_context.tolist(), extra_context])
    assert cost.step_time(more) >= cost.step_time(batch)
    longer = BatchShape.build(batch.prefill_tokens, batch.prefill_context, batch.decode_context + 100)
    assert cost.step_time(longer) >= cost.step_time(batch)


@settings(max_examples=60, deadline=None)
@given(batch=batches, chunk=st.integers(1, 4096), model=st.sampled_from(sorted(MODELS)))
def test_another_prefill_chunk_never_takes_less_time(batch: BatchShape, chunk: int, model: str) -> None:
    cost = COSTS[model]
    more = BatchShape.build([*batch.prefill_tokens.tolist(), chunk],
                            [*batch.prefill_context.tolist(), 0], batch.decode_context)
    assert cost.step_time(more) >= cost.step_time(batch)


def test_decode_only_shape_equals_the_validated_one() -> None:
    """The engine's unvalidated decode-only constructor builds exactly what ``build`` builds."""
    import dataclasses

    context = np.array([5, 10, 20, 0], dtype=np.int64)
    fast, slow = BatchShape.decodes_only(context), BatchShape.build(decode_context=context)
    for field in dataclasses.fields(BatchShape):
        a, b = getattr(fast, field.name), getattr(slow, field.name)
        assert (np.array_equal(a, b) and a.dtype == b.dtype) if isinstance(a, np.ndarray) else a == b
