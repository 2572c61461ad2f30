"""``servesim run`` and ``servesim validate``: simulate an experiment YAML, or only check it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from servesim.atomic_io import make_output_dir
from servesim.cli.console import console
from servesim.config import ExperimentConfig, load_experiment
from servesim.engine import resolve_deployment, simulate
from servesim.engine.deployment import Deployment
from servesim.errors import ServesimError
from servesim.metrics import write_run
from servesim.resources import configs_dir, find_builtin
from servesim.sweep.spec import is_sweep_file
from servesim.workloads import build_workload
from servesim.workloads.requests import RequestTable

GIB = 2**30


def find_config(text: str) -> Path:
    """A path, or the name of a built-in experiment (``quickstart`` -> configs/quickstart.yaml)."""
    return find_builtin(text, [configs_dir()], "CONFIG", "experiment",
                        lambda path: not is_sweep_file(path))


SetOption = Annotated[list[str] | None, typer.Option(
    "--set", help="Override a config key, e.g. --set deployment.tp=2 (repeatable)")]
SeedOption = Annotated[int | None, typer.Option(help="Seed of the workload (overrides the file)")]


def _prepare(config_path: str, overrides: list[str] | None, seed: int | None
             ) -> tuple[Path, ExperimentConfig, Deployment, RequestTable]:
    path = find_config(config_path)
    config = load_experiment(path, overrides or [], seed)
    deployment = resolve_deployment(config)
    workload = build_workload(config.workload, config.seed, path.parent)
    if len(workload) == 0:
        raise ServesimError("workload", "has no requests", "widen the time window or raise num_requests")
    return path, config, deployment, workload


def _describe(config: ExperimentConfig, deployment: Deployment, workload: RequestTable) -> None:
    if config.policy.name == "disaggregated":
        _describe_pools(config, deployment, workload)
        return
    d, m, lim = deployment, deployment.memory, deployment.limits
    console.print(f"[bold]{config.name}[/]: {d.model.name} on {d.replicas} x {d.tp} x "
                  f"[bold]{d.hardware.name}[/] ({d.num_gpus} GPU{'s' if d.num_gpus > 1 else ''}), "
                  f"policy [bold]{config.policy.name}[/], router {config.router.name}")
    console.print(f"memory per GPU: weights {m.weight_bytes / GIB:.1f} GiB, activations "
                  f"{m.activation_bytes / GIB:.1f} GiB, KV pool {m.kv_cache_bytes / GIB:.1f} GiB = "
                  f"{lim.num_blocks:,} blocks of {lim.block_size} tokens per replica; "
                  f"max_num_seqs {lim.max_num_seqs}, max_num_batched_tokens "
                  f"{lim.max_num_batched_tokens:,}, max_model_len {lim.max_model_len:,}")
    console.print(f"workload: {escape(workload.describe())}")
    if lim.enable_prefix_caching and not workload.has_prefixes:
        console.print("[yellow]prefix caching is on, but the workload has no prefix block ids, so "
                      "nothing can hit[/] (add workload.shared_prefix or replay a mooncake trace)")
    if d.hardware.spec_only:
        console.print("[dim]hardware profile is spec-only: efficiencies are defaults, not fitted to "
                      "measurements[/]")


def _describe_pools(config: ExperimentConfig, deployment: Any, workload: RequestTable) -> None:
    """A disaggregated deployment: one line per pool, one for the link."""
    console.print(f"[bold]{config.name}[/]: {deployment.model.name}, [bold]disaggregated[/] on "
                  f"{deployment.num_gpus} GPUs, router {config.router.name}")
    for name in ("prefill", "decode"):
        d = deployment.pool(name)
        m, lim = d.memory, d.limits
        console.print(f"  {name}: {d.replicas} x {d.tp} x [bold]{d.hardware.name}[/], policy "
                      f"{deployment.pool_policy(name)[0]}; KV pool {m.kv_cache_bytes / GIB:.1f} GiB = "
                      f"{lim.num_blocks:,} blocks of {lim.block_size} tokens per replica; max_num_seqs "
                      f"{lim.max_num_seqs}, max_num_batched_tokens {lim.max_num_batched_tokens:,}")
    link = deployment.link
    console.print(f"  KV link: {link.kind}, {link.bandwidth_Bps * link.efficiency / 1e9:.1f} GB/s x "
                  f"{link.lanes} lane(s), {link.latency_s * 1e6:.0f} us, {link.channels} channel(s); "
                  f"{deployment.kv_bytes_per_token / 1024:.0f} KiB of KV per prompt token")
    console.print(f"workload: {escape(workload.describe())}")


def validate_command(
    config: Annotated[str, typer.Argument(help="Experiment YAML (or a built-in name, e.g. quickstart)")],
    overrides: SetOption = None,
    seed: SeedOption = None,
) -> None:
    """Check an experiment without running it: keys, model, hardware, memory fit and workload."""
    _, cfg, deployment, workload = _prepare(config, overrides, seed)
    _describe(cfg, deployment, workload)
    console.print("[green]valid[/]")


def run_command(
    config: Annotated[str, typer.Argument(help="Experiment YAML (or a built-in name, e.g. quickstart)")],
    overrides: SetOption = None,
    out: Annotated[Path | None, typer.Option(help="Output folder (default runs/<name>)")] = None,
    seed: SeedOption = None,
    report: Annotated[bool, typer.Option(help="Write report.html")] = True,
    quiet: Annotated[bool, typer.Option(help="No progress bar")] = False,
) -> None:
    """Simulate an experiment and write its summary, tables and interactive report."""
    path, cfg, deployment, workload = _prepare(config, overrides, seed)
    _describe(cfg, deployment, workload)
    out_dir = out or Path("runs") / cfg.name
    make_output_dir(out_dir)  # fail before a long run, not after it
    columns = (TextColumn("simulating"), BarColumn(),
               TextColumn("{task.completed:,}/{task.total:,} requests"),
               TextColumn("sim {task.fields[sim]:,.0f} s"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=quiet, transient=True) as bar:
        task = bar.add_task("run", total=len(workload), sim=0.0)

        def progress(done: int, total: int, sim_s: float) -> None:
            bar.update(task, completed=done, sim=sim_s)

        result = simulate(cfg, workload, path.parent, progress=None if quiet else progress)
    tables = write_run(result, out_dir, report=report)
    render_summary(tables.summary)
    console.print(f"simulated {len(workload):,} requests, {len(result.steps):,} steps in "
                  f"{result.wall_time_s:.2f} s wall ({len(workload) / max(result.wall_time_s, 1e-9):,.0f} "
                  "requests/s)")
    written = "summary.json, config.resolved.yaml"
    if cfg.output == "full":
        written += ", requests.parquet, steps.parquet, itl.parquet" + (", report.html" if report else "")
    console.print(f"wrote {out_dir}/ ({written})")


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def render_summary(summary: dict[str, Any]) -> None:
    table = Table(show_edge=False, box=None, pad_edge=False)
    table.add_column("latency")
    for column in ("mean", "p50", "p90", "p99", "max"):
        table.add_column(column, justify="right")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queueing_s", "queueing")):
        stats = summary[key]
        table.add_row(label, *(_fmt(stats[c]) for c in ("mean", "p50", "p90", "p99", "max")))
    console.print(table)
    t = summary["throughput"]
    console.print(f"throughput: {t['requests_per_s']:.2f} requests/s, {t['output_tokens_per_s']:,.0f} "
                  f"output tokens/s, {t['total_tokens_per_s']:,.0f} total tokens/s over "
                  f"{summary['duration_s']:,.1f} s")
    kv, batch = summary["kv"], summary["batch"]
    peak = kv["peak_blocks_used"] / max(kv["blocks_total"], 1)
    console.print(f"completed {summary['completed']:,}, rejected {summary['rejected']:,}, preemptions "
                  f"{summary['preemptions']:,}; mean batch {batch['mean_size']:.1f}; KV use mean "
                  f"{kv['mean_utilization']:.0%}, peak {peak:.0%}")
    if summary.get("disaggregation"):
        dis = summary["disaggregation"]
        link, pools = dis["link"], dis["pools"]
        copy, link_wait, room_wait = dis["transfer_s"], dis["link_wait_s"], dis["decode_wait_s"]
        console.print(f"KV transfers: {link['transfers']:,}, copy p50 {_fmt(copy['p50'])} p99 "
                      f"{_fmt(copy['p99'])}; link wait p99 {_fmt(link_wait['p99'])}, decode-room wait "
                      f"p99 {_fmt(room_wait['p99'])}; link busy {link['utilization']:.0%}; prefill pool "
                      f"busy {pools['prefill']['busy_fraction']:.0%}, decode pool busy "
                      f"{pools['decode']['busy_fraction']:.0%}")
    swap = summary.get("swap") or {}
    if swap.get("swaps_out"):
        console.print(f"swapped {swap['swaps_out']:,} out / {swap['swaps_in']:,} in over the host link: "
                      f"{(swap['bytes_out'] + swap['bytes_in']) / 1e9:,.2f} GB, "
                      f"{swap['transfer_s']:,.3f} s of step time")
    prefix = summary.get("prefix_cache")
    if prefix:
        console.print(f"prefix cache: hit rate [bold]{prefix['hit_rate']:.1%}[/] "
                      f"({prefix['cached_tokens']:,} of {prefix['prompt_tokens']:,} prompt tokens), "
                      f"{prefix['evicted_blocks']:,} blocks evicted")
    if summary.get("unfinished"):
        console.print(f"[bold red]{summary['unfinished']:,} requests neither completed nor were "
                      "rejected[/]: the policy left them queued (see requests.parquet, status unfinished)")
    if summary.get("slos"):
        limits = ", ".join(f"{k.removesuffix('_s').upper()} <= {_fmt(v)}" for k, v in summary["slos"].items())
        console.print(f"SLOs ({limits}): attainment [bold]{summary['slo_attainment']:.1%}[/], goodput "
                      f"{summary['goodput_requests_per_s']:.2f} requests/s")
