"""The latency limits of an SLO, as experiments and capacity plans both write them.

``ttft_s``, ``tpot_s`` and ``e2e_s`` hold seconds after validation (what summaries, reports and
the planner read). A user may write each as a number in the key's unit or with an explicit unit
(``tpot_s: 50ms``), or under the milliseconds spelling (``tpot_ms: 50``), as the serving
ecosystem quotes latency objectives; see :mod:`servesim.inputs.units` for the one rule. The
``_ms`` keys are read into the ``_s`` ones and never written back (resolved configs, sweep run
names and summaries are unchanged by which spelling was used).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from servesim.inputs.schema import StrictModel
from servesim.inputs.units import parse_duration

SLO_METRICS = ("ttft", "tpot", "e2e")


class SloLimits(StrictModel):
    """Per-request latency limits in seconds (any unit on input)."""

    ttft_s: float | None = Field(None, gt=0, description="time to first token limit (seconds, or 500ms)")
    tpot_s: float | None = Field(None, gt=0, description="time per output token limit (seconds, or 50ms)")
    e2e_s: float | None = Field(None, gt=0, description="end-to-end latency limit (seconds, or 30s)")
    ttft_ms: float | None = Field(None, gt=0, exclude=True, description="ttft_s in milliseconds")
    tpot_ms: float | None = Field(None, gt=0, exclude=True, description="tpot_s in milliseconds")
    e2e_ms: float | None = Field(None, gt=0, exclude=True, description="e2e_s in milliseconds")

    @field_validator("ttft_s", "tpot_s", "e2e_s", "ttft_ms", "tpot_ms", "e2e_ms", mode="before")
    @classmethod
    def _duration(cls, value: Any, info: Any) -> Any:
        if value is None:
            return None
        key = str(info.field_name)
        metric, unit = key.rsplit("_", 1)
        return parse_duration(value, metric, "ms" if unit == "ms" else "s", key)

    @model_validator(mode="after")
    def _seconds(self) -> SloLimits:
        for metric in SLO_METRICS:
            ms = getattr(self, f"{metric}_ms")
            if ms is None:
                continue
            if getattr(self, f"{metric}_s") is not None:
                raise ValueError(f"give {metric}_s or {metric}_ms, not both")
            setattr(self, f"{metric}_s", ms)  # already seconds: the validator reads the unit
            setattr(self, f"{metric}_ms", None)
        return self

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s),
                                  ("e2e_s", self.e2e_s)) if v is not None}
