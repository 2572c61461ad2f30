"""SLO durations: explicit units, the one rule for bare numbers, and implausible values refused."""

from __future__ import annotations

from typing import Any

import pytest

from servesim.capacity import validate_capacity
from servesim.config import validate_document
from servesim.errors import ServesimError
from servesim.inputs.units import parse_duration

WORKLOAD = {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 10,
            "lengths": {"preset": "sharegpt"}}


def experiment(slo: dict[str, Any]) -> dict[str, Any]:
    return {"model": "llama-3-8b", "hardware": "h100-sxm-80gb", "workload": WORKLOAD, "slo": slo}


@pytest.mark.parametrize(("value", "bare", "seconds"), [
    ("500ms", "s", 0.5), ("0.5s", "ms", 0.5), ("2000us", "s", 0.002),
    ("1.5 s", "s", 1.5), (" 80ms ", "s", 0.08), ("1min", "s", 60.0), ("5e2ms", "s", 0.5),
    (0.05, "s", 0.05), (50, "ms", 0.05), ("50", "ms", 0.05), ("0.05", "s", 0.05),
])
def test_parse_duration(value: object, bare: str, seconds: float) -> None:
    assert parse_duration(value, "tpot", bare, "x") == pytest.approx(seconds)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "bare", "message"), [
    (80, "s", "80 under x is 80 s, implausible for TPOT (a bare number there is in seconds): write 80ms"),
    (0.05, "ms", "0.05 under x is 0.05 ms, implausible for TPOT (a bare number there is in milliseconds)"),
    ("fast", "s", "'fast' is not a duration; write a number with a unit, e.g. 500ms or 0.5s"),
    ("50m", "s", "is not a duration"),  # minutes or milliseconds? neither: refused
    (True, "s", "True is not a duration"),
    ("0ms", "s", "must be a positive duration"),
])
def test_bad_durations(value: object, bare: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_duration(value, "tpot", bare, "x")  # type: ignore[arg-type]
    assert message in str(error.value)


def test_an_explicit_unit_is_taken_as_meant() -> None:
    """80 s per token as a bare number is a slip; written 80s it is a (strange) decision."""
    assert parse_duration("80s", "tpot", "s", "tpot_s") == 80.0
    assert parse_duration("0.5ms", "ttft", "s", "ttft_s") == 0.0005


def test_every_spelling_resolves_to_the_same_experiment() -> None:
    """tpot_s: 0.05, tpot_s: 50ms and tpot_ms: 50 give identical configs (and so identical
    resolved YAML and sweep run names: the _ms keys are never written back)."""
    spellings = [{"ttft_s": 2, "tpot_s": 0.05}, {"ttft_s": "2s", "tpot_s": "50ms"},
                 {"ttft_ms": 2000, "tpot_ms": 50}, {"ttft_s": "2000ms", "tpot_ms": "0.05s"}]
    dumps = [validate_document(experiment(s)).model_dump(mode="json") for s in spellings]
    assert all(d == dumps[0] for d in dumps)
    assert dumps[0]["slo"] == {"ttft_s": 2.0, "tpot_s": 0.05, "e2e_s": None}


@pytest.mark.parametrize(("slo", "message"), [
    ({"tpot_s": 80}, "slo.tpot_s: 80 under tpot_s is 80 s, implausible for TPOT"),
    ({"ttft_ms": 0.5}, "slo.ttft_ms: 0.5 under ttft_ms is 0.5 ms, implausible for TTFT"),
    ({"tpot_s": 0.05, "tpot_ms": 50}, "slo: give tpot_s or tpot_ms, not both"),
    ({"tpot_us": 5}, "slo.tpot_us: unknown key; remove it or use one of: ttft_s, tpot_s, e2e_s, ttft_ms"),
])
def test_slo_mistakes_are_one_line(slo: dict[str, Any], message: str) -> None:
    with pytest.raises(ServesimError) as error:
        validate_document(experiment(slo))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_capacity_slo_reads_the_same_units() -> None:
    doc = {"model": "llama-3-8b", "workload": WORKLOAD, "candidates": {"hardware": ["h100-sxm-80gb"]},
           "slo": {"ttft_ms": 500, "tpot_s": "50ms", "percentile": 90}}
    slo = validate_capacity(doc).slo
    assert slo.limits() == {"ttft_s": 0.5, "tpot_s": 0.05}
    assert slo.describe() == "p90 TTFT <= 500 ms and p90 TPOT <= 50 ms"
