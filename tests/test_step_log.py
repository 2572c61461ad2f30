"""The step log's tables: rows and fast-forwarded runs merged into columns in clock order, held
once (the sources dropped, the DataFrame reading the arrays without a copy), and the columns
derived for the steps table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.config import validate_document
from servesim.core import step_log, step_runs
from servesim.core.step_log import (
    RECORD_COLUMNS,
    ROW,
    SPECULATIVE_SUMMARY_COLUMNS,
    SUMMARY_COLUMNS,
    StepColumns,
    StepLog,
    _per_replica_count,
    frame_columns,
)
from servesim.cost import BOUNDS
from servesim.errors import ServesimError
from servesim.pipeline import prepare, simulate
from servesim.pipeline.result import RunResult

RECORD_WIDTH = len(RECORD_COLUMNS)


def row(replica: int, start: float, duration: float, prefills: int, decodes: int, used: int) -> tuple:
    """One appended step: batch fields, then the record (time, bound, flops, ...), then extra_s."""
    batch = (replica, start, prefills, decodes, 100 * prefills, decodes, used, 3, decodes, 0, 0, 0)
    record = (duration, BOUNDS.index("compute"), 1e12, 2e9, *([duration / 6] * 6), 0.0, 0.0)
    assert len(record) == RECORD_WIDTH
    return (*batch, *record, 0.0)


def run_records(durations: list[float]) -> np.ndarray:
    out = np.zeros((len(durations), RECORD_WIDTH))
    out[:, 0] = durations
    out[:, 1] = BOUNDS.index("memory")
    return out


def two_replica_log() -> StepLog:
    """Replica 0 appends steps at 0.0 and 1.0 and then runs three decode steps at 2.0, 2.5, 3.0;
    replica 1 appends steps at 0.5, 2.25 and 4.0 (appended before the run is logged at 2.0 would
    be in the reference mode only where start times say so)."""
    log = StepLog()
    log.append(*row(0, 0.0, 1.0, 1, 0, 10))
    log.append(*row(1, 0.5, 0.5, 1, 0, 20))
    log.append(*row(0, 1.0, 1.0, 1, 1, 12))
    log.extend_decode_run(0, [2.0, 2.5, 3.0], 2, np.array([13, 13, 14]), 4, 1,
                          run_records([0.5, 0.5, 0.75]))
    log.append(*row(1, 2.25, 0.25, 0, 1, 21))
    log.append(*row(1, 4.0, 0.5, 0, 1, 22))
    return log


def test_rows_and_runs_merge_in_clock_order() -> None:
    log = two_replica_log()
    assert len(log) == 8
    columns = log.columns()
    assert list(columns) == list(ROW.names or ())
    assert columns["start_s"].tolist() == [0.0, 0.5, 1.0, 2.0, 2.25, 2.5, 3.0, 4.0]
    assert columns["replica"].tolist() == [0, 1, 0, 0, 1, 0, 0, 1]
    # the run: two decodes per step, its blocks per step, queue length 4, one preemption at its first step
    assert columns["num_decodes"].tolist() == [0, 0, 1, 2, 1, 2, 2, 1]
    assert columns["kv_blocks_used"].tolist() == [10, 20, 12, 13, 21, 13, 14, 22]
    assert columns["waiting"].tolist() == [3, 3, 3, 4, 3, 4, 4, 3]
    assert columns["preempted"].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    assert columns["prefill_tokens"].tolist() == [100, 100, 100, 0, 0, 0, 0, 0]
    compute, memory = BOUNDS.index("compute"), BOUNDS.index("memory")
    assert columns["bound"].tolist() == [compute, compute, compute, memory, compute, memory, memory, compute]
    assert columns["duration_s"].tolist() == [1.0, 0.5, 1.0, 0.5, 0.25, 0.5, 0.75, 0.5]
    assert all(columns[name].dtype == ROW[name] for name in columns)
    assert log.end_s() == 4.5


def random_runs(seed: int, count: int) -> tuple[StepLog, list[tuple[float, np.ndarray, np.ndarray]]]:
    """``count`` runs of 1-40 steps, each record column constant in some runs and varying in
    others; each run's starts are its clock (the first start, then start + duration in turn)."""
    rng = np.random.default_rng(seed)
    log, runs = StepLog(), []
    t = 0.0
    for index in range(count):
        steps = int(rng.integers(1, 41))
        records = np.tile(rng.random(RECORD_WIDTH), (steps, 1))
        records[:, 1] = BOUNDS.index("memory")
        for column in np.flatnonzero(rng.random(RECORD_WIDTH) < 0.4):
            records[:, column] = rng.random(steps)
        used = 10 + np.cumsum(rng.integers(0, 3, size=steps))
        starts = [t]
        for duration in records[:-1, 0].tolist():
            starts.append(starts[-1] + duration)
        log.extend_decode_run(index % 3, starts, steps + 1, used, index, index % 2, records)
        runs.append((t, records, used))
        t = starts[-1] + float(records[-1, 0])
    return log, runs


def test_runs_expand_to_every_step_exactly() -> None:
    """A run-length record gives back each step's record, blocks, start (the same floats as the
    run's clock, summed in Python) and batch fields; per step it keeps two int32."""
    log, runs = random_runs(7, 60)
    total = sum(len(records) for _, records, _ in runs)
    assert len(log) == total
    log._runs._compact()  # the staged rows interned in the record table
    # per run: 5 int32 and the first start; per step: int32 blocks and record index
    assert log._runs.nbytes() == len(runs) * (5 * 4 + 8) + total * (4 + 4)
    every = np.concatenate([records for _, records, _ in runs])
    assert len(log._table) == len(np.unique(every, axis=0))  # each distinct record once
    columns = log.columns()
    assert all(columns[name].dtype == ROW[name] for name in columns)
    for index, name in enumerate(RECORD_COLUMNS):
        expected = every[:, index].astype(ROW[name])
        assert columns[name].tobytes() == np.ascontiguousarray(expected).tobytes(), name
    starts = []
    for t, records, _ in runs:
        starts.append(t)
        for duration in records[:-1, 0].tolist():
            starts.append(starts[-1] + duration)
    assert columns["start_s"].tolist() == starts  # bit for bit
    assert columns["kv_blocks_used"].tolist() == np.concatenate([used for *_, used in runs]).tolist()
    lengths = [len(records) for _, records, _ in runs]
    assert columns["num_decodes"].tolist() == np.repeat([n + 1 for n in lengths], lengths).tolist()
    assert columns["waiting"].tolist() == np.repeat(np.arange(len(runs)), lengths).tolist()
    first = np.cumsum(lengths) - lengths
    assert np.flatnonzero(columns["preempted"]).tolist() == [int(f) for i, f in enumerate(first) if i % 2]


def test_runs_compacted_in_staged_blocks_expand_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs interned a few at a time (a stage of 50 floats) give the same columns as all at once."""
    whole = random_runs(9, 300)[0].columns()
    monkeypatch.setattr(step_runs, "STAGE_FLOATS", 50)
    log = random_runs(9, 300)[0]
    assert len(log._runs._record) > 0 and len(log._runs._staged) < 50 + 40 * RECORD_WIDTH
    for name, values in log.columns().items():
        assert np.ascontiguousarray(values).tobytes() == np.ascontiguousarray(whole[name]).tobytes(), name


def test_record_table_keeps_each_record_once_bit_for_bit() -> None:
    """Records are matched by their bits: the same row again (in this block or a later one) gets
    its first index, while -0.0 and 0.0, or two NaNs of different payloads, stay apart."""
    table = step_runs.RecordTable(3)
    quiet, other_nan = np.float64("nan"), np.frombuffer(np.uint64(0x7FF8000000000001).tobytes())[0]
    block = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, quiet], [1.0, 2.0, 3.0], [-0.0, 1.0, quiet],
                      [0.0, 1.0, other_nan]])
    index = table.intern(block)
    assert index.dtype == np.int32 and index.tolist()[:3] == [index[0], index[1], index[0]]
    assert len(set(index.tolist())) == 4 == len(table)
    again = table.intern(np.array([[0.0, 1.0, quiet], [5.0, 5.0, 5.0], [-0.0, 1.0, quiet]]))
    assert again.tolist() == [index[1], 4, index[3]] and len(table) == 5
    read = np.stack([table.column(c, np.concatenate([index, again])) for c in range(3)], axis=1)
    written = np.concatenate([block, [[0.0, 1.0, quiet], [5.0, 5.0, 5.0], [-0.0, 1.0, quiet]]])
    assert read.tobytes() == written.tobytes()


def test_record_table_never_merges_rows_whose_hashes_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every row hashed alike, the table keeps each different row (a hash only finds
    candidates; the bits decide)."""
    monkeypatch.setattr(step_runs, "_row_hashes", lambda bits: np.zeros(len(bits), dtype=np.uint64))
    table = step_runs.RecordTable(2)
    first = table.intern(np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]]))  # collide within the block
    assert len(set(first.tolist())) == 3  # kept as they are: nothing merged
    second = table.intern(np.array([[5.0, 6.0]]))  # collides with an indexed row of other bits
    third = table.intern(np.array([[5.0, 6.0], [5.0, 6.0]]))
    rows = table.rows()
    assert rows[second].tolist() == [[5.0, 6.0]] and rows[third].tolist() == [[5.0, 6.0]] * 2
    assert rows[first].tolist() == [[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]]


def test_row_chunks_keep_their_records_in_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full chunk keeps each row's record as an index into the log's table (shared with the
    runs: a run step priced like an appended row points at the same record)."""
    monkeypatch.setattr(step_log, "_CHUNK", 4)
    log = StepLog()
    for index in range(9):
        log.append(*row(0, float(index), 1.0 + index % 2, 1, 1, 5))
    assert len(log._chunks) == 2
    assert all(name not in chunk for chunk in log._chunks for name in RECORD_COLUMNS)
    assert len(log._table) == 2  # two durations: two records
    assert log.column("duration_s").tolist() == [1.0 + i % 2 for i in range(9)]
    assert log.column("bound").dtype == np.int8
    assert log.end_s() == 9.0


@pytest.mark.parametrize("seed", range(6))
def test_two_ordered_sequences_merge_as_the_stable_sort(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock order of a replica's rows and runs (each in order) is the stable sort's
    permutation, ties (the same start in both) keeping the rows first; merged in small chunks."""
    monkeypatch.setattr(step_log, "_MERGE_CHUNK", 7)
    rng = np.random.default_rng(seed)
    first = np.sort(rng.integers(0, 30, size=int(rng.integers(1, 60))).astype(float))
    second = np.sort(rng.integers(0, 30, size=int(rng.integers(1, 60))).astype(float))
    expected = np.argsort(np.concatenate((first, second)), kind="stable")
    order = step_log._merge_order(first, second)
    if order is None:
        assert (expected == np.arange(expected.size)).all()
    else:
        assert order.dtype == np.int32 and order.tolist() == expected.tolist()
    assert step_log._merge_order(np.array([1.0, 2.0]), np.array([2.0, 3.0])) is None


def test_a_replicas_rows_and_runs_merge_into_the_reference_order() -> None:
    """One replica: rows appended around runs come out in the stable sort's order of starts."""
    log = StepLog()
    log.append(*row(0, 0.0, 1.0, 1, 0, 10))
    log.extend_decode_run(0, [1.0, 1.5], 1, np.array([11, 11]), 0, 0, run_records([0.5, 0.5]))
    log.append(*row(0, 2.0, 1.0, 1, 1, 12))
    log.extend_decode_run(0, [3.0, 3.25], 2, np.array([13, 14]), 0, 0, run_records([0.25, 0.25]))
    log.append(*row(0, 3.5, 1.0, 1, 0, 15))
    assert log.column("start_s").tolist() == [0.0, 1.0, 1.5, 2.0, 3.0, 3.25, 3.5]
    assert log.column("kv_blocks_used").tolist() == [10, 11, 11, 12, 13, 14, 15]


def test_ends_are_starts_plus_durations_bit_for_bit() -> None:
    """Each step's end, added piece by piece before the clock order (rows, runs, then settled
    columns), is the same float as adding the two columns."""
    log, _ = random_runs(11, 40)
    for index in range(5):
        log.append(*row(index % 3, 0.37 * index + 0.05, 0.1 + index / 7, 1, 2, 9))
    expected = log.column("start_s") + log.column("duration_s")
    assert log.ends().tobytes() == expected.tobytes()
    log.columns()
    assert log.ends().tobytes() == expected.tobytes()
    assert StepLog().ends().size == 0


def test_end_is_the_last_runs_clock() -> None:
    log, _ = random_runs(3, 20)
    end = log.end_s()
    columns = log.columns()
    columns_end = float((columns["start_s"] + columns["duration_s"]).max())
    assert end == columns_end == log.end_s()


def test_a_pool_beyond_int32_is_refused() -> None:
    log = StepLog()
    with pytest.raises(ServesimError, match="KV pool counts 2,147,483,648 blocks"):
        log.extend_decode_run(0, [0.0, 1.0], 1, np.array([1, 2**31]), 0, 0, run_records([1.0, 1.0]))


def test_row_chunks_are_kept_narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full chunks of appended rows keep each integer column in the narrowest dtype that holds it
    and a column of one value once; the table reads the same values in its own dtypes."""
    monkeypatch.setattr(step_log, "_CHUNK", 4)
    log = StepLog()
    for index in range(10):
        log.append(*row(index % 2, float(index), 1.0, 1, 40 * index, 5 + 100 * index))
    assert len(log._chunks) == 2 and log._fill == 2
    chunk = log._chunks[1]  # steps 4..7
    assert chunk["num_decodes"].dtype == np.int16  # up to 280
    assert chunk["num_prefills"].strides == (0,)  # 1 throughout
    assert chunk["kv_blocks_used"].dtype == np.int16 and chunk["replica"].dtype == np.int8
    assert log.column("num_decodes").dtype == np.int16  # what the summary reads: as narrow
    assert log.column("replica").dtype == np.int8
    columns = log.columns()
    assert columns["num_decodes"].tolist() == [40 * i for i in range(10)]
    assert columns["kv_blocks_used"].tolist() == [5 + 100 * i for i in range(10)]
    assert all(columns[name].dtype == ROW[name] for name in columns)


def test_columns_hold_the_steps_once() -> None:
    log = two_replica_log()
    columns = log.columns()
    assert log.columns() is columns  # nothing new: the same arrays
    assert not log._chunks and not log._runs.steps and log._fill == 0  # the sources are gone
    assert not columns["start_s"].flags.writeable
    frame = log.to_frame([100, 200])
    for name in ("start_s", "duration_s", "kv_blocks_used", "op_gemm_s"):
        assert np.shares_memory(frame[name].to_numpy(), columns[name]), name
    rows = log.records()
    assert rows.dtype == ROW and all(np.array_equal(rows[name], columns[name]) for name in columns)


def test_steps_logged_after_columns_merge_in() -> None:
    log = two_replica_log()
    log.columns()
    log.extend_decode_run(1, [4.5, 5.0], 1, np.array([22, 23]), 0, 0, run_records([0.5, 0.5]))
    log.append(*row(0, 4.75, 0.25, 1, 0, 30))
    assert len(log) == 11
    columns = log.columns()
    assert columns["start_s"].tolist() == [0.0, 0.5, 1.0, 2.0, 2.25, 2.5, 3.0, 4.0, 4.5, 4.75, 5.0]
    assert columns["replica"].tolist() == [0, 1, 0, 0, 1, 0, 0, 1, 1, 0, 1]
    assert log.end_s() == 5.5


def test_steps_frame_columns() -> None:
    frame = two_replica_log().to_frame([100, 200], ["prefill", "decode"])
    assert list(frame.columns) == frame_columns(pooled=True)
    assert list(frame.columns[:6]) == ["replica", "pool", "step", "start_s", "duration_s", "num_prefills"]
    assert frame["step"].tolist() == [0, 0, 1, 2, 1, 3, 4, 2]
    assert frame["pool"].tolist() == ["prefill", "decode", "prefill", "prefill", "decode", "prefill",
                                      "prefill", "decode"]
    assert frame["batch_size"].tolist() == [1, 1, 2, 2, 1, 2, 2, 1]
    assert frame["kv_blocks_total"].tolist() == [100, 200, 100, 100, 200, 100, 100, 200]
    assert frame["bound"].tolist()[2:4] == ["compute", "memory"]
    assert str(frame["duration_s"].dtype) == "float64" and str(frame["step"].dtype) == "int64"


def test_per_replica_count_is_groupbys_cumcount() -> None:
    replica = np.random.default_rng(5).integers(0, 7, size=5000)
    expected = pd.Series(replica).groupby(replica).cumcount().to_numpy()
    assert np.array_equal(_per_replica_count(replica), expected)
    assert _per_replica_count(np.zeros(4, dtype=np.int64)).tolist() == [0, 1, 2, 3]
    assert _per_replica_count(np.zeros(0, dtype=np.int64)).size == 0


def test_empty_log() -> None:
    log = StepLog()
    assert log.end_s() == 0.0
    assert all(len(values) == 0 for values in log.columns().values())
    assert len(log.to_frame([1])) == 0


def test_a_column_of_one_value_is_held_once() -> None:
    columns = two_replica_log().columns()
    for name in ("proposed_tokens", "accepted_tokens", "extra_s", "op_proposal_s"):
        assert columns[name].strides == (0,) and columns[name].tolist() == [0] * 8, name
    assert columns["replica"].strides == (8,)  # two replicas: a real column
    log = StepLog()
    for start in (0.0, 1.0, 2.0):
        log.append(*row(0, start, 1.0, 0, 1, 5))
    assert log.columns()["replica"].strides == (0,) and log.columns()["kv_blocks_used"].tolist() == [5, 5, 5]
    assert log.to_frame([10])["kv_blocks_total"].tolist() == [10, 10, 10]


def small_run(**deployment: int) -> RunResult:
    document = {"name": "steps", "seed": 0, "model": "llama-3-8b", "hardware": "h100-sxm-80gb",
                "engine": "vllm-v0", "output": "full", "deployment": deployment,
                "workload": {"arrival": {"process": "poisson", "rate": 20.0}, "num_requests": 200,
                             "prompt": {"dist": "uniform", "low": 16, "high": 600},
                             "output": {"dist": "uniform", "low": 1, "high": 300}}}
    return simulate(prepare(validate_document(document)))


def test_the_summary_keeps_no_steps_table() -> None:
    """The summary reads a steps table without the label columns and drops it; built from the
    full table (what ``output: full`` builds first) it is the same summary."""
    light = small_run(replicas=2)
    summary = light.summary
    assert "steps" not in light.__dict__
    full = small_run(replicas=2)
    assert list(full.steps.columns) == frame_columns(pooled=False)
    assert full.summary.to_dict() == summary.to_dict()
    assert summary.batch.steps == len(full.steps) > 200
    light_frame = light._summary_steps()
    # One group: the columns are read one at a time, never held as a table
    assert isinstance(light_frame, StepColumns) and len(light_frame) == len(full.steps)
    # Without speculative decoding its columns stay out (zeros at 23 bytes a step, with the
    # narrowed kv_blocks_total); the summary is the same all the same (above).
    assert list(light_frame) == [name for name in full.steps if name in SUMMARY_COLUMNS
                                 and name not in SPECULATIVE_SUMMARY_COLUMNS]
    assert light_frame["kv_blocks_total"].dtype.itemsize < full.steps["kv_blocks_total"].dtype.itemsize
    assert "steps" not in light.__dict__ and len(light.step_log._chunks) + light.step_log._runs.steps > 0
    for name in light_frame:  # the same numbers; integers as narrow as they fit
        assert np.array_equal(light_frame[name], full.steps[name].to_numpy()), name
