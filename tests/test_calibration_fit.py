"""Fitting without torch: recovering known curves, the Curve rule, agreement with the cost
model, hold-out, profile writing and one-line CLI errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim import load_hardware, load_model
from servesim.calibration.fit import fit_link, fit_operator, monotone_knots
from servesim.calibration.profile_fit import fit_profile
from servesim.calibration.profiles import write_profile
from servesim.calibration.schema import holdout_mask, read_measurements
from servesim.calibration.work import ape, fast_predict, operator_cost, predict, work
from servesim.cost import CostModel
from servesim.dtypes import DType, Precision
from servesim.errors import ServesimError
from servesim.hardware import Curve, Link, OperatorEfficiency

TRUTH = OperatorEfficiency(
    compute=Curve(axis="tokens", x=(16, 128, 1024, 8192), y=(0.2, 0.45, 0.7, 0.75)),
    memory=Curve(axis="bytes", x=(1e6, 1e8), y=(0.4, 0.85)), fixed_s=5e-6)


def synthetic_gemms(noise: float, seed: int = 0) -> pd.DataFrame:
    """GEMM timings made by the roofline with TRUTH on an H100, times lognormal noise."""
    rng = np.random.default_rng(seed)
    shapes = [(k, n) for k, n in ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (8192, 1280))]
    ms = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192]
    table = pd.DataFrame([{"m": m, "n": n, "k": k, "dtype": "bf16", "time_s": 1.0}
                          for k, n in shapes for m in ms])
    h100 = load_hardware("h100-sxm-80gb")
    clean = fast_predict(work("gemm", table, h100), TRUTH, h100.memory.bandwidth_Bps)
    table["time_s"] = clean * np.exp(rng.normal(0, noise, len(table)))
    return table


def test_fit_recovers_a_known_curve_from_noisy_roofline_timings() -> None:
    h100 = load_hardware("h100-sxm-80gb")
    table = synthetic_gemms(noise=0.03)
    held = holdout_mask(table, "gemm")
    w = work("gemm", table, h100)
    fit = fit_operator(w.subset(~held), h100.memory.bandwidth_Bps, h100.efficiency.gemm)
    predicted = fast_predict(w.subset(held), fit.efficiency, h100.memory.bandwidth_Bps)
    errors = ape(predicted, w.time_s[held])
    assert np.median(errors) < 0.04  # the 3% noise itself has a 2% median
    assert np.percentile(errors, 90) < 0.10
    for m in (1024, 4096, 8192):  # clearly compute-bound: the curve itself is recovered
        assert fit.efficiency.compute.at(m) == pytest.approx(TRUTH.compute.at(m), rel=0.08)
    assert fit.efficiency.memory.at(5e7) == pytest.approx(TRUTH.memory.at(5e7), rel=0.08)


SHAPED_TRUTH = TRUTH.model_copy(update={
    "outputs": Curve(axis="outputs", x=(2.0**17, 2.0**20, 2.0**23), y=(0.35, 0.8, 1.0)),
    "depth": Curve(axis="depth", x=(512.0, 2048.0, 8192.0), y=(0.6, 0.9, 1.0))})


def test_fit_recovers_the_gemm_shape_factors() -> None:
    """A GEMM class whose efficiency falls for few output elements (idle SMs) and short K loops:
    the fit finds the factors, and predicts held-out row counts within the 3% noise; fitted by rows
    alone (``shape_factors=False``), one curve per row count misses them."""
    h100 = load_hardware("h100-sxm-80gb")
    bandwidth = h100.memory.bandwidth_Bps
    rng = np.random.default_rng(3)
    sizes = (512, 1024, 2048, 4096, 8192, 16384)
    ms = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
    table = pd.DataFrame([{"m": m, "n": n, "k": k, "dtype": "bf16", "time_s": 1.0}
                          for m in ms for n in sizes for k in sizes])
    clean = fast_predict(work("gemm", table, h100), SHAPED_TRUTH, bandwidth)
    table["time_s"] = clean * np.exp(rng.normal(0, 0.03, len(table)))
    held = holdout_mask(table, "gemm")

    def held_out_median(shape_factors: bool) -> tuple[float, OperatorEfficiency]:
        w = work("gemm", table, h100, shape_factors=shape_factors)
        fit = fit_operator(w.subset(~held), bandwidth, h100.efficiency.gemm).efficiency
        return float(np.median(ape(fast_predict(w.subset(held), fit, bandwidth), w.time_s[held]))), fit

    shaped_error, shaped = held_out_median(True)
    plain_error, plain = held_out_median(False)
    assert shaped_error < 0.04  # the noise alone has a 2% median
    assert plain_error > 2 * shaped_error
    assert plain.outputs is None and plain.depth is None
    assert shaped.outputs is not None and shaped.depth is not None
    # the factors are found up to the normalisation (their best octave reads 1)
    for small, large, axis in ((2.0**17, 2.0**23, "outputs"), (512.0, 8192.0, "depth")):
        truth, fitted = getattr(SHAPED_TRUTH, axis), getattr(shaped, axis)
        expected = truth.at(small) / truth.at(large)
        assert fitted.at(small) / fitted.at(large) == pytest.approx(expected, rel=0.1)


ATTENTION_TRUTH = OperatorEfficiency(
    compute=Curve(axis="tokens", x=(256, 2048, 16384), y=(0.3, 0.6, 0.75)),
    memory=Curve(axis="bytes", x=(1e6, 1e8), y=(0.3, 0.7)), fixed_s=8e-6,
    outputs=Curve(axis="outputs", x=(2.0**12, 2.0**16, 2.0**20), y=(0.3, 0.8, 1.0)),
    depth=Curve(axis="depth", x=(64.0, 128.0, 256.0), y=(0.6, 0.85, 1.0)))


def test_fit_recovers_the_prefill_attention_shape_factors() -> None:
    """Prefill attention whose kernel idles SMs on a small grid (few query rows x heads) and runs
    short head dimensions less efficiently: the fit finds both factors and predicts held-out
    sequence lengths within the 3% noise; by its tokens curve alone it does not."""
    h100 = load_hardware("h100-sxm-80gb")
    bandwidth = h100.memory.bandwidth_Bps
    rng = np.random.default_rng(5)
    seqs = (1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)  # compute-bound
    table = pd.DataFrame([{"batch": b, "seq": s, "context": 0, "heads": h, "kv_heads": max(1, h // 4),
                           "head_dim": d, "time_s": 1.0}
                          for b in (1, 4, 16) for s in seqs for h in (2, 8, 32) for d in (64, 128, 256)])
    clean = fast_predict(work("attention_prefill", table, h100), ATTENTION_TRUTH, bandwidth)
    table["time_s"] = clean * np.exp(rng.normal(0, 0.03, len(table)))
    held = holdout_mask(table, "attention_prefill")
    prior = h100.efficiency.attention_prefill.model_copy(update={"outputs": None, "depth": None})

    def held_out_median(shape_factors: bool) -> tuple[float, OperatorEfficiency]:
        w = work("attention_prefill", table, h100, shape_factors=shape_factors)
        fit = fit_operator(w.subset(~held), bandwidth, prior).efficiency
        return float(np.median(ape(fast_predict(w.subset(held), fit, bandwidth), w.time_s[held]))), fit

    shaped_error, shaped = held_out_median(True)
    plain_error, plain = held_out_median(False)
    assert shaped_error < 0.04
    assert plain_error > 2 * shaped_error
    assert plain.outputs is None and shaped.outputs is not None and shaped.depth is not None
    for small, large, axis in ((2.0**13, 2.0**19, "outputs"), (64.0, 256.0, "depth")):
        truth, fitted = getattr(ATTENTION_TRUTH, axis), getattr(shaped, axis)
        expected = truth.at(small) / truth.at(large)
        assert fitted.at(small) / fitted.at(large) == pytest.approx(expected, rel=0.1)


def test_fit_obeys_the_curve_rule_on_adversarial_data() -> None:
    rng = np.random.default_rng(1)
    x = np.exp2(np.arange(12.0))
    for _ in range(50):
        y = monotone_knots(x, rng.uniform(0.001, 1.5, x.size), rng.uniform(1, 10, x.size))
        Curve(axis="tokens", x=tuple(x), y=tuple(y))  # raises if the rule is broken
        assert np.all((y > 0) & (y <= 1))


def test_link_fit_recovers_latency_and_efficiency() -> None:
    link = Link(kind="nvlink", bandwidth_Bps=450e9, latency_s=0.0, efficiency=1.0)
    sizes = np.geomspace(4e3, 2.5e8, 40)
    world = np.full(sizes.size, 8.0)
    time_s = 12e-6 + 2 * 7 / 8 * sizes / (450e9 * 0.7)
    fitted = fit_link(sizes, world, time_s, link)
    assert fitted.latency_s == pytest.approx(12e-6, rel=0.15)
    assert fitted.efficiency == pytest.approx(0.7, rel=0.05)


def attention_rows() -> dict[str, pd.DataFrame]:
    prefill = pd.DataFrame([{"batch": b, "seq": s, "context": c, "heads": 32, "kv_heads": 8,
                             "head_dim": 128, "time_s": 1e-3}
                            for b in (1, 4) for s in (64, 512, 4096) for c in (0, 1000)])
    decode = pd.DataFrame([{"batch": b, "context": c, "heads": 8, "kv_heads": 1, "head_dim": 128,
                            "time_s": 1e-4} for b in (1, 32) for c in (100, 4000)])
    fp8_kv = pd.DataFrame([{"batch": b, "context": c, "heads": 16, "kv_heads": 4, "head_dim": 64,
                            "kv_bytes": 1.0, "time_s": 1e-4} for b in (2, 64) for c in (7, 8191)])
    memory = pd.DataFrame({"bytes": [1e4, 1e6, 1e8], "time_s": 1e-5})
    return {"attention_prefill": prefill, "attention_decode": decode, "memory": memory,
            "gemm": synthetic_gemms(0.0).head(30), "attention_decode_fp8": fp8_kv}


@pytest.mark.parametrize("profile", ["a100-sxm-80gb", "h100-sxm-80gb", "mi300x"])
def test_fast_path_equals_the_cost_model(profile: str) -> None:
    """What the fit optimises and validate reports is what the simulator charges."""
    hardware = load_hardware(profile)
    for family, table in attention_rows().items():  # an fp8 cache: its own class where fitted (H100)
        expected = [operator_cost(family, row, hardware).time_s for _, row in table.iterrows()]
        np.testing.assert_allclose(predict(family, table, hardware), expected, rtol=1e-12)


def test_fit_profile_writes_a_loadable_profile_with_provenance(tmp_path: Path) -> None:
    tables = {"gemm": synthetic_gemms(0.02)}
    fitted, report = fit_profile(tables, load_hardware("h200-sxm-141gb"), "synthetic", "2026-01-01")
    assert not fitted.spec_only
    text = fitted.provenance["efficiency.gemm"]
    for word in ("synthetic", "2026-01-01", "held out", "in-sample", "held-out", "method"):
        assert word in text
    row = report.table().iloc[0]
    assert row["fit_out_median_%"] < row["spec_median_%"]
    path = write_profile(fitted, tmp_path / "h200.yaml", "test")
    assert load_hardware(path) == fitted


def test_holdout_interleaves_the_axis() -> None:
    table = pd.DataFrame({"m": [1, 2, 4, 8, 8, 16], "n": 1, "k": 1, "dtype": "bf16", "time_s": 1.0})
    assert holdout_mask(table, "gemm").tolist() == [False, True, False, True, True, False]


def test_missing_measurements_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ServesimError, match="calibrate bench"):
        read_measurements(tmp_path)
    (tmp_path / "gemm.csv").write_text("m,n,time_s\n1,2,3\n")
    with pytest.raises(ServesimError, match="missing column"):
        read_measurements(tmp_path)


@pytest.mark.parametrize(("args", "message"), [
    (["fit", "/no/such/dir", "--profile", "x.yaml"], "error: measurements: no such directory"),
    (["validate", "/no/such/dir", "--profile", "h100-sxm-80gb"], "error: measurements: no such"),
    (["validate", ".", "--profile", "tpu"], "error: --profile: unknown hardware 'tpu'"),
    (["bench", "--device", "tpu", "--out", "/tmp/servesim-never"], "error: --device"),
])
def test_calibrate_cli_errors_are_one_line(args: list[str], message: str) -> None:
    pytest.importorskip("torch", reason="bench's device check runs after importing torch") if (
        args[0] == "bench") else None
    run = subprocess.run([sys.executable, "-m", "servesim", "calibrate", *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_missing_torch_says_how_to_install_it() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from servesim.calibration.timing import import_torch\n"
            "from servesim.errors import ServesimError\n"
            "try:\n    import_torch()\nexcept ServesimError as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in run.stdout


def test_fit_and_validate_never_import_torch() -> None:
    code = ("import sys, servesim.calibration.fit, servesim.calibration.profile_fit, "
            "servesim.calibration.validate, servesim.calibration.vidur, servesim.calibration.profiles, "
            "servesim.cli.calibrate; "
            "assert 'torch' not in sys.modules")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_bench_reps_override_sets_warmups_to_a_fifth() -> None:
    from servesim.calibration.timing import Timing

    assert Timing.for_run("cuda", False) == Timing(warmup=10, reps=50)
    assert Timing.for_run("cuda", False, reps=15) == Timing(warmup=3, reps=15)
    assert Timing.for_run("cpu", True, reps=4) == Timing(warmup=2, reps=4)
    with pytest.raises(ServesimError, match="--reps"):
        Timing.for_run("cuda", False, reps=0)


def test_e2e_sorts_profiled_operators_into_the_cost_models_classes() -> None:
    """The GPU end-to-end check compares GPU time by class with the prediction by class: a
    2-D matrix product is a GEMM, math-backend attention's batched products are attention, the
    KV-slot gathers are apart (the cost model has no such cost) and the rest is elementwise."""
    from servesim.calibration.transformer_e2e import kernel_class

    assert kernel_class("aten::mm") == "gemm"
    assert kernel_class("aten::_scaled_mm") == "gemm"
    assert kernel_class("aten::bmm") == "attention"
    assert kernel_class("aten::_scaled_dot_product_flash_attention") == "attention"
    assert kernel_class("aten::_safe_softmax") == "attention"
    assert kernel_class("aten::index_select") == "kv_gather_and_copies"
    assert kernel_class("aten::_index_put_impl_") == "kv_gather_and_copies"
    assert kernel_class("aten::_fused_rms_norm") == "elementwise"
    assert kernel_class("aten::silu") == "elementwise"


def test_a_fused_moe_slower_than_its_weights_is_fitted_on_the_compute_side_when_unlocked() -> None:
    """A grouped GEMM pads each expert's rows to its row tile, so with 8-64 rows per expert its time
    grows with the tokens although the textbook calls it bound by its (unchanging) weight bytes.
    Timings made by the roofline with a compute curve that reaches that regime (20x below the
    ridge at 8 rows per expert): the ridge-locked fit keeps those rows on the flat memory side and
    misses them; fitted without the lock (as ``UNLOCKED_FAMILIES`` are) the held-out rows come
    back (median under 2%)."""
    from servesim.calibration.fit import RIDGE_LOCK
    from servesim.calibration.profile_fit import UNLOCKED_FAMILIES

    assert {"moe", "moe_fp8", "moe_w4a16", "moe_fp4"} <= UNLOCKED_FAMILIES
    h100 = load_hardware("h100-sxm-80gb")
    truth = OperatorEfficiency(
        compute=Curve(axis="tokens", x=(1, 8, 64, 512), y=(0.008, 0.024, 0.07, 0.2)),
        memory=Curve(axis="bytes", x=(1e6, 1e9), y=(0.5, 0.85)), fixed_s=3e-6)
    tokens = [2**i for i in range(0, 14)] + [3 * 2**i for i in range(0, 12)]
    table = pd.DataFrame([{"tokens": t, "hidden": h, "inter": i, "topk": 8, "experts": 64, "tp": 1,
                           "ep": 1, "routing": "balanced", "time_s": 1.0}
                          for t in tokens for h, i in ((4096, 1024), (2048, 768), (7168, 2048))])
    w = work("moe_fp8", table, h100)
    table["time_s"] = fast_predict(w, truth, h100.memory.bandwidth_Bps)
    w = work("moe_fp8", table, h100)
    held = holdout_mask(table, "moe_fp8")
    # the regime the test is about: rows the textbook locks on the memory side, though truly compute-bound
    bandwidth = h100.memory.bandwidth_Bps
    ideal_c, ideal_m = w.flops / w.peak, w.bytes / bandwidth
    truly_compute = w.flops / (w.peak * w.compute_eff(truth)) > ideal_m / 0.85
    assert ((ideal_m > RIDGE_LOCK * ideal_c) & truly_compute).sum() > 20
    prior = h100.efficiency.moe_fp8
    assert prior is not None
    errors = {}
    for name, lock in (("locked", RIDGE_LOCK), ("unlocked", None)):
        fit = fit_operator(w.subset(~held), bandwidth, prior, ridge_lock=lock).efficiency
        errors[name] = ape(fast_predict(w.subset(held), fit, bandwidth), w.time_s[held])
    # measured: locked 8.9% / 30.0%, unlocked 0.6% / 12.4% (the p90: knots per octave against
    # the truth's per-three-octaves ones, at token counts between them)
    assert np.median(errors["unlocked"]) < 0.02 and np.percentile(errors["unlocked"], 90) < 0.15
    assert np.median(errors["locked"]) > 5 * np.median(errors["unlocked"])
    assert np.percentile(errors["locked"], 90) > 2 * np.percentile(errors["unlocked"], 90)


def test_b200s_nvfp4_linears_are_priced_as_the_cost_model_charges_them() -> None:
    """The FP4 class is fitted on what the simulator charges a W4A4 GEMM: its own curve at the FP4
    peak, rows padded to its tile, and a one-pass input quantisation (servesim.cost.quantise)."""
    hardware = load_hardware("b200")
    shapes = [(1, 4096, 4096), (200, 7168, 2048), (3000, 2112, 7168), (16384, 16384, 7168)]
    table = pd.DataFrame([{"m": m, "n": n, "k": k, "dtype": "nvfp4", "time_s": 1e-4} for m, n, k in shapes])
    expected = [operator_cost("gemm_fp4", row, hardware).time_s for _, row in table.iterrows()]
    np.testing.assert_allclose(predict("gemm_fp4", table, hardware), expected, rtol=1e-12)
    model = CostModel(load_model("llama-3-8b"), hardware, 1, Precision.from_names("nvfp4", "nvfp4"))
    charged = [model.gemm(m, k, n).time_s for m, n, k in shapes]
    np.testing.assert_allclose(charged, expected, rtol=1e-12)
    assert hardware.efficiency.gemm_for(DType.FP4) is hardware.efficiency.gemm_fp4
    # The one-pass quantisation writes half a byte and a 1-byte scale per 16 values.
    m, k = 3000, 7168
    side = expected[2] - model.gemm(m, k, 2112).roofline_s - model.gemm(m, k, 2112).fixed_s
    quantise = hardware.efficiency.quantisation
    assert side == pytest.approx(quantise.fixed_s + m * k * (2 + 0.5625) / (
        hardware.memory.bandwidth_Bps * quantise.memory.at(m * k * 2.5625)), rel=1e-9)
