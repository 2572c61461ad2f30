"""Bytes per element and the rules of mixing formats."""

import pytest

from servesim import DType, Precision, ServesimError


@pytest.mark.parametrize(("dtype", "expected"), [
    ("bf16", 2.0), ("fp16", 2.0), ("fp8", 1.0), ("int8", 1.0),
    ("int4", 0.5 + 2 / 128),  # 4 bits + one fp16 scale per 128 weights = 0.515625
])
def test_bytes_per_element(dtype: str, expected: float) -> None:
    assert DType(dtype).bytes_per_element() == expected


def test_int4_group_size_changes_scale_overhead() -> None:
    assert DType.INT4.bytes_per_element(group_size=32) == 0.5 + 2 / 32
    assert Precision.from_names("int4", group_size=64).weight_bytes == 0.5 + 2 / 64


def test_aliases_and_unknown_names() -> None:
    assert DType.parse("bfloat16", "x") is DType.BF16
    assert DType.parse("float16", "x") is DType.FP16
    assert DType.parse("fp4", "x") is DType.NVFP4  # FP4 formats are modelled (tests/test_fp4.py)
    with pytest.raises(ServesimError, match=r"^kv_dtype: unknown dtype 'fp6'; use one of"):
        DType.parse("fp6", "kv_dtype")


def test_math_runs_in_the_activation_format() -> None:
    assert Precision.from_names("int4", "bf16").math is DType.BF16  # weight-only
    assert Precision.from_names("fp8", "fp8").math is DType.FP8  # W8A8


def test_w16a8_is_rejected_with_the_fix() -> None:
    with pytest.raises(ServesimError, match=r"W16A8.*use precision.weights: fp8"):
        Precision.from_names("bf16", "fp8")


def test_int4_activations_are_rejected() -> None:
    with pytest.raises(ServesimError, match=r"precision\.activations: int4 activations are not supported"):
        Precision.from_names("int4", "int4")


def test_two_different_8_bit_formats_are_rejected() -> None:
    with pytest.raises(ServesimError, match="mixes two 8-bit formats"):
        Precision.from_names("fp8", "int8")
    Precision.from_names("int4", "fp8")  # W4A8 kernels exist (e.g. QServe)
