"""``servesim calibrate``: microbenchmark, fit and validate (a thin shell over ``calibration``).

``bench`` needs torch (a CPU wheel: ``pip install torch --index-url
https://download.pytorch.org/whl/cpu``); ``fit``, ``import-vidur`` and ``validate``
need only numpy and pandas. The calibration package is imported inside each command so that
``servesim`` itself starts without it, and the simulator core never imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from servesim.cli.console import console as _console

if TYPE_CHECKING:
    import pandas as pd

calibrate_app = typer.Typer(help="Microbenchmark kernels, fit hardware profiles, validate the cost model.",
                            no_args_is_help=True)
Opt = typer.Option


def _print(table: pd.DataFrame, title: str) -> None:
    _console.print(f"[bold]{title}[/]")
    _console.print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))


@calibrate_app.command("bench")
def bench_command(
    device: Annotated[str, Opt(help="cuda or cpu")] = "cuda",
    out: Annotated[Path, Opt(help="Folder for the CSVs and metadata.json")] = Path("calibration_run"),
    quick: Annotated[bool, Opt(help="Sparse grid, few repetitions (CI: seconds on a CPU)")] = False,
    threads: Annotated[int, Opt(help="CPU threads (default 1, see calibration/bench.py)")] = 1,
) -> None:
    """Time GEMMs, attention prefill/decode, memory kernels (and all-reduce with several GPUs)."""
    from servesim.calibration.bench import run_bench

    meta = run_bench(device, out, quick=quick, threads=threads)
    families = ", ".join(k for k in meta["seconds"] if k != "total")
    _console.print(f"{meta['device_name']}: wrote {families} to {out} in {meta['seconds']['total']:.1f} s")


@calibrate_app.command("fit")
def fit_command(
    directory: Annotated[Path, typer.Argument(help="A `bench --out` folder")],
    profile: Annotated[Path, Opt(help="Profile YAML to fit (created for a CPU run if missing)")],
    out: Annotated[Path | None, Opt(help="Write here instead of over --profile")] = None,
) -> None:
    """Fit the profile's efficiency curves and fixed costs; write them with provenance."""
    from servesim.calibration.profiles import fit_directory

    fitted, report = fit_directory(directory, profile, out)
    _print(report, f"{fitted.name}: APE % (spec roofline and fit on held-out rows)")
    _console.print(f"wrote {out or profile}")


@calibrate_app.command("import-vidur")
def import_vidur_command(
    path: Annotated[Path, typer.Argument(help="The vidur_profiling folder")] = Path(
        "../shared/data/kernels/vidur_profiling"),
    out_dir: Annotated[Path | None, Opt(
        help="Write profiles here (default: $SERVESIM_HOME/hardware_profiles or "
             "~/.local/share/servesim/hardware_profiles; hardware_profiles/ of a checkout refits the "
             "shipped ones)")] = None,
) -> None:
    """Fit a100-sxm-80gb and h100-sxm-80gb from the public Vidur profiles."""
    from servesim.calibration.profiles import import_vidur
    from servesim.resources import user_profiles_dir

    target = out_dir or user_profiles_dir()
    fitted, report = import_vidur(path, target)
    _print(report, "APE % on held-out rows: spec = spec-sheet roofline, prior = previous profile")
    for name in fitted.values():
        _console.print(f"wrote {target / (name.name + '.yaml')}")
    _console.print(f"use them with --hardware {target}/<name>.yaml (or hardware: PATH in an experiment); "
                   "the built-in profiles are unchanged")


@calibrate_app.command("validate")
def validate_command(
    directory: Annotated[Path, typer.Argument(help="A `bench --out` folder, or vidur_profiling")],
    profile: Annotated[str, Opt(help="Profile name or YAML")],
    out: Annotated[Path | None, Opt(help="Folder for the summary CSV, rows CSV and chart")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print the summary as JSON")] = False,
) -> None:
    """Predicted vs measured kernel time per family: median and p90 absolute % error."""
    from servesim.calibration.validate import validate
    from servesim.hardware_io import load_hardware

    summary, _ = validate(directory, load_hardware(profile, "--profile"), out)
    if as_json:
        print(json.dumps(summary.to_dict(orient="records"), indent=2))
        return
    _print(summary, f"{profile}: absolute % error (held out = never seen by the fit)")
    if out:
        _console.print(f"wrote {out}/validation_summary.csv, validation_rows.csv, validation.html")


@calibrate_app.command("e2e")
def e2e_command(
    profile: Annotated[str, Opt(help="Profile fitted on this machine (e.g. cpu-local.yaml)")],
    out: Annotated[Path | None, Opt(help="Write the per-step CSV here")] = None,
    threads: Annotated[int, Opt(help="CPU threads (use the bench's)")] = 1,
) -> None:
    """Run a small transformer with torch under continuous batching; compare each step with the
    cost model."""
    from servesim.calibration.transformer_e2e import run_e2e
    from servesim.hardware_io import load_hardware

    steps = run_e2e(load_hardware(profile, "--profile"), threads=threads)
    if out:
        steps.to_csv(out, index=False)
    ape = steps["ape"] * 100
    _console.print(f"{len(steps)} steps: per-step error median {ape.median():.1f}%, "
                   f"p90 {ape.quantile(0.9):.1f}%, mean signed {steps['signed_%'].mean():+.1f}%")
