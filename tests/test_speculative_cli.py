"""Speculative decoding as a user reaches it: the ``speculative:`` section by ``--set``, the lines
``servesim run`` prints, the summary section and report, one-line errors with exit code 2, and the
engine's fitted overheads reproducible from the published measurements they came from."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_cli import servesim

from servesim.calibration.speculation import fit_speculation_overheads
from servesim.engines import make_engine

SPECULATE = ("speculative={method: eagle3, num_speculative_tokens: 3, "
             "acceptance: {preset: eagle3-llama-3.1-8b-mtbench}}")


def test_run_with_set_prints_and_writes_the_speculation(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = servesim("run", "quickstart", "--set", "workload.num_requests=60", "--set", SPECULATE,
                      "--set", "engine=vllm-v0", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "speculative: eagle3, k = 3, proposer llama-3-8b-eagle3-head (1 layer, tp 1)" in result.stdout
    assert "speculation: eagle3, k = 3:" in result.stdout and "proposals accepted" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    spec = summary["speculation"]
    assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 3
    assert spec["acceptance_model"]["expected_acceptance_length"] == pytest.approx(2.79, abs=0.006)
    assert spec["mean_acceptance_length"] == pytest.approx(2.79, abs=0.3)
    steps = pd.read_parquet(out / "steps.parquet")
    assert steps["accepted_tokens"].sum() == spec["accepted_tokens"]
    assert steps["op_proposal_s"].sum() == pytest.approx(spec["proposal_s"])
    ops = [c for c in steps.columns if c.startswith("op_")]
    priced = (steps["duration_s"] - steps["extra_s"]).to_numpy()
    assert steps[ops].sum(axis=1).to_numpy() == pytest.approx(priced)
    assert "speculative proposals" in (out / "report.html").read_text()  # its operator class
    resolved = (out / "config.resolved.yaml").read_text()
    again = servesim("run", str(out / "config.resolved.yaml"), "--out", str(tmp_path / "again"),
                     "--quiet", "--no-report")
    assert again.returncode == 0 and "speculative:" in resolved
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["speculation"] == spec


@pytest.mark.parametrize(("override", "message"), [
    ("speculative.method=eagle4", "speculative.method: Input should be"),
    ("speculative={method: draft_model, num_speculative_tokens: 2, acceptance: {rate: 0.5}}",
     "speculative.model: is required for method draft_model"),
    ("speculative={method: eagle, num_speculative_tokens: 2, acceptance: {rate: 0.5}, ngram: 1}",
     "speculative.ngram: unknown key"),
])
def test_bad_speculative_sections_are_one_line_exit_2(override: str, message: str) -> None:
    result = servesim("validate", "quickstart", "--set", override)
    assert result.returncode == 2
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_vllm_overheads_are_the_fit_to_the_published_step_times() -> None:
    """The engine's speculative software times come from calibration/measurements/
    vllm-spec-decode-h100 by least squares (servesim.calibration.speculation): refitting gives
    them back, so they change only with the cost model or the data."""
    fit = fit_speculation_overheads()
    step_s, pass_s, source = make_engine("vllm-v0", {}).speculation_overheads()
    assert fit.step_s == pytest.approx(step_s, abs=0.05e-3)
    assert fit.pass_s == pytest.approx(pass_s, abs=0.05e-3)
    assert "issue #20780" in source
    assert len(fit.rows) == 12
