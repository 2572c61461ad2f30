"""Human-readable numbers and the latency metrics a report talks about.

One table of metrics (name, display unit) keeps the verdict, the tables and the chart axes in the
same units: TTFT, E2E and queueing in seconds, TPOT and ITL in milliseconds, as serving engineers
quote them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MISSING = "–"


@dataclass(frozen=True)
class Metric:
    """A latency metric: its summary key, label, display unit and per-request column."""

    key: str
    label: str
    unit: str
    request_column: str | None  # the per-request value an SLO on this metric is checked against

    @property
    def scale(self) -> float:
        """Factor from seconds to the display unit."""
        return 1e3 if self.unit == "ms" else 1.0


METRICS: dict[str, Metric] = {
    "ttft_s": Metric("ttft_s", "TTFT", "s", "ttft_s"),
    "tpot_s": Metric("tpot_s", "TPOT", "ms", "tpot_s"),
    "itl_s": Metric("itl_s", "ITL", "ms", "max_itl_s"),
    "e2e_s": Metric("e2e_s", "E2E", "s", "e2e_s"),
    "queueing_s": Metric("queueing_s", "Queueing", "s", None),
}


def as_float(value: Any) -> float:
    """A JSON number as float; None, strings and other junk become NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def fmt_sig(value: Any, digits: int = 3) -> str:
    """``digits`` significant figures, keeping trailing zeros (2.00, 1.42, 142); thousands separated."""
    x = as_float(value)
    if not math.isfinite(x):
        return MISSING
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    if x == 0:
        return "0"
    text = f"{x:#.{digits}g}"
    if "e" in text:  # very small: plain scientific notation reads better than 0.0000142
        return f"{x:.{digits - 1}e}"
    return text.rstrip(".")


def fmt_latency(seconds: Any, unit: str) -> str:
    """A latency given in seconds, shown in ``unit`` ("s" or "ms")."""
    x = as_float(seconds)
    if not math.isfinite(x):
        return MISSING
    return f"{fmt_sig(x * (1e3 if unit == 'ms' else 1.0))} {unit}"


def fmt_pct(fraction: Any, decimals: int = 1) -> str:
    """A fraction as a percentage."""
    x = as_float(fraction)
    return MISSING if not math.isfinite(x) else f"{100 * x:.{decimals}f}%"


def fmt_count(value: Any) -> str:
    """An integer count with thousands separators."""
    x = as_float(value)
    return MISSING if not math.isfinite(x) else f"{round(x):,}"


def fmt_rate(value: Any, unit: str) -> str:
    """A rate (requests/s, tokens/s) with its unit."""
    text = fmt_sig(value)
    return text if text == MISSING else f"{text} {unit}"


def format_value(value: Any) -> str:
    """A varied key's value as people read it: ``16``, ``chunked_prefill``, and a mapping (a
    ``policy`` with its knobs) as ``sjf (predictor=noisy, sigma=1)`` rather than a Python dict
    repr, also when an older sweep stored it as that repr's text."""
    if isinstance(value, str) and value[:1] in "{[":
        value = _literal(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:g}"
    if value is None:
        return "–"
    if isinstance(value, dict):
        items = {k: v for k, v in value.items() if v is not None}
        name = items.pop("name", None)
        knobs = ", ".join(f"{k}={format_value(v)}" for k, v in items.items())
        if name is None:
            return knobs or "–"
        return f"{name} ({knobs})" if knobs else str(name)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def _literal(text: str) -> Any:
    """The Python or JSON literal ``text`` spells (a mapping stored as its repr), else the text."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
