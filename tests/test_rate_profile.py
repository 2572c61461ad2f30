"""Time-varying load: rate profiles integrated and inverted exactly, non-homogeneous Poisson
counts against theory, diurnal shapes, bursts, and trace replays at a changing rate scale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim.errors import ServesimError
from servesim.workloads import build_workload, parse_workload_config
from servesim.workloads.profile_config import RateProfileConfig
from servesim.workloads.rate_profile import shape_of, shaped_arrival_times


def shape(**profile: object):
    return shape_of(RateProfileConfig.model_validate(profile))


def test_step_and_linear_profiles_integrate_and_invert_exactly() -> None:
    """Step 1 then 3 from t = 100: L(150) = 100 + 3 x 50; L^-1(250) = 150, and past the last
    point the last value holds. A ramp 0 -> 2 over 100 s: L(t) = t^2 / 100, L^-1(u) = sqrt(100 u)."""
    step = shape(points=[[0, 1], [100, 3]], interpolate="step")
    assert step.integral(150) == 250
    assert step.inverse(np.array([50.0, 100.0, 250.0, 400.0])).tolist() == [50, 100, 150, 200]
    ramp = shape(points=[[0, 0], [100, 2]])
    assert ramp.integral(50) == pytest.approx(25)
    assert ramp.inverse(np.array([1.0, 25.0, 100.0])) == pytest.approx([10, 50, 100])
    assert ramp.inverse(np.array([300.0]))[0] == pytest.approx(200)  # 100 + (300 - 100) / 2


def test_bursts_multiply_the_shape() -> None:
    burst = shape(bursts=[{"start_s": 10, "duration_s": 5, "multiplier": 4}])
    assert burst.multiplier(np.array([9.9, 10.0, 14.9, 15.0])).tolist() == [1, 4, 4, 1]
    assert burst.integral(20) == 10 + 20 + 5
    on_diurnal = shape(diurnal={"period_s": 100, "peak_s": 0, "trough": 0.0},
                       bursts=[{"start_s": 150, "duration_s": 10, "multiplier": 2}])
    plain = shape(diurnal={"period_s": 100, "peak_s": 0, "trough": 0.0})
    # the burst doubles the area of [150, 160) and the diurnal shape repeats past it
    extra = plain.integral(160) - plain.integral(150)
    assert on_diurnal.integral(300) == pytest.approx(plain.integral(300) + extra, rel=1e-9)


def test_diurnal_shape() -> None:
    """1 at the peak, the trough half a period later, and a mean of (1 + trough) / 2 per period
    (the 1,440-chord approximation of the cosine is exact to 1e-6)."""
    day = shape(diurnal={"period_s": 86_400, "peak_s": 50_400, "trough": 0.25})
    assert day.multiplier(np.array([50_400.0, 50_400.0 + 43_200]))[0] == pytest.approx(1.0)
    assert day.multiplier(np.array([7_200.0]))[0] == pytest.approx(0.25)
    assert day.integral(86_400) / 86_400 == pytest.approx(0.625, rel=1e-6)
    assert day.integral(3 * 86_400) == pytest.approx(3 * day.integral(86_400), rel=1e-9)


def test_non_homogeneous_poisson_counts_match_the_integral() -> None:
    """A ramp from 0.5 to 1.5 of 20 req/s over an hour: each quarter hour's count is Poisson
    with mean 20 x its area; all four within 4 standard deviations, and the total too."""
    ramp = shape(points=[[0, 0.5], [3600, 1.5]])
    times = shaped_arrival_times("poisson", 20.0, ramp, np.random.default_rng(1), num_requests=None,
                                 duration_s=3600)
    counts = np.histogram(times, bins=4, range=(0, 3600))[0]
    expected = np.array([20 * (ramp.integral(900 * (i + 1)) - ramp.integral(900 * i)) for i in range(4)])
    assert expected.tolist() == pytest.approx([11_250, 15_750, 20_250, 24_750])
    assert np.all(np.abs(counts - expected) < 4 * np.sqrt(expected))
    assert times.max() < 3600 and np.all(np.diff(times) >= 0)


def test_generated_workload_follows_a_profile(tmp_path: Path) -> None:
    (tmp_path / "rates.csv").write_text("time_s,multiplier\n0,1\n60,0\n120,2\n")
    workload = parse_workload_config({
        "arrival": {"process": "constant", "rate": 1.0,
                    "profile": {"csv": "rates.csv", "interpolate": "step"}},
        "duration_s": 180, "lengths": {"preset": "azure-conversation"}})
    table = build_workload(workload, 0, tmp_path)
    # constant arrivals, one per unit of area (u = 1, 2, ... < L(180) = 180): 60 in the first
    # minute, none in the second, then two per second
    expected = list(range(1, 61)) + [120 + (u - 60) / 2 for u in range(61, 180)]
    assert table.arrival_s.tolist() == pytest.approx(expected)
    assert "rates.csv" in table.source


def test_trace_replayed_at_a_changing_rate(tmp_path: Path) -> None:
    """One request per second for 100 s, replayed 2x faster after t = 20: the first 20 arrive at
    their times, the other 80 in the next 40 s."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i},10,5\n" for i in range(100)))
    table = build_workload(parse_workload_config({"trace": {
        "path": str(path), "format": "csv",
        "rate_profile": {"points": [[0, 1], [20, 2]], "interpolate": "step"}}}), 0)
    assert table.arrival_s[:21].tolist() == list(range(21))
    assert table.arrival_s[-1] == pytest.approx(20 + 79 / 2)


@pytest.mark.parametrize(("profile", "message"), [
    ({"points": [[0, 1]], "diurnal": {}}, "give one shape"),
    ({"points": [[10, 1], [0, 2]]}, "in time order"),
    ({}, "give a shape"),
    ({"points": [[0, -1]]}, "greater than or equal to 0"),
])
def test_profile_errors_are_one_line(profile: dict, message: str) -> None:
    with pytest.raises(ServesimError) as info:
        parse_workload_config({"arrival": {"process": "poisson", "rate": 1, "profile": profile},
                               "num_requests": 5, "lengths": {"preset": "azure-conversation"}})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_profile_csv_errors_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("time_s,multiplier\n0,1\n10,x\n")
    workload = parse_workload_config({
        "arrival": {"process": "poisson", "rate": 1.0, "profile": {"csv": "bad.csv"}},
        "duration_s": 10, "lengths": {"preset": "azure-conversation"}})
    with pytest.raises(ServesimError, match=r"bad\.csv line 3 is not two numbers"):
        build_workload(workload, 0, tmp_path)
    zero = parse_workload_config({
        "arrival": {"process": "poisson", "rate": 1.0, "profile": {"points": [[0, 0]]}},
        "duration_s": 10, "lengths": {"preset": "azure-conversation"}})
    with pytest.raises(ServesimError, match="0 everywhere"):
        build_workload(zero, 0)
