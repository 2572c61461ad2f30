"""One record per iteration, written into preallocated NumPy chunks (one row per step, no
Python object kept per step), and turned into the steps table at the end.

The columns are defined here once: what the replica knows of the batch (:data:`BATCH_FIELDS`),
then the cost model's :class:`~servesim.cost.StepRecord` fields under their column names
(``time_s`` is ``duration_s``, each operator class ``x_s`` is ``op_x_s``; ``verify_extra_s`` keeps
its name), then ``extra_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal

import numpy as np

from servesim.core.step_runs import INT32_MAX, RECORD_KEY, DecodeRuns, RecordTable, compact_chunk, narrow_ints
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
LABEL_COLUMNS = ("step", "bound")
"""Columns of the steps table that only the files and the report read (each step's index in its
replica, its bound by name): the summary's table goes without them."""
SUMMARY_COLUMNS = ("replica", "pool", "start_s", "duration_s", "num_prefills", "num_decodes", "batch_size",
                   "decode_tokens", "kv_blocks_used", "kv_blocks_total", "proposed_tokens", "op_proposal_s",
                   "verify_extra_s")
"""The steps table's columns that the summary reads (``metrics.usage``: KV use, batch sizes, busy
time; ``metrics.benchmark_names``: tokens per second; the groups' sections; the speculative
section): its table is only these, expanded one by one, so it never holds the whole table. A
summary figure that reads another column adds it here."""
SPECULATIVE_SUMMARY_COLUMNS = ("proposed_tokens", "op_proposal_s", "verify_extra_s")
"""Of :data:`SUMMARY_COLUMNS`, those only the speculative section reads: a run without speculative
decoding leaves them out of the summary's table (at a million requests they are 65 MiB of zeros)."""


class StepLog:
    """The steps table under construction; :meth:`append` is called once per iteration.

    Steps arrive as rows (:meth:`append`, into a preallocated chunk; a full chunk is kept column
    by column in the narrowest dtypes that hold it, :func:`~servesim.core.step_runs.compact_chunk`)
    and as fast-forwarded runs (:meth:`extend_decode_run`, kept as run-length records,
    :class:`~servesim.core.step_runs.DecodeRuns`). Nothing is expanded to a row per step until a
    reader asks: :meth:`column` expands one column in clock order (the summary reads the few it
    needs, :data:`SUMMARY_COLUMNS`), :meth:`columns` every column (the steps table, its parquet
    file), after which the log holds those arrays and drops its compact sources.
    """

    def __init__(self) -> None:
        self._chunks: list[dict[str, np.ndarray]] = []
        """Full chunks of appended rows, compacted column by column, in the order appended."""
        self._chunk_ends: list[float] = []
        """When each full chunk's last step ended (:meth:`end_s` reads these, not the chunks)."""
        self._chunk_steps = 0
        self._current = np.empty(_CHUNK, dtype=ROW)
        self._fill = 0
        self._table = RecordTable(len(RECORD_COLUMNS))
        """Every distinct step record of the chunks and runs, which keep their steps' table rows."""
        self._runs = DecodeRuns(RECORD_COLUMNS, self._table)
        self._settled: dict[str, np.ndarray] | None = None
        """The steps logged before the last :meth:`columns` call, column by column in clock order."""
        self._settled_steps = 0
        self._cached: tuple[int, np.ndarray] | None = None
        self._order: tuple[int, np.ndarray | None] | None = None
        """(steps, the permutation that puts the log's pieces in clock order, None if they are)."""

    def __len__(self) -> int:
        return self._settled_steps + self._chunk_steps + self._fill + self._runs.steps

    def append(self, *values: float) -> None:
        """One step's values, in the order of :data:`ROW`'s fields."""
        if self._fill == _CHUNK:
            current = self._current
            self._chunk_ends.append(float((current["start_s"] + current["duration_s"]).max()))
            self._chunks.append(compact_chunk(current, RECORD_COLUMNS, self._table))
            self._chunk_steps += _CHUNK
            self._fill = 0
        self._current[self._fill] = values
        self._fill += 1

    def extend_decode_run(self, replica: int, starts: list[float], decodes: int,
                          used_blocks: list[int] | np.ndarray, waiting: int, preempted: int,
                          records: np.ndarray) -> None:
        """The steps of a fast-forwarded run of pure-decode steps (``servesim.core.fast_forward``):
        each step's start, KV blocks in use and record (one row per step, the
        :class:`~servesim.cost.StepRecord` fields); the rest is the same for every step (only the
        first may count preempted requests). Kept as a run-length record (the starts follow
        from the first and the durations) and expanded into the rows :meth:`append` would have
        got when a reader asks."""
        self._runs.add(replica, starts, decodes, used_blocks, waiting, preempted, records)

    def nbytes(self) -> int:
        """Bytes the log holds now (compact chunks, the chunk being filled, runs, settled columns)."""
        held = self._current.nbytes + self._runs.nbytes() + self._table.nbytes()
        held += sum(values.nbytes for chunk in self._chunks for values in chunk.values()
                    if values.strides != (0,))
        if self._settled is not None:
            held += sum(values.nbytes for values in self._settled.values() if values.strides != (0,))
        return held

    def _pieces(self, name: str) -> list[np.ndarray]:
        """One column's values, piece by piece in the order the clock sort expects: the settled
        columns, the appended rows, the runs."""
        pieces = [] if self._settled is None else [self._settled[name]]
        pieces.extend(self._chunk_column(chunk, name) for chunk in self._chunks)
        if self._fill:
            pieces.append(self._current[name][:self._fill].copy())
        runs = self._runs
        if runs.steps:
            values = runs.column(name)
            pieces.append(values if isinstance(values, np.ndarray)
                          else np.broadcast_to(np.array(values, dtype=ROW[name]), (runs.steps,)))
        return pieces

    def _chunk_column(self, chunk: dict[str, np.ndarray], name: str) -> np.ndarray:
        """One column of a compacted chunk (a record column read from the record table)."""
        if name in chunk:
            return chunk[name]
        return self._table.column(RECORD_COLUMNS.index(name), chunk[RECORD_KEY])

    def _clock_order(self) -> np.ndarray | None:
        """The stable sort by start time of the pieces of :meth:`_pieces` (None when they are in
        clock order already, as rows appended step by step always are): step by step the rows are
        appended in clock order, so a stable sort puts the runs' rows where the reference mode
        has them (a settled column sorts first among steps starting at the very same float).
        With one replica the rows and the runs are each in clock order, and the sort is a merge
        of the two (:func:`_merge_order`: the same permutation, without sorting 3.8 million
        starts at a million requests)."""
        total = len(self)
        if self._order is not None and self._order[0] == total:
            return self._order[1]
        order = None
        if self._runs.steps or self._settled is not None:
            pieces = self._pieces("start_s")
            if self._settled is None and len(pieces) > 1:  # the rows, then the runs
                rows = np.concatenate(pieces[:-1])
                if _non_decreasing(rows) and _non_decreasing(pieces[-1]):
                    order = _merge_order(rows, pieces[-1])
                    self._order = (total, order)
                    return order
                del rows
            starts = np.concatenate(pieces)
            del pieces
            if not _non_decreasing(starts):
                order = np.argsort(starts, kind="stable")
                if total <= INT32_MAX:
                    order = order.astype(np.int32)
        self._order = (total, order)
        return order

    def ends(self) -> np.ndarray:
        """Every step's end (``start_s + duration_s``) in clock order (read-only): each piece's
        starts and durations are added before the pieces are put in clock order, so the two
        columns are never held whole at once (the same floats: one addition per step either way)."""
        if self._settled is not None and self._settled_steps == len(self):
            return self._settled["start_s"] + self._settled["duration_s"]
        starts, durations = self._pieces("start_s"), self._pieces("duration_s")
        pieces = []
        while starts:
            pieces.append(starts.pop(0) + durations.pop(0))
        values = np.concatenate(pieces) if len(pieces) > 1 else pieces[0] if pieces else np.empty(0)
        del pieces
        order = self._clock_order()
        if order is not None:
            values = values[order]
        values.flags.writeable = False
        return values

    def column(self, name: str, *, narrow: bool = True) -> np.ndarray:
        """Every step's values of one :data:`ROW` field in clock order, expanded from the compact
        log without building the others (read-only). ``narrow``: integers in the narrowest dtype
        that holds them (the same numbers: what the summary reads, whose figures convert them to
        floats or compare them), else in the table's dtype; a column of one value is that value
        broadcast."""
        if self._settled is not None and self._settled_steps == len(self):
            return self._settled[name]
        pieces = self._pieces(name)
        values = np.concatenate(pieces) if len(pieces) > 1 else pieces[0] if pieces \
            else np.empty(0, dtype=ROW[name])
        del pieces
        order = self._clock_order()
        if order is not None:
            values = values[order]
        if values.dtype.kind == "i":
            values = narrow_ints(values) if narrow else values.astype(ROW[name], copy=False)
        elif values.dtype != ROW[name]:
            values = values.astype(ROW[name])
        values = _one_value_once(values)
        values.flags.writeable = False
        return values

    def columns(self) -> dict[str, np.ndarray]:
        """Every step's values, one read-only array per :data:`ROW` field in its dtype, in the
        order the step-by-step loop appends them (see :meth:`_clock_order`).

        The log then holds these arrays and drops the compact chunks and runs they came from;
        steps logged afterwards are merged in at the next call."""
        total = len(self)
        if self._settled is not None and self._settled_steps == total:
            return self._settled
        assert ROW.names is not None  # a structured dtype
        columns = {name: self.column(name, narrow=False) for name in ROW.names}
        self._chunks, self._chunk_ends, self._chunk_steps, self._fill = [], [], 0, 0
        self._table = RecordTable(len(RECORD_COLUMNS))
        self._runs = DecodeRuns(RECORD_COLUMNS, self._table)
        self._settled = columns
        self._settled_steps = total
        self._order = (total, None)
        return columns

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
        """When the last step ended (0 without steps); reads the log where it is, building nothing
        (a run's last step ends last among its steps: each starts where the one before ended)."""
        filling = {name: self._current[name][:self._fill] for name in ("start_s", "duration_s")}
        parts = [filling] if self._settled is None else [filling, self._settled]
        ends = [float((part["start_s"] + part["duration_s"]).max()) for part in parts if len(part["start_s"])]
        ends.extend(self._chunk_ends)
        if self._runs.steps:
            ends.append(self._runs.max_end)
        return max(ends) if ends else 0.0

    def to_frame(self, blocks_total: list[int], groups: list[str] | None = None, *,
                 labels: bool = True, only: tuple[str, ...] | None = None) -> pd.DataFrame:
        """``blocks_total`` and (runs with several replica groups) ``groups`` are per replica
        index; the group names go into the ``pool`` column (its name in the files). The frame
        reads the log's column arrays without copying them (only the derived columns are new);
        ``labels=False`` leaves out :data:`LABEL_COLUMNS` (the summary's table). ``only``: just
        these of the table's columns (:data:`SUMMARY_COLUMNS`), expanded one by one from the
        compact log (integers in the narrowest dtype that holds them) without building or keeping
        the others."""
        import pandas as pd  # here: a run that writes no steps table needs no pandas

        names, fetch = self._column_source(blocks_total, groups, labels, only)
        return pd.DataFrame({name: fetch(name) for name in names}, copy=False)

    def summary_columns(self, blocks_total: list[int], only: tuple[str, ...]) -> StepColumns:
        """The summary's steps table of a run with one replica group, read column by column
        (:class:`StepColumns`): ``to_frame(blocks_total, labels=False, only=only)`` without
        holding it (at a million requests that table is 88 MiB, and building it is the summary's
        peak)."""
        names, fetch = self._column_source(blocks_total, None, False, only)
        return StepColumns(fetch, names, len(self), self.ends)

    def _column_source(self, blocks_total: list[int], groups: list[str] | None, labels: bool,
                       only: tuple[str, ...] | None) -> tuple[list[str], Callable[[str], np.ndarray]]:
        """The steps table's column names and how to get each (see :meth:`to_frame`)."""
        names = frame_columns(groups is not None, labels)
        if only is None:
            columns = self.columns()
            get: Callable[[str], np.ndarray] = columns.__getitem__
        else:
            names = [name for name in names if name in only]
            get = self.column
        totals = np.asarray(blocks_total, dtype=np.int64)
        if only is not None:  # the summary's table: as narrow as the other integer columns
            totals = narrow_ints(totals)
        derived: dict[str, Callable[[], np.ndarray]] = {
            "batch_size": lambda: _add(get("num_prefills"), get("num_decodes")),
            "kv_blocks_total": lambda: _per_replica(totals, get("replica")),
            "step": lambda: _per_replica_count(get("replica")),
            "bound": lambda: np.asarray(BOUNDS, dtype=object)[get("bound")],
            "pool": lambda: np.asarray(groups, dtype=object)[get("replica")]}
        if not labels:
            del derived["step"], derived["bound"]

        def fetch(name: str) -> np.ndarray:
            return derived[name]() if name in derived else get(name)

        return names, fetch


class StepColumns:
    """The summary's steps table as columns read one at a time: each is expanded from the compact
    log when read and dropped when its reader is done, so the summary never holds the table.
    It answers what the summary asks of a table (a column by name as a NumPy array, ``len``,
    ``in``: :mod:`servesim.metrics.columns`); a run with several groups, whose sections select
    rows by pool, gets a real table instead."""

    def __init__(self, fetch: Callable[[str], np.ndarray], names: list[str], length: int,
                 ends: Callable[[], np.ndarray]) -> None:
        self._fetch, self._names, self._length, self._ends = fetch, names, length, ends

    def ends(self) -> np.ndarray:
        """Each step's ``start_s + duration_s`` (:meth:`StepLog.ends`: without holding both columns)."""
        return self._ends()

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        return self._fetch(name)

    def __len__(self) -> int:
        return self._length

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        """The column names, as iterating a table gives them."""
        return iter(self._names)


def _non_decreasing(values: np.ndarray) -> bool:
    """Whether ``values`` are in order (ties allowed)."""
    return values.size < 2 or bool((values[1:] >= values[:-1]).all())


_MERGE_CHUNK = 1 << 18
"""Values placed at a time by :func:`_merge_order` (its temporaries are a chunk's, not the log's)."""


def _merge_order(first: np.ndarray, second: np.ndarray) -> np.ndarray | None:
    """``np.argsort(np.concatenate((first, second)), kind="stable")`` of two sequences each in
    order (a replica's appended rows and its runs), by merging them: ``first[i]`` goes after the
    ``i`` before it and the values of ``second`` below it, ``second[j]`` after the ``j`` before it
    and the values of ``first`` up to it (ties keep ``first`` first, as the stable sort does).
    None when ``second`` follows ``first`` whole (the concatenation is in order). Int32 when the
    log has fewer than 2^31 steps; no sort's copies of the starts."""
    if not first.size or not second.size or first[-1] <= second[0]:
        return None
    total = first.size + second.size
    dtype = np.int32 if total <= INT32_MAX else np.int64
    order = np.empty(total, dtype=dtype)
    _place(order, first, second, "left", 0)
    _place(order, second, first, "right", first.size)
    return order


def _place(order: np.ndarray, values: np.ndarray, other: np.ndarray, side: Literal["left", "right"],
           offset: int) -> None:
    """:func:`_merge_order`'s entries for ``values`` (at ``offset`` in the concatenation): each
    goes after those of ``values`` before it and those of ``other`` below it (``side="left"``) or
    up to it (``"right"``), a chunk at a time."""
    for low in range(0, values.size, _MERGE_CHUNK):
        part = values[low:low + _MERGE_CHUNK]
        index = np.arange(low, low + part.size, dtype=order.dtype)
        order[np.searchsorted(other, part, side=side) + index] = index + offset


def _add(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """``first + second`` of two integer columns, in the narrowest dtype that holds every sum
    (int64 when either column is: the table's own dtype)."""
    if first.dtype == np.int64 or second.dtype == np.int64 or not len(first):
        return first.astype(np.int64, copy=False) + second
    high = int(first.max()) + int(second.max())
    low = int(first.min()) + int(second.min())
    dtype = narrow_ints(np.array([low, high], dtype=np.int64)).dtype
    return np.add(first, second, dtype=dtype)


def _per_replica(values: np.ndarray, replica: np.ndarray) -> np.ndarray:
    """``values[replica]``; one replica throughout (a broadcast column) stays one value."""
    if len(replica) and replica.strides == (0,):
        return np.broadcast_to(values[replica[:1]], replica.shape)
    return values[replica]


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


