"""The MTP acceptance fit reads each row's replayed TPOT error between the grid's rates and picks
the rate at which the median error is zero; held out, each campaign is scored at the rate fitted to
the others."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.calibration.mtp_acceptance import GRID, fit_rate, held_out_ape, leave_one_group_out, median_ape


def _curves(crossings: dict[str, list[float]], slope: float = -2.0) -> pd.DataFrame:
    """Rows whose log TPOT error is ``slope * (rate - crossing)``: exact at their crossing."""
    lines = []
    row = 0
    for campaign, points in crossings.items():
        for crossing in points:
            lines.append({"row": row, "campaign": campaign, "measured_tpot_s": 0.01,
                          **{rate: slope * (rate - crossing) for rate in GRID}})
            row += 1
    return pd.DataFrame(lines).set_index("row")


def test_the_fit_finds_the_rate_the_rows_agree_on_between_grid_points() -> None:
    curves = _curves({"a": [0.72, 0.72, 0.72]})
    assert fit_rate(curves) == pytest.approx(0.72)
    assert median_ape(curves, 0.72) == pytest.approx(0.0, abs=1e-9)
    # 0.1 away: |log error| 0.2 -> exp(0.2) - 1 = 22.14%
    assert median_ape(curves, 0.82) == pytest.approx(100 * np.expm1(0.2))


def test_the_median_row_sets_the_rate() -> None:
    """Crossings 0.65, 0.75 and 0.85: at 0.75 one row replays too slow, one too fast and one
    exactly, so the median log error is zero there (not at 0.7 or 0.8, where the median absolute
    error would be least)."""
    assert fit_rate(_curves({"a": [0.65, 0.75, 0.85]})) == pytest.approx(0.75)


def test_each_campaign_is_scored_at_the_rate_of_the_others() -> None:
    """Campaign a agrees on 0.7, b on 0.8: without a the fit is b's 0.8, where a's rows are 0.1
    away (22.14%); without b it is 0.7, where b's are."""
    curves = _curves({"a": [0.7, 0.7], "b": [0.8, 0.8]})
    table = leave_one_group_out(curves).set_index("campaign")
    assert table.loc["a", "rate_fitted_without"] == pytest.approx(0.8)
    assert table.loc["b", "rate_fitted_without"] == pytest.approx(0.7)
    assert table["median_ape_%"].tolist() == pytest.approx([100 * np.expm1(0.2)] * 2)
    assert held_out_ape(curves) == pytest.approx(100 * np.expm1(0.2))
