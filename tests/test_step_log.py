"""The step log's tables: rows and fast-forwarded runs merged into columns in clock order, held
once (the sources dropped, the DataFrame reading the arrays without a copy), and the columns
derived for the steps table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.config import validate_document
from servesim.core import step_log
from servesim.core.step_log import RECORD_COLUMNS, ROW, StepLog, _per_replica_count, frame_columns
from servesim.cost import BOUNDS
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


def test_runs_records_in_several_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs' records kept in blocks of 2 steps (24 floats) come out as from one buffer."""
    logs = []
    for block in (step_log._RECORD_BLOCK, 2 * RECORD_WIDTH):
        monkeypatch.setattr(step_log, "_RECORD_BLOCK", block)
        logs.append(two_replica_log())
        logs[-1].extend_decode_run(1, [4.5, 5.0, 5.5], 1, np.array([22, 23, 23]), 0, 0,
                                   run_records([0.5, 0.5, 0.25]))
    expected, log = logs
    assert len(log._runs._full_records) == 2 and not expected._runs._full_records
    assert log.end_s() == expected.end_s() == 5.75
    assert log.records().tobytes() == expected.records().tobytes()
    assert log.columns()["duration_s"].tolist()[-4:] == [0.5, 0.5, 0.5, 0.25]


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
    assert "step" not in light_frame and "bound" not in light_frame
    assert light_frame.equals(full.steps.drop(columns=["step", "bound"]))
