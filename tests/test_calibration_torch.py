"""The CPU calibration pipeline end to end (needs torch): bench -> fit cpu-local -> validate,
then a real small transformer under continuous batching against ``servesim step``.

Skipped without torch (the README's test command does not install it; ``.ci/run`` does). Set
``SERVESIM_CALIB_DIR`` to a finished ``bench --quick`` folder to reuse it instead of benchmarking
again (CI does, after running the CLI pipeline).

Tolerances: CPU timings on a shared 2-core machine are noisy, so every bound is on a median.
Kernel families: the fit must beat the CPU's own best-case roofline out of sample, and GEMM and
attention held-out medians stay under 25% / 45% (we measured 5-11% and 10-20%). The elementwise
class is one curve for ops whose cost per byte differs 10x on CPU bf16 (a norm vs an add), so it
is only required to beat the roofline. End to end the simulator underpredicts this eager torch
model by about 1.6-1.8x (per-step median error 35-45% measured, mean signed -37% to -45%): it does
not model the decode KV gather and the unfused bf16 norms and RoPE a CPU runs, which a serving
engine fuses. Each step's time is the median of three timed passes. We require the predicted step
times to rank the measured ones (Spearman > 0.6; 0.96-0.99 here even with three busy loops on the
2 cores, but one single-pass CI run saw 0.70), and the prediction to be low by more than 10% and
less than 5x on the mean (-0.80 < signed < -0.10; -0.72 measured with the cores oversubscribed
after the fit), with the median error under 80%: the cost model must order steps right and get
the scale within what the unmodelled work explains.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="CPU calibration needs torch: pip install torch --index-url https://download.pytorch.org/whl/cpu")

from servesim import load_hardware  # noqa: E402
from servesim.calibration.bench import run_bench  # noqa: E402
from servesim.calibration.profiles import fit_directory  # noqa: E402
from servesim.calibration.transformer_e2e import Workload, run_e2e  # noqa: E402
from servesim.calibration.validate import validate  # noqa: E402


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("SERVESIM_CALIB_DIR")
    if given and (Path(given) / "gemm.csv").exists():
        return Path(given)
    out = tmp_path_factory.mktemp("bench")
    run_bench("cpu", out, quick=True)
    return out


@pytest.fixture(scope="module")
def cpu_profile(cpu_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "cpu-local.yaml"
    fit_directory(cpu_run, path)
    return path


def test_quick_bench_writes_every_family(cpu_run: Path) -> None:
    for family in ("gemm", "attention_prefill", "attention_decode", "memory"):
        assert (cpu_run / f"{family}.csv").exists()
    assert (cpu_run / "metadata.json").exists()


def test_bench_times_gemms_at_the_row_counts_asked_for(tmp_path: Path) -> None:
    """``calibrate bench --gemm-rows 100,513``: only GEMMs, every quick-grid layer shape at exactly
    those token counts (off the grid's multiples of 16), and nothing else written."""
    import pandas as pd
    from typer.testing import CliRunner

    from servesim.calibration.shapes import gemm_shapes
    from servesim.cli.app import app

    done = CliRunner().invoke(app, ["calibrate", "bench", "--device", "cpu", "--quick", "--reps", "2",
                                    "--gemm-rows", "100,513", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm.csv", "metadata.json"]
    table = pd.read_csv(tmp_path / "gemm.csv")
    expected = {(s.m, s.n, s.k) for s in gemm_shapes("cpu", True, (100, 513))}
    assert set(zip(table["m"], table["n"], table["k"], strict=True)) == expected
    assert set(table["m"]) == {100, 513} and len(expected) > 10


def test_cpu_fit_beats_the_roofline_out_of_sample(cpu_profile: Path, cpu_run: Path,
                                                  tmp_path: Path) -> None:
    profile = load_hardware(cpu_profile)
    assert not profile.spec_only and profile.name == "cpu-local"
    summary, _ = validate(cpu_run, profile, tmp_path)
    assert (tmp_path / "validation.html").exists()
    by_family = summary.set_index("family")
    for family, row in by_family.iterrows():
        assert row["held_out_median_%"] < row["spec_median_%"], family
    assert by_family.loc["gemm", "held_out_median_%"] < 25
    assert by_family.loc["attention_decode", "held_out_median_%"] < 45
    assert by_family.loc["attention_prefill", "held_out_median_%"] < 45


def test_small_transformer_steps_match_the_cost_model(cpu_profile: Path) -> None:
    steps = run_e2e(load_hardware(cpu_profile), Workload(requests=24))
    assert len(steps) > 30 and steps["prefills"].sum() >= 24 and steps["decodes"].max() > 8
    # Bounds and why: see the module docstring (noisy shared CPU, unmodelled eager-mode work).
    assert steps[["predicted_s", "measured_s"]].corr(method="spearman").iloc[0, 1] > 0.6
    signed = (steps["predicted_s"] / steps["measured_s"] - 1.0).mean()
    assert -0.80 < signed < -0.10, signed
    assert steps["ape"].median() < 0.80
