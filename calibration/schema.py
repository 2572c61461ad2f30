"""The on-disk format of a calibration run: one CSV per kernel family plus ``metadata.json``.

Every family shares ``time_s`` (median seconds of one kernel), ``source`` (who measured it) and
the shape columns its cost needs. Benchmarks write these files, the Vidur importer produces the
same tables in memory, and ``fit`` and ``validate`` read only them, so they never need torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim.atomic_io import atomic_write
from servesim.errors import ServesimError

FAMILIES: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k", "dtype"),
    "gemm_fp8": ("m", "n", "k", "dtype"),
    "gemm_fp4": ("m", "n", "k", "dtype"),
    "attention_prefill": ("batch", "seq", "context", "heads", "kv_heads", "head_dim"),
    "attention_decode": ("batch", "context", "heads", "kv_heads", "head_dim"),
    "memory": ("bytes",),
    "allreduce": ("bytes", "world"),
}
"""Required shape columns per family (besides ``time_s``)."""

HOLDOUT_AXIS = {"gemm": "m", "gemm_fp8": "m", "gemm_fp4": "m", "attention_prefill": "seq",
                "attention_decode": "context",
                "attention_decode_fp8": "context",
                "memory": "bytes", "allreduce": "bytes", "moe": "tokens", "moe_fp8": "tokens",
                "moe_w4a16": "tokens", "moe_fp4": "tokens"}
"""The column whose every other distinct value is held out of the fit (see :func:`holdout_mask`)."""

METADATA = "metadata.json"


def write_family(out: Path, family: str, rows: pd.DataFrame) -> Path:
    path = out / f"{family}.csv"
    atomic_write(path, lambda tmp: rows.to_csv(tmp, index=False))  # whole or absent on Ctrl-C
    return path


def read_measurements(directory: Path) -> dict[str, pd.DataFrame]:
    """Every family CSV found in ``directory``, checked for its columns."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ServesimError("measurements", f"no such directory {directory}",
                            "give the --out folder of `servesim calibrate bench`")
    tables: dict[str, pd.DataFrame] = {}
    for family, columns in FAMILIES.items():
        path = directory / f"{family}.csv"
        if not path.exists():
            continue
        table = pd.read_csv(path)
        missing = [c for c in (*columns, "time_s") if c not in table.columns]
        if missing:
            raise ServesimError(f"{path}", f"missing column(s) {', '.join(missing)}",
                                "re-run `servesim calibrate bench` to write it")
        table = table[np.isfinite(table["time_s"]) & (table["time_s"] > 0)]
        if len(table):
            tables[family] = table.reset_index(drop=True)
    if not tables:
        raise ServesimError("measurements", f"{directory} holds no {'/'.join(FAMILIES)} CSV",
                            "run `servesim calibrate bench --out DIR` first")
    return tables


def read_metadata(directory: Path) -> dict[str, Any]:
    path = Path(directory) / METADATA
    return json.loads(path.read_text()) if path.exists() else {}


def holdout_mask(table: pd.DataFrame, family: str) -> np.ndarray:
    """True for rows held out of the fit: those whose hold-out axis value has an odd rank among
    the distinct values. The fit never sees them, so validation on them is out of sample, and
    because they interleave with the fitted values they test the interpolation between knots."""
    if "op" in table.columns and family == "memory":  # each elementwise op on its own size grid
        mask = np.zeros(len(table), dtype=bool)
        for _, index in table.groupby("op").groups.items():
            rows = np.asarray(index)
            mask[rows] = holdout_mask(table.loc[rows].drop(columns="op"), family)
        return mask
    column = table[HOLDOUT_AXIS[family]].to_numpy()
    values = np.unique(column)
    odd = values[1::2]
    return np.isin(column, odd)
