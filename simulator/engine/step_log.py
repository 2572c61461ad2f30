"""One record per iteration, written into preallocated NumPy chunks (one row per step, no
Python object kept per step), and turned into the steps table at the end."""

from __future__ import annotations

import numpy as np
import pandas as pd
from servesim.cost import BOUNDS, OP_CLASSES

OP_COLUMNS = tuple(f"op_{name}_s" for name in OP_CLASSES)
"""Seconds of each operator class in a step (``op_gemm_s``, ``op_attn_prefill_s``, ...); they sum
to ``duration_s - extra_s``."""

# The fields after ``preempted`` are CostModel.step_record's tuple, in its order, so the replica
# appends it unpacked; to_frame puts ``duration_s`` back beside ``start_s``.
ROW = np.dtype([("replica", np.int64), ("start_s", np.float64), ("num_prefills", np.int64),
                ("num_decodes", np.int64), ("prefill_tokens", np.int64), ("decode_tokens", np.int64),
                ("kv_blocks_used", np.int64), ("waiting", np.int64), ("running", np.int64),
                ("preempted", np.int64), ("duration_s", np.float64), ("bound", np.int8),
                ("flops", np.float64), ("hbm_bytes", np.float64),
                *((name, np.float64) for name in OP_COLUMNS), ("extra_s", np.float64)])
"""``duration_s`` is the priced model pass plus ``extra_s`` (time beyond it: KV swap copies), so the
``op_*_s`` columns sum to ``duration_s - extra_s``."""
_CHUNK = 1 << 15


class StepLog:
    """The steps table under construction; :meth:`append` is called once per iteration."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._current = np.empty(_CHUNK, dtype=ROW)
        self._fill = 0

    def __len__(self) -> int:
        return len(self._chunks) * _CHUNK + self._fill

    def append(self, *values: float) -> None:
        """One step's values, in the order of :data:`ROW`'s fields."""
        if self._fill == _CHUNK:
            self._chunks.append(self._current)
            self._current = np.empty(_CHUNK, dtype=ROW)
            self._fill = 0
        self._current[self._fill] = values
        self._fill += 1

    def records(self) -> np.ndarray:
        return np.concatenate([*self._chunks, self._current[:self._fill]])

    def to_frame(self, blocks_total: list[int], pools: list[str] | None = None) -> pd.DataFrame:
        """``blocks_total`` and (disaggregated runs) ``pools`` are per replica index."""
        rows = self.records()
        frame = pd.DataFrame({name: rows[name] for name in ROW.names if name != "bound"})
        frame.insert(2, "duration_s", frame.pop("duration_s"))
        frame.insert(1, "step", frame.groupby("replica").cumcount().astype(np.int64))
        frame.insert(frame.columns.get_loc("num_decodes") + 1, "batch_size",
                     frame["num_prefills"] + frame["num_decodes"])
        totals = np.asarray(blocks_total, dtype=np.int64)
        frame.insert(frame.columns.get_loc("kv_blocks_used") + 1, "kv_blocks_total",
                     totals[frame["replica"].to_numpy()])
        frame.insert(frame.columns.get_loc("preempted") + 1, "bound",
                     np.asarray(BOUNDS, dtype=object)[rows["bound"]])
        if pools is not None:
            frame.insert(1, "pool", np.asarray(pools, dtype=object)[frame["replica"].to_numpy()])
        return frame
