"""Durations as users write them: ``500ms``, ``0.5s``, ``250us``, or a bare number.

The serving ecosystem quotes latency limits in milliseconds on the command line
(``vllm bench serve --goodput ttft:500 tpot:50``, AIConfigurator's ``--ttft 300 --tpot 10``)
and servesim's YAML keys in the unit their name ends in (``slo.ttft_s``). One rule makes every
value unambiguous:

- a number **with a unit** (``ms``, ``s``, ``us``/``µs``, ``min``) means exactly that, anywhere;
- a **bare number** is in the unit of the name it is given under: seconds under a key ending in
  ``_s`` (``tpot_s: 0.05``), milliseconds under a key ending in ``_ms`` (``tpot_ms: 50``) and
  under the command-line flags ``--ttft``, ``--tpot``, ``--e2e`` (``--tpot 50``), as in vLLM and
  AIConfigurator.

A bare number that is implausible as a limit of its metric in that unit (a TPOT of 80 s, a TTFT of
0.05 ms: the classic slip between seconds and milliseconds) is refused with the spelling that fixes
it, instead of passing silently and producing a plan nobody asked for. A value with an explicit
unit is taken as meant.
"""

from __future__ import annotations

import math
import re
from typing import Literal

Unit = Literal["s", "ms"]

UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "min": 60.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|us|µs|min)?\s*$")

PLAUSIBLE_S: dict[str, tuple[float, float]] = {
    "ttft": (0.005, 600.0),
    "tpot": (0.001, 10.0),
    "e2e": (0.005, 86_400.0),
}
"""Per metric, the range a bare number must fall in once read in its unit (seconds). Below: no
engine emits a first token in under 5 ms (a prefill step plus the engine's own overhead) or a
token every microsecond; above: 80 s per output token or a 10-minute first token is not a
latency objective, it is a unit slip."""

NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E latency"}


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:g} ms" if seconds < 1 else f"{seconds:g} s"


def parse_duration(value: object, metric: str, bare_unit: Unit, name: str) -> float:
    """``value`` in seconds. ``metric`` (``ttft``, ``tpot``, ``e2e``) picks the plausible range of
    a bare number, read in ``bare_unit``; ``name`` is the key or flag it came under (for the
    message). Raises ``ValueError`` with the fix (the schema turns it into one line)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{value!r} is not a duration; write e.g. 500ms or 0.5s")
    explicit = False
    unit: str
    if isinstance(value, int | float):
        number, unit = float(value), bare_unit
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"{value!r} is not a duration; write a number with a unit, e.g. 500ms or 0.5s")
        number = float(match.group(1))
        explicit = match.group(2) is not None
        unit = match.group(2) or bare_unit
    else:
        raise ValueError(f"{value!r} is not a duration; write e.g. 500ms or 0.5s")
    seconds = number * UNIT_SECONDS[unit]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("must be a positive duration")
    if not explicit:
        low, high = PLAUSIBLE_S[metric]
        if not low <= seconds <= high:
            raise ValueError(_implausible(number, unit, metric, name))
    return seconds


def _implausible(number: float, unit: str, metric: str, name: str) -> str:
    label = NAMES[metric]
    seconds = number * UNIT_SECONDS[unit]
    other = "ms" if unit == "s" else "s"
    return (f"{number:g} under {name} is {_fmt(seconds)}, implausible for {label} (a bare number there "
            f"is in {'seconds' if unit == 's' else 'milliseconds'}): write {number:g}{other} if that is "
            f"what you meant, or {number:g}{unit} to keep it")
