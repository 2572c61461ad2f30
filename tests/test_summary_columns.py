"""The summary reads its tables as NumPy columns (``servesim.metrics.columns``) when a run writes
only its summary, and as DataFrames when the tables were built first: the same summary either
way, including the rows it selects (rejected requests), SLOs, the prefix cache and sessions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from servesim.config import validate_document
from servesim.metrics.columns import ColumnTable, as_frame, column, select
from servesim.pipeline import prepare, simulate
from servesim.pipeline.result import RunResult

INDEPENDENT = {"num_requests": 400, "prompt": {"dist": "uniform", "low": 16, "high": 9000},
               "output": {"dist": "uniform", "low": 1, "high": 200}}
"""400 requests, some prompts longer than the 8,192-token context: those are rejected (so the
summary selects the completed rows)."""


def run(**workload: Any) -> RunResult:
    """``workload`` (:data:`INDEPENDENT` by default) on one H100 with SLOs and prefix caching."""
    document = {"name": "columns", "seed": 3, "model": "llama-3-8b", "hardware": "h100-sxm-80gb",
                "engine": "vllm", "deployment": {"enable_prefix_caching": True},
                "slo": {"ttft_s": 0.2, "tpot_s": 0.03},
                "workload": {"arrival": {"process": "poisson", "rate": 25.0}, **(workload or INDEPENDENT)}}
    return simulate(prepare(validate_document(document)))


def summaries(**workload: Any) -> tuple[dict[str, Any], dict[str, Any], RunResult]:
    """(the summary from NumPy columns, the summary from the DataFrames, the first run)."""
    light = run(**workload)
    from_columns = light.summary.to_dict()
    assert "requests" not in light.__dict__ and "itl" not in light.__dict__
    full = run(**workload)
    # the tables built first, so the summary reads them
    assert len(full.requests) == len(full.plan.workload) and len(full.itl) > 0 and len(full.steps) > 0
    return from_columns, full.summary.to_dict(), light


def test_the_summary_from_columns_is_the_summary_from_frames() -> None:
    from_columns, from_frames, light = summaries()
    assert from_columns == from_frames
    # the selection was exercised: requests longer than the context are rejected, not completed
    assert from_columns["rejected"] > 0 and from_columns["completed"] + from_columns["rejected"] == 400
    assert from_columns["slo_attainment"] is not None and from_columns["prefix_cache"] is not None
    table = light._summary_requests()
    assert isinstance(table, ColumnTable) and len(table) == 400
    assert "request_id" not in table and "ttft_s" in table  # only what a figure reads


def test_sessions_read_from_columns_match_frames() -> None:
    from_columns, from_frames, _ = summaries(sessions={
        "turns": {"dist": "uniform", "low": 1, "high": 4}, "user_tokens": {"dist": "fixed", "value": 100},
        "output": {"dist": "fixed", "value": 50}, "think_time_s": {"dist": "fixed", "value": 1.0},
        "count": 60})
    assert from_columns == from_frames and from_columns["sessions"]["sessions"] > 0


def test_select_and_column_answer_alike_for_both_kinds_of_table() -> None:
    values = {"a": np.arange(5.0), "b": np.array(["x", "y", "x", "y", "x"], dtype=object)}
    table, frame = ColumnTable(dict(values)), pd.DataFrame(values)
    mask = column(table, "b") == "x"
    assert mask.tolist() == [True, False, True, False, True]
    picked, picked_frame = select(table, mask, ["a"]), select(frame, mask, ["a"])
    assert len(picked) == len(picked_frame) == 3
    assert column(picked, "a").tolist() == column(picked_frame, "a").tolist() == [0.0, 2.0, 4.0]
    assert column(select(table, None, ["b"]), "b") is values["b"]  # not copied
    assert as_frame(table)["a"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and as_frame(frame) is frame
    with pytest.raises(ValueError, match="different lengths"):
        ColumnTable({"a": np.zeros(2), "b": np.zeros(3)})
    with pytest.raises(ValueError, match="has 2 rows, the table 5"):
        table["c"] = np.zeros(2)
