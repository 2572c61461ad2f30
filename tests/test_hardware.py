"""Hardware profiles: the shipped files, their provenance, curves and clear errors."""

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from servesim import DType, ServesimError, load_hardware
from servesim.hardware import Curve
from servesim.hardware_io import builtin_hardware_names, hardware_from_dict, profile_to_yaml

REQUIRED = {"a100-sxm-80gb", "a100-pcie-80gb", "h100-sxm-80gb", "h100-pcie-80gb",
            "h200-sxm-141gb", "l40s", "b200", "mi300x"}
CALIBRATED = {"a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200"}


def test_every_required_profile_ships() -> None:
    assert set(builtin_hardware_names()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_profile_numbers_have_sources(name: str) -> None:
    profile = load_hardware(name)
    for key in ("peak_flops", "memory.capacity_bytes", "memory.bandwidth_Bps", "interconnect",
                "host_link", "efficiency.gemm", "efficiency.attention_prefill",
                "efficiency.attention_decode", "efficiency.elementwise", "calibration"):
        assert profile.provenance.get(key), f"{name}: no provenance for {key}"
    # A100, H100, H200 and B200 SXM are fitted to NVIDIA AIConfigurator's measured vLLM kernels
    # (`servesim calibrate import-aiconfigurator`), with their collectives; the others are not, and
    # every profile must say which it is.
    if name in CALIBRATED:
        assert not profile.spec_only
        assert "fitted" in profile.provenance["efficiency.gemm"]
        assert "held-out" in profile.provenance["efficiency.gemm"]
        assert profile.collectives is not None and "held-out" in profile.provenance["collectives"]
        assert profile.efficiency.gemm_fp8 is not None or name.startswith("a100")
    else:
        assert profile.spec_only
        assert "spec-only" in profile.provenance["calibration"]


def test_spec_sheet_peaks() -> None:
    h100 = load_hardware("h100-sxm-80gb")
    assert h100.peak(DType.BF16) == pytest.approx(989.4e12)
    assert h100.peak(DType.FP16) == h100.peak(DType.BF16)
    assert h100.peak(DType.FP8) == pytest.approx(2 * 989.4e12, rel=1e-3)
    assert h100.memory.bandwidth_Bps == 3.35e12
    assert load_hardware("h200-sxm-141gb").memory.bandwidth_Bps == 4.8e12


def test_a100_has_no_fp8_tensor_cores() -> None:
    with pytest.raises(ServesimError, match="a100-sxm-80gb has no fp8 tensor cores"):
        load_hardware("a100-sxm-80gb").peak(DType.FP8)


def test_ridge_points() -> None:
    # 312 TFLOP/s over 2.039 TB/s; textbooks round the bandwidth to 2 TB/s and get 156.
    assert load_hardware("a100-sxm-80gb").ridge_point() == pytest.approx(312 / 2.039, rel=1e-9)
    assert load_hardware("h100-sxm-80gb").ridge_point() == pytest.approx(989.4 / 3.35, rel=1e-9)


def test_prefix_lookup_and_ambiguity() -> None:
    assert load_hardware("h200").name == "h200-sxm-141gb"
    with pytest.raises(ServesimError, match="'h100' is ambiguous"):
        load_hardware("h100")


def test_curve_interpolates_in_log_space_and_clamps() -> None:
    curve = Curve(axis="tokens", x=(16, 1024), y=(0.2, 0.8))
    assert curve.at(4) == 0.2 and curve.at(1e6) == 0.8
    assert curve.at(128) == pytest.approx(0.5)  # 128 = geometric midpoint of 16 and 1024
    assert curve(128.0) == pytest.approx(0.5)
    import numpy as np
    assert np.allclose(curve(np.array([4.0, 128.0, 1e6])), [0.2, 0.5, 0.8])


def test_curve_rejects_efficiency_above_one() -> None:
    with pytest.raises(ValueError, match="efficiencies in"):
        Curve(x=(1, 2), y=(0.5, 1.5))


def test_ideal_profile_is_the_pure_roofline() -> None:
    ideal = load_hardware("h100-sxm-80gb").ideal()
    assert ideal.efficiency.gemm.compute.at(1) == 1.0
    assert ideal.efficiency.attention_decode.fixed_s == 0.0
    assert ideal.interconnect.latency_s == 0.0
    assert not hasattr(ideal, "overhead")  # the per-step software cost is the engine's


def test_a_profile_with_a_step_overhead_gets_the_migration_line(tmp_path: Path) -> None:
    """servesim 0.1 profiles held the engine's per-step cost; now it is an error naming the fix."""
    data = yaml.safe_load(profile_to_yaml(load_hardware("l40s")))
    data["overhead"] = {"step_s": 6e-4}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ServesimError, match=r"old\.yaml: overhead: the per-step framework cost belongs "
                       r"to the serving engine .*engine\.step_overhead_s"):
        load_hardware(path)


def test_profile_round_trips_through_yaml(tmp_path: Path) -> None:
    profile = load_hardware("h100-sxm-80gb")
    path = tmp_path / "copy.yaml"
    path.write_text(profile_to_yaml(profile))
    again = load_hardware(path)
    assert again == profile
    assert again.memory.capacity_bytes == 81559 * 2**20  # no digits lost


def test_malformed_yaml_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\npeak_flops: {bf16: 1e15\nmemory: [\n")
    with pytest.raises(ServesimError, match=r"malformed YAML at line \d+; fix the syntax"):
        load_hardware(path)


def test_wrong_field_is_named(tmp_path: Path) -> None:
    data = yaml.safe_load(profile_to_yaml(load_hardware("l40s")))
    data["memory"]["bandwidth_Bps"] = -1
    path = tmp_path / "neg.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ServesimError, match=r"memory\.bandwidth_Bps: Input should be greater than 0"):
        load_hardware(path)
    data["memory"]["bandwidth_Bps"] = 1e12
    data["memroy"] = {}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ServesimError, match=r"memroy: unknown key"):
        load_hardware(path)


def test_unknown_hardware_lists_choices() -> None:
    with pytest.raises(ServesimError, match="unknown hardware 'tpu-v5'; use one of a100-pcie-80gb"):
        load_hardware("tpu-v5")


def test_capacity_is_what_the_device_reports() -> None:
    assert load_hardware("a100-sxm-80gb").memory.capacity_bytes == 80 * 2**30
    assert math.isclose(load_hardware("mi300x").memory.capacity_bytes, 192 * 2**30)


def test_curve_that_would_make_more_work_faster_is_rejected() -> None:
    # 0.1 -> 0.5 over a doubling of the axis: a 2x bigger GEMM would finish 2.5x sooner.
    with pytest.raises(ValueError, match="rises faster than the axis"):
        Curve(x=(64, 128), y=(0.1, 0.5))
    Curve(x=(64, 128), y=(0.1, 0.169))  # just under the limit 0.1 * (1 + ln 2)


def test_missing_efficiency_is_an_error_not_a_perfect_gpu(tmp_path: Path) -> None:
    data = yaml.safe_load(profile_to_yaml(load_hardware("l40s")))
    del data["efficiency"]["attention_decode"]
    path = tmp_path / "partial.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ServesimError, match=r"efficiency\.attention_decode: is required"):
        load_hardware(path)


def test_a_written_profile_reads_back_to_the_same_floats() -> None:
    """``profile_to_yaml`` writes each float with as many digits as reading it back exactly needs:
    183,359 MiB (a B200 as nvidia-smi reports it) takes 12 significant digits, which a fixed 11
    rounded to 1.9226584678e+11, 4 bytes short; every shipped profile survives a write and read."""
    text = profile_to_yaml(load_hardware("b200"))
    assert "capacity_bytes: 1.92265846784e+11" in text
    assert "fixed_s: 3.06e-06" in profile_to_yaml(load_hardware("h100-sxm-80gb"))
    for name in builtin_hardware_names():
        profile = load_hardware(name)
        again = hardware_from_dict(yaml.safe_load(profile_to_yaml(profile)), name)
        assert again.model_dump() == profile.model_dump(), name


def test_gemm_shape_factors_scale_the_compute_side_only() -> None:
    """A GEMM's compute efficiency is the rows curve times its outputs (m x n) and depth (k)
    factors; a kernel that gives no shape (a fused MoE priced by the GEMM curves) and a class
    without factors take the rows curve alone, and the memory side never changes."""
    from servesim.cost.roofline import roofline
    from servesim.hardware import Curve, OperatorEfficiency

    plain = OperatorEfficiency(compute=Curve.constant(0.8), memory=Curve.constant(0.5, "bytes"), fixed_s=0.0)
    shaped = plain.model_copy(update={
        "outputs": Curve(axis="outputs", x=(1e5, 1e7), y=(0.5, 1.0)),
        "depth": Curve(axis="depth", x=(1024.0, 4096.0), y=(0.8, 1.0))})
    assert shaped.compute_at(1024, 1e5, 1024) == pytest.approx(0.8 * 0.5 * 0.8)
    assert shaped.compute_at(1024, 1e7, 4096) == pytest.approx(0.8)
    assert shaped.compute_at(1024) == plain.compute_at(1024, 1e5, 1024) == 0.8
    m, n, k = 256, 512, 1024  # 131,072 outputs: factor 0.5 + 0.5 * ln(1.31072) / ln(100)
    flops, nbytes = 2.0 * m * n * k, float(k * n + m * k + m * n) * 2
    op = roofline("gemm", flops, nbytes, peak_flops=1e15, bandwidth=1e12, eff=shaped, compute_axis=m,
                  outputs=m * n, depth=k)
    outputs_factor = 0.5 + 0.5 * math.log(m * n / 1e5) / math.log(100.0)
    assert op.compute_s == pytest.approx(flops / (1e15 * 0.8 * outputs_factor * 0.8))
    assert op.memory_s == pytest.approx(nbytes / (1e12 * 0.5))
    assert roofline("gemm", flops, nbytes, peak_flops=1e15, bandwidth=1e12, eff=shaped,
                    compute_axis=m).compute_s == pytest.approx(flops / (1e15 * 0.8))


def test_prefill_attention_shape_factors_read_keys_times_heads_and_head_dim() -> None:
    """Prefill attention's compute efficiency is each chunk's tokens curve times the outputs factor
    at (the keys every chunk sees x heads on the GPU: one varlen kernel's grid, its short chunks
    split along their context) and the depth factor at the query-key head dimension; the memory
    side and a class without factors are unchanged."""
    from servesim.cost import BatchShape
    from servesim.cost.attention import AttentionShape, causal_pairs, prefill_attention
    from servesim.hardware import Curve

    base = load_hardware("h100-sxm-80gb")
    plain = base.efficiency.attention_prefill.model_copy(update={
        "compute": Curve.constant(0.6), "outputs": None, "depth": None})
    shaped = plain.model_copy(update={"outputs": Curve(axis="outputs", x=(1e3, 1e5), y=(0.25, 1.0)),
                                      "depth": Curve(axis="depth", x=(64.0, 128.0), y=(0.6, 1.0))})
    shape = AttentionShape(heads=8, q_head_dim=64, v_head_dim=64, cache_elements_per_token=2 * 2 * 64,
                           prefill_kv_elements_per_token=2 * 2 * 64, prefill_flops_per_pair=2 * 8 * 128,
                           decode_flops_per_key=2 * 8 * 128, decode_q_width=8 * 64, decode_o_width=8 * 64,
                           window=None)
    batch = BatchShape.build([100, 400], [0, 300])  # (100 + 700) keys seen x 8 heads = 6,400 outputs

    def priced(eff: object) -> object:
        hardware = base.model_copy(update={"efficiency": base.efficiency.model_copy(
            update={"attention_prefill": eff})})
        return prefill_attention(batch, shape, hardware, 1e15, 2.0, 1)

    pairs = float(causal_pairs(np.array([100, 400]), np.array([0, 300]), None).sum())
    flops = pairs * shape.prefill_flops_per_pair
    outputs_factor = 0.25 + 0.75 * math.log(6400 / 1e3) / math.log(100.0)
    assert priced(plain).compute_s == pytest.approx(flops / (1e15 * 0.6))
    assert priced(shaped).compute_s == pytest.approx(flops / (1e15 * 0.6 * outputs_factor * 0.6))
    assert priced(shaped).memory_s == priced(plain).memory_s
    assert shaped.shape_factor(6400, 64) == pytest.approx(outputs_factor * 0.6)
    assert plain.shape_factor(6400, 64) == 1.0
