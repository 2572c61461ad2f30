"""One record per iteration, written into preallocated NumPy chunks (one row per step, no
Python object kept per step), and turned into the steps table at the end.

The columns are defined here once: what the replica knows of the batch (:data:`BATCH_FIELDS`),
then the cost model's :class:`~servesim.cost.StepRecord` fields under their column names
(``time_s`` is ``duration_s``, each operator class ``x_s`` is ``op_x_s``; ``verify_extra_s`` keeps
its name), then ``extra_s``.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import numpy as np

from servesim.cost import BOUNDS, OP_CLASSES, StepRecord

if TYPE_CHECKING:
    import pandas as pd

BATCH_FIELDS = ("replica", "start_s", "num_prefills", "num_decodes", "prefill_tokens", "decode_tokens",
                "kv_blocks_used", "waiting", "running", "preempted", "proposed_tokens", "accepted_tokens")
"""What the replica records of each step besides its price (integers but ``start_s``).
``decode_tokens`` counts every token the decodes computed (with speculative decoding, their
proposals too); ``proposed_tokens`` and ``accepted_tokens`` are the speculative proposals the step
verified and how many the target accepted (zero without speculative decoding: the columns are
always there, so every steps table has one schema)."""

OP_COLUMNS = tuple(f"op_{name}_s" for name in OP_CLASSES)
"""Seconds of each operator class in a step (``op_gemm_s``, ``op_attn_prefill_s``, ...); they sum
to ``duration_s - extra_s``."""


def _record_column(field: str) -> str:
    if field == "time_s":
        return "duration_s"
    if field.removesuffix("_s") in OP_CLASSES:
        return f"op_{field}"
    return field


RECORD_COLUMNS = tuple(_record_column(field) for field in StepRecord._fields)
ROW = np.dtype([*((name, np.float64 if name == "start_s" else np.int64) for name in BATCH_FIELDS),
                *((column, np.int8 if column == "bound" else np.float64) for column in RECORD_COLUMNS),
                ("extra_s", np.float64)])
"""``duration_s`` is the priced model pass plus ``extra_s`` (time beyond it: KV swap copies), so the
``op_*_s`` columns sum to ``duration_s - extra_s``."""
assert set(OP_COLUMNS) <= set(RECORD_COLUMNS)
_CHUNK = 1 << 15
_RECORD_BLOCK = 1 << 20
"""Floats per block of the fast-forwarded runs' records (8 MB: some 87,000 steps)."""
LABEL_COLUMNS = ("step", "bound")
"""Columns of the steps table that only the files and the report read (each step's index in its
replica, its bound by name): the summary's table goes without them."""


class StepLog:
    """The steps table under construction; :meth:`append` is called once per iteration.

    Steps arrive as rows (:meth:`append`, into preallocated chunks) and as fast-forwarded runs
    (:meth:`extend_decode_run`, into flat buffers). :meth:`columns` turns them into one array per
    column in clock order and drops the chunks and buffers they came from, so a finished run's
    steps are held once (the steps DataFrame and the parquet writer read those arrays without
    copying them): a long run's peak memory is its steps table, not two or three copies of it.
    """

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._current = np.empty(_CHUNK, dtype=ROW)
        self._fill = 0
        self._runs = _RunBuffers()
        self._settled: dict[str, np.ndarray] | None = None
        """The steps logged before the last :meth:`columns` call, column by column in clock order."""
        self._settled_steps = 0
        self._cached: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._settled_steps + len(self._chunks) * _CHUNK + self._fill + self._runs.steps

    def append(self, *values: float) -> None:
        """One step's values, in the order of :data:`ROW`'s fields."""
        if self._fill == _CHUNK:
            self._chunks.append(self._current)
            self._current = np.empty(_CHUNK, dtype=ROW)
            self._fill = 0
        self._current[self._fill] = values
        self._fill += 1

    def extend_decode_run(self, replica: int, starts: list[float], decodes: int, used_blocks: np.ndarray,
                          waiting: int, preempted: int, records: np.ndarray) -> None:
        """The steps of a fast-forwarded run of pure-decode steps (``servesim.core.fast_forward``):
        each step's start, KV blocks in use and record (one row per step, the
        :class:`~servesim.cost.StepRecord` fields); the rest is the same for every step (only the
        first may count preempted requests). Kept in flat buffers (no Python object per run) and
        written out as the rows :meth:`append` would have got when :meth:`columns` is asked for."""
        self._runs.add(replica, starts, decodes, used_blocks, waiting, preempted, records)

    def columns(self) -> dict[str, np.ndarray]:
        """Every step's values, one read-only array per :data:`ROW` field, in the order the
        step-by-step loop appends them: step by step the rows are appended in clock order (start
        times never decrease), so a stable sort by start time puts the runs' rows where the
        reference mode has them.

        The rows and runs logged so far are moved into these arrays (and dropped from the log,
        chunk by chunk and column by column, so that the table is never held twice); steps logged
        afterwards are merged in at the next call (the arrays already built sort first among
        steps that start at the very same float time)."""
        total = len(self)
        if self._settled is not None and self._settled_steps == total:
            return self._settled
        runs = self._runs
        appended = self._take_appended()
        settled = self._settled or {}
        order = None
        if runs.steps or settled:
            starts = np.concatenate([*(part for part in (settled.get("start_s"), appended.get("start_s"))
                                       if part is not None), runs.column_array("start_s", runs.steps)])
            order = np.argsort(starts, kind="stable")
            del starts
        columns: dict[str, np.ndarray] = {}
        run_records = runs.take_records()
        assert ROW.names is not None  # a structured dtype
        for name in ROW.names:
            pieces = [piece for piece in (settled.pop(name, None), appended.pop(name, None))
                      if piece is not None]
            if runs.steps:
                run_part = run_records.pop(name, None)
                pieces.append(run_part.astype(ROW[name], copy=False) if run_part is not None
                              else runs.column_array(name, runs.steps))
                del run_part
            values = np.concatenate(pieces) if len(pieces) > 1 else pieces[0] if pieces \
                else np.empty(0, dtype=ROW[name])
            del pieces
            column = values[order] if order is not None else values
            del values
            column.flags.writeable = False
            columns[name] = _one_value_once(column)
        self._runs = _RunBuffers()
        self._settled = {name: columns[name] for name in ROW.names}
        self._settled_steps = total
        return self._settled

    def _take_appended(self) -> dict[str, np.ndarray]:
        """The appended rows column by column, each chunk dropped once its columns are copied."""
        parts = self._chunks
        parts.append(self._current[:self._fill])
        count = sum(len(part) for part in parts)
        self._chunks, self._current, self._fill = [], np.empty(_CHUNK, dtype=ROW), 0
        if not count:
            return {}
        assert ROW.names is not None  # a structured dtype
        out = {name: np.empty(count, dtype=ROW[name]) for name in ROW.names}
        offset = 0
        while parts:
            part = parts.pop(0)
            for name in ROW.names:
                out[name][offset:offset + len(part)] = part[name]
            offset += len(part)
            del part
        return out

    def records(self) -> np.ndarray:
        """Every step's row as one structured array (:data:`ROW`), in the order of
        :meth:`columns` (read-only: kept until another step is logged). A copy of the columns:
        what the capacity planner and the tests read; the tables read :meth:`columns`."""
        if self._cached is not None and self._cached[0] == len(self):
            return self._cached[1]
        columns = self.columns()
        rows = np.empty(len(self), dtype=ROW)
        for name, values in columns.items():
            rows[name] = values
        rows.flags.writeable = False
        self._cached = (len(self), rows)
        return rows

    def end_s(self) -> float:
        """When the last step ended (0 without steps); reads the log where it is, building nothing."""
        ends = [float((part["start_s"] + part["duration_s"]).max())
                for part in (*self._chunks, self._current[:self._fill]) if len(part)]
        if self._settled is not None and self._settled_steps:
            ends.append(float((self._settled["start_s"] + self._settled["duration_s"]).max()))
        if self._runs.steps:
            runs = self._runs
            ends.append(float((runs.column_array("start_s", runs.steps)
                               + runs.column_array("duration_s", runs.steps)).max()))
        return max(ends) if ends else 0.0

    def to_frame(self, blocks_total: list[int], groups: list[str] | None = None, *,
                 labels: bool = True) -> pd.DataFrame:
        """``blocks_total`` and (runs with several replica groups) ``groups`` are per replica
        index; the group names go into the ``pool`` column (its name in the files). The frame
        reads the log's column arrays without copying them (only the derived columns are new);
        ``labels=False`` leaves out :data:`LABEL_COLUMNS` (the summary's table)."""
        import pandas as pd  # here: a run that writes no steps table needs no pandas

        columns = self.columns()
        replica = columns["replica"]
        names = frame_columns(groups is not None, labels)
        derived = {"batch_size": columns["num_prefills"] + columns["num_decodes"],
                   "kv_blocks_total": np.asarray(blocks_total, dtype=np.int64)[replica]}
        if labels:
            derived["step"] = _per_replica_count(replica)
            derived["bound"] = np.asarray(BOUNDS, dtype=object)[columns["bound"]]
        if groups is not None:
            derived["pool"] = np.asarray(groups, dtype=object)[replica]
        return pd.DataFrame({name: derived[name] if name in derived else columns[name] for name in names},
                            copy=False)


def _one_value_once(column: np.ndarray) -> np.ndarray:
    """A column of one value throughout (the speculative columns and ``extra_s`` of most runs,
    ``replica`` with one replica) as that value broadcast to the column's length: 8 bytes instead
    of 8 per step. Reads, the DataFrame and the parquet writer see the same values."""
    if len(column) < 2 or not (column == column[0]).all():
        return column
    return np.broadcast_to(column[:1].copy(), column.shape)


def frame_columns(pooled: bool, labels: bool = True) -> list[str]:
    """The steps table's columns in order: ``replica``, (``pool``), ``step``, ``start_s``,
    ``duration_s``, the batch fields with ``batch_size`` after ``num_decodes``,
    ``kv_blocks_total`` after ``kv_blocks_used`` and ``bound`` after ``preempted``, then the
    record fields and ``extra_s``. Without ``labels``, the table leaves out :data:`LABEL_COLUMNS`."""
    assert ROW.names is not None  # a structured dtype
    names = [name for name in ROW.names if name not in ("bound", "duration_s")]
    names.insert(2, "duration_s")
    names.insert(1, "step")
    for column, after in (("batch_size", "num_decodes"), ("kv_blocks_total", "kv_blocks_used"),
                          ("bound", "preempted")):
        names.insert(names.index(after) + 1, column)
    if pooled:
        names.insert(1, "pool")
    return names if labels else [name for name in names if name not in LABEL_COLUMNS]


def _per_replica_count(replica: np.ndarray) -> np.ndarray:
    """Each step's index among its replica's steps (``groupby("replica").cumcount()``)."""
    count = len(replica)
    if not count or (replica == replica[0]).all():
        return np.arange(count, dtype=np.int64)
    order = np.argsort(replica, kind="stable")
    grouped = replica[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    step = np.empty(count, dtype=np.int64)
    step[order] = np.arange(count, dtype=np.int64) - np.repeat(starts, np.diff(np.r_[starts, count]))
    return step


class _RunBuffers:
    """The fast-forwarded runs' step-log values in flat buffers: per step, its start, blocks in
    use and record (the :class:`~servesim.cost.StepRecord` fields, 12 floats); per run, its
    replica, length, batch size, queue length and preemptions (what is the same in every step)."""

    def __init__(self) -> None:
        self.steps = 0
        self._starts = array("d")
        self._used = array("q")
        self._records = array("d")
        self._full_records: list[array[float]] = []
        """Filled record buffers of _RECORD_BLOCK floats or more, in order, then ``_records``:
        blocks, so that :meth:`take_records` frees them one by one as it moves them out."""
        self._per_run = array("q")  # replica, steps, decodes, waiting, preempted; run after run

    def add(self, replica: int, starts: list[float], decodes: int, used_blocks: np.ndarray,
            waiting: int, preempted: int, records: np.ndarray) -> None:
        steps = len(starts)
        self.steps += steps
        self._starts.extend(starts)
        self._used.frombytes(used_blocks.astype(np.int64, copy=False).tobytes())
        self._records.frombytes(np.ascontiguousarray(records, dtype=np.float64).tobytes())
        if len(self._records) >= _RECORD_BLOCK:
            self._full_records.append(self._records)
            self._records = array("d")
        self._per_run.extend((replica, steps, decodes, waiting, preempted))

    def column_array(self, name: str, steps: int) -> np.ndarray:
        """:meth:`column` as an array of ``steps`` values (in the column's dtype)."""
        values = self.column(name)
        if isinstance(values, np.ndarray):
            return values.astype(ROW[name], copy=False)
        return np.full(steps, values, dtype=ROW[name])

    def take_records(self) -> dict[str, np.ndarray]:
        """The runs' record fields, one array per column, moved out of the row-wise buffers from
        the last block to the first, each block freed once copied (the two are never both
        whole); the buffers are left empty."""
        width = len(RECORD_COLUMNS)
        blocks = [*self._full_records, self._records]
        self._full_records, self._records = [], array("d")
        out = {name: np.empty(self.steps, dtype=np.float64) for name in RECORD_COLUMNS}
        end = self.steps
        while blocks:
            rows = np.frombuffer(blocks.pop(), dtype=np.float64).reshape(-1, width)
            start = end - len(rows)
            for index, name in enumerate(RECORD_COLUMNS):
                out[name][start:end] = rows[:, index]
            end = start
            del rows
        assert end == 0
        return out

    def column(self, name: str) -> np.ndarray | float:
        """The runs' values of one step-log column, one per step (or one value for all)."""
        per_run = np.frombuffer(self._per_run, dtype=np.int64).reshape(-1, 5)
        lengths = per_run[:, 1]
        if name == "start_s":
            return np.frombuffer(self._starts, dtype=np.float64)
        if name == "kv_blocks_used":
            return np.frombuffer(self._used, dtype=np.int64)
        if name == "replica":
            return np.repeat(per_run[:, 0], lengths)
        if name in ("num_decodes", "decode_tokens", "running"):
            return np.repeat(per_run[:, 2], lengths)
        if name == "waiting":
            return np.repeat(per_run[:, 3], lengths)
        if name == "preempted":  # only a run's first step may count preempted requests
            preempted = np.zeros(self.steps, dtype=np.int64)
            preempted[np.cumsum(lengths) - lengths] = per_run[:, 4]
            return preempted
        if name in RECORD_COLUMNS:
            index, width = RECORD_COLUMNS.index(name), len(RECORD_COLUMNS)
            return np.concatenate([np.frombuffer(block, dtype=np.float64).reshape(-1, width)[:, index]
                                   for block in (*self._full_records, self._records)])
        # num_prefills, prefill_tokens, proposed_tokens, accepted_tokens (runs never speculate)
        # and extra_s (nothing beyond the priced pass)
        return 0
