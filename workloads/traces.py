"""Trace readers: real request logs turned into a :class:`RequestTable`.

Formats (``TRACE_FORMATS``):

==========  ===================================================================================
``csv``       ``arrival_s,prompt_tokens,output_tokens[,priority]``: servesim's own plain format.
``azure``     Azure LLM inference traces, 2023 (1 hour) and 2024 (one week, May 2024, the data
              of the DynamoLLM paper): both ``TIMESTAMP,ContextTokens,GeneratedTokens``.
              TIMESTAMP is a datetime string: 2023 writes 7 fractional digits
              (``2023-11-16 18:17:03.9799600``), 2024 an ISO 8601 time with a UTC offset and 6 or
              no fractional digits (``2024-05-10 00:00:00.009930+00:00``,
              ``2024-05-12 00:00:00+00:00``). Arrivals are seconds from the earliest row; use
              ``start_s``/``end_s`` to replay one day of the week.
``mooncake``  Mooncake JSONL: ``timestamp`` (ms from trace start), ``input_length``,
              ``output_length``, ``hash_ids`` (ids of 512-token prompt blocks, kept as the table's
              prefix blocks so the engine can model prefix caching).
``burstgpt``  BurstGPT: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``;
              Timestamp is seconds from trace start. ``model=`` keeps one model (e.g. ``GPT-4``).
``vidur-stats``  Length statistics ``num_prefill_tokens,num_decode_tokens,...`` as published by
``arxiv``       Sarathi-Serve and Vidur (their ShareGPT and arXiv files: each row one request of
              their processed multi-turn traces). Lengths only, no arrival times: use them as a
              length source (:func:`read_lengths`, or ``lengths: {trace: ...}``) under an arrival
              process. ``arxiv`` reads the same columns. Servesim 0.1 called ``vidur-stats``
              ``sharegpt``; that name now means raw ShareGPT JSON, and a stats file given as
              ``sharegpt`` is an error saying to use ``vidur-stats``.
``sharegpt``  Raw ShareGPT JSON (a list of conversations), read as ``vllm bench serve
              --dataset-name sharegpt`` reads it: each conversation's first turn, pruned by vLLM's
              length filter (:mod:`servesim.workloads.sharegpt`). Lengths only.
==========  ===================================================================================

Decisions, the same for every format:

- Timeline: each format's own clock (seconds from trace start; Azure from its earliest row).
  Unsorted rows are sorted by arrival (stable), and the number moved is reported.
- Rows with 0 prompt or 0 output tokens are dropped, never silently: the count and the first
  line go into ``RequestTable.source`` and a logged warning. (The engine needs >= 1 of each;
  such rows are failed requests, e.g. BurstGPT's rows with 0 response tokens.) Negative, missing
  or fractional lengths, unparsable timestamps and malformed JSON are errors instead, naming the
  column, the file and its 1-based line (header counted). Blank lines are skipped.
- Options apply in this order: the window ``[start_s, end_s)`` on the trace's original timeline;
  re-basing so that ``start_s`` becomes 0 (a window's first request keeps its offset from the
  window start; without ``start_s`` the timeline is kept); ``max_requests`` (the first N after the
  window); then ``rate_scale`` (2.0 replays twice as fast: every arrival time is divided by 2).

Line numbers assume one CSV record per line (no quoted newlines), which all these formats use.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servesim.errors import ServesimError
from servesim.inputs.files import read_text
from servesim.inputs.limits import BYTES_PER_REQUEST, MAX_TRACE_BYTES, check_memory
from servesim.workloads.plain_csv import naive_timestamp_seconds, plain_columns, whole_numbers
from servesim.workloads.requests import RequestTable
from servesim.workloads.sharegpt import first_turns

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

TRACE_FORMATS = ("csv", "azure", "mooncake", "burstgpt", "vidur-stats", "arxiv", "sharegpt")
LENGTH_ONLY_FORMATS = ("vidur-stats", "arxiv", "sharegpt")
MOONCAKE_BLOCK_TOKENS = 512

_HEADERS = {
    "csv": ["arrival_s", "prompt_tokens", "output_tokens"],
    "azure": ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
    "burstgpt": ["Timestamp", "Request tokens", "Response tokens"],
    "vidur-stats": ["num_prefill_tokens", "num_decode_tokens"],
    "arxiv": ["num_prefill_tokens", "num_decode_tokens"],
}

_LENGTH_COLUMNS = {fmt: tuple(cols[-2:]) for fmt, cols in _HEADERS.items()}


@dataclass(frozen=True)
class LengthSample:
    """(prompt, output) pairs of a trace, for resampling: row ``i`` is one real request."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str = ""

    def __len__(self) -> int:
        return int(self.prompt_tokens.size)


@dataclass
class _Rows:
    """A parsed file, in file order: the columns plus the 1-based file line of every row."""

    lines: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    arrival_s: np.ndarray | None = None
    priority: np.ndarray | None = None
    offsets: np.ndarray | None = None
    ids: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)

    def take(self, keep: np.ndarray) -> _Rows:
        offsets, ids = self.offsets, self.ids
        if offsets is not None and ids is not None:
            offsets, ids = _csr_take(offsets, ids, np.flatnonzero(keep))
        arrival = None if self.arrival_s is None else self.arrival_s[keep]
        priority = None if self.priority is None else self.priority[keep]
        return _Rows(self.lines[keep], self.prompt[keep], self.output[keep], arrival, priority,
                     offsets, ids, self.notes)


# ---------------------------------------------------------------------------------------- public
def read_trace(path: str | Path, format: str, *, rate_scale: float = 1.0, start_s: float | None = None,
               end_s: float | None = None, max_requests: int | None = None,
               model: str | None = None) -> RequestTable:
    """Read a trace with arrival times (see the module docstring for formats and options)."""
    path = Path(path).expanduser()
    fmt = _check_format(format)
    if fmt in LENGTH_ONLY_FORMATS:
        raise ServesimError("format", f"{fmt} files hold lengths only, no arrival times",
                            f"use it as a length source under an arrival process, e.g. lengths: "
                            f"{{trace: {path}, format: {fmt}}} with arrival: {{process: poisson, rate: 4}}")
    _check_options(rate_scale, start_s, end_s, max_requests)
    rows = _parse(path, fmt, model)
    n_rows = rows.lines.size
    assert rows.arrival_s is not None
    moved = int(np.count_nonzero(np.diff(rows.arrival_s) < 0))
    if moved:
        rows.notes.append(f"sorted {moved} out-of-order rows by arrival")
    table = RequestTable.unsorted(rows.arrival_s, rows.prompt, rows.output, priority=rows.priority,
                                  prefix_block_offsets=rows.offsets, prefix_block_ids=rows.ids,
                                  prefix_block_size=MOONCAKE_BLOCK_TOKENS)
    span = (float(table.arrival_s[0]), float(table.arrival_s[-1])) if len(table) else (0.0, 0.0)
    if start_s is not None or end_s is not None:
        lo = -math.inf if start_s is None else start_s
        hi = math.inf if end_s is None else end_s
        table = table.take((table.arrival_s >= lo) & (table.arrival_s < hi))
        if start_s is not None:
            table = replace(table, arrival_s=table.arrival_s - start_s)
        rows.notes.append(f"window [{_num(start_s, 0)}, {_num(end_s, 'end')}) s kept {len(table)}")
        if not len(table):
            raise ServesimError("start_s/end_s", f"the window [{start_s}, {end_s}) s of {path} holds no "
                                f"requests (the trace spans {span[0]:.6g} to {span[1]:.6g} s)",
                                "choose a window inside the trace's span")
    if max_requests is not None and max_requests < len(table):
        table = table.take(np.arange(max_requests))
        rows.notes.append(f"first {max_requests}")
    if rate_scale != 1.0:
        table = replace(table, arrival_s=table.arrival_s / rate_scale)
        rows.notes.append(f"rate x{rate_scale:g}")
    notes = "; ".join(rows.notes)
    source = f"{path.name} ({fmt}): {len(table)} of {n_rows} rows" + (f"; {notes}" if notes else "")
    return replace(table, source=source)


def read_lengths(path: str | Path, format: str, *, model: str | None = None,
                 tokenizer: str | None = None) -> LengthSample:
    """The (prompt, output) pairs of any format, arrivals ignored, for resampling (``tokenizer``:
    raw ShareGPT JSON only, see :mod:`servesim.workloads.tokens`)."""
    path = Path(path).expanduser()
    fmt = _check_format(format)
    if fmt == "sharegpt":
        prompt, output, source = first_turns(path, tokenizer)
        return LengthSample(prompt, output, source)
    if tokenizer is not None:
        raise ServesimError("tokenizer", f"applies to sharegpt JSON, whose lengths are text; {fmt} files "
                            "hold token counts", "remove tokenizer")
    rows = _parse(path, fmt, model)
    notes = "; ".join(rows.notes)
    source = f"{path.name} ({fmt}): {rows.lines.size} length pairs" + (f"; {notes}" if notes else "")
    return LengthSample(rows.prompt, rows.output, source)


# ---------------------------------------------------------------------------------------- parsing
def _parse(path: Path, fmt: str, model: str | None) -> _Rows:
    if not path.is_file():
        raise ServesimError("path", f"no such trace file {path}",
                            "check the path (in a YAML, relative paths resolve against the YAML's folder)")
    if model is not None and fmt != "burstgpt":
        raise ServesimError("model", f"filtering by model applies to burstgpt traces, not {fmt}",
                            "remove model")
    text = read_text(path, "path", MAX_TRACE_BYTES)  # the input layer: unreadable, huge or non-UTF-8
    lines = text.count("\n") + 1
    check_memory(lines * BYTES_PER_REQUEST["summary"] + 4 * len(text), "path",
                 f"{path}'s {lines:,} rows", "replay a part of it (cut the file, or read it as "
                 "lengths: {trace: ...} under a generated arrival process with fewer requests)")
    rows = _parse_mooncake(path, text) if fmt == "mooncake" else _parse_csv(path, text, fmt, model)
    return _drop_empty(rows, path)


def _parse_csv(path: Path, text: str, fmt: str, model: str | None) -> _Rows:
    plain = _parse_plain(text, fmt) if model is None else None
    if plain is not None:
        return plain
    frame, lines = _read_csv(path, text, fmt, _HEADERS[fmt] + (["Model"] if model is not None else []))
    notes: list[str] = []
    if model is not None:
        names = frame["Model"].astype(str).str.strip()
        keep = (names == model).to_numpy()
        if not keep.any():
            raise ServesimError("model", f"no rows of model {model!r} in {path}",
                                f"use one of {', '.join(sorted(names.unique()))}")
        notes.append(f"model {model} only ({int((~keep).sum())} rows of other models skipped)")
        frame, lines = frame[keep], lines[keep]
    prompt_col, output_col = _LENGTH_COLUMNS[fmt]
    prompt = _whole(frame[prompt_col], prompt_col, lines, path)
    output = _whole(frame[output_col], output_col, lines, path)
    arrival = priority = None
    if fmt == "csv":
        arrival = _seconds(frame["arrival_s"], "arrival_s", lines, path)
        if "priority" in frame.columns:
            priority = _whole(frame["priority"], "priority", lines, path, negative_ok=True)
    elif fmt == "burstgpt":
        arrival = _seconds(frame["Timestamp"], "Timestamp", lines, path)
    elif fmt == "azure":
        arrival = _azure_seconds(frame["TIMESTAMP"], lines, path)
    return _Rows(lines, prompt, output, arrival, priority, notes=notes)


_PLAIN_FORMATS = ("azure", "vidur-stats", "arxiv")
"""Formats :mod:`servesim.workloads.plain_csv` may read: whole-number lengths and naive Azure
timestamps. (``csv`` and ``burstgpt`` times are decimals, which pandas' parser and Python's
``float`` may round differently in the last place; they stay with pandas.)"""


def _parse_plain(text: str, fmt: str) -> _Rows | None:
    """The file read without pandas, when :mod:`~servesim.workloads.plain_csv` can; else None."""
    if fmt not in _PLAIN_FORMATS:
        return None
    columns = plain_columns(text, _HEADERS[fmt])
    if columns is None:
        return None
    prompt_col, output_col = _LENGTH_COLUMNS[fmt]
    prompt, output = whole_numbers(columns[prompt_col]), whole_numbers(columns[output_col])
    if prompt is None or output is None:
        return None
    arrival = None
    if fmt == "azure":
        arrival = naive_timestamp_seconds(columns["TIMESTAMP"])
        if arrival is None:
            return None
    return _Rows(np.arange(prompt.size, dtype=np.int64) + 2, prompt, output, arrival)


def _read_csv(path: Path, text: str, fmt: str, required: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """The file's text as a frame (blank lines skipped) and the file line of each kept row."""
    import pandas as pd  # here: validating a config that names no CSV trace needs no pandas
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            # index_col=False: a row with an extra field must not shift the columns silently.
            frame = pd.read_csv(io.StringIO(text, newline=""), skip_blank_lines=False,
                                skipinitialspace=True, index_col=False)
    except pd.errors.EmptyDataError:
        raise ServesimError("path", f"{path} is empty", f"a {fmt} trace starts with the header "
                            f"{','.join(_HEADERS[fmt])}") from None
    except pd.errors.ParserWarning:
        line, fields, expected = _first_ragged_row(text)
        raise ServesimError("path", f"{path} line {line} has {fields} fields but the header has {expected}",
                            "fix that line (one value per header column)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ServesimError("path", f"{path} is not a readable CSV ({' '.join(str(exc).split())})",
                            "fix that line") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ServesimError(missing[0], f"column(s) {', '.join(missing)} missing from the header of "
                            f"{path} line 1 (found: {', '.join(frame.columns)})",
                            f"a {fmt} trace has the header {','.join(_HEADERS[fmt])}")
    lines = np.arange(len(frame), dtype=np.int64) + 2
    blank = frame.isna().all(axis=1).to_numpy()
    if blank.any():
        frame, lines = frame[~blank], lines[~blank]
    return frame, lines


def _first_ragged_row(text: str) -> tuple[int, int, int]:
    """(1-based line, its field count, the header's) of the first row whose width differs."""
    rows = csv.reader(io.StringIO(text, newline=""))
    header = next(rows, [])
    for row in rows:
        if row and len(row) != len(header):
            return rows.line_num, len(row), len(header)
    return 0, 0, len(header)


_MAX_WHOLE = 2.0**53
"""Larger counts are not token counts (and would not survive the conversion to int64 exactly)."""


def _is_bool(value: object) -> bool:
    return type(value) is bool


def _whole(column: pd.Series, name: str, lines: np.ndarray, path: Path, *,
           negative_ok: bool = False) -> np.ndarray:
    """A column of whole numbers (>= 0 unless ``negative_ok``), or an error at its first bad row."""
    import pandas as pd  # here: validating a config that names no CSV trace needs no pandas
    is_bool = (np.ones(len(column), bool) if pd.api.types.is_bool_dtype(column.dtype)
               else column.map(_is_bool).to_numpy(dtype=bool) if column.dtype == object
               else np.zeros(len(column), bool))
    if is_bool.any():
        i = int(np.argmax(is_bool))
        raise ServesimError(name, f"{_shown(column.iloc[i])} at {path} line {lines[i]} is not a number",
                            "fix or delete that row")
    if pd.api.types.is_integer_dtype(column.dtype):
        values = column.to_numpy(dtype=np.int64)
        bad = np.zeros(values.size, bool) if negative_ok else values < 0
    else:
        numbers = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(numbers) | (numbers != np.floor(numbers)) | (np.abs(numbers) > _MAX_WHOLE)
        if not negative_ok:
            bad |= numbers < 0
        values = np.where(bad, 0, numbers).astype(np.int64)
    if bad.any():
        i = int(np.argmax(bad))
        kind = "a whole number" if negative_ok else "a whole number of tokens >= 0"
        raise ServesimError(name, f"{_shown(column.iloc[i])} at {path} line {lines[i]} is not {kind}",
                            "fix or delete that row")
    return values


def _seconds(column: pd.Series, name: str, lines: np.ndarray, path: Path) -> np.ndarray:
    import pandas as pd  # here: validating a config that names no CSV trace needs no pandas
    numbers = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(numbers) | (numbers < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ServesimError(name, f"{_shown(column.iloc[i])} at {path} line {lines[i]} is not a time in "
                            "seconds >= 0", "fix or delete that row")
    return numbers


def _azure_seconds(column: pd.Series, lines: np.ndarray, path: Path) -> np.ndarray:
    import pandas as pd  # here: validating a config that names no CSV trace needs no pandas
    try:
        stamps = pd.to_datetime(column, format="ISO8601", errors="coerce")
    except (ValueError, TypeError) as exc:  # e.g. a mix of zoned and naive stamps
        raise ServesimError("TIMESTAMP", f"cannot parse the timestamps of {path} ({exc})",
                            "use one datetime format, e.g. 2023-11-16 18:17:03.9799600") from None
    bad = stamps.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise ServesimError("TIMESTAMP", f"{_shown(column.iloc[i])} at {path} line {lines[i]} is not a "
                            "datetime", "write it like 2023-11-16 18:17:03.9799600 or fix or delete that row")
    if not len(stamps):
        return np.zeros(0)
    return (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=np.float64)


def _parse_mooncake(path: Path, text: str) -> _Rows:
    """One JSON object per line; parsed line by line so an error can name its line."""
    stamps: list[object] = []
    prompt: list[object] = []
    output: list[object] = []
    counts: list[int] = []
    flat: list[object] = []
    lines: list[int] = []
    # one JSON record per line of the text the input layer read
    for lineno, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ServesimError("path", f"malformed JSON at {path} line {lineno} ({exc.msg}, column "
                                f"{exc.colno})", "fix or delete that line") from None
        if not isinstance(record, dict):
            raise ServesimError("path", f"{path} line {lineno} is not a JSON object",
                                "write one object per line") from None
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in record:
                raise ServesimError(key, f"missing at {path} line {lineno}",
                                    "every line needs timestamp, input_length, output_length, hash_ids")
        blocks = record["hash_ids"]
        if not isinstance(blocks, list):
            raise ServesimError("hash_ids", f"{_shown(blocks)} at {path} line {lineno} is not a list",
                                "give a list of block ids")
        stamps.append(record["timestamp"])
        prompt.append(record["input_length"])
        output.append(record["output_length"])
        counts.append(len(blocks))
        flat.extend(blocks)
        lines.append(lineno)
    line_arr = np.asarray(lines, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    ms = _seconds(_series(stamps), "timestamp", line_arr, path)
    ids = _whole(_series(flat), "hash_ids", np.repeat(line_arr, counts), path, negative_ok=True)
    return _Rows(line_arr, _whole(_series(prompt), "input_length", line_arr, path),
                 _whole(_series(output), "output_length", line_arr, path), ms / 1000.0, None, offsets, ids)


def _series(values: list[object]) -> pd.Series:
    """A list from JSON as a Series: a fast numeric one when every value is a number, else object
    (so that ``_whole`` can point at the bad value)."""
    import pandas as pd  # here: validating a config that names no CSV trace needs no pandas
    try:
        array = np.array(values)
    except ValueError:  # ragged nesting
        array = None
    if array is not None and array.ndim == 1 and array.dtype.kind in "iuf":
        return pd.Series(array)
    return pd.Series(values, dtype=object)


# ---------------------------------------------------------------------------------------- helpers
def _drop_empty(rows: _Rows, path: Path) -> _Rows:
    """Drop rows with 0 prompt or 0 output tokens, and say so."""
    empty = (rows.prompt == 0) | (rows.output == 0)
    if not empty.any():
        return rows
    count = int(empty.sum())
    first = int(rows.lines[np.argmax(empty)])
    note = f"dropped {count} rows with 0 prompt or 0 output tokens (first at line {first})"
    log.warning("%s: %s", path, note)
    kept = rows.take(~empty)
    kept.notes.append(note)
    return kept


def _csr_take(offsets: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts, ends = offsets[rows], offsets[rows + 1]
    lengths = ends - starts
    new = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    gather = np.repeat(starts - new[:-1], lengths) + np.arange(new[-1])
    return new, ids[gather]


def _check_format(format: str) -> str:
    fmt = str(format).strip().lower()
    if fmt not in TRACE_FORMATS:
        raise ServesimError("format", f"unknown trace format {format!r}",
                            f"use one of {', '.join(TRACE_FORMATS)}")
    return fmt


def _check_options(rate_scale: float, start_s: float | None, end_s: float | None,
                   max_requests: int | None) -> None:
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise ServesimError("rate_scale", f"must be > 0, got {rate_scale}", "2.0 replays at twice the rate")
    if start_s is not None and not (math.isfinite(start_s) and start_s >= 0):
        raise ServesimError("start_s", f"must be >= 0 s, got {start_s}", "give a time on the trace's clock")
    if end_s is not None and start_s is not None and not end_s > start_s:
        raise ServesimError("end_s", f"must be after start_s ({start_s}), got {end_s}",
                            "the window is [start_s, end_s)")
    if max_requests is not None and max_requests < 1:
        raise ServesimError("max_requests", f"must be >= 1, got {max_requests}", "give a positive count")


def _shown(value: object) -> str:
    """A bad value as it read in the file: numbers bare, text quoted."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "a missing value"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _num(value: float | None, default: object) -> str:
    return f"{value:g}" if value is not None else str(default)
