"""Calibrating against my own benchmark run: result files in the vLLM and SGLang formats, written
here from servesim runs with known, perturbed coefficients, must give those coefficients back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from servesim.calibration.benchmark_result import read_benchmark
from servesim.calibration.from_benchmark import from_benchmark, scaled_profile
from servesim.calibration.profiles import write_profile
from servesim.calibration.replay import ZERO_CPU, Coefficients, simulate_document, trace_run
from servesim.errors import ServesimError
from servesim.hardware_io import load_hardware

RNG = np.random.default_rng(7)
PROMPTS = RNG.integers(100, 1500, 96)
OUTPUTS = RNG.integers(20, 160, 96)


def deployment(engine: dict[str, Any], hardware: str = "h100-sxm-80gb") -> dict[str, Any]:
    return {"model": "llama-3-8b", "hardware": hardware, "engine": engine,
            "workload": {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 1,
                         "lengths": {"preset": "azure-conversation"}}}


def measured_run(engine: dict[str, Any], concurrency: int | None, hardware: str = "h100-sxm-80gb",
                 ) -> dict[str, Any]:
    """A servesim run of the 96 requests, as the benchmark tools send them (closed loop with
    ``concurrency`` clients, or all at t = 0), and its per-request results."""
    n = len(PROMPTS)
    arrival = ({"process": "closed", "concurrency": concurrency} if concurrency
               else {"process": "poisson", "rate": "inf"})
    document = deployment(engine, hardware)
    document["workload"] = {"arrival": arrival, "num_requests": n, "prompt": {"dist": "fixed", "value": 1},
                            "output": {"dist": "fixed", "value": 1}}
    from servesim.workloads.requests import RequestTable
    table = RequestTable(np.zeros(n), PROMPTS, OUTPUTS)
    result = simulate_document(document, table)
    requests = result.requests
    return {"input_lens": PROMPTS.tolist(), "output_lens": OUTPUTS.tolist(),
            "ttfts": requests["ttft_s"].tolist(),
            "itls": [[float(t)] * (int(o) - 1) for t, o in zip(requests["tpot_s"], OUTPUTS, strict=True)],
            "errors": [""] * n, "max_concurrency": concurrency}


def vllm_file(path: Path, run: dict[str, Any]) -> Path:
    document = {"date": "20261130-120000", "endpoint_type": "openai",
                "model_id": "meta-llama/Meta-Llama-3-8B",
                "tokenizer_id": "meta-llama/Meta-Llama-3-8B", "num_prompts": len(run["input_lens"]),
                "request_rate": "inf", "burstiness": 1.0, **run}
    path.write_text(json.dumps(document))
    return path


def sglang_file(path: Path, run: dict[str, Any]) -> Path:
    """SGLang appends one JSON object per run; an older run on the first line must be ignored."""
    older = {"backend": "sglang", "dataset_name": "random", "request_rate": 4.0, "input_lens": [1],
             "output_lens": [1], "ttfts": [0.1], "itls": [[]], "errors": [""], "max_concurrency": None}
    document = {"backend": "sglang", "dataset_name": "random", "random_input_len": 1024,
                "request_rate": float("inf"), **run}
    path.write_text(json.dumps(older) + "\n" + json.dumps(document) + "\n")
    return path


def config_file(path: Path, engine: dict[str, Any], hardware: str = "h100-sxm-80gb") -> Path:
    path.write_text(yaml.safe_dump(deployment(engine, hardware)))
    return path


def test_a_closed_loops_schedule_does_not_depend_on_step_times() -> None:
    """The replay's premise: traced once with no CPU work, the schedule re-timed with any CPU
    coefficients gives the TTFT and TPOT of a full simulation with them, to rounding."""
    n = len(PROMPTS)
    document = deployment({"name": "vllm", "async_scheduling": False})
    document["workload"] = {"arrival": {"process": "closed", "concurrency": 12}, "num_requests": n,
                            "prompt": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}}
    from servesim.workloads.requests import RequestTable
    table = RequestTable(np.zeros(n), PROMPTS, OUTPUTS)
    trace = trace_run(simulate_document(document, table, ZERO_CPU))
    for overlap in (False, True):
        document["engine"]["async_scheduling"] = overlap
        for serial in (0.0, 4e-4):
            coefficients = Coefficients(fixed_s=2e-3, per_seq_s=3e-4, per_token_s=1e-7,
                                        serial_fixed_s=serial, serial_per_seq_s=serial / 20)
            full = simulate_document(document, table, coefficients.knobs()).requests
            traced = trace_run(simulate_document(document, table, ZERO_CPU))
            ttft, tpot = traced.evaluate(coefficients)
            assert ttft == pytest.approx(full["ttft_s"].to_numpy(), rel=1e-9)
            assert tpot == pytest.approx(full["tpot_s"].to_numpy(), rel=1e-9, nan_ok=True)
    assert trace.done.all()


TRUTH = {"name": "vllm", "async_scheduling": False, "step_overhead_s": 1.5e-3, "cpu_per_seq_s": 4e-5,
         "cpu_per_token_s": 0.0, "frontend_latency_s": 0.03}
"""A serial vLLM whose host spends 1.5 ms per step and 40 us per sequence, behind a front end that
takes 30 ms per request."""


def test_vllm_result_recovers_the_engines_cpu_coefficients(tmp_path: Path) -> None:
    """All 96 requests at once (vllm bench serve's default rate): the batch shrinks from 96 to 1
    as requests finish, so the cost per step and the cost per sequence are told apart. The
    experiment starts from the engine's own coefficients."""
    result = vllm_file(tmp_path / "vllm.json", measured_run(TRUTH, None))
    config = config_file(tmp_path / "deploy.yaml", {"name": "vllm", "async_scheduling": False})
    fitted = from_benchmark(result, config, out=tmp_path / "fit")
    assert fitted.after.fixed_s == pytest.approx(1.5e-3, rel=0.05)
    assert fitted.after.per_seq_s == pytest.approx(4e-5, rel=0.05)
    assert fitted.after.per_token_s < 1e-8
    assert fitted.after.frontend_s == pytest.approx(0.03, rel=0.05)
    after = fitted.metrics.set_index(["metric", "stat"])
    assert (after["after_error_%"].abs() < 1.0).all()
    # The fit starts from the shipped coefficients, which are not the truth, and leaves them.
    assert (fitted.before.fixed_s, fitted.before.frontend_s) != pytest.approx((1.5e-3, 0.03), rel=0.5)
    assert after["before_error_%"].abs().max() > 2 * after["after_error_%"].abs().max()
    profile = tmp_path / "fit" / "engine-vllm.yaml"
    assert profile.is_file() and (tmp_path / "fit" / "benchmark_metrics.csv").is_file()
    # The written profile is what a run reads back: the same step costs as the truth.
    rerun = measured_run({"name": "vllm", "async_scheduling": False, "profile": str(profile)}, None)
    assert np.allclose(rerun["ttfts"], json.loads(result.read_text())["ttfts"], rtol=0.02)


def test_a_closed_loop_pins_the_cost_of_its_own_batch(tmp_path: Path) -> None:
    """16 closed-loop clients keep about 16 sequences in every step, so such a run measures the
    host's time for a 16-sequence step (1.5 ms + 16 x 40 us = 2.14 ms), not how it splits."""
    result = vllm_file(tmp_path / "vllm.json", measured_run(TRUTH, 16))
    config = config_file(tmp_path / "deploy.yaml", {"name": "vllm", "async_scheduling": False})
    after = from_benchmark(result, config).after
    assert after.fixed_s + 16 * after.per_seq_s == pytest.approx(2.14e-3, rel=0.02)


def test_a_decode_scale_reaches_both_kv_cache_classes() -> None:
    """A decode-attention scale slows decode over a bf16 cache and over an fp8 one alike (the fp8
    class, where the profile has one, prices every 8-bit-cache step): both curves divided by it."""
    h100 = load_hardware("h100-sxm-80gb")
    slow = scaled_profile(h100, (1.0, 1.0, 1.5, 1.0, 1.0), "test")
    for kv_bytes in (2.0, 1.0):
        before, after = h100.efficiency.decode_for(kv_bytes), slow.efficiency.decode_for(kv_bytes)
        assert after.memory.y == pytest.approx([min(1.0, y / 1.5) for y in before.memory.y])
        assert after.fixed_s == pytest.approx(before.fixed_s * 1.5)
    assert slow.efficiency.decode_for(1.0) is not slow.efficiency.decode_for(2.0)


def test_a_communication_scale_slows_every_all_reduce_kernel_and_group() -> None:
    """A communication scale of 2 doubles every collective fit's latencies and halves its
    bandwidth fractions, the per-group curves (which replace the single fraction for their group)
    and the symmetric-memory fit included: a bandwidth-bound 8-GPU all-reduce vLLM sends to NCCL
    (1 GiB) and one it sends to symmetric memory (32 MiB) each take twice as long, to the
    latencies' share."""
    from servesim.cost.communication import allreduce_s
    from servesim.engines import make_engine

    h100 = load_hardware("h100-sxm-80gb")
    slow = scaled_profile(h100, (1.0, 1.0, 1.0, 1.0, 2.0), "test")
    assert h100.collectives is not None and slow.collectives is not None
    for name in ("nccl", "oneshot", "twoshot", "symm_mem"):
        before, after = getattr(h100.collectives, name), getattr(slow.collectives, name)
        assert after.latency_s == pytest.approx(2 * before.latency_s)
        for world, curve in (before.efficiency_by_world or {}).items():
            assert after.efficiency_by_world[world].y == pytest.approx([y / 2 for y in curve.y])
    vllm = make_engine("vllm", {}).runtime("h100-sxm-80gb", tp=8)
    for message in (2**30, 32 * 2**20):
        assert allreduce_s(message, 8, vllm, slow) == pytest.approx(2 * allreduce_s(message, 8, vllm, h100),
                                                                    rel=1e-9)


def test_sglang_result_recovers_a_kernel_scale(tmp_path: Path) -> None:
    """GEMMs 30% slower than the profile says, everything at t = 0 (SGLang's default rate, JSON
    lines): asked for a GEMM scale, the fit finds 1.3 and writes the slower profile."""
    slow = scaled_profile(load_hardware("h100-sxm-80gb"), (1.3, 1.0, 1.0, 1.0, 1.0), "test")
    truth_hw = write_profile(slow, tmp_path / "slow.yaml", "test")
    engine = {"name": "sglang", "step_overhead_s": 2e-4, "cpu_per_seq_s": 1e-6}
    result = sglang_file(tmp_path / "sglang.jsonl", measured_run(engine, None, str(truth_hw)))
    run = read_benchmark(result)
    assert run.tool == "sglang" and len(run) == 96 and run.max_concurrency is None
    config = config_file(tmp_path / "deploy.yaml", engine)
    fitted = from_benchmark(result, config, scale_classes=("gemm",), out=tmp_path / "fit")
    assert fitted.after.scales[0] == pytest.approx(1.3, rel=0.03)
    assert (tmp_path / "fit" / "hardware-h100-sxm-80gb.yaml").is_file()
    assert fitted.metrics["after_error_%"].abs().max() < 3.0


@pytest.mark.parametrize(("document", "message"), [
    ({"input_lens": [1], "output_lens": [1], "ttfts": [0.1]}, r"has no per-request itls; run the benchmark "
     r"with --save-detailed"),
    ({"input_lens": [1, 2], "output_lens": [1], "ttfts": [0.1, 0.2], "itls": [[], []]},
     r"output_lens: has 1 entries for 2 requests"),
    ({"input_lens": [5], "output_lens": [3], "ttfts": [0.1], "itls": [[0.01, 0.01]], "errors": ["timeout"]},
     r"has no successful request"),
    ({"input_lens": [5], "output_lens": [3], "ttfts": [0.1], "itls": [[0.01, 0.01]], "request_rate": -1},
     r"request_rate: -1.0 is not positive"),
])
def test_bad_result_files_are_one_line_errors(tmp_path: Path, document: dict[str, Any], message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ServesimError, match=message):
        read_benchmark(path)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ServesimError, match=r"not JSON"):
        read_benchmark(tmp_path / "x.json")


def test_an_open_loop_run_at_its_recorded_start_times_recovers_the_coefficients(tmp_path: Path) -> None:
    """At a finite rate (12 requests/s, start times recorded, as recent vllm bench serve writes)
    the schedule moves with the step times: a trace of the shipped engine's slower steps has
    twice the batch, and re-timing it alone would say the host costs nothing. Fitting and
    re-simulating in turn still finds the serial host's 1.5 ms per step and 40 us per sequence."""
    n = len(PROMPTS)
    starts = np.cumsum(np.random.default_rng(3).exponential(1 / 12.0, n))
    document = deployment(TRUTH)
    document["workload"] = {"arrival": {"process": "poisson", "rate": 12.0}, "num_requests": n,
                            "prompt": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}}
    from servesim.workloads.requests import RequestTable
    requests = simulate_document(document, RequestTable(starts, PROMPTS, OUTPUTS)).requests
    run = {"input_lens": PROMPTS.tolist(), "output_lens": OUTPUTS.tolist(),
           "ttfts": requests["ttft_s"].tolist(),
           "itls": [[float(t)] * (int(o) - 1) for t, o in zip(requests["tpot_s"], OUTPUTS, strict=True)],
           "errors": [""] * n, "max_concurrency": None, "start_times": (starts + 1000.0).tolist()}
    result = vllm_file(tmp_path / "vllm.json", run)
    document = json.loads(result.read_text())
    document["request_rate"] = 12.0
    result.write_text(json.dumps(document))
    assert read_benchmark(result).start_s is not None
    config = config_file(tmp_path / "deploy.yaml", {"name": "vllm", "async_scheduling": False})
    fitted = from_benchmark(result, config)
    assert fitted.after.fixed_s == pytest.approx(1.5e-3, rel=0.01)
    assert fitted.after.per_seq_s == pytest.approx(4e-5, rel=0.02)
    assert fitted.metrics["after_error_%"].abs().max() < 0.5
    assert fitted.metrics["before_error_%"].abs().max() > 15
