"""``servesim run`` and ``servesim validate``: simulate an experiment YAML, or only check it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from servesim.atomic_io import make_output_dir
from servesim.cli.console import console
from servesim.cli.report import PlotlyJsOption, check_plotlyjs_early
from servesim.errors import ServesimError
from servesim.resources import configs_dir, find_builtin

if TYPE_CHECKING:
    from servesim.metrics.summary import Summary
    from servesim.pipeline import RunPlan
    from servesim.topology.base import Topology
    from servesim.topology.group import ReplicaGroup

GIB = 2**30


def find_config(text: str) -> Path:
    """A path, or the name of a built-in experiment (``quickstart`` -> configs/quickstart.yaml)."""

    def is_experiment(path: Path) -> bool:
        from servesim.sweep.spec import is_sweep_file  # here: only a built-in name is asked about

        return not is_sweep_file(path)

    return find_builtin(text, [configs_dir()], "CONFIG", "experiment", is_experiment)


SetOption = Annotated[list[str] | None, typer.Option(
    "--set", help="Override a config key, e.g. --set deployment.tp=2 (repeatable)")]
SeedOption = Annotated[int | None, typer.Option(help="Seed of the workload (overrides the file)")]


def _plan(config_path: str, overrides: list[str] | None, seed: int | None) -> RunPlan:
    from servesim.pipeline import load_plan

    return load_plan(find_config(config_path), overrides or [], seed)


def _group_line(group: ReplicaGroup) -> str:
    m, lim = group.memory, group.limits
    return (f"KV pool {m.kv_cache_bytes / GIB:.1f} GiB = {lim.num_blocks:,} blocks of {lim.block_size} "
            f"tokens per replica; max_num_seqs {lim.max_num_seqs}, max_num_batched_tokens "
            f"{lim.max_num_batched_tokens:,}")


def percentiles_override(text: str) -> str:
    """``--metric-percentiles 50,90,99`` as the override ``metric_percentiles=[50.0, 90.0, 99.0]``."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ServesimError("--metric-percentiles", f"{text!r} is not a list of numbers",
                            "write e.g. --metric-percentiles 50,90,99") from None
    if not values:
        raise ServesimError("--metric-percentiles", "is empty", "write e.g. --metric-percentiles 50,90,99")
    return f"metric_percentiles=[{', '.join(repr(v) for v in values)}]"


def describe_plan(plan: RunPlan) -> None:
    """The deployment, one line per replica group (and link), then the workload."""
    from servesim.speculative.metrics import speculation_plan_line

    config, topology, workload = plan.config, plan.topology, plan.workload
    engine = topology.engine
    if len(topology.groups) == 1:
        g = topology.groups[0]
        m, lim = g.memory, g.limits
        layout = str(g.tp) if g.parallelism.is_single_group else f"({g.parallelism.label()})"
        console.print(f"[bold]{config.name}[/]: {g.model.name} on {g.replicas} x {layout} x "
                      f"[bold]{g.hardware.name}[/] ({g.num_gpus} GPU{'s' if g.num_gpus > 1 else ''}), "
                      f"engine {engine.name} {engine.version}, policy [bold]{g.policy.name}[/], router "
                      f"{config.router.name}")
        outside = " (outside the engine fraction)" if m.budget_rule == "weights_and_kv" else ""
        state = f", recurrent state {m.state_bytes / GIB:.1f} GiB" if m.state_bytes else ""
        console.print(f"memory per GPU: weights {m.weight_bytes / GIB:.1f} GiB, activations "
                      f"{m.activation_bytes / GIB:.1f} GiB{outside}{state}, {_group_line(g)}, max_model_len "
                      f"{lim.max_model_len:,}")
        if g.speculation is not None:
            console.print(escape(speculation_plan_line(g.speculation)))
    else:
        console.print(f"[bold]{config.name}[/]: {topology.model.name}, [bold]{topology.kind}[/] on "
                      f"{topology.num_gpus} GPUs, engine {engine.name} {engine.version}, router "
                      f"{config.router.name}")
        for g in topology.groups:
            console.print(f"  {g.name}: {g.replicas} x {g.tp} x [bold]{g.hardware.name}[/], policy "
                          f"{g.policy.name}; {_group_line(g)}")
        for line in topology.describe_links():
            console.print(f"  {line}")
    console.print(f"workload: {escape(workload.describe())}")
    caching = any(g.limits.enable_prefix_caching for g in topology.groups)
    if caching and not workload.has_prefixes:
        console.print("[yellow]prefix caching is on, but the workload has no prefix block ids, so "
                      "nothing can hit[/] (add workload.shared_prefix or replay a mooncake trace)")
    rejections = plan.rejections()
    if rejections:
        total = sum(rejections.values())
        reasons = "; ".join(f"{count:,}: {reason}" for reason, count in rejections.items())
        console.print(f"[yellow]{total:,} of {len(workload):,} requests will be rejected[/] ({reasons})")
    if any(g.hardware.spec_only for g in topology.groups):
        console.print("[dim]hardware profile is spec-only: efficiencies are defaults, not fitted to "
                      "measurements[/]")


def validate_command(
    config: Annotated[str, typer.Argument(help="Experiment YAML (or a built-in name, e.g. quickstart)")],
    overrides: SetOption = None,
    seed: SeedOption = None,
) -> None:
    """Check an experiment without running it: keys, model, hardware, memory fit, workload, and
    which requests the deployment will refuse."""
    describe_plan(_plan(config, overrides, seed))
    console.print("[green]valid[/]")


def run_command(
    config: Annotated[str, typer.Argument(help="Experiment YAML (or a built-in name, e.g. quickstart)")],
    overrides: SetOption = None,
    out: Annotated[Path | None, typer.Option(help="Output folder (default runs/<name>)")] = None,
    seed: SeedOption = None,
    report: Annotated[bool, typer.Option(help="Write report.html")] = True,
    quiet: Annotated[bool, typer.Option(help="No progress bar")] = False,
    plotlyjs: PlotlyJsOption = "inline",
    metric_percentiles: Annotated[str | None, typer.Option(
        help="Percentiles of summary.json's vLLM-named keys, e.g. 50,90,99 (as vllm bench serve; "
             "default 99)")] = None,
) -> None:
    """Simulate an experiment and write its summary, tables and interactive report."""
    check_plotlyjs_early(plotlyjs)
    if metric_percentiles is not None:
        overrides = [*(overrides or []), percentiles_override(metric_percentiles)]
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from servesim.pipeline import render, simulate

    plan = _plan(config, overrides, seed)
    describe_plan(plan)
    cfg, workload = plan.config, plan.workload
    out_dir = out or Path("runs") / cfg.name
    make_output_dir(out_dir)  # fail before a long run, not after it
    columns = (TextColumn("simulating"), BarColumn(),
               TextColumn("{task.completed:,}/{task.total:,} requests"),
               TextColumn("sim {task.fields[sim]:,.0f} s"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=quiet, transient=True) as bar:
        task = bar.add_task("run", total=len(workload), sim=0.0)

        def progress(done: int, total: int, sim_s: float) -> None:
            bar.update(task, completed=done, sim=sim_s)

        result = simulate(plan, progress=None if quiet else progress)
    render(result, out_dir, report=report, plotlyjs=plotlyjs)
    render_summary(result.summary, plan.topology)
    console.print(f"simulated {len(workload):,} requests, {len(result.step_log):,} steps in "
                  f"{result.wall_time_s:.2f} s wall ({len(workload) / max(result.wall_time_s, 1e-9):,.0f} "
                  "requests/s)")
    written = "summary.json, config.resolved.yaml"
    if cfg.output == "full":
        written += ", requests.parquet, steps.parquet, itl.parquet" + (", report.html" if report else "")
    console.print(f"wrote {out_dir}/ ({written})")


def render_summary(summary: Summary, topology: Topology) -> None:
    from rich.table import Table

    from servesim.metrics.stats import fmt_seconds
    from servesim.speculative.metrics import speculation_lines

    table = Table(show_edge=False, box=None, pad_edge=False)
    table.add_column("latency")
    for column in ("mean", "p50", "p90", "p99", "max"):
        table.add_column(column, justify="right")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queueing_s", "queueing")):
        stats = summary.latency(key)
        table.add_row(label, *(fmt_seconds(getattr(stats, c)) for c in ("mean", "p50", "p90", "p99", "max")))
    console.print(table)
    t = summary.throughput
    console.print(f"throughput: {t.requests_per_s:.2f} requests/s, {t.output_tokens_per_s:,.0f} "
                  f"output tokens/s, {t.total_tokens_per_s:,.0f} total tokens/s over "
                  f"{summary.duration_s:,.1f} s")
    kv, batch = summary.kv, summary.batch
    console.print(f"completed {summary.completed:,}, rejected {summary.rejected:,}, preemptions "
                  f"{summary.preemptions:,}; mean batch {batch.mean_size:.1f}; KV use mean "
                  f"{kv.mean_utilization:.0%}, peak {kv.peak_fraction:.0%}")
    for line in topology.summary_lines(summary.sections) + speculation_lines(summary.sections):
        console.print(line)
    swap = summary.swap
    if swap.swaps_out:
        console.print(f"swapped {swap.swaps_out:,} out / {swap.swaps_in:,} in over the host link: "
                      f"{(swap.bytes_out + swap.bytes_in) / 1e9:,.2f} GB, "
                      f"{swap.transfer_s:,.3f} s of step time")
    prefix = summary.prefix_cache
    if prefix:
        console.print(f"prefix cache: hit rate [bold]{prefix.hit_rate:.1%}[/] "
                      f"({prefix.cached_tokens:,} of {prefix.prompt_tokens:,} prompt tokens), "
                      f"{prefix.evicted_blocks:,} blocks evicted")
    if summary.unfinished:
        console.print(f"[bold red]{summary.unfinished:,} requests neither completed nor were "
                      "rejected[/]: the policy left them queued (see requests.parquet, status unfinished)")
    if summary.slos:
        limits = ", ".join(f"{k.removesuffix('_s').upper()} <= {fmt_seconds(v)}"
                           for k, v in summary.slos.items())
        console.print(f"SLOs ({limits}): attainment [bold]{summary.slo_attainment:.1%}[/], goodput "
                      f"{summary.goodput_requests_per_s:.2f} requests/s")
