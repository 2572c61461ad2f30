"""The capacity planner searches pipeline, data-parallel and expert-parallel layouts too."""

from __future__ import annotations

import pytest
from test_capacity import one_at_a_time

from servesim.capacity import plan_capacity, validate_capacity
from servesim.capacity.candidate import expand_candidates
from servesim.capacity.plan import decode_limits_only


def deepseek(**candidates: object) -> dict:
    return {"model": "deepseek-v3",
            "workload": {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 200,
                         "lengths": {"preset": "azure-conversation"}},
            "slo": {"tpot_s": 0.05}, "engine": "vllm-v0",
            "precision": {"weights": "fp8", "activations": "fp8", "kv_cache": "fp8"},
            "deployment": {"max_model_len": 16384, "max_num_batched_tokens": 16384},
            "candidates": {"hardware": ["h200-sxm-141gb"], **candidates}}


def test_the_layout_axes_multiply_and_impossible_layouts_are_listed_with_the_reason() -> None:
    config = validate_capacity(deepseek(tp=[8, 1], dp=[1, 8], ep=[1, 8]))
    labels = [c.label for c in expand_candidates(config)]
    assert len(labels) == 8 and "h200-sxm-141gb tp1 dp8 ep8 continuous" in labels
    limits = {row["candidate"]: row for row in decode_limits_only(config)}
    assert limits["h200-sxm-141gb tp8 continuous"]["feasible"]
    assert limits["h200-sxm-141gb tp8 ep8 continuous"]["feasible"]
    assert limits["h200-sxm-141gb tp1 dp8 ep8 continuous"]["feasible"]
    assert "does not divide tp 1" in limits["h200-sxm-141gb tp1 ep8 continuous"]["infeasible_reason"]
    assert "use ep 1 or 64" in limits["h200-sxm-141gb tp8 dp8 ep8 continuous"]["infeasible_reason"]
    # TP8 replicates the MLA latent on all 8 GPUs; each of DP8's ranks has its own pool, so a rank
    # holds more sequences per GPU than the TP8 group does
    tp8 = limits["h200-sxm-141gb tp8 continuous"]["decode_batch_limits"]
    dp8 = limits["h200-sxm-141gb tp1 dp8 ep8 continuous"]["decode_batch_limits"]
    assert dp8["kv_bytes_per_token"] == tp8["kv_bytes_per_token_per_gpu"] == 576 * 61  # fp8 latent


def test_pipelined_candidates_count_every_stage_in_the_fleet() -> None:
    """The D/D/1 workload (one request at a time per scheduling unit) at 50 req/s: a PP2 replica
    has two virtual engines on two GPUs, so its fleet is sets x 2 GPUs."""
    doc = one_at_a_time("constant", 0.5, 99, 300, 1, target_rate=50.0)
    doc["candidates"] = {"hardware": ["h100-sxm-80gb"], "pp": [1, 2]}
    # no host time per step: V0 spends it serially on one GPU but off the stages of a pipeline,
    # which would make PP2 more than twice as fast by an amount that depends on the profile
    doc["engine"] = {"name": "vllm-v0", "step_overhead_s": 0.0}
    answer = plan_capacity(validate_capacity(doc))
    by_pp = {r.get("pp", 1): r for r in answer["candidates"]}
    assert "pp" not in by_pp[1] and by_pp[2]["gpus_per_replica"] == 2
    for pp, record in by_pp.items():
        target = record["target"]
        assert target["gpus"] == target["replicas"] * pp
        assert record["gpus_per_set"] == pp
    # one GPU holding all 32 layers serves one prompt at a time; two stages overlap two prompts,
    # each through both stages, so a PP2 replica sustains close to twice the rate on twice the GPUs
    assert by_pp[2]["search"]["max_rate"] == pytest.approx(2 * by_pp[1]["search"]["max_rate"], rel=0.15)
