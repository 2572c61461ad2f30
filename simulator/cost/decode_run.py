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

import numpy as np

from servesim.cost.attention import ATTENTION_IO_BYTES, AttentionShape, decode_run_keys
from servesim.cost.engine_runtime import EngineRuntime
from servesim.hardware import HardwareProfile, OperatorEfficiency

RECORD_FIELDS = 12
"""``len(StepRecord._fields)``: one column per field (proposal and verify seconds stay 0)."""


@dataclass(frozen=True, slots=True)
class _Kind:
    """One attention kind's constants for ``n`` decodes (see :func:`decode_attention_of`)."""

    shape: AttentionShape
    eff: OperatorEfficiency
    layers: int
    io_bytes: float
    """``n * (q_width + o_width) * ATTENTION_IO_BYTES``: Q read and O written, per layer."""
    compute_peak: float
    """``peak_flops * compute_efficiency(n)``."""
    memory_peak: float | None
    """``bandwidth * memory_efficiency(n)`` when the memory curve reads tokens (None: it reads
    each step's bytes)."""
    fixed_s: float
    """``fixed_s * layers``."""


class DecodeRunPricer:
    """Prices runs of ``n`` decodes (one per ``n`` per cost model; see the module docstring)."""

    def __init__(self, n: int, part_totals: tuple[float, float, float, float, float, float, float,
                                                    float, float],
                 attention: list[tuple[AttentionShape, int]], hardware: HardwareProfile,
                 peak_flops: float, kv_bytes: float, step_overhead_s: float,
                 engine: tuple[EngineRuntime, float, float, float | None] | None) -> None:
        """``part_totals``: the memoised token part's (total, compute, memory, overhead, flops,
        bytes, gemm, elementwise, communication) seconds and work; ``engine``: (runtime, launch,
        CPU, serial or None) host times of a step of ``n`` decodes, or None for the flat runtime
        (whose constant ``step_overhead_s`` is in the token part already)."""
        self.n = n
        self._n = float(n)
        self._part = part_totals
        self._step_overhead_s = step_overhead_s
        self._engine = engine
        self._kv_bytes = kv_bytes
        eff = hardware.efficiency.attention_decode
        self._tile = eff.key_tile
        self._bandwidth = hardware.memory.bandwidth_Bps
        kinds = []
        for shape, layers in attention:
            memory_peak = None
            if eff.memory.axis != "bytes":
                memory_peak = hardware.memory.bandwidth_Bps * eff.memory.at(self._n)
            kinds.append(_Kind(shape, eff, layers,
                               self._n * (shape.decode_q_width + shape.decode_o_width) * ATTENTION_IO_BYTES,
                               peak_flops * eff.compute.at(self._n), memory_peak, eff.fixed_s * layers))
        self._kinds = tuple(kinds)

    def records(self, context: np.ndarray, first_step: int, steps: int) -> np.ndarray:
        """Rows of the :class:`~servesim.cost.StepRecord` fields of decode steps ``first_step ..
        first_step + steps - 1`` over ``context`` (``n`` requests' cached tokens at step 0)."""
        total_s, compute_s, memory_s, overhead_s, flops, nbytes, gemm_s, elementwise_s, comm_s = self._part
        n, kv_bytes = self._n, self._kv_bytes
        total: np.ndarray | float = total_s
        compute: np.ndarray | float = compute_s
        memory: np.ndarray | float = memory_s
        overhead: float = overhead_s
        work: np.ndarray | float = flops
        moved: np.ndarray | float = nbytes
        decode: np.ndarray | float = 0.0
        for kind in self._kinds:
            shape, layers = kind.shape, kind.layers
            keys = decode_run_keys(context, first_step, steps, shape, self._tile)
            # decode_attention_of, element by element
            op_flops = keys * shape.decode_flops_per_key
            op_bytes = (keys + n) * shape.cache_elements_per_token * kv_bytes + kind.io_bytes
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
        columns[5] = 0.0
        columns[6] = decode
        columns[7] = elementwise_s
        columns[8] = comm_s
        columns[10:] = 0.0
        return columns.T
