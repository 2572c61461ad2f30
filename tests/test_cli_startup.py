"""Startup stays light: ``--help``, ``models``, ``hardware`` and ``step`` must not import the heavy
libraries their answers do not need (pandas, plotly, simpy; numpy and pydantic for --help). The
speed itself is measured in benchmarks, never here; this holds the import placement that gives it."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("pandas", "plotly", "simpy", "pyarrow")


def imported(*args: str) -> set[str]:
    """Top-level packages imported by ``python -m servesim ARGS`` (from ``-X importtime``)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "servesim", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


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
    """``validate`` resolves the deployment (the replica loop's modules, so SimPy, are loaded) and
    builds the workload, but makes no table."""
    modules = imported("validate", "quickstart")
    assert not modules & {"pandas", "plotly", "pyarrow"}, sorted(modules & {"pandas", "plotly", "pyarrow"})
