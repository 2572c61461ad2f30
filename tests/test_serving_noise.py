"""The serving file's noise floor: each re-measurement predicted by the mean of the others."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import SHARED_DATA

from servesim.calibration.serving_data import read_serving_file
from servesim.calibration.serving_noise import leave_one_out_errors, noise_summary, replayed_noise

SERVING = SHARED_DATA / "serving" / "aiconfigurator_silicon_dev.csv"


def measurement(ttft: float, tpot: float, concurrency: int = 8, backend: str = "vllm",
                day: str = "2026-01-01", tp: int = 1) -> dict[str, object]:
    return {"id": f"{backend}-{concurrency}-{day}-{ttft}", "backend": backend,
            "silicon_data_source": f"db; silicon_concurrency={concurrency}; measured={day}",
            "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "mode": "agg", "isl": "1024",
            "osl": "128", "tp_size": str(tp), "silicon_ttft_ms": str(ttft), "silicon_tpot_ms": str(tpot)}


def table(*rows: dict[str, object]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame.index = range(1, len(frame) + 1)
    return frame


def test_each_measurement_is_predicted_by_the_mean_of_the_others() -> None:
    """Three measurements of one configuration: TTFT 100, 110, 140 ms and TPOT 10, 10, 11 ms.
    Leave one out, by hand: TTFT 125 for 100 (25%), 120 for 110 (9.09%), 105 for 140 (25%); TPOT
    10.5 for 10 (5%), 10.5 for 10 (5%), 10 for 11 (9.09%). Within TTFT 20% and TPOT 10%: the
    second only, 1 of 3. A configuration measured once (another concurrency, another TP) is no
    re-measurement."""
    unique = table(measurement(100, 10, day="2026-01-01"), measurement(110, 10, day="2026-02-01"),
                   measurement(140, 11, day="2026-03-01"), measurement(100, 10, concurrency=16),
                   measurement(100, 10, tp=2))
    errors = leave_one_out_errors(unique)
    assert list(errors["measurements"]) == [3, 3, 3]
    assert list(errors["ttft_ape_%"]) == pytest.approx([25.0, 100 / 11, 25.0])
    assert list(errors["tpot_ape_%"]) == pytest.approx([5.0, 5.0, 100 / 11])
    summary = noise_summary(unique).set_index("engine")
    assert summary.loc["all", "configurations"] == 1 and summary.loc["all", "measurements"] == 3
    assert summary.loc["all", "within_tpot10_ttft20_%"] == pytest.approx(100 / 3)
    assert summary.loc["all", "ttft_median_ape_%"] == pytest.approx(25.0)
    assert summary.loc["vllm", "tpot_median_ape_%"] == pytest.approx(5.0)


def test_engines_are_summarised_apart_and_unusable_figures_take_no_part() -> None:
    """Two SGLang measurements of 200 and 300 ms predict each other at 50% and 33.3% TTFT error
    (TPOT 20 and 20: none); a vLLM pair agrees exactly. A measurement without a TPOT neither counts
    nor makes its configuration a re-measured one."""
    unique = table(measurement(200, 20, backend="sglang"), measurement(300, 20, backend="sglang", day="b"),
                   measurement(50, 5), measurement(50, 5, day="b"),
                   measurement(70, float("nan"), concurrency=32), measurement(70, 7, concurrency=32))
    summary = noise_summary(unique).set_index("engine")
    assert summary.loc["sglang", "ttft_median_ape_%"] == pytest.approx((50 + 100 / 3) / 2)
    assert summary.loc["sglang", "within_tpot10_ttft20_%"] == 0.0
    assert summary.loc["vllm", "within_tpot10_ttft20_%"] == 100.0
    assert summary.loc["all", "measurements"] == 4 and summary.loc["all", "configurations"] == 2


def test_only_the_replayed_rows_count_and_an_empty_file_has_no_floor() -> None:
    unique = table(measurement(100, 10), measurement(150, 10, day="b"), measurement(90, 9, concurrency=2))
    assert replayed_noise(unique, pd.DataFrame({"row": [1, 3]})).empty
    assert replayed_noise(unique, pd.DataFrame({"row": [1, 2]}))["measurements"].tolist() == [2, 2]
    assert replayed_noise(unique, pd.DataFrame(columns=["row"])).empty
    assert replayed_noise(pd.DataFrame(), pd.DataFrame({"row": [1, 2]})).empty  # rows not kept


@pytest.mark.skipif(not SERVING.is_file(), reason="../shared/data/serving is not here")
def test_the_serving_file_remeasures_some_replayable_configurations() -> None:
    """On the shared file, re-measured configurations among the replayable rows exist for vLLM
    (104) and TensorRT-LLM (2), and most of them agree within the aims (the floor is well below
    the replay's error). SGLang's six and 13 more of TensorRT-LLM's (2026-11-28) were one
    measurement re-exported with the last digit of a float changed, which the reader now drops as
    a duplicate (``serving_data.same_float_text``): they agreed to 1e-14, not within noise."""
    data = read_serving_file(SERVING)
    rows = pd.DataFrame({"row": [r.row for r in data.rows]})
    summary = replayed_noise(data.unique, rows).set_index("engine")
    assert set(summary.index) == {"all", "vllm", "trtllm"}
    assert summary.loc["trtllm", "configurations"] == 2
    assert summary.loc["all", "measurements"] >= 200
    assert summary.loc["all", "within_tpot10_ttft20_%"] > 80
