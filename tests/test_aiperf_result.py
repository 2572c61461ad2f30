"""Calibrating against an aiperf run: its artifact directory, written here from a servesim run with
known coefficients, read as aiperf writes it (warm-up records, failed requests, units, records in
completion order) and fitted back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_from_benchmark import OUTPUTS, PROMPTS, TRUTH, config_file, deployment

from servesim.calibration.aiperf_result import RECORDS, SUMMARY, is_aiperf, read_aiperf
from servesim.calibration.benchmark_result import read_benchmark
from servesim.calibration.from_benchmark import from_benchmark
from servesim.calibration.replay import simulate_document
from servesim.errors import ServesimError
from servesim.workloads.requests import RequestTable

CLIENTS = 16
EPOCH_NS = 1_759_813_207_000_000_000


def record(start_s: float, prompt: int, output: int, ttft_s: float, tpot_s: float,
           phase: str = "profiling", error: dict[str, Any] | None = None, session: int = 0) -> dict[str, Any]:
    metrics = {"input_sequence_length": {"value": prompt, "unit": "tokens"},
               "output_sequence_length": {"value": output, "unit": "tokens"},
               "time_to_first_token": {"value": ttft_s * 1e3, "unit": "ms"},
               "request_latency": {"value": (ttft_s + (output - 1) * tpot_s) * 1e3, "unit": "ms"}}
    if output > 1:
        metrics["inter_token_latency"] = {"value": tpot_s * 1e3, "unit": "ms"}
    return {"metadata": {"session_num": session, "request_start_ns": EPOCH_NS + round(start_s * 1e9),
                         "benchmark_phase": phase, "was_cancelled": False},
            "metrics": metrics if error is None else {"error_isl": {"value": prompt, "unit": "tokens"}},
            "error": error}


def aiperf_run(folder: Path, engine: dict[str, Any], loadgen: dict[str, Any] | None = None,
               command: str = f"aiperf profile --concurrency {CLIENTS} --streaming") -> Path:
    """The 96 requests served by ``CLIENTS`` closed-loop clients, as aiperf's artifact directory:
    records in completion order, one warm-up record before them and one failed request after."""
    n = len(PROMPTS)
    document = deployment(engine)
    document["workload"] = {"arrival": {"process": "closed", "concurrency": CLIENTS}, "num_requests": n,
                            "prompt": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}}
    requests = simulate_document(document, RequestTable(np.zeros(n), PROMPTS, OUTPUTS)).requests
    lines = [record(0.0, 50, 10, 0.5, 0.01, phase="warmup")]
    finish = requests["finish_s"].to_numpy()
    for i in np.argsort(finish, kind="stable"):
        lines.append(record(float(requests["arrival_s"].iloc[i]), int(PROMPTS[i]), int(OUTPUTS[i]),
                            float(requests["ttft_s"].iloc[i]), float(requests["tpot_s"].iloc[i]),
                            session=int(i)))
    lines.append(record(float(finish.max()), 300, 0, 0.0, 0.0, session=n,
                        error={"code": 500, "type": "InternalServerError", "message": "boom"}))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORDS).write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    config = {"endpoint": {"streaming": True}, "cli_command": command,
              "loadgen": loadgen if loadgen is not None else {"concurrency": CLIENTS}}
    (folder / SUMMARY).write_text(json.dumps({"request_count": {"unit": "requests", "avg": n},
                                              "input_config": config}))
    return folder


def test_an_aiperf_run_is_read_as_aiperf_sent_it(tmp_path: Path) -> None:
    folder = aiperf_run(tmp_path / "artifacts", TRUTH)
    assert is_aiperf(folder) and is_aiperf(folder / RECORDS) and not is_aiperf(tmp_path)
    run = read_benchmark(folder)
    assert run.tool == "aiperf" and run.max_concurrency == CLIENTS and np.isinf(run.request_rate)
    assert len(run) == 96 and run.failed == 1  # the warm-up record is neither read nor counted
    # records come in completion order; the run is in the order the requests were sent (aiperf's
    # session_num), which a closed loop's replay hands to its clients
    assert run.start_s is not None and np.all(np.diff(run.start_s) >= 0) and run.start_s[0] == 0.0
    assert run.prompt_tokens.tolist() == PROMPTS.tolist()
    # the records file alone reads the same (its summary beside it)
    same = read_aiperf(folder / RECORDS)
    assert np.array_equal(same.ttft_s, run.ttft_s) and np.array_equal(same.tpot_s, run.tpot_s, equal_nan=True)


def test_an_aiperf_closed_loop_pins_the_cost_of_its_own_batch(tmp_path: Path) -> None:
    """As for vllm bench serve's closed loop: 16 clients measure the host's time for a 16-sequence
    step, 1.5 ms + 16 x 40 us = 2.14 ms, from aiperf's milliseconds."""
    folder = aiperf_run(tmp_path / "artifacts", TRUTH)
    config = config_file(tmp_path / "deploy.yaml", {"name": "vllm", "async_scheduling": False})
    fitted = from_benchmark(folder, config, out=tmp_path / "fit")
    assert fitted.after.fixed_s + CLIENTS * fitted.after.per_seq_s == pytest.approx(2.14e-3, rel=0.02)
    # the front end and the clients' queueing trade against each other in a closed loop: the
    # latency comes out within 10% (32 ms here), every metric within 1.5% after the fit
    assert fitted.after.frontend_s == pytest.approx(0.03, rel=0.1)
    assert fitted.metrics["after_error_%"].abs().max() < 1.5
    assert fitted.metrics["before_error_%"].abs().max() > 10
    assert "aiperf" in (tmp_path / "fit" / "engine-vllm.yaml").read_text()


def test_the_command_line_stands_in_for_a_loadgen_section_without_the_setting(tmp_path: Path) -> None:
    folder = aiperf_run(tmp_path / "a", TRUTH, loadgen={},
                        command="aiperf profile --concurrency 12 --osl 100")
    assert read_benchmark(folder).max_concurrency == 12
    folder = aiperf_run(tmp_path / "b", TRUTH, loadgen={"request_rate": 8.0}, command="aiperf profile")
    run = read_benchmark(folder)
    assert run.max_concurrency is None and run.request_rate == 8.0


@pytest.mark.parametrize(("change", "message"), [
    ("no summary", r"profile_export_aiperf.json: is missing: how aiperf sent the requests is unknown"),
    ("no load", r"input_config: gives neither a concurrency nor a request rate"),
    ("bad unit", r"line 2: time_to_first_token: unit 'furlongs' is not a time unit"),
    ("all failed", r"has no successful request"),
])
def test_bad_aiperf_exports_are_one_line_errors(tmp_path: Path, change: str, message: str) -> None:
    folder = tmp_path / "artifacts"
    folder.mkdir()
    good = record(0.0, 100, 10, 0.2, 0.01)
    lines = [record(0.0, 50, 10, 0.5, 0.01, phase="warmup"), good]
    summary: dict[str, Any] = {"input_config": {"loadgen": {"concurrency": 4}}}
    if change == "no summary":
        summary = {}
    elif change == "no load":
        summary = {"input_config": {"loadgen": {}, "cli_command": "aiperf profile"}}
    elif change == "bad unit":
        good["metrics"]["time_to_first_token"]["unit"] = "furlongs"
    elif change == "all failed":
        lines[1] = record(0.0, 100, 0, 0.0, 0.0, error={"code": 500, "type": "X", "message": "x"})
    (folder / RECORDS).write_text("\n".join(json.dumps(line) for line in lines))
    if summary:
        (folder / SUMMARY).write_text(json.dumps(summary))
    with pytest.raises(ServesimError, match=message):
        read_benchmark(folder)
