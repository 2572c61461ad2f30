"""A table as named NumPy columns: what the summary reads of a run, without pandas.

A run that writes only its summary (a benchmark, a sweep point, a capacity probe's report) reads
a few columns of the request, ITL and step tables and reduces each to a handful of numbers. Those
reductions are NumPy's whether the column comes from a DataFrame or not, so the summary reads
its tables through the three helpers below, which take a :class:`ColumnTable` or a DataFrame
alike: the same arrays, the same figures, bit for bit. Importing pandas costs about 0.3 s of CPU
on the 2-core machine, some 15% of the 10,000-request core benchmark as a whole process (issue
#18); it is imported where a figure needs a table operation (a session's groupby, a fleet's
timeline) or where a table is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


class ColumnTable:
    """Equal-length NumPy columns by name. It answers what the summary asks of a table: a column
    by name (the array itself, not a copy), ``len`` (rows), ``in`` and iteration (column names)."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        lengths = {len(values) for values in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths {sorted(lengths)}")
        self._columns = columns
        self._length = lengths.pop() if lengths else 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self._columns[name]

    def __setitem__(self, name: str, values: np.ndarray) -> None:
        if self._columns and len(values) != self._length:
            raise ValueError(f"column {name!r} has {len(values)} rows, the table {self._length}")
        if not self._columns:
            self._length = len(values)
        self._columns[name] = values

    def __len__(self) -> int:
        return self._length

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    def to_frame(self) -> pd.DataFrame:
        """The same columns as a DataFrame (read in place, not copied)."""
        import pandas as pd

        return pd.DataFrame(self._columns, copy=False)


Table = Any
"""A :class:`ColumnTable` or a ``pandas.DataFrame`` (typed loosely: pandas is not imported to
name it)."""


def column(table: Table, name: str) -> np.ndarray:
    """``table[name]`` as a NumPy array (a DataFrame's column values, not copied)."""
    return np.asarray(table[name])


def select(table: Table, mask: np.ndarray | None, names: Iterable[str]) -> Table:
    """The rows of ``table`` where ``mask`` holds (all of them when None), only ``names``: a
    :class:`ColumnTable` of the selected arrays, or the DataFrame's own selection."""
    names = list(names)
    if isinstance(table, ColumnTable):
        if mask is None:
            return ColumnTable({name: table[name] for name in names})
        return ColumnTable({name: table[name][mask] for name in names})
    return table[names] if mask is None else table.loc[mask, names]


def as_frame(table: Table) -> pd.DataFrame:
    """``table`` as a DataFrame, for the figures that need pandas' table operations."""
    return table.to_frame() if isinstance(table, ColumnTable) else table
