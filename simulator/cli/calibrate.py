"""``servesim calibrate``: microbenchmark, fit and validate (a thin shell over ``calibration``).

``bench`` needs torch (a CPU wheel: ``pip install torch --index-url
https://download.pytorch.org/whl/cpu``); ``fit``, ``import-vidur`` and ``validate``
need only numpy and pandas. The calibration package is imported inside each command so that
``servesim`` itself starts without it, and the simulator core never imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from servesim.cli.console import console as _console

if TYPE_CHECKING:
    import pandas as pd

calibrate_app = typer.Typer(help="Microbenchmark kernels, fit hardware profiles, validate the cost model.",
                            no_args_is_help=True)
Opt = typer.Option


@contextmanager
def _replay_progress() -> Iterator[None]:
    """A progress bar (on a terminal, gone when done) over every batch of rows a serving replay
    runs, labelled by its stage (:mod:`servesim.calibration.replay_pool`)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from servesim.calibration.replay_pool import reporting

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"),
               TimeElapsedColumn())
    with Progress(*columns, console=_console, transient=True) as bar:
        task = bar.add_task("replaying rows", total=0)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        with reporting(progress):
            yield


def _print(table: pd.DataFrame, title: str) -> None:
    _console.print(f"[bold]{title}[/]")
    _console.print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))


@calibrate_app.command("bench")
def bench_command(
    device: Annotated[str, Opt(help="cuda or cpu")] = "cuda",
    out: Annotated[Path, Opt(help="Folder for the CSVs and metadata.json")] = Path("calibration_run"),
    quick: Annotated[bool, Opt(help="Sparse grid, few repetitions (CI: seconds on a CPU)")] = False,
    threads: Annotated[int, Opt(help="CPU threads (default 1, see calibration/bench.py)")] = 1,
    reps: Annotated[int | None, Opt(help="Timed repetitions per kernel (default 50 on cuda, 15 on "
                                         "cpu; fewer when a GPU lease is short)")] = None,
    gemm_rows: Annotated[str | None, Opt(help="Only GEMMs, at these row counts (comma-separated, "
                                              "e.g. 100,1000,1100: your steps' token counts)")] = None,
) -> None:
    """Time GEMMs, attention prefill/decode, memory kernels (and all-reduce with several GPUs)."""
    from servesim.calibration.bench import run_bench

    rows = _row_counts(gemm_rows) if gemm_rows is not None else None
    meta = run_bench(device, out, quick=quick, threads=threads, reps=reps, gemm_rows=rows)
    families = ", ".join(k for k in meta["seconds"] if k != "total")
    _console.print(f"{meta['device_name']}: wrote {families} to {out} in {meta['seconds']['total']:.1f} s")


def _row_counts(text: str) -> tuple[int, ...]:
    """``--gemm-rows``: positive integers, comma-separated."""
    from servesim.errors import ServesimError

    try:
        rows = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        rows = ()
    if not rows or min(rows) < 1:
        raise ServesimError("--gemm-rows", f"{text!r} is not a list of positive row counts",
                            "write them comma-separated, e.g. --gemm-rows 100,1000,1100")
    return rows


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


@calibrate_app.command("import-aiconfigurator")
def import_aiconfigurator_command(
    path: Annotated[Path, typer.Argument(help="The kernels/aiconfigurator folder")] = Path(
        "../shared/data/kernels/aiconfigurator"),
    out_dir: Annotated[Path | None, Opt(help="Write profiles here (default: the built-in ones)")] = None,
) -> None:
    """Fit h100-sxm-80gb, h200-sxm-141gb, b200 and a100-sxm-80gb (kernels and collectives) from
    NVIDIA AIConfigurator's measured vLLM kernels."""
    from servesim.calibration.aic_import import import_aiconfigurator

    _, report = import_aiconfigurator(path, out_dir)
    columns = ["gpu", "family", "rows_fit", "rows_held_out", "spec_median_%", "spec_p90_%",
               "prior_median_%", "prior_p90_%", "fit_out_median_%", "fit_out_p90_%"]
    _print(report[columns], "APE % on held-out rows: spec = spec-sheet roofline, prior = the profile "
           "before, fit_out = fitted")


@calibrate_app.command("validate-serving")
def validate_serving_command(
    path: Annotated[Path, typer.Argument(help="A serving file in AIConfigurator's silicon CSV format")],
    out: Annotated[Path | None, Opt(help="Folder for serving_rows.csv, serving_summary.csv, "
                                        "serving_by_concurrency.csv, serving_skipped.csv and "
                                        "serving.html")] = None,
    workers: Annotated[int, Opt(help="Processes that replay rows")] = 1,
    measured: Annotated[int, Opt(help="Measured requests per client (after one warm-up request)")] = 3,
    length_spread: Annotated[float, Opt(help="Replay output lengths uniform within +/- this fraction of "
                                               "each row's OSL (default 0: exactly the OSL; 0.02 breaks "
                                               "the replay's lock-step, see README Calibration)")] = 0.0,
) -> None:
    """Replay every measured deployment the simulator can express; predicted vs measured TTFT and
    TPOT per engine and GPU, and every other row counted by reason."""
    from servesim.calibration.serving_validate import validate_serving

    _check_replay(length_spread, workers, measured)
    with _replay_progress():
        rows, summary, skipped, noise = validate_serving(path, out, workers=workers, measured=measured,
                                                         length_spread=length_spread)
    _print(summary, f"{path.name}: absolute % error of mean TTFT and TPOT, engines as shipped")
    _print_bands(rows)
    _print_noise(noise)
    _print_skipped(skipped)
    if out:
        _console.print(f"wrote {out}/serving_rows.csv, serving_summary.csv, serving_by_concurrency.csv, "
                       "serving_noise.csv, serving_skipped.csv, serving.html")


def _print_bands(rows: pd.DataFrame) -> None:
    """The replay's bias by band of client concurrency (:func:`~servesim.calibration.
    serving_validate.by_concurrency`)."""
    from servesim.calibration.serving_validate import by_concurrency

    if rows.empty:
        return
    bands = by_concurrency(rows)
    for column in ("ttft_median_ratio", "tpot_median_ratio"):  # two decimals, where _print keeps one
        bands[column] = bands[column].map(lambda v: f"{v:.2f}")
    _print(bands, "by client concurrency: median predicted / measured (1 = unbiased) and median "
           "absolute % error")


def _print_noise(noise: pd.DataFrame) -> None:
    """The floor under the errors above: re-measurements of one configuration as each other's
    prediction (:mod:`servesim.calibration.serving_noise`)."""
    if noise.empty:
        _console.print("no replayed configuration is measured twice: no noise floor to show")
        return
    _print(noise, "re-measured configurations: absolute % error of the mean of the other measurements "
           "as each one's prediction (the floor under any replay's error on these rows)")


def _check_replay(length_spread: float, workers: int, measured: int) -> None:
    """A spread outside [0, 0.5), no worker process or no measured round is one line, not a replay
    of impossible lengths, a pool of none, or a prediction read from the burst round alone."""
    from servesim.errors import ServesimError, at_least_one

    if not 0.0 <= length_spread < 0.5:
        raise ServesimError("--length-spread", f"{length_spread} is not a fraction in [0, 0.5)",
                            "use e.g. 0.02, or 0 for exactly each row's OSL")
    at_least_one("--workers", workers)
    at_least_one("--measured", measured)


def _print_skipped(skipped: pd.DataFrame) -> None:
    counts = skipped["reason"].value_counts()
    _console.print(f"[bold]rows not replayed: {int(counts.sum())}[/]")
    for reason, count in counts.items():
        _console.print(f"  {count:5d}  {escape(str(reason))}")


@calibrate_app.command("fit-serving")
def fit_serving_command(
    path: Annotated[Path, typer.Argument(help="A serving file in AIConfigurator's silicon CSV format")],
    out_dir: Annotated[Path | None, Opt(help="Write <engine>.yaml here (default: configs/engines)")] = None,
    report: Annotated[Path | None, Opt(help="Folder for the leave-one-model-out rows and summary")] = None,
    workers: Annotated[int, Opt(help="Processes that replay rows")] = 1,
    measured: Annotated[int, Opt(help="Measured requests per client (after one warm-up request)")] = 3,
    source: Annotated[str | None, Opt(help="How the profiles' provenance names the file (default: its "
                                           "name), e.g. with the commit it was taken from")] = None,
    length_spread: Annotated[float, Opt(help="Replay output lengths uniform within +/- this fraction of "
                                               "each row's OSL (default 0: exactly the OSL; 0.02 breaks "
                                               "the replay's lock-step, see README Calibration)")] = 0.0,
    stream: Annotated[bool, Opt(help="Also fit the front end's time per streamed chunk "
                                     "(engine.frontend_chunk_s; every re-timed row simulated 8 more "
                                     "times)")] = False,
) -> None:
    """Fit each engine's CPU time per step to the measured deployments; report the
    leave-one-model-out error and write the engines' runtime profiles."""
    from servesim.calibration.serving_validate import fit_serving, write_engine_fits, write_outputs
    from servesim.resources import configs_dir

    _check_replay(length_spread, workers, measured)
    with _replay_progress():
        result = fit_serving(path, workers=workers, measured=measured, length_spread=length_spread,
                             stream=stream)
    for engine, c in result.coefficients.items():
        _console.print(f"{engine}: overlapped {c.fixed_s * 1e6:.0f} us per step + {c.per_seq_s * 1e6:.2f} us "
                       f"per sequence; serial {c.serial_fixed_s * 1e6:.0f} us per step + "
                       f"{c.serial_per_seq_s * 1e6:.2f} us per sequence; front end "
                       f"{c.frontend_s * 1e3:.3g} ms per request"
                       + (f", {c.frontend_chunk_s * 1e6:.3g} us per streamed chunk" if stream else "")
                       + f" ({result.rows_used[engine]} rows)")
    _print(result.lomo_summary, "leave-one-model-out: absolute % error of mean TTFT and TPOT")
    _print_bands(result.lomo_rows)
    _print_noise(result.noise)
    _print_skipped(result.skipped)
    written = write_engine_fits(result, source or path.name, out_dir or configs_dir() / "engines")
    if report:
        write_outputs(report, result.lomo_rows, result.lomo_summary, result.skipped,
                      f"{path.name}: leave-one-model-out predictions", result.noise)
    _console.print("wrote " + ", ".join(str(p) for p in written))


@calibrate_app.command("from-benchmark")
def from_benchmark_command(
    result: Annotated[Path, typer.Argument(help="vllm bench serve --save-result --save-detailed JSON, "
                                                "sglang.bench_serving --output-details JSON lines, or "
                                                "aiperf's artifact directory")],
    config: Annotated[Path, Opt("--config", help="Experiment YAML of the deployment that served the run "
                                                 "(its workload is replaced by the run's requests)")],
    set_: Annotated[list[str] | None, Opt("--set", help="KEY=VALUE overrides of the experiment")] = None,
    scales: Annotated[str, Opt(help="Also fit one scale per kernel class: comma-separated from gemm, "
                                    "attn_prefill, attn_decode, elementwise, communication, or 'all'")] = "",
    out: Annotated[Path, Opt(help="Folder for the metrics, the requests and the fitted profiles")] = Path(
        "benchmark_fit"),
) -> None:
    """Replay my benchmark run through the simulator, report the error per metric, fit the
    engine's runtime (and kernel scales) to it, and write profiles for run, sweep and capacity."""
    from servesim.calibration.from_benchmark import describe, from_benchmark
    from servesim.calibration.replay import KERNEL_CLASSES
    from servesim.errors import ServesimError

    classes = tuple(KERNEL_CLASSES) if scales == "all" else tuple(c for c in scales.split(",") if c)
    unknown = [c for c in classes if c not in KERNEL_CLASSES]
    if unknown:
        raise ServesimError("--scales", f"unknown kernel class {unknown[0]!r}",
                            f"use some of {', '.join(KERNEL_CLASSES)} or all")
    fitted = from_benchmark(result, config, set_ or [], classes, out)
    run = fitted.run
    sent = f"{run.max_concurrency} clients" if run.max_concurrency else f"rate {run.request_rate:g}"
    failed = f"; {run.failed} failed requests left out" if run.failed else ""
    _console.print(f"{run.source}: {len(run)} requests replayed ({run.tool}, {sent}{failed})")
    _print(fitted.metrics, "measured vs predicted (ms), before and after the fit")
    _console.print(describe(fitted))
    hardware = f"hardware-{fitted.hardware.name}.yaml" if fitted.scaled_hardware else ""
    _console.print(f"wrote {out}/ (benchmark_metrics.csv, benchmark_requests.csv, "
                   f"engine-{fitted.engine}.yaml{', ' + hardware if hardware else ''})")
    _console.print(f"use it: engine: {{name: {fitted.engine}, profile: {out}/engine-{fitted.engine}.yaml}}"
                   + (f", hardware: {out}/{hardware}" if hardware else ""))


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
    device: Annotated[str, Opt(help="cpu (a small model) or cuda (a full-size catalogue model)")] = "cpu",
    model: Annotated[str | None, Opt(help="Catalogue model run on cuda (default llama-3-8b)")] = None,
    passes: Annotated[int, Opt(help="Timed passes; a step's time is their median")] = 3,
) -> None:
    """Run a transformer with torch under continuous batching (random bf16 weights); compare each
    step with the cost model."""
    from servesim.calibration.transformer_e2e import run_e2e
    from servesim.hardware_io import load_hardware

    steps = run_e2e(load_hardware(profile, "--profile"), threads=threads, passes=passes, device=device,
                    model_name=model)
    if out:
        steps.to_csv(out, index=False)
    ape = steps["ape"] * 100
    _console.print(f"{len(steps)} steps: per-step error median {ape.median():.1f}%, "
                   f"p90 {ape.quantile(0.9):.1f}%, mean signed {steps['signed_%'].mean():+.1f}%")
    if "kernel_s" in steps:
        kernel = steps["kernel_ape"] * 100
        _console.print(f"against the GPU's kernel time per step (profiler): median {kernel.median():.1f}%, "
                       f"p90 {kernel.quantile(0.9):.1f}%, "
                       f"mean signed {steps['kernel_signed_%'].mean():+.1f}%; "
                       f"host time the eager loop adds: median "
                       f"{(steps['measured_s'] - steps['kernel_s']).median() * 1e3:.2f} ms per step")
        classes = steps.attrs["kernel_classes"]
        _print(classes.assign(gpu_ms=classes["gpu_s"] * 1e3, predicted_ms=classes["predicted_s"] * 1e3)
               [["class", "gpu_ms", "predicted_ms"]], "GPU time by operator class over one pass")
        if out:
            classes.to_csv(out.with_name(out.stem + "_classes.csv"), index=False)


@calibrate_app.command("launch")
def launch_command(
    profile: Annotated[str, Opt(help="Profile that prices the steps' kernels (e.g. h200-sxm-141gb)")],
    out: Annotated[Path | None, Opt(help="Write the per-batch CSV here")] = None,
    device: Annotated[str, Opt(help="cuda (a full-size model) or cpu (a small one, eager)")] = "cuda",
    model: Annotated[str | None, Opt(help="Catalogue model run on cuda (default llama-3-8b)")] = None,
    context: Annotated[int, Opt(help="Tokens every sequence attends over")] = 1024,
    reps: Annotated[int, Opt(help="Forwards timed back to back per batch size")] = 50,
    threads: Annotated[int, Opt(help="CPU threads")] = 1,
) -> None:
    """Measure what a decode step's kernel launches and its CUDA graph cost (eager vs replayed)."""
    from servesim.calibration.bench_launch import launch_figures, run_launch
    from servesim.hardware_io import load_hardware

    table = run_launch(load_hardware(profile, "--profile"), device=device, model_name=model,
                       context=context, reps=reps, threads=threads)
    if out:
        from servesim.atomic_io import atomic_write

        atomic_write(out, lambda path: table.to_csv(path, index=False))
    shown = table.assign(**{f"{c}_ms": table[c] * 1e3 for c in ("eager_s", "graph_s", "kernel_s",
                                                              "predicted_kernel_s")})
    _print(shown[["batch", "kernels", "eager_s_ms", "graph_s_ms", "kernel_s_ms", "predicted_kernel_s_ms"]],
           f"{table.attrs['model']} decode steps at context {context}")
    micro = table.iloc[0]
    _console.print(f"one-element adds: {micro['micro_eager_s'] * 1e6:.2f} us eager, "
                   f"{micro['micro_graph_s'] * 1e6:.2f} us in a graph")
    if device == "cuda":
        figures = launch_figures(table)
        _console.print(f"host time per kernel launch {figures['launch_s'] * 1e6:.2f} us "
                       f"({figures['launch_bound_rows']:.0f} launch-bound batch sizes); a graph adds "
                       f"{figures['graph_gap_s'] * 1e6:.2f} us per kernel")
