"""Startup stays light: ``--help``, ``models``, ``hardware`` and ``step`` must not import the heavy
libraries their answers do not need (pandas, plotly, simpy; numpy and pydantic for --help). The
speed itself is measured in benchmarks (``benchmarks/bench_startup.py``), never here; this holds
the import placement that gives it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.resources import configs_dir

HEAVY = ("pandas", "plotly", "simpy", "pyarrow")


def modules_of(argv: list[str], env: dict[str, str] | None = None) -> set[str]:
    """Every module ``python -X importtime ARGV`` imports (dotted names)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def imported(*args: str) -> set[str]:
    """Top-level packages imported by ``python -m servesim ARGS`` (from ``-X importtime``)."""
    return {name.split(".")[0] for name in modules_of(["-m", "servesim", *args])}


@pytest.mark.parametrize("args", [("--help",), ("models",), ("hardware",),
                                  ("step", "--decode-batch", "8", "--decode-context", "512"),
                                  ("run", "--help"), ("capacity", "--help")])
def test_commands_that_need_no_tables_import_no_table_library(args: tuple[str, ...]) -> None:
    modules = imported(*args)
    assert "servesim" in modules
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_help_imports_neither_numpy_nor_pydantic() -> None:
    modules = imported("--help")
    assert not modules & {"numpy", "pydantic", "yaml"}, sorted(modules & {"numpy", "pydantic", "yaml"})


def test_validate_builds_the_plan_without_pandas_plotly_or_pyarrow() -> None:
    """``validate`` resolves the deployment and builds the workload, but makes no table."""
    modules = imported("validate", "quickstart")
    assert not modules & {"pandas", "plotly", "pyarrow"}, sorted(modules & {"pandas", "plotly", "pyarrow"})


def test_a_run_that_writes_only_its_summary_imports_no_table_library(tmp_path: Path) -> None:
    """The summary reads its tables as NumPy columns (``servesim.metrics.columns``): a run with
    ``output: summary`` and no report writes summary.json without pandas, plotly or pyarrow (a
    run with a report or tables imports them where it writes them)."""
    modules = imported("run", "quickstart", "--set", "output=summary", "--set", "workload.num_requests=200",
                       "--no-report", "--quiet", "--out", str(tmp_path / "run"))
    assert (tmp_path / "run" / "summary.json").is_file()
    assert not modules & {"pandas", "plotly", "pyarrow"}, sorted(modules & {"pandas", "plotly", "pyarrow"})


def test_validate_builds_no_replica_and_reads_no_trace() -> None:
    """A plan builds no replica loop (replicas are made when a run starts) and a generated
    workload loads no trace reader; a config given as a path loads no sweep schema."""
    modules = modules_of(["-m", "servesim", "validate", str(configs_dir() / "quickstart.yaml")])
    unneeded = {"servesim.core.replica", "servesim.core.parallel_replica", "servesim.core.kv_link",
                "servesim.topology.fleet_runtime", "servesim.workloads.traces", "servesim.workloads.sessions",
                "servesim.sweep.spec"}
    assert "servesim.pipeline.plan" in modules
    assert not modules & unneeded, sorted(modules & unneeded)


@pytest.mark.parametrize("args", [("models",), ("hardware",), ("hardware", "h100-sxm-80gb")])
def test_the_catalogues_load_no_numpy(args: tuple[str, ...]) -> None:
    modules = imported(*args)
    assert "pydantic" in modules and "numpy" not in modules


def test_the_experiment_schema_loads_no_numpy() -> None:
    """``servesim.config`` reads an experiment's sections without the workload generators, the
    speculative acceptance model and the engines' NumPy."""
    modules = modules_of(["-c", "import servesim.config"])
    assert "servesim.config" in modules and "servesim.workloads.config" in modules
    assert not {name.split(".")[0] for name in modules} & {"numpy", "pandas", "simpy"}


def test_a_cached_document_is_read_without_pyyaml(tmp_path: Path) -> None:
    """Once the parse cache holds the profiles, ``servesim hardware`` reads them back without
    importing PyYAML; with the cache off it parses them (and loads PyYAML)."""
    env = {**os.environ, "SERVESIM_CACHE_DIR": str(tmp_path / "cache")}
    first = {name.split(".")[0] for name in modules_of(["-m", "servesim", "hardware"], env)}
    again = {name.split(".")[0] for name in modules_of(["-m", "servesim", "hardware"], env)}
    off = {name.split(".")[0] for name in modules_of(["-m", "servesim", "hardware"],
                                                    {**env, "SERVESIM_CACHE_DIR": "off"})}
    assert "yaml" in first and "yaml" in off
    assert "yaml" not in again


def test_importing_the_schemas_builds_no_validator() -> None:
    """Every schema builds its validator on first use (``defer_build``): importing the experiment
    and hardware schemas and every engine leaves them unbuilt (a section some module instantiates
    at import, such as the default precision, is built then), and validating one builds that one
    alone (importing the config, cost model, engines and pipeline: 0.42 s of CPU, 0.46 s with
    every validator built at import)."""
    code = (
        "import servesim.config as c, servesim.engines\n"
        "from servesim.hardware import Curve, HardwareProfile, OperatorEfficiency\n"
        "schemas = (c.ExperimentConfig, HardwareProfile, OperatorEfficiency, Curve)\n"
        "built = [m.__name__ for m in schemas if m.__pydantic_complete__]\n"
        "Curve(x=(1.0,), y=(0.5,))\n"
        "print(built, Curve.__pydantic_complete__, c.ExperimentConfig.__pydantic_complete__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "True", "False"]
