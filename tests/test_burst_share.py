"""The burst-share check (calibration/burst_share.py) on round means built by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.calibration.burst_share import best_share, by_group, errors, held_out


def rounds(model: str, share: float, bursts: list[float], steady: float = 0.1) -> pd.DataFrame:
    """Rows whose measured TTFT is exactly ``share`` of the burst plus the rest of the steady state."""
    burst = np.array(bursts)
    return pd.DataFrame({"model": model, "engine": "vllm", "burst_s": burst, "steady_s": steady,
                         "measured_s": share * burst + (1 - share) * steady})


def test_errors_blend_burst_and_steady_state() -> None:
    # burst 2.1 s, steady 0.1 s, measured 0.3 s: share 0.1 blends to 0.1 * 2.1 + 0.9 * 0.1 = 0.3
    table = pd.DataFrame({"burst_s": [2.1], "steady_s": [0.1], "measured_s": [0.3]})
    assert errors(table, 0.1)[0] == pytest.approx(0.0, abs=1e-9)
    # at the recipe's 0.05: 0.105 + 0.095 = 0.2, a third below 0.3
    assert errors(table, 0.05)[0] == pytest.approx(100 / 3)


def test_best_share_recovers_the_share_the_rows_were_made_with() -> None:
    assert best_share(rounds("a", 0.12, [1.0, 2.0, 4.0, 8.0])) == pytest.approx(0.12)
    assert best_share(rounds("b", 0.0, [1.0, 3.0])) == 0.0


def test_held_out_fits_each_model_on_the_others() -> None:
    # Two models made with 0.2 and one with 0: without "zero", the others agree on 0.2 and
    # predict it 0.2 * (burst - steady) / steady off; without either 0.2 model the fit is
    # pulled between 0.2 and 0 (the median of the remaining rows decides).
    table = pd.concat([rounds("a", 0.2, [1.0, 2.0, 3.0]), rounds("b", 0.2, [1.5, 2.5, 3.5]),
                       rounds("zero", 0.0, [1.1, 2.1])])
    result = held_out(table).set_index("model")
    assert result.loc["zero", "share_fitted_without"] == pytest.approx(0.2)
    # zero's rows measure their steady state, 0.1 s; at 0.2 their bursts add 0.2 x (1.0 or 2.0)
    assert result.loc["zero", "median_ape_held_out_%"] == pytest.approx(np.median([200.0, 400.0]))
    assert result.loc["all", "rows"] == 8
    groups = by_group(table, "model").set_index("model")
    assert groups.loc["a", "best_share"] == pytest.approx(0.2)
    assert groups.loc["zero", "median_ape_best_%"] == pytest.approx(0.0, abs=1e-9)
