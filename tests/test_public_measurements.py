"""Vidur's public kernel timings as an independent check of the shipped A100/H100 profiles.

Skipped when ``../shared/data`` is absent. The shipped profiles are fitted to NVIDIA
AIConfigurator's vLLM kernels (``servesim calibrate import-aiconfigurator``); Vidur's timings
(2024, kineto kernel times, other vLLM/cuBLAS versions, LLM layer shapes) never entered that fit,
so every row here is out of sample. "Before" is the bare spec-sheet roofline; "fit" is the shipped
profile, on the rows ``import-vidur`` would hold out. The two sources disagree by more than
either fit's own held-out error (the profiles fitted to Vidur itself scored, held out: GEMM A100
5.0% / 14.1% median/p90, H100 7.3% / 20.8%; A100 prefill 14.8% / 32.8%, decode 8.3% / 20.9%;
all-reduce A100 5.6% / 19.1%, H100 6.7% / 20.0%), which is the spread a user should expect
between kernel benchmarks of different stacks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim import load_hardware
from servesim.calibration.validate import predictions
from servesim.calibration.vidur import vidur_tables

# Measured (2026-11-24; GEMMs 2026-11-27, with the shape factors, the earlier fit in comments;
# prefill attention 2026-11-27, with its shape factors read at the keys each chunk sees):
# held-out median / p90 APE in %, spec roofline -> shipped profile. Vidur's H100 GEMMs (2024 stack)
# run slower than AIConfigurator's vLLM 0.24 and our own torch 2.11 ones (priced a median 0.82x),
# which the shipped profile follows (4.0% on ours): the shape factors' faster wide GEMMs moved it
# further from them.
MEASURED = {
    ("a100", "gemm"): ((32.1, 48.0), (8.1, 19.9)),  # 8.4 / 18.0
    ("a100", "attention_prefill"): ((77.2, 85.7), (29.4, 52.7)),  # 35.8 / 56.2
    ("a100", "attention_decode"): ((37.2, 68.1), (18.9, 45.1)),
    ("a100", "allreduce"): ((64.4, 91.4), (29.6, 48.0)),
    ("h100", "gemm"): ((37.4, 58.7), (17.7, 34.2)),  # 15.6 / 34.2
    ("h100", "attention_prefill"): ((37.7, 40.7), (17.1, 98.1)),  # 41.6 / 114.8
    ("h100", "allreduce"): ((50.3, 92.4), (12.3, 55.5)),
}
"""H100 prefill rests on three FlashAttention-3 README figures (16k tokens per batch), where the
AIConfigurator fit is slower than the figures' best case: the one family that does not beat the
spec sheet."""


@pytest.fixture(scope="module", params=[("a100", "a100-sxm-80gb"), ("h100", "h100-sxm-80gb")],
                ids=["a100", "h100"])
def rows(request: pytest.FixtureRequest, shared_data: Path) -> tuple[str, object]:
    gpu, name = request.param
    tables = vidur_tables(shared_data / "kernels" / "vidur_profiling", gpu)
    return gpu, predictions(tables, load_hardware(name))


def test_shipped_profiles_beat_the_spec_sheet_on_independent_timings(rows: tuple[str, object]) -> None:
    gpu, table = rows
    assert len(table) > 20_000
    for family, group in table.groupby("family"):
        held = group[group["held_out"]]
        fitted = np.median(held["ape"]) * 100, np.percentile(held["ape"], 90) * 100
        spec = np.median(held["spec_ape"]) * 100, np.percentile(held["spec_ape"], 90) * 100
        if (gpu, family) != ("h100", "attention_prefill"):
            assert fitted[0] < spec[0] and fitted[1] < spec[1], (gpu, family, fitted, spec)
        expected_spec, expected_fit = MEASURED[(gpu, family)]
        assert spec == pytest.approx(expected_spec, abs=0.2), (gpu, family)
        # Guard the fit: a re-fit may move a little, never much further from these timings.
        assert fitted[0] <= expected_fit[0] + 1.0, (gpu, family, fitted)
        assert fitted[1] <= expected_fit[1] + 3.0, (gpu, family, fitted)


def test_gemm_error_stays_within_twice_the_vidur_fits_own(rows: tuple[str, object]) -> None:
    """Fitted to another stack's timings, the GEMM curves still predict Vidur's within about
    twice the error of curves fitted to Vidur itself (A100 5.0% / 14.1%, H100 7.3% / 20.8%). On
    H100 the median is 2.4x since the shape factors (17.7%, was 15.6%): Vidur's 2024 H100 GEMMs run
    slower than both newer stacks (AIConfigurator's vLLM 0.24, our own torch 2.11 run, which the
    shipped profile prices at 4.0%), and the factors made wide GEMMs faster still."""
    gpu, table = rows
    gemm = table[(table["family"] == "gemm") & table["held_out"]]
    own = {"a100": (5.0, 14.1), "h100": (7.3, 20.8)}[gpu]
    median_ratio = {"a100": 2.2, "h100": 2.5}[gpu]
    assert np.median(gemm["ape"]) * 100 < median_ratio * own[0]
    assert np.percentile(gemm["ape"], 90) * 100 < 2.2 * own[1]
