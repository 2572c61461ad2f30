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


class DecodeRuns:
    """Fast-forwarded runs as run-length records (see the module docstring)."""

    def __init__(self, record_columns: tuple[str, ...]) -> None:
        self.record_columns = record_columns
        self.width = len(record_columns)
        self.steps = 0
        self.runs = 0
        self.max_end = -np.inf
        """The latest end of a run's last step (each run's steps end in order, so its last ends last)."""
        self._ints = array("i")  # _PER_RUN_INTS per run
        self._first = array("d")  # per run: the first step's start, then its record's fields
        self._varies = array("B")  # per run: one byte per record column, 1 where it changes in the run
        self._varying = array("d")  # per run: steps 1 .. L-1 of each varying column in turn
        self._used = array("i")  # per step: KV blocks in use

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
        self._first.append(starts[0])
        self._first.frombytes(records[0].tobytes())
        varies = (records[1:] != records[0]).any(axis=0)
        self._varies.frombytes(varies.tobytes())
        if steps > 1 and varies.any():
            self._varying.frombytes(np.ascontiguousarray(records[1:, varies].T).tobytes())
        self._used.frombytes(used_blocks.astype(np.int32).tobytes())
        end = starts[-1] + float(records[-1, 0])  # the run's clock: its last start plus its last duration
        if end > self.max_end:
            self.max_end = end

    def nbytes(self) -> int:
        """Bytes the runs hold (their buffers' contents)."""
        return sum(len(part) * part.itemsize
                   for part in (self._ints, self._first, self._varies, self._varying, self._used))

    # ------------------------------------------------------------------ expansion
    def _per_run(self) -> np.ndarray:
        return np.frombuffer(self._ints, dtype=np.int32).reshape(-1, _PER_RUN_INTS)

    def _firsts(self) -> np.ndarray:
        return np.frombuffer(self._first, dtype=np.float64).reshape(-1, 1 + self.width)

    def column(self, name: str) -> np.ndarray | int:
        """One column's values, one per step in the order the runs were added (a record column,
        ``start_s``, ``kv_blocks_used`` or a batch field), or 0 for a column that is 0 in every
        run step (prefill and speculative counts, ``extra_s``)."""
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
        firsts = self._firsts()
        out = np.repeat(firsts[:, 1 + index], lengths)
        varies = np.frombuffer(self._varies, dtype=np.bool_).reshape(-1, self.width)
        mine = varies[:, index]
        if not mine.any():
            return out
        later = lengths.astype(np.int64) - 1  # values per varying column of each run
        # each run's block in the varying buffer: its varying columns' values, column after column
        block_start = np.cumsum(varies.sum(axis=1) * later) - varies.sum(axis=1) * later
        rank = varies[:, :index].sum(axis=1)  # varying columns before this one in the run's block
        runs = np.flatnonzero(mine)
        counts = later[runs]
        source = block_start[runs] + rank[runs] * counts
        target = (np.cumsum(lengths, dtype=np.int64) - lengths)[runs] + 1
        total = int(counts.sum())
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        values = np.frombuffer(self._varying, dtype=np.float64)
        out[np.repeat(target, counts) + within] = values[np.repeat(source, counts) + within]
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
        starts[first_index] = self._firsts()[:, 0]
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
