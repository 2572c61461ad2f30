"""The shipped default efficiencies against Vidur's public GEMM timings (A100 and H100).

Skipped when ``../shared/data`` is absent. The default curves were read off this same data by
hand, so this is a regression guard on the defaults (and a check that the cost model's GEMM
FLOPs/bytes match the measured operators), not an out-of-sample validation: that is the job of
``servesim calibrate validate``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from simulator import load_hardware
from simulator.cost.roofline import roofline


def gemm_shapes(row: dict[str, str]) -> dict[str, tuple[int, int]]:
    """(K, N) on one GPU of each GEMM Vidur times, from its shape columns."""
    h, inter = int(row["n_embd"]), int(row["n_expanded_embd"])
    heads, kv_heads = int(row["n_head"]), int(row["n_kv_head"])
    tp = int(row["num_tensor_parallel_workers"])
    up = (2 if row["use_gated_mlp"] == "True" else 1) * inter
    return {"attn_pre_proj": (h, (heads + 2 * kv_heads) * (h // heads) // tp),
            "attn_post_proj": (h // tp, h), "mlp_up_proj": (h, up // tp),
            "mlp_down_proj": (inter // tp, h)}


def gemm_errors(shared: Path, gpu: str, profile_name: str, ideal: bool) -> np.ndarray:
    profile = load_hardware(profile_name)
    profile = profile.ideal() if ideal else profile
    errors = []
    for path in sorted((shared / "kernels/vidur_profiling/compute" / gpu).glob("*/*/mlp.csv")):
        with path.open() as handle:
            for row in csv.DictReader(handle):
                m = int(row["num_tokens"])
                for name, (k, n) in gemm_shapes(row).items():
                    predicted = roofline(name, 2.0 * m * k * n, (k * n + m * (k + n)) * 2.0,
                                         peak_flops=profile.peak_flops["bf16"],
                                         bandwidth=profile.memory.bandwidth_Bps,
                                         eff=profile.efficiency.gemm, compute_axis=m).time_s
                    measured = float(row[f"time_stats.{name}.median"]) * 1e-3
                    errors.append(abs(predicted - measured) / measured)
    return np.asarray(errors)


@pytest.mark.parametrize(("gpu", "profile"), [("a100", "a100-sxm-80gb"), ("h100", "h100-sxm-80gb")])
def test_default_gemm_efficiencies_track_public_measurements(shared_data: Path, gpu: str,
                                                             profile: str) -> None:
    defaults = gemm_errors(shared_data, gpu, profile, ideal=False)
    roofline_only = gemm_errors(shared_data, gpu, profile, ideal=True)
    assert defaults.size > 10_000
    # Measured: A100 5.8% / H100 9.4% median error with the defaults, 32% / 37% for the bare
    # spec-sheet roofline (which is always optimistic).
    assert np.median(defaults) < 0.15
    assert np.median(defaults) < 0.5 * np.median(roofline_only)
