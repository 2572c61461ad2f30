"""The per-segment shortcuts of the core (issue #18) give what the general paths give, exactly.

Each shortcut below replaces a general computation on the engine's hottest trip (schedule, plan,
price, credit) and must be invisible in every result; each is compared with the computation it
replaces, with zero tolerance: ``Batch.of_one`` (one admitted prompt, classified from Python
ints), ``ReplicaState.drop_done`` (a run's finished requests dropped without reading every
status), ``_OpColumns.of`` (each operator's properties evaluated once),
``PrefixBlockPool.admit_one`` (one admission with Python ints), ``ItlLog.add``'s grouping of a
few gaps (bisecting runs of equal values), ``BatchShape.decodes_only``'s Python sum of a few
contexts, ``CostModel._decode_op`` (decode kernels remembered by their key counts),
``DecodeRunPricer._price_around`` (a tiled run's missing rows priced with the key counts around
them) and
``Replica._ahead`` (a sole
replica's ordinary steps credited inside the timeout of the step or run before them, up to the
next arrival or horizon), whose oracle is the step-by-step mode.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cost_runs import DEPLOYMENTS, cost_model, per_step
from test_fast_forward import assert_same, both_ways, contended_plan
from test_fast_forward_chains import CHAINING_POLICIES, slices_in_lockstep, sparse

from servesim import load_hardware, load_model
from servesim.config import validate_document
from servesim.core.replica import Replica
from servesim.core.replica_state import ReplicaState
from servesim.core.state import SMALL_GAPS, ItlLog
from servesim.cost import BatchShape, CostModel, decode_run
from servesim.cost.attention import decode_attention
from servesim.cost.roofline import OpCost
from servesim.cost.step_cost import OP_CLASS_OF, _OpColumns
from servesim.dtypes import Precision
from servesim.pipeline import prepare, simulate
from servesim.pipeline.result import RunResult
from servesim.pipeline.slices import SlicedSimulation
from servesim.policies.base import Batch


def reference_columns(ops: tuple[OpCost, ...]) -> _OpColumns:
    """``_OpColumns.of`` as it was written first: every column read from :class:`OpCost`'s
    properties, one generator per column."""
    return _OpColumns(ops, tuple(op.time_s for op in ops),
                      tuple(op.roofline_s for op in ops if op.bound == "compute"),
                      tuple(op.roofline_s for op in ops if op.bound == "memory"),
                      tuple(op.side_s for op in ops), tuple(op.fixed_s for op in ops),
                      tuple(op.flops for op in ops), tuple(op.bytes for op in ops),
                      tuple(op.time_s for op in ops if OP_CLASS_OF[op.name] == "gemm"),
                      tuple(op.time_s for op in ops if OP_CLASS_OF[op.name] == "elementwise"),
                      tuple(op.time_s for op in ops if OP_CLASS_OF[op.name] == "attn_prefill"),
                      tuple(op.time_s for op in ops if OP_CLASS_OF[op.name] == "attn_decode"))


def assert_same_columns(fast: _OpColumns, reference: _OpColumns) -> None:
    """Every column the same floats (compared as their bit patterns: 0.0 and -0.0 differ)."""
    for name in _OpColumns.__slots__:
        a, b = getattr(fast, name), getattr(reference, name)
        assert len(a) == len(b), name
        if name != "ops":
            assert np.array_equal(np.array(a, dtype=np.float64).view(np.int64),
                                  np.array(b, dtype=np.float64).view(np.int64)), name


@pytest.mark.parametrize("deployment", DEPLOYMENTS,
                         ids=[f"{d[0]}-{d[1]}-tp{d[2]}-{d[3]}" for d in DEPLOYMENTS])
def test_op_columns_are_the_operator_properties(deployment: tuple[str, str, int, str]) -> None:
    """The token halves of many token counts and the LM heads of many logits counts, on every
    kind of deployment (dense, MoE, MLA, windows, TP collectives): the one-pass columns are the
    properties' columns."""
    cost = cost_model(*deployment)
    for tokens in (1, 2, 7, 64, 333, 2048, 8191):
        ops = tuple(cost._body_ops(float(tokens)))
        assert_same_columns(_OpColumns.of(ops), reference_columns(ops))
        head = tuple(cost._logits_ops(float(tokens)))  # a hybrid model's state traffic, the LM head
        if head:
            assert_same_columns(_OpColumns.of(head), reference_columns(head))


def test_op_columns_of_quantised_gemms_keep_their_side_kernels() -> None:
    """FP8 GEMMs carry their input quantisation as ``side_s`` (it adds to the time, not to the
    roofline): the same columns, and some operator has a side kernel at all."""
    cost = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb"), 1,
                     Precision.from_names("fp8", "fp8"))
    sides = 0
    for tokens in (1, 16, 500, 4096):
        ops = tuple(cost._body_ops(float(tokens)))
        sides += sum(op.side_s > 0 for op in ops)
        assert_same_columns(_OpColumns.of(ops), reference_columns(ops))
    assert sides > 0


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("fast_forward", [False, True])
def test_one_admitted_prompt_is_batched_as_the_general_path(monkeypatch: pytest.MonkeyPatch,
                                                             prefix: bool, fast_forward: bool) -> None:
    """``continuous`` batches one admitted prompt with ``Batch.of_one``; against ``Batch.of`` of
    the same arrays on whole runs (prompts after a prefix-cache hit, recomputes after
    preemption): every request and every step the same."""
    plan = contended_plan("continuous", prefix)
    calls = {"one": 0}
    of_one = Batch.of_one.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Batch], ids: np.ndarray, new_tokens: np.ndarray, computed: int, new: int) -> Batch:
        calls["one"] += 1
        return of_one(cls, ids, new_tokens, computed, new)

    monkeypatch.setattr(Batch, "of_one", classmethod(counted))
    fast = simulate(plan, fast_forward=fast_forward)
    assert calls["one"] > 0

    def general(cls: type[Batch], ids: np.ndarray, new_tokens: np.ndarray, computed: int, new: int) -> Batch:
        done = np.array([computed], dtype=np.int64)
        return cls.of(ids, new_tokens, done, done + new)

    monkeypatch.setattr(Batch, "of_one", classmethod(general))
    reference = simulate(plan, fast_forward=fast_forward)
    assert int(reference.request_state.preemptions.sum()) > 0
    assert_same(reference, fast)


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_a_run_drops_its_finished_requests_as_the_status_scan_does(monkeypatch: pytest.MonkeyPatch,
                                                                   prefix: bool, policy: str) -> None:
    """A fast-forwarded run drops the requests it finished with ``drop_done`` (the run knows
    them); against ``drop_finished``'s scan of every running status on whole runs: the same
    blocks freed, the same running requests, every request and step the same."""
    plan = contended_plan(policy, prefix)
    calls = {"known": 0}
    drop_done = ReplicaState.drop_done

    def counted(self: ReplicaState, ids: np.ndarray, done: np.ndarray) -> None:
        calls["known"] += int(ids is self.running)
        drop_done(self, ids, done)

    monkeypatch.setattr(ReplicaState, "drop_done", counted)
    fast = simulate(plan)
    assert calls["known"] > 0
    monkeypatch.setattr(ReplicaState, "drop_done", lambda self, ids, done: self.drop_finished())
    reference = simulate(plan)
    assert_same(reference, fast)


def early_steps(result: RunResult) -> int:
    """Ordinary steps credited inside the timeout of an earlier step or run."""
    return sum(unit.early_steps for run in result.groups for unit in run.replicas
               if isinstance(unit, Replica))


@pytest.mark.parametrize("policy", CHAINING_POLICIES, ids=lambda p: "-".join(map(str, p.values())))
@pytest.mark.parametrize("engine", ["vllm-v0", "vllm", "sglang", "trtllm"])
def test_steps_ahead_of_the_clock_are_exact(policy: dict[str, object], engine: str) -> None:
    """Every policy that fast-forwards, on every engine, on one replica: admissions and lone
    decode steps were credited ahead of the clock, and both modes agree."""
    reference, fast = both_ways(sparse(policy=policy, engine=engine))
    assert early_steps(reference) == 0
    assert early_steps(fast) > 0
    assert_same(reference, fast)


@pytest.mark.parametrize("prefix", [False, True])
def test_steps_ahead_on_a_tight_pool_are_exact(prefix: bool) -> None:
    """Preemptions and recomputes (a tight pool at a high rate) and prefix-cache hits: steps
    ahead of the clock, the same results as step by step."""
    plan = contended_plan("continuous", prefix)
    fast, reference = simulate(plan), simulate(plan, fast_forward=False)
    assert early_steps(fast) > 0
    assert int(reference.request_state.preemptions.sum()) > 0
    assert_same(reference, fast)


def test_two_replicas_take_no_step_ahead() -> None:
    """Behind a router another replica's rows and ITL pairs come between this one's steps, so
    only a sole replica steps ahead (its chains of runs still go on)."""
    reference, fast = both_ways(sparse(rate=4.0, deployment={"replicas": 2}))
    assert early_steps(fast) == 0
    assert_same(reference, fast)


@pytest.mark.parametrize("slice_s", [0.05, 0.25, 2.0])
def test_steps_ahead_stop_at_each_slice_end(slice_s: float) -> None:
    """The capacity planner reads the requests between slices: a step credited ahead of the
    clock ends before the slice's end, so at every boundary the state is the step-by-step one."""
    config = validate_document(sparse(rate=3.0, requests=60), "test")
    fast, reference = SlicedSimulation(prepare(config)), SlicedSimulation(prepare(config), fast_forward=False)
    slices_in_lockstep(fast, reference, slice_s)
    assert early_steps(fast.result()) > 0
    assert_same(reference.result(), fast.result())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0125, 0.04, 0.04000000000000001, 1e-9, 3.5, 0.1 + 0.2, 0.3]),
                min_size=1, max_size=SMALL_GAPS))
def test_a_few_gaps_are_grouped_as_counted(gaps: list[float]) -> None:
    """``ItlLog.add`` of up to ``SMALL_GAPS`` gaps: each distinct value once with its count, in
    sorted order (what ``Counter`` of the sorted gaps gives), each pair at the step's time."""
    log = ItlLog()
    log.add(np.array(gaps), 7.5)
    counted = Counter(sorted(gaps))
    assert list(log.values) == list(counted)
    assert list(log.counts) == list(counted.values())
    assert list(log.at) == [7.5] * len(counted)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=150))
def test_a_decode_batch_sums_its_contexts_as_numpy_does(contexts: list[int]) -> None:
    """``decodes_only`` (Python's sum up to ``SMALL_SUM`` decodes) against the validated
    constructor: every field the same value and type."""
    context = np.array(contexts, dtype=np.int64)
    fast, reference = BatchShape.decodes_only(context), BatchShape.build(decode_context=context)
    for name in ("num_prefills", "num_decodes", "num_prefill_tokens", "num_decode_tokens", "num_new_tokens",
                 "decode_context_sum", "num_logits", "decode_tokens"):
        assert getattr(fast, name) == getattr(reference, name), name
        assert type(getattr(fast, name)) is type(getattr(reference, name)), name


@pytest.mark.parametrize("deployment", DEPLOYMENTS,
                         ids=[f"{d[0]}-{d[1]}-tp{d[2]}-{d[3]}" for d in DEPLOYMENTS])
def test_remembered_decode_kernels_are_the_kernels_priced_afresh(
        deployment: tuple[str, str, int, str]) -> None:
    """Mixed steps' decodes over contexts that repeat (so their key counts do), alone or beside a
    chunk, plain or verifying proposals: each kernel ``_batch_ops`` gives, remembered or not, is
    the one ``decode_attention`` prices directly (KV tiles, windows, chunked attention, MLA, DSA's
    indexer at its FP8 peak)."""
    cost = cost_model(*deployment)
    rng = np.random.default_rng(11)
    pool = [rng.integers(0, 20_000, int(size)).tolist() for size in rng.integers(1, 40, 12)]
    for round_ in range(120):
        decodes = pool[int(rng.integers(len(pool)))]
        verified = [1 + int(rng.integers(0, 4)) for _ in decodes] if round_ % 7 == 6 else None
        batch = BatchShape.build(prefill_tokens=[int(rng.integers(1, 3000))] if round_ % 2 else [],
                                 decode_context=decodes, decode_tokens=verified)
        direct = [decode_attention(batch, shape, cost.hardware, peak, cost._kv_bytes, layers)
                  for (shape, layers), peak in zip(cost._attention_groups, cost._kind_peaks, strict=True)]
        priced = [op for op in cost._batch_ops(batch) if op.name == "attn_decode"]
        assert priced == direct, (deployment, round_)
    assert len(cost._decode_ops) < 120 * len(cost._attention_groups)  # some were remembered


TILED = [d for d in DEPLOYMENTS if d[1] in ("a100-sxm-80gb", "b200") and d[0] != "gemma-3-27b"]
"""One full-attention kind read in whole KV tiles (gemma's sliding layers count every context)."""


@pytest.mark.parametrize("deployment", TILED, ids=[f"{d[0]}-{d[1]}-tp{d[2]}-{d[3]}" for d in TILED])
def test_rows_priced_around_a_run_are_the_per_step_records(deployment: tuple[str, str, int, str]) -> None:
    """KV tiles: a run that misses the memo prices the key counts around it too; later runs over
    longer and shorter contexts of the same batch size find those rows in the memo, and every
    row is the per-step record."""
    cost = cost_model(*deployment)
    rng = np.random.default_rng(5)
    context = rng.integers(200, 3000, 20)
    tile = cost.hardware.efficiency.attention_decode.key_tile
    first = cost.decode_run_records(context, 8)
    assert first is not None
    np.testing.assert_array_equal(first, per_step(cost, context, 0, 8))
    pricer = cost._run_pricers[20]
    remembered = len(pricer._memo)
    assert remembered > 8  # rows around the run were priced with it
    for count, shift in ((1, tile), (5, 2 * tile), (3, -tile)):  # other runs, a few tiles on or back
        later = context.copy()
        later[:count] += shift
        rows = cost.decode_run_records(later, 8)
        assert rows is not None
        np.testing.assert_array_equal(rows, per_step(cost, later, 0, 8))
    assert len(pricer._memo) == remembered  # all found in the memo


def test_a_spent_memo_prices_only_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Near the memo's budget a run's rows are priced alone (and past it not remembered): the same
    rows."""
    cost = cost_model("codellama-34b", "a100-sxm-80gb", 2, "vllm")
    monkeypatch.setattr(decode_run, "MEMO_ROWS", 1 << 18)
    cost._run_memo.rows = (1 << 16) + 4  # less than a quarter of the budget left
    context = np.random.default_rng(6).integers(200, 3000, 12)
    rows = cost.decode_run_records(context, 6)
    assert rows is not None
    np.testing.assert_array_equal(rows, per_step(cost, context, 0, 6))
    assert len(cost._run_pricers[12]._memo) <= 6
