"""What a capacity report shows, read from ``capacity.json`` (or the answer in memory).

The planner's answer is one JSON document (:mod:`servesim.capacity.output`); the report needs it
as tables: one row per candidate with its fleet, costs and headroom, and per candidate the rates
its search simulated, each with its phase (first guess, bracketing, bisection) and verdict.
Loading checks the pieces the report needs and turns anything missing into one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.capacity.output import candidate_row, fleet_of
from servesim.errors import ServesimError

CAPACITY_FILE = "capacity.json"
LATENCY_KEYS = ("ttft_s", "tpot_s", "e2e_s")


@dataclass(frozen=True)
class CapacityData:
    folder: Path
    answer: dict[str, Any]

    @property
    def candidates(self) -> list[dict[str, Any]]:
        """Every candidate's record, in rank order."""
        return list(self.answer["candidates"])

    @property
    def searched(self) -> list[dict[str, Any]]:
        """The candidates whose rate was searched (feasible ones), in rank order."""
        return [r for r in self.candidates if r.get("feasible") and r.get("search")]

    @property
    def slo(self) -> dict[str, Any]:
        return dict(self.answer.get("slo") or {})

    @property
    def limits(self) -> dict[str, float]:
        """SLO limits in seconds by metric key (``ttft_s``...)."""
        return {k: float(self.slo[k]) for k in LATENCY_KEYS if self.slo.get(k) is not None}

    @property
    def percentile(self) -> float:
        return float(self.slo.get("percentile") or 99)

    @property
    def mode(self) -> str:
        """``target``, ``budget`` or ``rate`` (neither: each candidate at its own highest rate)."""
        if self.answer.get("target_rate") is not None:
            return "target"
        if self.answer.get("gpu_budget") is not None:
            return "budget"
        return "rate"

    def metric_key(self, key: str) -> str:
        """The key an evaluation's ``metrics`` hold a latency under (``p99_ttft_s``)."""
        return f"p{self.percentile:g}_{key}"

    def rows(self) -> list[dict[str, Any]]:
        """The ranked table: :func:`candidate_row` of each candidate."""
        return [candidate_row(r) for r in self.candidates]


def search_phases(evaluations: list[dict[str, Any]]) -> list[str]:
    """Each simulated rate's part in the search: the ``first guess``, the ``bracket`` steps that
    double or halve the rate, then the ``bisect`` steps between the last pass and fail."""
    phases = []
    for i, e in enumerate(evaluations):
        if i == 0:
            phases.append("first guess")
            continue
        ratio = e["rate"] / evaluations[i - 1]["rate"]
        bracketing = phases[-1] != "bisect" and (math.isclose(ratio, 2.0) or math.isclose(ratio, 0.5))
        phases.append("bracket" if bracketing else "bisect")
    return phases


def fleet_latencies(record: dict[str, Any], data: CapacityData) -> dict[str, float]:
    """The latencies (seconds, by metric key) of the fleet the candidate is judged by: its
    verified run at the target rate or on the budget, else its highest passing rate."""
    fleet_run = None
    for key in ("target", "budget"):
        section = record.get(key)
        if section and section.get("attempts"):
            fleet_run = section["attempts"][-1]
    if fleet_run is None:
        fleet_run = (record.get("knee") or {}).get("passing") or {}
    metrics = fleet_run.get("metrics") or {}
    out = {}
    for key in LATENCY_KEYS:
        value = metrics.get(data.metric_key(key))
        out[key] = float(value) if isinstance(value, int | float) else math.nan
    return out


def fleet_cost(record: dict[str, Any]) -> tuple[float, float]:
    """(USD per hour, USD per 1M output tokens) of the candidate's fleet (NaN when unknown)."""
    fleet = fleet_of(record)
    usd, per_token = fleet.get("usd_per_hour"), fleet.get("usd_per_1m_output_tokens")
    return (float(usd) if usd is not None else math.nan,
            float(per_token) if per_token is not None else math.nan)


def load_capacity(folder: Path) -> CapacityData:
    """Read ``folder/capacity.json``; a missing or unreadable file is one line."""
    folder = Path(folder)
    path = folder / CAPACITY_FILE
    if not path.is_file():
        raise ServesimError("FOLDER", f"{CAPACITY_FILE} not found in {folder}",
                            "pass the output folder of `servesim capacity`")
    try:
        answer = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ServesimError("FOLDER", f"{CAPACITY_FILE} is not valid JSON ({exc})",
                            "re-run `servesim capacity` to rewrite it") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("candidates"), list):
        raise ServesimError("FOLDER", f"{CAPACITY_FILE} has no candidates list",
                            "re-run `servesim capacity` with this version of servesim")
    return CapacityData(folder, answer)
