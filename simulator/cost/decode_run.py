"""The price of every step of a fast-forwarded run of ``n`` pure decodes, in one pass.

A run (``servesim.core.fast_forward``) keeps the same ``n`` requests decoding, so everything in
a step's price but attention's key count is the same in every step of every run of ``n``
decodes: the memoised token part, the engine's graph size, launch, CPU and serial host time, each
attention kind's compute efficiency, its Q/O bytes and launch floors. :class:`DecodeRunPricer`
computes those once per ``n`` (``CostModel.decode_run_records`` keeps one per batch size) and
prices a run with only the arithmetic that depends on the keys.

Bit for bit: each expression below is the one the per-step formula evaluates, in the same order
(:func:`~servesim.cost.attention.decode_attention_of` for each attention kind,
``CostModel._record`` for the sums and the bound, :meth:`EngineRuntime.time` for the engine),
applied element by element, so every row is the record ``CostModel.step_record`` gives that step
(``tests/test_cost_runs.py`` holds it on random runs of every kind of deployment). A constant
folded here is one the per-step formula also computes before touching the keys (``peak *
efficiency(n)``, ``n * (q + o) * bytes``, ``fixed * layers``); nothing is reassociated.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from servesim.cost.attention import (
    ATTENTION_IO_BYTES,
    TILE_KEYS_REQUESTS,
    AttentionShape,
    decode_run_keys,
    tile_run_keys,
)
from servesim.cost.engine_runtime import EngineRuntime
from servesim.hardware import HardwareProfile, OperatorEfficiency

RECORD_FIELDS = 12
"""``len(StepRecord._fields)``: one column per field (proposal and verify seconds stay 0)."""

SCALAR_ROWS = 12
"""Up to this many rows missing from the memo, a run prices them one by one in Python floats
(:meth:`DecodeRunPricer._price_one`, about 2 us a row; NumPy's ~40 calls cost 19 us on two rows,
26 us on twelve, 32 us on sixteen: the two cross near twelve)."""

AHEAD_TILES = 32
"""When a run of tiled steps misses the memo, the key counts up to this many tiles above its
largest are priced with it (the batch's contexts keep growing, and runs of the same batch size
read nearby counts: the core benchmark's runs that miss fall from 2,934 to some 350)."""
BEHIND_TILES = 16
"""... and this many below its smallest (another batch of the same size may hold shorter contexts)."""

MEMO_ROWS = 1 << 18
"""Rows a cost model's run pricers remember in all (96 bytes each, plus the dict entry: about
50 MB at most); past it, steps are still priced exactly, just not remembered."""


@dataclass(slots=True)
class MemoBudget:
    """Rows the run pricers of one cost model may still remember (shared by every batch size)."""

    rows: int = MEMO_ROWS


@dataclass(frozen=True, slots=True)
class _Kind:
    """One attention kind's constants for ``n`` decodes (see :func:`decode_attention_of`)."""

    shape: AttentionShape
    eff: OperatorEfficiency
    layers: int
    io_bytes: float
    """``n * (q_width + o_width) * ATTENTION_IO_BYTES``: Q read and O written, per layer."""
    compute_peak: float
    """``peak * compute_efficiency(n)`` (the kind's peak: DSA's indexer computes in FP8)."""
    memory_peak: float | None
    """``bandwidth * memory_efficiency(n)`` when the memory curve reads tokens (None: it reads
    each step's bytes)."""
    fixed_s: float
    """``fixed_s * layers``."""


class DecodeRunPricer:
    """Prices runs of ``n`` decodes (one per ``n`` per cost model; see the module docstring)."""

    def __init__(self, n: int, part_totals: tuple[float, float, float, float, float, float, float,
                                                    float, float, float, float],
                 attention: list[tuple[AttentionShape, int]], hardware: HardwareProfile,
                 peak_flops: list[float], kv_bytes: float, step_overhead_s: float,
                 engine: tuple[EngineRuntime, float, float, float | None] | None,
                 budget: MemoBudget) -> None:
        """``part_totals``: the memoised token part's (total, compute, memory, overhead, flops,
        bytes, gemm, elementwise, communication, prefill attention, decode attention) seconds and
        work (the attention sums are a hybrid model's linear-attention kernels, else 0.0);
        ``engine``: (runtime, launch, CPU, serial or None) host times of a step of ``n`` decodes,
        or None for the flat runtime (whose constant ``step_overhead_s`` is in the token part
        already)."""
        self.n = n
        self._n = float(n)
        self._part = part_totals
        self._step_overhead_s = step_overhead_s
        self._engine = engine
        self._kv_bytes = kv_bytes
        eff = hardware.efficiency.decode_for(kv_bytes)
        self._tile = eff.key_tile
        self._bandwidth = hardware.memory.bandwidth_Bps
        kinds = []
        for (shape, layers), peak in zip(attention, peak_flops, strict=True):
            memory_peak = None
            if eff.memory.axis != "bytes":
                memory_peak = hardware.memory.bandwidth_Bps * eff.memory.at(self._n)
            kinds.append(_Kind(shape, eff, layers,
                               self._n * (shape.decode_q_width + shape.decode_o_width) * ATTENTION_IO_BYTES,
                               peak * eff.compute.at(self._n), memory_peak, eff.fixed_s * layers))
        self._kinds = tuple(kinds)
        self._scalars = tuple((kind.shape.decode_flops_per_key, kind.shape.cache_elements_per_token,
                               kind.io_bytes, kind.compute_peak, kind.memory_peak, kind.eff.memory.at,
                               self._bandwidth, kind.layers, kind.fixed_s) for kind in kinds)
        """Per kind, what :meth:`_price_one` reads: (FLOPs per key, cache elements per token,
        ``io_bytes``, ``compute_peak``, ``memory_peak``, the memory curve's ``at``, the bandwidth,
        layers, ``fixed_s``)."""
        self._tile_keys = (len(attention) == 1 and self._tile > 1 and attention[0][0].window is None
                           and attention[0][0].chunk is None)
        """One full-attention kind read in whole KV tiles: :func:`tile_run_keys` counts short runs."""
        self._sum_keys = (len(attention) == 1 and self._tile == 1 and attention[0][0].window is None
                          and attention[0][0].chunk is None)
        """One full-attention kind read key by key: a step's keys are the contexts' sum plus ``n``
        per step (:meth:`records` counts them in Python ints)."""
        self._budget = budget
        self._memo: dict[object, int] = {}
        """Each priced step's attention key count(s) -> its row of ``_table``."""
        self._table = np.empty((64, RECORD_FIELDS))

    def records(self, context: np.ndarray, first_step: int, steps: int) -> np.ndarray:
        """Rows of the :class:`~servesim.cost.StepRecord` fields of decode steps ``first_step ..
        first_step + steps - 1`` over ``context`` (``n`` requests' cached tokens at step 0).

        A decode step's record depends on its requests only through ``n`` and each attention
        kind's key count, and with KV tiles (every profile's decode kernel reads whole tiles)
        those counts repeat from run to run: rows already priced are taken from the memo, the
        others priced together and remembered (while the memo budget lasts)."""
        if self._tile_keys and steps <= self._tile and context.size <= TILE_KEYS_REQUESTS:
            # One full-attention kind read in whole tiles (the common case): its key counts as
            # Python ints (equal keys in the memo), an array only if some row must be priced.
            counted = tile_run_keys(context.tolist(), first_step, steps, self._tile)
            found = list(map(self._memo.get, counted, repeat(-1, steps)))
            if -1 not in found:  # (take: a third of indexing's cost with a list of rows)
                return self._table.take(found, axis=0)
            if self._price_around(counted):
                return self._table.take([self._memo[key] for key in counted], axis=0)
            return self._price_missing([np.array(counted, dtype=np.float64)], counted, found, steps)
        if self._sum_keys:
            # One full-attention kind read key by key: decode_run_keys' float(sum + n j) + n in
            # Python (the same integers, rounded once, then the same float addition); an array
            # only if some row must be priced.
            total, n = int(context.sum()), self.n
            summed = [float(total + n * j) + self._n for j in range(first_step, first_step + steps)]
            found = list(map(self._memo.get, summed, repeat(-1, steps)))
            if -1 not in found:
                return self._table.take(found, axis=0)
            return self._price_missing([np.array(summed, dtype=np.float64)], summed, found, steps)
        keys = [decode_run_keys(context, first_step, steps, kind.shape, self._tile) for kind in self._kinds]
        if not keys:
            return self._price(keys, steps)
        memo = self._memo
        lookup = keys[0].tolist() if len(keys) == 1 else list(zip(*(k.tolist() for k in keys), strict=True))
        get = memo.get
        found = [get(key, -1) for key in lookup]
        if -1 not in found:
            return self._table.take(found, axis=0)
        return self._price_missing(keys, lookup, found, steps)

    def _price_missing(self, keys: list[np.ndarray], lookup: list[Any], found: list[int],
                       steps: int) -> np.ndarray:
        """:meth:`records` when the memo lacks some rows (``found[j]`` -1): price those, take the
        others from the table, and remember the new ones."""
        missing = [j for j, row in enumerate(found) if row < 0]
        if len(missing) <= SCALAR_ROWS:  # a row or two: Python floats, without NumPy's per-call cost
            single = len(self._kinds) == 1
            priced = np.array([self._price_one((lookup[j],) if single else lookup[j]) for j in missing],
                              dtype=np.float64)
            rows = priced if len(missing) == steps else None
        elif len(missing) == steps:
            priced = rows = self._price(keys, steps)
        else:
            priced = self._price([k[missing] for k in keys], len(missing))
            rows = None
        if rows is None:
            rows = np.empty((steps, RECORD_FIELDS))
            hit = [j for j, row in enumerate(found) if row >= 0]
            rows[hit] = self._table.take([found[j] for j in hit], axis=0)
            rows[missing] = priced
        self._remember([lookup[j] for j in missing], priced)
        return rows

    def _price_around(self, counted: list[int]) -> bool:
        """Price and remember, in one vectorised pass, the key counts of a tiled run that the memo
        lacks together with those around it (:data:`AHEAD_TILES` tiles above its largest,
        :data:`BEHIND_TILES` below its smallest, none below one tile per request): each row is a
        function of its own key count alone (``_price`` is element-wise), so a row priced ahead
        is the row priced when asked. False when the memo's budget is nearly spent (the run is then
        priced as before, only its own rows remembered)."""
        memo, tile = self._memo, self._tile
        top, bottom, floor = max(counted), min(counted), self.n * tile
        wanted: list[object] = list(dict.fromkeys(
            [*(key for key in counted if key not in memo),
             *(key for key in range(top + tile, top + (AHEAD_TILES + 1) * tile, tile) if key not in memo),
             *(key for key in range(bottom - tile, max(floor, bottom - BEHIND_TILES * tile) - 1, -tile)
               if key not in memo)]))
        if self._budget.rows < len(wanted) + MEMO_ROWS // 4:  # the last quarter: only what runs read
            return False
        self._remember(wanted, self._price([np.array(wanted, dtype=np.float64)], len(wanted)))
        return True

    def _remember(self, keys: list[object], priced: np.ndarray) -> None:
        """Keep ``priced`` rows under their keys, while the shared budget lasts."""
        budget = self._budget
        fresh = [(key, i) for i, key in enumerate(keys) if key not in self._memo]
        fresh = list(dict(fresh).items())  # a key priced twice in one run is kept once
        if not fresh or budget.rows < len(fresh):
            return
        budget.rows -= len(fresh)
        used = len(self._memo)
        if used + len(fresh) > self._table.shape[0]:
            grown = np.empty((max(2 * self._table.shape[0], used + len(fresh)), RECORD_FIELDS))
            grown[:used] = self._table[:used]
            self._table = grown
        if len(fresh) == len(keys):  # every key new and distinct: the rows in their order
            self._table[used:used + len(fresh)] = priced
        else:
            self._table[used:used + len(fresh)] = priced[[i for _, i in fresh]]
        for offset, (key, _) in enumerate(fresh):
            self._memo[key] = used + offset

    def _price_one(self, keys: tuple[float, ...]) -> list[float]:
        """:meth:`_price` of one step whose attention kinds read ``keys`` keys, in Python floats:
        the same IEEE operations on the same values in the same order (``max`` for
        ``np.maximum``, ``index(max)`` for ``argmax``; the key counts made floats first, as the
        array's are), so the very row. Each kind's constants come from :attr:`_scalars` (the
        same values :meth:`_price` reads from :class:`_Kind` and its shape)."""
        total, compute, memory, overhead, work, moved, gemm_s, elementwise_s, comm_s, prefill_s, \
            decode_s = self._part
        n, kv_bytes = self._n, self._kv_bytes
        decode = decode_s
        for (per_key, per_token, io_bytes, compute_peak, memory_peak, memory_at, bandwidth, layers,
             fixed_s), count in zip(self._scalars, keys, strict=True):
            kind_keys = float(count)
            # decode_attention_of
            op_flops = kind_keys * per_key
            op_bytes = (kind_keys + n) * per_token * kv_bytes + io_bytes
            op_compute = op_flops / compute_peak
            if memory_peak is None:
                op_memory = op_bytes / (bandwidth * memory_at(op_bytes))
            else:
                op_memory = op_bytes / memory_peak
            op_compute = op_compute * layers
            op_memory = op_memory * layers
            # max(op_compute, op_memory), the first of equals, as np.maximum
            if op_compute >= op_memory:
                time_s = op_compute + fixed_s
                compute = compute + op_compute
            else:
                time_s = op_memory + fixed_s
                memory = memory + op_memory
            # CostModel._record's sums, in its order
            total = total + time_s
            overhead = overhead + fixed_s
            work = work + op_flops * layers
            moved = moved + op_bytes * layers
            decode = decode + time_s
        kernels = total
        step_overhead = self._step_overhead_s
        overhead_sum = overhead
        engine = self._engine
        if engine is not None:  # EngineRuntime.time
            runtime, launch, cpu, serial = engine
            gpu = max(kernels, launch)
            timed = max(gpu, cpu) if runtime.runtime.overlap else gpu + cpu
            if serial is not None:
                timed = timed + serial
            step_overhead = timed - kernels
            kernels = timed
            overhead_sum = overhead + step_overhead
        sums = [compute, memory, comm_s, overhead_sum]
        return [kernels, float(sums.index(max(sums))), work, moved, gemm_s, prefill_s, decode, elementwise_s,
                comm_s, step_overhead, 0.0, 0.0]

    def _price(self, keys: list[np.ndarray], steps: int) -> np.ndarray:
        """The records of steps whose attention kinds read ``keys`` keys (one array per kind)."""
        total_s, compute_s, memory_s, overhead_s, flops, nbytes, gemm_s, elementwise_s, comm_s, prefill_s, \
            decode_s = self._part
        n, kv_bytes = self._n, self._kv_bytes
        total: np.ndarray | float = total_s
        compute: np.ndarray | float = compute_s
        memory: np.ndarray | float = memory_s
        overhead: float = overhead_s
        work: np.ndarray | float = flops
        moved: np.ndarray | float = nbytes
        decode: np.ndarray | float = decode_s
        for kind, kind_keys in zip(self._kinds, keys, strict=True):
            shape, layers = kind.shape, kind.layers
            # decode_attention_of, element by element
            op_flops = kind_keys * shape.decode_flops_per_key
            op_bytes = (kind_keys + n) * shape.cache_elements_per_token * kv_bytes + kind.io_bytes
            op_compute = op_flops / kind.compute_peak
            if kind.memory_peak is None:
                op_memory = op_bytes / (self._bandwidth * kind.eff.memory.at_many(op_bytes))
            else:
                op_memory = op_bytes / kind.memory_peak
            op_compute = op_compute * layers
            op_memory = op_memory * layers
            time_s = np.maximum(op_compute, op_memory) + kind.fixed_s
            # CostModel._record's sums, in its order
            total = total + time_s
            compute_bound = op_compute >= op_memory
            if compute_bound.all():
                compute = compute + op_compute
            elif not compute_bound.any():
                memory = memory + op_memory
            else:  # adding 0.0 leaves a sum as it is, as _record's skipped branch does
                compute = compute + np.where(compute_bound, op_compute, 0.0)
                memory = memory + np.where(compute_bound, 0.0, op_memory)
            overhead = overhead + kind.fixed_s
            work = work + op_flops * layers
            moved = moved + op_bytes * layers
            decode = decode + time_s
        columns = np.empty((RECORD_FIELDS, steps))  # one row per field, then transposed
        kernels = columns[0]
        kernels[:] = total
        step_overhead: np.ndarray | float = self._step_overhead_s
        engine = self._engine
        if engine is not None:  # EngineRuntime.time, element by element
            runtime, launch, cpu, serial = engine
            gpu = np.maximum(kernels, launch)
            timed = np.maximum(gpu, cpu) if runtime.runtime.overlap else gpu + cpu
            if serial is not None:
                timed = timed + serial
            step_overhead = timed - kernels
            columns[9] = step_overhead
            kernels[:] = timed
            overhead_sum: np.ndarray | float = overhead + columns[9]
        else:
            columns[9] = step_overhead
            overhead_sum = overhead
        sums = columns[1:5]  # (compute, memory, communication, overhead), overwritten below
        sums[0], sums[1], sums[2], sums[3] = compute, memory, comm_s, overhead_sum
        columns[1] = np.argmax(sums, axis=0)  # the first largest, as sums.index(max(sums))
        columns[2] = work
        columns[3] = moved
        columns[4] = gemm_s
        columns[5] = prefill_s
        columns[6] = decode
        columns[7] = elementwise_s
        columns[8] = comm_s
        columns[10:] = 0.0
        return columns.T
