"""servesim from a notebook: one call per question, results as typed objects and DataFrames.

::

    import servesim

    result = servesim.run("quickstart", workload__arrival__rate=16, workload__num_requests=1000)
    result.summary.ttft_s.p99          # typed Summary; result.summary.to_dict() is summary.json
    result.requests, result.steps      # pandas DataFrames, one row per request / engine step
    result.report()                    # writes report.html (a temporary folder unless out= is given)

    sweep = servesim.sweep("rates-h100", workload__num_requests=200, out="sweeps/rates")
    sweep.results                      # results.parquet as a DataFrame (mean and ci95 per point)

    plan = servesim.capacity("llama3-8b-chat", target_rate=40)
    plan.candidates, plan.winner, plan.launch["vllm"]["text"]

The first argument is what the command line takes: a built-in experiment, sweep or capacity
example by name, or a path to a YAML file; a mapping (the YAML's contents) or an
:class:`~servesim.config.ExperimentConfig` work too. Keyword arguments override keys, with a
double underscore for each dot (``deployment__tp=2`` is ``--set deployment.tp=2``); keys that are
not Python names go in ``overrides={"workload.arrival.rate": 16}``. Every mistake is one
:class:`~servesim.errors.ServesimError` line, as on the command line.

``servesim.sweep`` and ``servesim.capacity`` are also the packages of those features; calling them
calls :func:`sweep` and :func:`capacity` here.
"""

from __future__ import annotations

import copy
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesim.errors import ServesimError

if TYPE_CHECKING:
    import pandas as pd

    from servesim.config import ExperimentConfig
    from servesim.metrics.summary import Summary
    from servesim.pipeline.result import RunResult
    from servesim.sweep.runner import SweepOutcome


def override_list(overrides: dict[str, Any] | None, keys: dict[str, Any]) -> list[tuple[str, Any]]:
    """``overrides`` then ``keys`` as (dotted key, value) pairs, ``a__b`` read as ``a.b``."""
    pairs = list((overrides or {}).items())
    pairs += [(name.replace("__", "."), value) for name, value in keys.items()]
    for key, _ in pairs:
        if not key or any(not part for part in key.split(".")):
            raise ServesimError("overrides", f"{key!r} is not a dotted key", "write e.g. deployment__tp=2")
    return pairs


def apply_pairs(document: dict[str, Any], pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``document`` with each (dotted key, value) set (Python values, not YAML text)."""
    from servesim.inputs.overrides import set_dotted

    for key, value in pairs:
        set_dotted(document, key.split("."), copy.deepcopy(value), key)
    return document


# ---------------------------------------------------------------------- one run
@dataclass
class Result:
    """One simulated run: its typed summary, tables, and files on demand."""

    result: RunResult
    out_dir: Path | None = None
    """Where its files were written (None until :meth:`save` or :meth:`report`)."""

    @property
    def config(self) -> ExperimentConfig:
        return self.result.plan.config

    @property
    def summary(self) -> Summary:
        """The typed summary (``.to_dict()`` is ``summary.json``)."""
        return self.result.summary

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request (``requests.parquet``)."""
        return self.result.requests

    @property
    def steps(self) -> pd.DataFrame:
        """One row per engine step of any replica (``steps.parquet``)."""
        return self.result.steps

    @property
    def itl(self) -> pd.DataFrame:
        """Every inter-token latency as (value, count) pairs (``itl.parquet``)."""
        return self.result.itl

    def save(self, out: str | Path | None = None, report: bool = True, plotlyjs: str = "inline") -> Path:
        """Write the run's files (as ``servesim run`` does) to ``out``, or to the folder given to
        :func:`run`, or a new temporary folder; returns the folder."""
        from servesim.pipeline import render

        folder = (Path(out) if out is not None
                  else self.out_dir or Path(tempfile.mkdtemp(prefix="servesim-run-")))
        full = self.config.output == "full"
        render(self.result, folder, report=report and full, plotlyjs=plotlyjs)
        self.out_dir = folder
        return folder

    def report(self, out: str | Path | None = None, plotlyjs: str = "inline") -> Path:
        """Write ``report.html`` (with the run's files, which it is built from) and return its
        path; in Jupyter, ``IPython.display.IFrame(str(path), width="100%", height=800)`` shows it."""
        if self.config.output != "full":
            raise ServesimError("output", "is summary, so the run kept no tables to chart",
                                "run with output='full' (the default)")
        return self.save(out, report=True, plotlyjs=plotlyjs) / "report.html"

    def __repr__(self) -> str:
        s = self.summary
        return (f"<servesim.Result {self.config.name}: {s.completed:,} completed, p99 TTFT "
                f"{_ms(s.ttft_s.p99)}, p99 TPOT {_ms(s.tpot_s.p99)}, "
                f"{s.throughput.requests_per_s:.2f} req/s>")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def experiment_config(config: Any, overrides: dict[str, Any] | None = None, seed: int | None = None,
                      **keys: Any) -> tuple[ExperimentConfig, Path | None]:
    """The validated experiment of ``config`` (a name, path, mapping or config) with overrides,
    and the folder its relative paths resolve against."""
    from servesim.config import ExperimentConfig, read_yaml_document, validate_document

    base_dir: Path | None = None
    if isinstance(config, ExperimentConfig):
        document = config.model_dump(mode="json")
        source = config.name
    elif isinstance(config, dict):
        document, source = copy.deepcopy(config), "config"
    elif isinstance(config, str | Path):
        from servesim.cli.run import find_config

        path = find_config(str(config))
        document, source, base_dir = read_yaml_document(path), str(path), path.parent
    else:
        raise ServesimError("config", f"{type(config).__name__} is not an experiment",
                            "pass a built-in name, a YAML path, a mapping or an ExperimentConfig")
    document = apply_pairs(document, override_list(overrides, keys))
    if seed is not None:
        document["seed"] = seed
    return validate_document(document, source), base_dir


def run(config: Any, overrides: dict[str, Any] | None = None, *, seed: int | None = None,
        out: str | Path | None = None, report: bool = True, **keys: Any) -> Result:
    """Simulate an experiment (``servesim run``); writes files only when ``out`` is given."""
    from servesim.pipeline import prepare, simulate

    experiment, base_dir = experiment_config(config, overrides, seed, **keys)
    plan = prepare(experiment, base_dir=base_dir)
    if len(plan.workload) == 0:
        raise ServesimError("workload", "has no requests", "widen the time window or raise num_requests")
    result = Result(simulate(plan))
    if out is not None:
        result.save(out, report=report)
    return result


# ---------------------------------------------------------------------- sweeps
@dataclass
class SweepResult:
    """A finished sweep: its tables as DataFrames and its folder."""

    outcome: SweepOutcome
    out_dir: Path

    @property
    def results(self) -> pd.DataFrame:
        """One row per point: varied keys, mean and ``.ci95`` of every summary metric."""
        import pandas as pd

        return pd.read_parquet(self.out_dir / "results.parquet")

    @property
    def points(self) -> pd.DataFrame:
        """One row per run (point x replication)."""
        import pandas as pd

        return pd.read_parquet(self.out_dir / "points.parquet")

    def report(self, out: str | Path | None = None, plotlyjs: str = "inline") -> Path:
        from servesim.report.page import check_plotlyjs
        from servesim.report.sweep_report import write_sweep_report

        return write_sweep_report(self.out_dir, Path(out) if out else None, plotlyjs=check_plotlyjs(plotlyjs))


def sweep(spec: str | Path, overrides: dict[str, Any] | None = None, *, out: str | Path | None = None,
          workers: int | None = None, backend: str = "local", report: bool = True,
          **keys: Any) -> SweepResult:
    """Run a sweep (``servesim sweep``) into ``out`` (default ``sweeps/<name>``, resumable);
    overrides apply to its base experiment, as ``--set``. With ``workers`` > 1 in a script, guard
    the call with ``if __name__ == "__main__":`` as any multiprocessing code."""
    from servesim.config import read_yaml_document
    from servesim.sweep.backends import check_backend
    from servesim.sweep.runner import prepare
    from servesim.sweep.spec import find_sweep, parse_sweep

    path = find_sweep(str(spec))
    document = read_yaml_document(path)
    section = document.setdefault("set", {})
    if not isinstance(section, dict):
        raise ServesimError("set", "is not a mapping", "write set: {key: value, ...}")
    for key, value in override_list(overrides, keys):
        section[key] = copy.deepcopy(value)
    loaded = parse_sweep(document, path.parent, str(path), default_name=path.stem)
    folder = Path(out) if out is not None else Path("sweeps") / loaded.name
    outcome = prepare(loaded, folder).run(check_backend(backend), workers)
    result = SweepResult(outcome, folder)
    if report:
        result.report()
    return result


# ---------------------------------------------------------------------- capacity
@dataclass
class CapacityResult:
    """A capacity plan: every candidate ranked, the winner and how to launch it."""

    answer: dict[str, Any]
    out_dir: Path | None = None

    @property
    def candidates(self) -> pd.DataFrame:
        """One row per candidate in rank order (``capacity.csv``'s columns)."""
        import pandas as pd

        from servesim.capacity.output import candidate_row

        return pd.DataFrame([candidate_row(r) for r in self.answer["candidates"]])

    @property
    def winner(self) -> dict[str, Any]:
        return dict(self.answer["candidates"][0])

    @property
    def launch(self) -> dict[str, Any] | None:
        """The winner's launch configuration: ``launch["vllm"]["text"]`` is the shell snippet."""
        return self.answer.get("launch")

    def save(self, out: str | Path | None = None) -> Path:
        from servesim.capacity.output import write_capacity

        folder = Path(out) if out is not None else self.out_dir or Path(
            tempfile.mkdtemp(prefix="servesim-capacity-"))
        write_capacity(self.answer, folder)
        self.out_dir = folder
        return folder

    def report(self, out: str | Path | None = None, plotlyjs: str = "inline") -> Path:
        from servesim.report.capacity_report import write_capacity_report
        from servesim.report.page import check_plotlyjs

        folder = self.out_dir if self.out_dir is not None else self.save()
        return write_capacity_report(folder, Path(out) if out else None, answer=self.answer,
                                     plotlyjs=check_plotlyjs(plotlyjs))


def capacity(config: str | Path | dict[str, Any] | None = None, overrides: dict[str, Any] | None = None,
             *, out: str | Path | None = None, workers: int = 1, report: bool = True,
             **keys: Any) -> CapacityResult:
    """Plan capacity (``servesim capacity``): a built-in example's name, a YAML path, or a mapping
    (flags become keys: ``model=``, ``candidates__hardware=[...]``, ``slo__tpot_s="50ms"``,
    ``target_rate=40``, ``gpu_budget=8``). Files are written only when ``out`` is given."""
    from servesim.capacity.config import load_capacity_document, validate_capacity
    from servesim.capacity.plan import plan_capacity

    base_dir: Path | None = None
    if isinstance(config, dict):
        document, source = copy.deepcopy(config), "capacity config"
    elif config is None:
        document, source = {}, "capacity config"
    else:
        from servesim.cli.capacity import find_capacity_config

        path = find_capacity_config(str(config))
        document, source, base_dir = load_capacity_document(path), str(path), path.parent
    document = apply_pairs(document, override_list(overrides, keys))
    answer = plan_capacity(validate_capacity(document, source), base_dir, workers)
    result = CapacityResult(answer)
    if out is not None:
        result.save(out)
        if report:
            result.report()
    return result


# ---------------------------------------------------------------------- servesim.sweep(...)
class CallablePackage(types.ModuleType):
    """A package that can also be called: ``servesim.sweep(...)`` is :func:`sweep`,
    ``servesim.capacity(...)`` is :func:`capacity` (the packages keep their modules)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entries: dict[str, Callable[..., Any]] = {"servesim.sweep": sweep, "servesim.capacity": capacity}
        entry = entries[self.__name__]
        return entry(*args, **kwargs)
