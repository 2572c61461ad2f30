"""The notebook API: servesim.run / sweep / capacity take what the commands take, give what the
commands write, and report mistakes as the commands do."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_cli import servesim as cli

import servesim
from servesim.config import load_experiment
from servesim.errors import ServesimError
from servesim.resources import configs_dir


def test_run_by_name_matches_the_command_line_byte_for_byte(tmp_path: Path) -> None:
    """servesim.run("quickstart", ...) with overrides writes the same summary.json and tables as
    `servesim run quickstart --set ...` (same config, same seed: identical results)."""
    api = servesim.run("quickstart", engine="vllm-v0", workload__num_requests=300,
                       overrides={"workload.arrival.rate": 14}, out=tmp_path / "api", report=False)
    done = cli("run", "quickstart", "--set", "engine=vllm-v0", "--set", "workload.num_requests=300",
               "--set", "workload.arrival.rate=14", "--out", str(tmp_path / "cli"), "--no-report", "--quiet")
    assert done.returncode == 0, done.stderr
    for name in ("summary.json", "requests.parquet", "steps.parquet", "itl.parquet", "config.resolved.yaml"):
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    assert api.summary.to_dict() == json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert isinstance(api.requests, pd.DataFrame) and len(api.requests) == 300
    assert isinstance(api.steps, pd.DataFrame) and api.steps["duration_s"].gt(0).all()
    assert "p99 TTFT" in repr(api) and not (tmp_path / "api" / "report.html").exists()


def test_run_takes_a_config_or_a_mapping_and_reports(tmp_path: Path) -> None:
    config = load_experiment(configs_dir() / "quickstart.yaml",
                             ["workload.num_requests=100", "engine=vllm-v0"])
    first = servesim.run(config)
    second = servesim.run(config.model_dump(mode="json"))
    assert first.summary == second.summary
    report = first.report(tmp_path / "r")
    assert report == tmp_path / "r" / "report.html" and report.stat().st_size > 1_000_000
    assert (tmp_path / "r" / "summary.json").is_file()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: servesim.run("quickstart", deployment__tpp=2), "deployment.tpp: unknown key"),
    (lambda: servesim.run("no-such-experiment"), "CONFIG: no-such-experiment"),
    (lambda: servesim.run(42), "config: int is not an experiment"),
    (lambda: servesim.run("quickstart", slo__tpot_s=80), "slo.tpot_s: 80 under tpot_s is 80 s"),
])
def test_mistakes_are_one_line(call, message: str) -> None:
    with pytest.raises(ServesimError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_sweep_and_capacity_are_callable_packages(tmp_path: Path) -> None:
    sweep_file = tmp_path / "mini.yaml"
    sweep_file.write_text("name: mini\nbase: quickstart\nset: {engine: vllm-v0}\n"
                          "grid: {workload.arrival.rate: [4, 8]}\nreplications: 2\n")
    swept = servesim.sweep(sweep_file, workload__num_requests=60, out=tmp_path / "s", report=False)
    results = swept.results
    assert list(results["workload.arrival.rate"]) == [4, 8] and (results["replications"] == 2).all()
    assert (results["completed"] == 60).all() and len(swept.points) == 4
    assert servesim.sweep.load_sweep is not None  # still the package
    plan = servesim.capacity("llama3-8b-chat", candidates__hardware=["h100-sxm-80gb"],
                             search={"replications": 1, "precision": 0.3, "requests_per_run": 150},
                             target_rate=None)
    assert list(plan.candidates["candidate"]) == ["h100-sxm-80gb tp1 continuous",
                                                  "h100-sxm-80gb tp2 continuous"]
    assert plan.winner["rank"] == 1 and "vllm serve meta-llama/Meta-Llama-3-8B" in plan.launch["vllm"]["text"]
    report = plan.report()
    assert report.name == "report.html" and (report.parent / "capacity.json").is_file()
