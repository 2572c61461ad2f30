"""``servesim run`` and ``servesim validate`` as a user runs them: files, numbers, determinism,
and one-line errors for every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_cli import servesim

SMALL = {
    "name": "small",
    "seed": 3,
    "model": "llama-3-8b",
    "hardware": "h100-sxm-80gb",
    "engine": "vllm-v0",  # the errors below are V0's (V1 chunks prompts and caches prefixes)
    "workload": {"arrival": {"process": "poisson", "rate": 20.0}, "num_requests": 300,
                 "lengths": {"preset": "azure-conversation"}},
    "slo": {"ttft_s": 0.5, "tpot_s": 0.03},
}
SUMMARY_STATS = {"mean", "p50", "p90", "p95", "p99", "max"}


def write_config(tmp_path: Path, document: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return path


def test_run_writes_every_output_with_stable_summary_keys(tmp_path: Path) -> None:
    config = write_config(tmp_path, SMALL)
    out = tmp_path / "out"
    result = servesim("run", str(config), "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    for name in ("summary.json", "requests.parquet", "steps.parquet", "itl.parquet",
                 "config.resolved.yaml", "report.html"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(summary[key]) == SUMMARY_STATS
    assert set(summary["throughput"]) == {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"}
    requests = pd.read_parquet(out / "requests.parquet")
    assert summary["completed"] + summary["rejected"] == len(requests) == 300
    # The summary agrees with the per-request table it was computed from.
    done = requests[requests["status"] == "completed"]
    assert summary["ttft_s"]["p99"] == pytest.approx(done["ttft_s"].quantile(0.99))
    met = ((done["ttft_s"] <= 0.5) & (done["tpot_s"].fillna(0) <= 0.03)).sum()
    assert summary["slo_attainment"] == pytest.approx(met / 300)
    assert summary["goodput_requests_per_s"] == pytest.approx(met / summary["duration_s"])
    # The resolved config runs as it is and gives the same answer.
    again = servesim("run", str(out / "config.resolved.yaml"), "--out", str(tmp_path / "again"),
                     "--quiet", "--no-report")
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["ttft_s"] == summary["ttft_s"]
    assert "TTFT" in result.stdout and "attainment" in result.stdout


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    config = write_config(tmp_path, SMALL)
    outputs = []
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        run = servesim("run", str(config), "--out", str(tmp_path / name), "--seed", seed, "--quiet",
                       "--no-report")
        assert run.returncode == 0, run.stderr
        outputs.append((tmp_path / name / "requests.parquet").read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_set_overrides_any_key(tmp_path: Path) -> None:
    config = write_config(tmp_path, SMALL)
    run = servesim("validate", str(config), "--set", "deployment.tp=2", "--set", "hardware=a100-sxm-80gb",
                   "--set", "workload.num_requests=10")
    assert run.returncode == 0, run.stderr
    assert "1 x 2 x a100-sxm-80gb (2 GPUs)" in run.stdout
    assert "10 requests" in run.stdout and "valid" in run.stdout


def test_builtin_quickstart_validates() -> None:
    run = servesim("validate", "quickstart")
    assert run.returncode == 0, run.stderr
    assert "llama-3-8b" in run.stdout and "h100-sxm-80gb" in run.stdout


@pytest.mark.parametrize(("change", "expected"), [
    ({"deployment": {"tpp": 2}}, "deployment.tpp: unknown key; remove it or use one of: tp,"),
    ({"model": "llama-9"}, "model"),
    ({"deployment": {"tp": 0}}, "deployment.tp"),
    ({"deployment": {"tp": 3}}, "tp"),
    ({"model": "llama-2-70b"}, "use deployment.tp: 2 or more"),
    ({"policy": {"name": "magic"}},
     "policy.name: unknown policy 'magic'; use one of: chunked_prefill, continuous"),
    ({"policy": {"name": "continuous", "chunk": 5}}, "policy.chunk: unknown key"),
    ({"policy": {"name": "static", "batch_size": 10**4}},
     "policy.batch_size: 10000 exceeds deployment.max_num_seqs"),
    ({"workload": {"trace": {"path": "missing.csv", "format": "csv"}}}, "missing.csv"),
    ({"deployment": {"max_num_batched_tokens": 1024}}, "deployment.max_num_batched_tokens"),
    ({"deployment": {"num_gpu_blocks": 10**9}}, "deployment.num_gpu_blocks"),
    ({"slo": {"ttft_s": -1}}, "slo.ttft_s"),
])
def test_bad_configs_get_one_line_errors(tmp_path: Path, change: dict, expected: str) -> None:
    document = {**SMALL, **change}
    run = servesim("validate", str(write_config(tmp_path, document)))
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), run.stderr
    assert expected in lines[0], lines[0]
    assert "Traceback" not in run.stderr


def test_malformed_yaml_and_bad_trace_rows(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("model: llama-3-8b\nhardware: [h100\n")
    run = servesim("run", str(bad_yaml))
    assert run.returncode == 2 and "line" in run.stderr and "Traceback" not in run.stderr
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,-3,10\n")
    document = {**SMALL, "workload": {"trace": {"path": "trace.csv", "format": "csv"}}}
    run = servesim("run", str(write_config(tmp_path, document)), "--quiet")
    assert run.returncode == 2, run.stdout
    assert "line 3" in run.stderr and "prompt_tokens" in run.stderr and "Traceback" not in run.stderr


def test_resolved_config_of_a_trace_replay_runs_from_its_own_folder(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n1.0,50,5\n")
    document = {**SMALL, "workload": {"trace": {"path": "trace.csv", "format": "csv"}}}
    first = servesim("run", str(write_config(tmp_path, document)), "--out", str(tmp_path / "a"),
                     "--quiet", "--no-report")
    assert first.returncode == 0, first.stderr
    resolved = yaml.safe_load((tmp_path / "a" / "config.resolved.yaml").read_text())
    assert resolved["workload"]["trace"]["path"] == str(trace.resolve())
    again = servesim("run", str(tmp_path / "a" / "config.resolved.yaml"), "--out", str(tmp_path / "b"),
                     "--quiet", "--no-report")
    assert again.returncode == 0, again.stderr
    first_table, second_table = (tmp_path / d / "requests.parquet" for d in "ab")
    assert first_table.read_bytes() == second_table.read_bytes()


def test_summary_only_output_leaves_no_stale_tables(tmp_path: Path) -> None:
    config = write_config(tmp_path, {**SMALL, "workload": {**SMALL["workload"], "num_requests": 20}})
    out = tmp_path / "out"
    assert servesim("run", str(config), "--out", str(out), "--quiet").returncode == 0
    assert (out / "report.html").is_file()
    run = servesim("run", str(config), "--out", str(out), "--quiet", "--set", "output=summary")
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.resolved.yaml", "summary.json"]


@pytest.mark.parametrize("args", [("--seed", "-1"), ("--set", "seed=true"),
                                  ("--set", "workload.duration_s=.inf"),
                                  ("--set", "workload.num_requests=100000000000")])
def test_bad_command_line_values_get_one_line_errors(tmp_path: Path, args: tuple[str, str]) -> None:
    run = servesim("validate", str(write_config(tmp_path, SMALL)), *args)
    assert run.returncode == 2, run.stdout
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr


def test_run_with_the_progress_bar_finishes(tmp_path: Path) -> None:
    config = write_config(tmp_path, {**SMALL, "workload": {**SMALL["workload"], "num_requests": 50}})
    run = servesim("run", str(config), "--out", str(tmp_path / "out"), "--no-report")
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["completed"] == 50
