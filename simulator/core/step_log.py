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


class StepLog:
    """The steps table under construction; :meth:`append` is called once per iteration."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._current = np.empty(_CHUNK, dtype=ROW)
        self._fill = 0
        self._runs = _RunBuffers()
        self._cached: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._chunks) * _CHUNK + self._fill + self._runs.steps

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
        written out as the rows :meth:`append` would have got when :meth:`records` is asked for."""
        self._runs.add(replica, starts, decodes, used_blocks, waiting, preempted, records)

    def records(self) -> np.ndarray:
        """Every step's row, in the order the step-by-step loop appends them (read-only: the
        array is kept until another step is logged, so the run's end and its tables share it)."""
        if self._cached is not None and self._cached[0] == len(self):
            return self._cached[1]
        parts = [*self._chunks, self._current[:self._fill]]
        rows = np.concatenate(parts) if not self._runs.steps else self._merged(parts)
        rows.flags.writeable = False
        self._cached = (len(self), rows)
        return rows

    def _merged(self, parts: list[np.ndarray]) -> np.ndarray:
        """The appended rows and the runs' rows in one table, in clock order: step by step the
        rows are appended in clock order (start times never decrease), so a stable sort by start
        time puts the runs' rows where the reference mode has them. Written column by column, so
        that the table is never held twice (the peak memory of a long run)."""
        runs = self._runs
        appended = sum(len(part) for part in parts)
        total = appended + runs.steps
        column = np.empty(total, dtype=np.float64)
        _gather(column, parts, "start_s", appended)
        column[appended:] = runs.column("start_s")
        order = np.argsort(column, kind="stable")
        rows = np.empty(total, dtype=ROW)
        assert ROW.names is not None  # a structured dtype
        for name in ROW.names:
            values = column if ROW[name] == np.float64 else np.empty(total, dtype=ROW[name])
            _gather(values, parts, name, appended)
            values[appended:] = runs.column(name)
            rows[name] = values[order]
        return rows

    def end_s(self) -> float:
        """When the last step ended (0 without steps)."""
        records = self.records()
        return float((records["start_s"] + records["duration_s"]).max()) if records.size else 0.0

    def to_frame(self, blocks_total: list[int], groups: list[str] | None = None) -> pd.DataFrame:
        """``blocks_total`` and (runs with several replica groups) ``groups`` are per replica
        index; the group names go into the ``pool`` column (its name in the files)."""
        import pandas as pd  # here: a run that writes no steps table needs no pandas

        rows = self.records()
        assert ROW.names is not None  # a structured dtype
        frame = pd.DataFrame({name: rows[name] for name in ROW.names if name != "bound"})
        frame.insert(2, "duration_s", frame.pop("duration_s"))
        frame.insert(1, "step", frame.groupby("replica").cumcount().astype(np.int64))
        frame.insert(_after(frame, "num_decodes"), "batch_size",
                     frame["num_prefills"] + frame["num_decodes"])
        totals = np.asarray(blocks_total, dtype=np.int64)
        frame.insert(_after(frame, "kv_blocks_used"), "kv_blocks_total",
                     totals[frame["replica"].to_numpy()])
        frame.insert(_after(frame, "preempted"), "bound",
                     np.asarray(BOUNDS, dtype=object)[rows["bound"]])
        if groups is not None:
            frame.insert(1, "pool", np.asarray(groups, dtype=object)[frame["replica"].to_numpy()])
        return frame


class _RunBuffers:
    """The fast-forwarded runs' step-log values in flat buffers: per step, its start, blocks in
    use and record (the :class:`~servesim.cost.StepRecord` fields, 12 floats); per run, its
    replica, length, batch size, queue length and preemptions (what is the same in every step)."""

    def __init__(self) -> None:
        self.steps = 0
        self._starts = array("d")
        self._used = array("q")
        self._records = array("d")
        self._per_run = array("q")  # replica, steps, decodes, waiting, preempted; run after run

    def add(self, replica: int, starts: list[float], decodes: int, used_blocks: np.ndarray,
            waiting: int, preempted: int, records: np.ndarray) -> None:
        steps = len(starts)
        self.steps += steps
        self._starts.extend(starts)
        self._used.frombytes(used_blocks.astype(np.int64, copy=False).tobytes())
        self._records.frombytes(np.ascontiguousarray(records, dtype=np.float64).tobytes())
        self._per_run.extend((replica, steps, decodes, waiting, preempted))

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
            records = np.frombuffer(self._records, dtype=np.float64).reshape(-1, len(RECORD_COLUMNS))
            return records[:, RECORD_COLUMNS.index(name)]
        # num_prefills, prefill_tokens, proposed_tokens, accepted_tokens (runs never speculate)
        # and extra_s (nothing beyond the priced pass)
        return 0


def _gather(into: np.ndarray, parts: list[np.ndarray], name: str, count: int) -> None:
    """``into[:count]`` = the appended rows' ``name`` column, part after part."""
    offset = 0
    for part in parts:
        into[offset:offset + len(part)] = part[name]
        offset += len(part)
    assert offset == count


def _after(frame: pd.DataFrame, column: str) -> int:
    """The position just after ``column`` (the frame's columns are unique, so it has one)."""
    position = frame.columns.get_loc(column)
    assert isinstance(position, int)
    return position + 1
