"""The step log's compact storage: fast-forwarded runs as run-length records, appended rows as
column chunks in the narrowest dtype that holds them (issue #18: a million requests' steps in a
few hundred bytes per run instead of a full row per step).

A fast-forwarded run (``servesim.core.fast_forward``) is ``L`` pure-decode steps of one batch.
Most of its step-log values are the same in every step, and the rest follow from a few numbers:

- per run: its replica, length, batch size, queue length, preemptions (only the first step counts
  them), its first step's start and its first step's whole record (the
  :class:`~servesim.cost.StepRecord` fields) are stored once;
- a record column that changes inside the run (the decode attention's time, work and bytes, the
  host time when it depends on the keys: :data:`VARYING_NOTE`) keeps its values of steps
  ``1 .. L-1``, the others nothing more (a run of an engine whose host time hides the GPU's has
  one duration throughout);
- each step's start is the step-by-step clock, recomputed: ``start[j + 1] = start[j] +
  duration[j]``, the same float additions in the same order as the run's clock
  (``plan_decode_run``), so the very floats;
- the KV blocks in use, one int32 per step (a pool's blocks are counted in int32: checked).

:meth:`DecodeRuns.column` expands one column on demand; nothing else is kept per step.
"""

from __future__ import annotations

from array import array

import numpy as np

from servesim.errors import ServesimError

INT32_MAX = int(np.iinfo(np.int32).max)
VARYING_NOTE = "columns that change inside a run are kept per step, the rest once per run"

_PER_RUN_INTS = 5
"""replica, steps, decodes, waiting, preempted (int32 each: seats, queue lengths, preemptions and
run lengths are all below the request count, which the run-size check keeps far below 2^31)."""


STAGE_FLOATS = 1 << 20
"""Record floats staged before they are compacted (8 MB, some 87,000 steps): a run is appended as
it comes (a microsecond), and its staged block is reduced to run-length form in one NumPy pass."""


class DecodeRuns:
    """Fast-forwarded runs as run-length records (see the module docstring).

    :meth:`add` stages a run's record rows as they are; every :data:`STAGE_FLOATS` floats (and
    before any read) the staged runs are compacted together: which columns vary in each run,
    and those columns' values of its later steps, one buffer per column."""

    def __init__(self, record_columns: tuple[str, ...]) -> None:
        self.record_columns = record_columns
        self.width = len(record_columns)
        self.steps = 0
        self.runs = 0
        self.max_end = -np.inf
        """The latest end of a run's last step (each run's steps end in order, so its last ends last)."""
        self._ints = array("i")  # _PER_RUN_INTS per run
        self._start = array("d")  # per run: its first step's start
        self._first = array("d")  # per compacted run: its first step's record
        self._varies = array("B")  # per compacted run: one byte per record column, 1 where it changes
        self._varying = [array("d") for _ in record_columns]
        """Per record column: its values in steps 1 .. L-1 of each run where it varies, run after run."""
        self._used = array("i")  # per step: KV blocks in use
        self._staged = array("d")  # record rows of the runs not yet compacted
        self._staged_runs = 0

    def add(self, replica: int, starts: list[float], decodes: int, used_blocks: np.ndarray,
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
        self._used.frombytes(used_blocks.astype(np.int32).tobytes())
        self._staged.frombytes(records.tobytes())
        self._staged_runs += 1
        if len(self._staged) >= STAGE_FLOATS:
            self._compact()
        end = starts[-1] + float(records[-1, 0])  # the run's clock: its last start plus its last duration
        if end > self.max_end:
            self.max_end = end

    def _compact(self) -> None:
        """Reduce the staged runs to run-length form (first row, flags, varying values)."""
        count = self._staged_runs
        if not count:
            return
        rows = np.frombuffer(self._staged, dtype=np.float64).reshape(-1, self.width)
        lengths = self._per_run()[-count:, 1].astype(np.int64)
        first_index = np.cumsum(lengths) - lengths
        firsts = rows[first_index]
        same = rows == np.repeat(firsts, lengths, axis=0)
        varies = ~np.logical_and.reduceat(same, first_index, axis=0)
        del same
        self._first.frombytes(firsts.tobytes())
        self._varies.frombytes(varies.tobytes())
        later = np.ones(len(rows), dtype=np.bool_)
        later[first_index] = False
        for column in np.flatnonzero(varies.any(axis=0)).tolist():
            keep = later & np.repeat(varies[:, column], lengths)
            self._varying[column].frombytes(rows[keep, column].tobytes())
        del rows
        self._staged = array("d")
        self._staged_runs = 0

    def nbytes(self) -> int:
        """Bytes the runs hold (their buffers' contents)."""
        parts: tuple[array[int] | array[float], ...] = (self._ints, self._start, self._first, self._varies,
                                                         self._used, self._staged, *self._varying)
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
            return self._record_column(self.record_columns.index(name), lengths)
        return 0

    def _record_column(self, index: int, lengths: np.ndarray) -> np.ndarray:
        """Record field ``index`` of every step: the first step's value throughout each run, then
        the stored values of steps 1 .. L-1 where the column varies in the run."""
        firsts = np.frombuffer(self._first, dtype=np.float64).reshape(-1, self.width)
        out = np.repeat(firsts[:, index], lengths)
        varies = np.frombuffer(self._varies, dtype=np.bool_).reshape(-1, self.width)[:, index]
        if not varies.any():
            return out
        later = np.ones(self.steps, dtype=np.bool_)
        later[np.cumsum(lengths, dtype=np.int64) - lengths] = False
        out[later & np.repeat(varies, lengths)] = np.frombuffer(self._varying[index], dtype=np.float64)
        return out

    def _starts(self, lengths: np.ndarray) -> np.ndarray:
        """Each step's start: the run's first start, then ``start[j + 1] = start[j] + duration[j]``,
        step by step (the run's own clock: the same additions in the same order, so the same
        floats). Vectorised across runs, one NumPy pass per step index."""
        starts = np.empty(self.steps, dtype=np.float64)
        if not self.steps:
            return starts
        durations = self._record_column(0, lengths)
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


def compact_chunk(chunk: np.ndarray) -> dict[str, np.ndarray]:
    """A full chunk of appended rows (structured) as one array per column: a column of one value
    is that value broadcast (8 bytes), an integer column is held in the narrowest dtype that holds
    its values, a float column as it is."""
    assert chunk.dtype.names is not None  # a structured dtype
    out: dict[str, np.ndarray] = {}
    for name in chunk.dtype.names:
        values = chunk[name]
        if len(values) > 1 and (values == values[0]).all():
            out[name] = np.broadcast_to(values[:1].copy(), values.shape)
        elif values.dtype.kind == "i":
            out[name] = narrow_ints(values).copy()
        else:
            out[name] = values.copy()
    return out
