"""The all-to-all link of the profiles, fitted to NCCL's alltoall timings (AIConfigurator's shared
data; the refit check skips without it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim import load_hardware
from servesim.calibration.all_to_all import fit_all_to_all, predict, read_alltoall

FILES = {"h100-sxm-80gb": "h100_sxm/comm/nccl/2.27.3", "h200-sxm-141gb": "h200_sxm/comm/nccl/2.26.2",
         "b200": "b200_sxm/comm/nccl/2.27.3"}


def test_the_fit_recovers_a_known_latency_and_efficiency() -> None:
    sent = 2.0 ** np.arange(9, 30) * 7 / 8
    rows = pd.DataFrame({"bytes_sent": sent, "seconds": predict(sent, 12e-6, 4.5e11, 0.7)})
    fit = fit_all_to_all(rows, 4.5e11, 8)
    assert (fit.latency_s, fit.efficiency) == (pytest.approx(12e-6), pytest.approx(0.7))
    assert fit.held_out_median_error < 1e-9


@pytest.mark.parametrize("name", sorted(FILES))
def test_profiles_hold_the_fit_of_the_measured_alltoall(name: str, shared_data: Path) -> None:
    profile = load_hardware(name)
    assert profile.all_to_all is not None
    path = shared_data / "kernels" / "aiconfigurator" / FILES[name] / "nccl_perf.parquet"
    fit = fit_all_to_all(read_alltoall(path, 8), profile.all_to_all.bandwidth_Bps, 8)
    assert (profile.all_to_all.latency_s, profile.all_to_all.efficiency) == (
        pytest.approx(fit.latency_s), pytest.approx(fit.efficiency))
    assert fit.held_out_median_error < 0.15
