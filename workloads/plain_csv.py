"""A reader for well-formed numeric trace CSVs that needs no pandas.

Importing pandas costs 0.3-0.45 s on the 2-core machine, more than parsing the 19,366 rows of the
Azure 2023 conversation trace takes in plain Python (about 0.03 s), and a run that resamples a
trace's lengths needs nothing else from pandas (issue #18: start-up). So
:func:`servesim.workloads.traces` first asks this module; it answers only for a file it can read
without any judgement (no quotes, no blank or ragged lines, every length a plain run of ASCII
digits, every Azure timestamp of one ISO shape) and returns None otherwise, and the pandas reader
then parses the file and words any error. Where this reader answers, its columns are the pandas
reader's, value for value (``tests/test_workloads_traces.py`` compares both on the shared traces
and on generated files), so a result never depends on which reader ran.
"""

from __future__ import annotations

import re

import numpy as np

MAX_DIGITS = 15
"""Longer digit runs go to pandas (which refuses counts past 2**53, about 9e15)."""

_STAMP = r"(?:19|20)\d\d-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d{1,9})?"
_STAMPS = re.compile(rf"(?:{_STAMP}\n)*{_STAMP}")
"""Naive ISO timestamps (the Azure 2023 shape), one per line: NumPy reads exactly these as
pandas' ISO 8601 parser does, to the nanosecond. Zoned ones (2024's ``+00:00``) go to pandas."""


def plain_columns(text: str, required: list[str]) -> dict[str, list[str]] | None:
    """The raw text of each ``required`` column, or None unless every line past the header has
    the header's number of comma-separated fields and the text has no quotes, lone carriage
    returns or blank lines (one trailing line end allowed; Windows line ends, as the Azure traces
    are written, read as Unix ones)."""
    if '"' in text:
        return None
    if "\r" in text:
        if text.count("\r") != text.count("\r\n"):
            return None
        text = text.replace("\r\n", "\n")
    body = text[:-1] if text.endswith("\n") else text
    lines = body.split("\n")
    header = [name.strip() for name in lines[0].split(",")]
    if len(lines) < 2 or len(set(header)) != len(header) or any(c not in header for c in required):
        return None
    width = len(header)
    if body.count(",") != (width - 1) * len(lines):
        return None  # some line has another number of fields
    rows = [line.split(",") for line in lines[1:]]
    if any(len(row) != width for row in rows):
        return None  # a line with too many commas beside one with too few
    return {name: [row[column] for row in rows] for name, column in ((n, header.index(n)) for n in required)}


def whole_numbers(values: list[str]) -> np.ndarray | None:
    """``values`` as int64 when each is a non-empty run of at most :data:`MAX_DIGITS` ASCII
    digits, else None (signs, decimals, spaces and blanks are the pandas reader's to judge)."""
    joined = "".join(values)
    if not (joined.isascii() and joined.isdigit()) or min(map(len, values)) == 0:
        return None
    if max(map(len, values)) > MAX_DIGITS:
        return None
    return np.fromiter(map(int, values), dtype=np.int64, count=len(values))


def naive_timestamp_seconds(values: list[str]) -> np.ndarray | None:
    """Seconds from the earliest of ``values`` when each is a naive ISO timestamp
    (``2023-11-16 18:15:46.6805900``) and they span under 2**53 ns (104 days), else None. Computed
    as pandas' ``total_seconds`` does: whole seconds plus the remaining nanoseconds / 1e9 (the sum
    of the same two correctly rounded terms, whatever resolution pandas parsed at)."""
    if _STAMPS.fullmatch("\n".join(values)) is None:
        return None
    try:
        stamps = np.array(values, dtype="datetime64[ns]").astype(np.int64)
    except ValueError:  # a month 13, a day 32: pandas words the error
        return None
    delta = stamps - stamps.min()
    if delta.max() > 2**53:
        return None
    whole, rest = np.divmod(delta, 1_000_000_000)
    return whole + rest / 1_000_000_000
