"""The step log's compact storage: fast-forwarded runs as run-length records, appended rows as
column chunks in the narrowest dtype that holds them, and every step's cost-model record as an
index into a table of distinct records (issue #18: a million requests' steps in a few dozen bytes
per run instead of a full row per step).

A step's record (the :class:`~servesim.cost.StepRecord` fields) is set by its batch: the cost
model remembers each price by the batch size and attention key count, so most records repeat
(at 100,000 requests 12% of the run steps' records and 24% of the appended rows' are distinct).
:class:`RecordTable` keeps each distinct record once (found by a hash of its bits and checked
bit for bit, so a record read back is the very floats written) and each step keeps an int32 index.

A fast-forwarded run (``servesim.core.fast_forward``) is ``L`` pure-decode steps of one batch:

- per run: its replica, length, batch size, queue length, preemptions (only the first step counts
  them) and its first step's start are stored once;
- per step: its record's index and the KV blocks in use (int32 each: a pool's blocks are counted
  in int32, checked);
- each step's start is the step-by-step clock, recomputed: ``start[j + 1] = start[j] +
  duration[j]``, the same float additions in the same order as the run's clock
  (``plan_decode_run``), so the very floats.

:meth:`DecodeRuns.column` expands one column on demand; nothing else is kept per step.
"""

from __future__ import annotations

from array import array

import numpy as np

from servesim.errors import ServesimError

INT32_MAX = int(np.iinfo(np.int32).max)
_PER_RUN_INTS = 5
"""replica, steps, decodes, waiting, preempted (int32 each: seats, queue lengths, preemptions and
run lengths are all below the request count, which the run-size check keeps far below 2^31)."""


STAGE_FLOATS = 1 << 20
"""Record floats staged before they are interned (8 MB, some 87,000 steps): a run is appended as
it comes (a microsecond), and its staged block is reduced to record indices in one NumPy pass."""

_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
"""An odd 64-bit constant (the golden ratio's): each column's bits are folded in by xor and a
multiply, so rows that differ in any bit almost surely hash apart (a match is checked anyway)."""


def _row_hashes(bits: np.ndarray) -> np.ndarray:
    """One uint64 per row of ``bits`` (records as their uint64 bit patterns): only a hint, every
    match it finds is compared bit for bit."""
    hashes = np.zeros(len(bits), dtype=np.uint64)
    for column in range(bits.shape[1]):
        hashes ^= bits[:, column]
        hashes *= _HASH_MULTIPLIER
        hashes ^= hashes >> np.uint64(29)
    return hashes


class RecordTable:
    """The distinct step records of a log (``width`` floats each), each kept once.

    :meth:`intern` gives each row of a block its index in the table, adding the rows not there
    yet. Rows are matched by their bits (``-0.0`` and ``0.0`` are different records, a NaN matches
    the same NaN), through a sorted index of their hashes; a hash match whose bits differ is
    stored as a row of its own, so the table may hold a record twice but never maps one to
    another. The runs and the appended rows of a log share one table."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._rows = array("d")
        self._hashes = np.empty(0, dtype=np.uint64)
        """The hashes of the indexed rows, sorted."""
        self._where = np.empty(0, dtype=np.int32)
        """The table row of each hash in :attr:`_hashes`."""

    def __len__(self) -> int:
        return len(self._rows) // self.width

    def rows(self) -> np.ndarray:
        """The table, one record per row (a read-only view: rows added later are not in it)."""
        table = np.frombuffer(self._rows, dtype=np.float64).reshape(-1, self.width)
        return table

    def column(self, index: int, rows: np.ndarray) -> np.ndarray:
        """Field ``index`` of the records at table rows ``rows`` (a new array)."""
        if not len(self._rows):
            return np.empty(0, dtype=np.float64)
        return self.rows()[:, index][rows]

    def nbytes(self) -> int:
        """Bytes the table and its hash index hold."""
        return len(self._rows) * 8 + self._hashes.nbytes + self._where.nbytes

    def intern(self, records: np.ndarray) -> np.ndarray:
        """Each row of ``records`` (float64, ``width`` columns) as its table row (int32), adding
        those not in the table."""
        if not len(records):
            return np.empty(0, dtype=np.int32)
        records = np.ascontiguousarray(records, dtype=np.float64)
        bits = records.view(np.uint64)
        hashes = _row_hashes(bits)
        distinct, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        if not (bits == bits[first[inverse]]).all():  # two different rows hashed alike: keep every row
            return self._append(records, None)
        wanted = bits[first]
        at = np.searchsorted(self._hashes, distinct)
        known = at < len(self._hashes)
        known[known] = self._hashes[at[known]] == distinct[known]
        found = self._where[at[known]]
        if len(found):
            same = (self.rows()[found].view(np.uint64) == wanted[known]).all(axis=1)
            known[np.flatnonzero(known)[~same]] = False  # a hash match of a different row
            found = found[same]
        index = np.empty(len(distinct), dtype=np.int32)
        index[known] = found
        new = ~known
        index[new] = self._append(records[first[new]], distinct[new] if new.any() else None)
        return index[inverse.ravel()]

    def _append(self, records: np.ndarray, hashes: np.ndarray | None) -> np.ndarray:
        """Add ``records`` as new rows (indexed by ``hashes`` when given: distinct, none indexed
        yet) and return their table rows."""
        first = len(self)
        if first + len(records) > INT32_MAX:
            raise ServesimError("workload.num_requests", f"more than {INT32_MAX:,} distinct step records",
                                "simulate fewer requests or a shorter window")
        self._rows.frombytes(np.ascontiguousarray(records, dtype=np.float64).tobytes())
        added = np.arange(first, first + len(records), dtype=np.int32)
        if hashes is not None and len(hashes):
            fresh = ~np.isin(hashes, self._hashes)  # (a hash already indexed for another row stays unindexed)
            at = np.searchsorted(self._hashes, hashes[fresh])
            self._hashes = np.insert(self._hashes, at, hashes[fresh])
            self._where = np.insert(self._where, at, added[fresh])
        return added


class DecodeRuns:
    """Fast-forwarded runs as run-length records (see the module docstring).

    :meth:`add` stages a run's record rows as they are; every :data:`STAGE_FLOATS` floats (and
    before any read) the staged rows are interned in the log's :class:`RecordTable` together,
    leaving one int32 per step."""

    def __init__(self, record_columns: tuple[str, ...], table: RecordTable | None = None) -> None:
        self.record_columns = record_columns
        self.width = len(record_columns)
        self.table = RecordTable(self.width) if table is None else table
        """Where the runs' records are kept (shared with the log's appended rows)."""
        self.steps = 0
        self.runs = 0
        self.max_end = -np.inf
        """The latest end of a run's last step (each run's steps end in order, so its last ends last)."""
        self._ints = array("i")  # _PER_RUN_INTS per run
        self._start = array("d")  # per run: its first step's start
        self._record = array("i")  # per interned step: its record's table row
        self._used = array("i")  # per step: KV blocks in use
        self._staged = array("d")  # record rows of the steps not yet interned

    def add(self, replica: int, starts: list[float], decodes: int, used_blocks: list[int] | np.ndarray,
            waiting: int, preempted: int, records: np.ndarray) -> None:
        steps = len(starts)
        last_used = int(used_blocks[-1])  # blocks only grow within a run: the last is the largest
        if last_used > INT32_MAX:
            raise ServesimError("deployment.block_size", f"a replica's KV pool counts {last_used:,} blocks, "
                                f"more than the step log's int32 holds ({INT32_MAX:,})",
                                "use larger blocks, or set deployment.num_gpu_blocks lower")
        self.steps += steps
        self.runs += 1
        self._ints.extend((replica, steps, decodes, waiting, preempted))
        self._start.append(starts[0])
        if isinstance(used_blocks, list):  # (a short run's counts: no array round trip)
            self._used.extend(used_blocks)
        else:
            self._used.frombytes(used_blocks.astype(np.int32).tobytes())
        self._staged.frombytes(records.tobytes())
        if len(self._staged) >= STAGE_FLOATS:
            self._compact()
        end = starts[-1] + float(records[-1, 0])  # the run's clock: its last start plus its last duration
        if end > self.max_end:
            self.max_end = end

    def _compact(self) -> None:
        """Intern the staged rows: each step keeps its record's table row."""
        if not len(self._staged):
            return
        rows = np.frombuffer(self._staged, dtype=np.float64).reshape(-1, self.width)
        self._record.frombytes(self.table.intern(rows).tobytes())
        del rows
        self._staged = array("d")

    def nbytes(self) -> int:
        """Bytes the runs hold (their buffers' contents; the record table is the log's)."""
        parts: tuple[array[int] | array[float], ...] = (self._ints, self._start, self._record, self._used,
                                                         self._staged)
        return sum(len(part) * part.itemsize for part in parts)

    # ------------------------------------------------------------------ expansion
    def _per_run(self) -> np.ndarray:
        return np.frombuffer(self._ints, dtype=np.int32).reshape(-1, _PER_RUN_INTS)

    def column(self, name: str) -> np.ndarray | int:
        """One column's values, one per step in the order the runs were added (a record column,
        ``start_s``, ``kv_blocks_used`` or a batch field), or 0 for a column that is 0 in every
        run step (prefill and speculative counts, ``extra_s``)."""
        self._compact()
        per_run = self._per_run()
        lengths = per_run[:, 1]
        if name == "start_s":
            return self._starts(lengths)
        if name == "kv_blocks_used":
            return np.frombuffer(self._used, dtype=np.int32)
        if name == "replica":
            return np.repeat(per_run[:, 0], lengths)
        if name in ("num_decodes", "decode_tokens", "running"):
            return np.repeat(per_run[:, 2], lengths)
        if name == "waiting":
            return np.repeat(per_run[:, 3], lengths)
        if name == "preempted":  # only a run's first step may count preempted requests
            preempted = np.zeros(self.steps, dtype=np.int32)
            preempted[np.cumsum(lengths) - lengths] = per_run[:, 4]
            return preempted
        if name in self.record_columns:
            return self._record_column(self.record_columns.index(name))
        return 0

    def _record_column(self, index: int) -> np.ndarray:
        """Record field ``index`` of every step, read from the table."""
        return self.table.column(index, np.frombuffer(self._record, dtype=np.int32))

    def _starts(self, lengths: np.ndarray) -> np.ndarray:
        """Each step's start: the run's first start, then ``start[j + 1] = start[j] + duration[j]``,
        step by step (the run's own clock: the same additions in the same order, so the same
        floats). Vectorised across runs, one NumPy pass per step index."""
        starts = np.empty(self.steps, dtype=np.float64)
        if not self.steps:
            return starts
        durations = self._record_column(0)
        first_index = np.cumsum(lengths, dtype=np.int64) - lengths
        starts[first_index] = np.frombuffer(self._start, dtype=np.float64)
        by_length = np.argsort(-lengths, kind="stable")
        descending = lengths[by_length]
        longest = int(descending[0])
        ordered_first = first_index[by_length]
        for j in range(1, longest):
            active = int(np.searchsorted(-descending, -j, side="left"))  # runs longer than j
            at = ordered_first[:active] + j
            starts[at] = starts[at - 1] + durations[at - 1]
        return starts


def narrow_ints(values: np.ndarray, floor: type[np.integer] = np.int8) -> np.ndarray:
    """``values`` (integers) in the narrowest signed dtype from ``floor`` up that holds them all
    (checked against their minimum and maximum: never wraps)."""
    if not values.size:
        return values
    low, high = int(values.min()), int(values.max())
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        if np.dtype(dtype).itemsize < np.dtype(floor).itemsize:
            continue
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return values.astype(dtype, copy=False)
    return values


RECORD_KEY = "record"
"""The key of a compacted chunk's record indices (see :func:`compact_chunk`)."""


def compact_chunk(chunk: np.ndarray, record_columns: tuple[str, ...] = (),
                  table: RecordTable | None = None) -> dict[str, np.ndarray]:
    """A full chunk of appended rows (structured) as one array per column: a column of one value
    is that value broadcast (8 bytes), an integer column is held in the narrowest dtype that holds
    its values, a float column as it is. With a ``table``, the ``record_columns`` are kept together
    as each row's record index in it (int32, under :data:`RECORD_KEY`) instead."""
    assert chunk.dtype.names is not None  # a structured dtype
    out: dict[str, np.ndarray] = {}
    if table is not None:
        records = np.empty((len(chunk), len(record_columns)), dtype=np.float64)
        for index, name in enumerate(record_columns):
            records[:, index] = chunk[name]
        out[RECORD_KEY] = table.intern(records)
        del records
    for name in chunk.dtype.names:
        if table is not None and name in record_columns:
            continue
        values = chunk[name]
        if len(values) > 1 and (values == values[0]).all():
            out[name] = np.broadcast_to(values[:1].copy(), values.shape)
        elif values.dtype.kind == "i":
            out[name] = narrow_ints(values).copy()
        else:
            out[name] = values.copy()
    return out
