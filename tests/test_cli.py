"""The ``servesim`` commands as a user runs them: output, JSON contract, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model


def servesim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servesim", *args], capture_output=True,
                          text=True, timeout=120)


def test_step_json_contract_matches_the_api() -> None:
    run = servesim("step", "--model", "llama-3-8b", "--hardware", "h100-sxm-80gb", "--tp", "2",
                   "--prefill-tokens", "512,2048", "--decode-batch", "32",
                   "--decode-context", "1000", "--engine", "vllm-v0", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert {"step_time_s", "bound", "breakdown"} <= out.keys()
    assert out["bound"] in {"compute", "memory", "communication", "overhead"}
    assert sum(out["breakdown"].values()) == pytest.approx(out["step_time_s"])
    expected = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb"), tp=2).step(
        BatchShape.build([512, 2048], None, [1000] * 32))
    assert out["step_time_s"] == expected.time_s
    assert out["batch"]["new_tokens"] == 2560 + 32


def test_step_human_output_explains_the_step() -> None:
    run = servesim("step", "--decode-batch", "8", "--decode-context", "512")
    assert run.returncode == 0, run.stderr
    for text in ("llama-3-8b", "h100-sxm-80gb", "attn_decode", "mlp", "step", "memory",
                 "arithmetic intensity", "KV pool"):
        assert text in run.stdout
    assert "spec-only" not in run.stdout  # h100-sxm-80gb is fitted (calibrate import-aiconfigurator)
    spec_only = servesim("step", "--hardware", "l40s", "--decode-batch", "8")
    assert "spec-only" in spec_only.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["step", "--model", "gpt-5", "--decode-batch", "1"], "error: --model: unknown model 'gpt-5'"),
    (["step", "--hardware", "tpu", "--decode-batch", "1"], "error: --hardware: unknown hardware 'tpu'"),
    (["step", "--tp", "3", "--decode-batch", "1"], "error: --tp: 3 does not divide"),
    (["step", "--prefill-tokens", "12,abc"], "error: --prefill-tokens: '12,abc' is not a"),
    (["step", "--decode-batch", "-4"], "error: --decode-batch: must be >= 0"),
    (["step"], "error: batch: the step has no tokens"),
    (["step", "--model", "llama-2-70b", "--hardware", "a100-sxm", "--decode-batch", "1"],
     "error: --tp: llama-2-70b needs"),
    (["step", "--model", "llama-2-70b", "--hardware", "a100-sxm", "--decode-batch", "1"],
     "use --tp 2 or more, or quantise the weights (e.g. --weight-dtype int4)"),
    (["step", "--weight-dtype", "fp8", "--act-dtype", "int8", "--decode-batch", "1"],
     "error: --act-dtype: fp8 weights with int8 activations mixes two 8-bit formats in one GEMM, which no "
     "kernel does; use --act-dtype fp8 (W8A8) or bf16 (weight-only)"),
    (["step", "--decode-batch", "1000", "--decode-context", "4000"], "error: batch: holds"),
    (["step", "--kv-dtype", "fp6", "--decode-batch", "1"], "error: --kv-dtype: unknown dtype 'fp6'"),
    (["calibrate", "fit-serving", "rows.csv", "--length-spread", "0.5"],
     "error: --length-spread: 0.5 is not a fraction in [0, 0.5); use e.g. 0.02, or 0 for exactly each "
     "row's OSL"),
])
def test_user_mistakes_get_one_line_and_exit_2(args: list[str], message: str) -> None:
    run = servesim(*args)
    assert run.returncode == 2
    assert message in run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_models_and_hardware_listings() -> None:
    models = servesim("models", "--json")
    assert models.returncode == 0
    assert "deepseek-v3" in {row["name"] for row in json.loads(models.stdout)}
    hardware = servesim("hardware")
    assert hardware.returncode == 0 and "mi300x" in hardware.stdout and "spec-only" in hardware.stdout
    detail = servesim("hardware", "h100-sxm-80gb")
    assert detail.returncode == 0 and "provenance" in detail.stdout and "hardware_specs.csv" in detail.stdout
    # a provenance's bracketed sources are printed, not read as console markup
    assert "[aiconfigurator h100_sxm gemm vllm 0.24.0]" in " ".join(detail.stdout.split())
    one = servesim("models", "mixtral-8x7b", "--json")
    assert json.loads(one.stdout)["active_params"] == 12_879_925_248


def test_core_never_imports_torch() -> None:
    code = ("import sys, simulator, servesim.cli.app, workloads, policies; "
            "from simulator import CostModel; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
