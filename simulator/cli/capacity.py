"""``servesim capacity``: the cheapest deployment that meets the SLOs, and why the others lose.

Flags and a YAML file (``configs/capacity/*.yaml``) both build one
:class:`~servesim.capacity.config.CapacityConfig`; flags beat the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import JustifyMethod
from rich.markup import escape
from rich.table import Table

from servesim.atomic_io import make_output_dir
from servesim.cli.console import console
from servesim.cli.report import PlotlyJsOption, check_plotlyjs_early
from servesim.errors import ServesimError
from servesim.resources import configs_dir, find_builtin

Opt = typer.Option
DEFAULT_WORKLOAD_REQUESTS = 1000


def find_capacity_config(text: str) -> Path:
    """A path, or a built-in example's name (``llama3-8b-chat`` -> configs/capacity/...)."""
    return find_builtin(text, [configs_dir() / "capacity"], "CONFIG", "example")


def split_list(values: list[str] | None) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]``: lists by repeating a flag or with commas."""
    return [part.strip() for v in values or [] for part in v.split(",") if part.strip()]


def _ints(values: list[str] | None, option: str) -> list[int]:
    try:
        return [int(v) for v in split_list(values)]
    except ValueError:
        raise ServesimError(option, f"{','.join(values or [])!r} is not a list of integers",
                            f"write e.g. {option} 1,2,4") from None


def parse_prices(values: list[str] | None) -> dict[str, float]:
    prices = {}
    for text in split_list(values):
        name, sep, raw = text.partition("=")
        try:
            prices[name.strip()] = float(raw)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ServesimError("--price", f"{text!r} is not NAME=USD_PER_GPU_HOUR",
                                "write e.g. --price h100-sxm-80gb=2.5")
    return prices


def flag_duration(text: str, flag: str) -> float:
    """``--tpot 50`` (milliseconds, as vLLM's and AIConfigurator's flags), ``--tpot 50ms`` or
    ``--tpot 0.05s``, in seconds; one line naming the flag when it cannot be read or is implausible."""
    from servesim.inputs.units import parse_duration

    try:
        return parse_duration(text, flag, "ms", f"--{flag}")
    except ValueError as exc:
        raise ServesimError(f"--{flag}", str(exc)) from None


def build_document(config: str | None, overrides: list[str] | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The YAML file (if any) with ``--set`` overrides, then every flag given on top."""
    from servesim.capacity.config import load_capacity_document

    document = load_capacity_document(find_capacity_config(config) if config else None, overrides)
    for key in ("model", "target_rate", "gpu_budget", "decode_context", "seed"):
        if flags[key] is not None:
            document[key] = flags[key]
    # the two questions exclude each other: a flag asking one replaces the file's other
    if flags["gpu_budget"] is not None and flags["target_rate"] is None:
        document.pop("target_rate", None)
    if flags["target_rate"] is not None and flags["gpu_budget"] is None:
        document.pop("gpu_budget", None)
    candidates = document.setdefault("candidates", {})
    for key, values in (("hardware", split_list(flags["hardware"])), ("tp", _ints(flags["tp"], "--tp")),
                        ("pp", _ints(flags["pp"], "--pp")), ("dp", _ints(flags["dp"], "--dp")),
                        ("ep", _ints(flags["ep"], "--ep")),
                        ("policy", split_list(flags["policy"])),
                        ("replicas", _ints(flags["replicas"], "--replicas")),
                        ("kind", split_list(flags["kind"])), ("splits", split_list(flags["splits"]))):
        if values:
            candidates[key] = values
    slo_flags = ("ttft", "tpot", "e2e", "percentile", "attainment")
    slo = (document.setdefault("slo", {}) if any(flags[k] is not None for k in slo_flags)
           else document.get("slo"))
    if slo is not None and isinstance(slo, dict):
        for key, flag in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e"),
                          ("percentile", "percentile"), ("attainment", "attainment")):
            if flags[flag] is not None:
                slo[key] = flag_duration(flags[flag], flag) if key.endswith("_s") else flags[flag]
    if "workload" not in document:
        document["workload"] = {"arrival": {"process": "poisson", "rate": 1.0},
                                "num_requests": DEFAULT_WORKLOAD_REQUESTS,
                                "lengths": {"preset": "azure-conversation"}}
    workload = document["workload"]
    if isinstance(workload, dict):
        if flags["lengths"] is not None:
            workload["lengths"] = {"preset": flags["lengths"]}
        if flags["arrival"] is not None and isinstance(workload.get("arrival"), dict):
            workload["arrival"]["process"] = flags["arrival"]
    search = document.setdefault("search", {})
    for key, flag in (("replications", "replications"), ("precision", "precision"),
                      ("requests_per_run", "requests")):
        if flags[flag] is not None:
            search[key] = flags[flag]
    if flags["prices"]:
        document["prices"] = {**(document.get("prices") or {}), **parse_prices(flags["prices"])}
    return document


def capacity_command(
    config: Annotated[str | None, typer.Argument(
        help="Capacity YAML (or a built-in example, e.g. llama3-8b-chat); flags alone work too")] = None,
    model: Annotated[str | None, Opt(help="Model name or config.json path")] = None,
    hardware: Annotated[list[str] | None, Opt(help="Candidate GPUs (repeat or comma-separate)")] = None,
    tp: Annotated[list[str] | None, Opt(help="Candidate TP degrees, e.g. 1,2,4")] = None,
    pp: Annotated[list[str] | None, Opt(help="Candidate pipeline stages, e.g. 1,2")] = None,
    dp: Annotated[list[str] | None, Opt(help="Candidate data-parallel attention ranks, e.g. 1,8")] = None,
    ep: Annotated[list[str] | None, Opt(help="Candidate expert-parallel degrees, e.g. 1,8")] = None,
    policy: Annotated[list[str] | None, Opt(help="Candidate scheduling policies")] = None,
    replicas: Annotated[list[str] | None, Opt(help="Candidate replicas per set, e.g. 1,2")] = None,
    ttft: Annotated[str | None, Opt(
        help="TTFT limit: 500ms, 0.5s, or bare milliseconds (as vllm bench serve --goodput)")] = None,
    tpot: Annotated[str | None, Opt(help="TPOT limit: 50ms, 0.05s, or bare milliseconds")] = None,
    e2e: Annotated[str | None, Opt(help="End-to-end latency limit: 30s, or bare milliseconds")] = None,
    percentile: Annotated[float | None, Opt(help="Percentile the limits apply to (default 99)")] = None,
    attainment: Annotated[float | None, Opt(
        help="Instead: fraction of requests that must meet every limit, e.g. 0.99")] = None,
    lengths: Annotated[str | None, Opt(help="Length preset (azure-conversation, ...)")] = None,
    arrival: Annotated[str | None, Opt(help="Arrival process: poisson, gamma, constant")] = None,
    requests: Annotated[int | None, Opt(help="Requests per simulation (default: num_requests)")] = None,
    replications: Annotated[int | None, Opt(help="Seeds simulated per rate (default 3)")] = None,
    precision: Annotated[float | None, Opt(help="Relative precision of the search (default 0.05)")] = None,
    kind: Annotated[list[str] | None, Opt(
        help="Topologies to rank: colocated, disaggregated (e.g. --kind colocated,disaggregated)")] = None,
    splits: Annotated[list[str] | None, Opt(
        help="Disaggregated prefill:decode replicas per set, e.g. 1:1,3:1")] = None,
    target_rate: Annotated[float | None, Opt(help="Size every candidate for this many requests/s")] = None,
    gpu_budget: Annotated[int | None, Opt(
        help="Instead: the best deployment on exactly this many GPUs (highest rate within the SLOs)")] = None,
    price: Annotated[list[str] | None, Opt(help="USD per GPU-hour, e.g. h100-sxm-80gb=2.5")] = None,
    decode_context: Annotated[int | None, Opt(
        help="Context of the decode-batch limits (default: the workload's mean decode context)")] = None,
    seed: Annotated[int | None, Opt(help="First seed (replication k uses seed + k)")] = None,
    overrides: Annotated[list[str] | None, Opt(
        "--set", help="Override a config key, e.g. --set search.replications=5")] = None,
    workers: Annotated[int, Opt(help="Candidates searched in parallel (processes)")] = 1,
    out: Annotated[Path | None, Opt(help="Output folder (default runs/capacity-<name>)")] = None,
    report: Annotated[bool, Opt(help="Write report.html")] = True,
    plotlyjs: PlotlyJsOption = "inline",
    limits_only: Annotated[bool, Opt(help="Print the decode-batch limits only; no simulation")] = False,
    as_json: Annotated[bool, Opt("--json", help="Print the answer as JSON")] = False,
) -> None:
    """Find each candidate's highest sustainable rate, the fewest GPUs for a target, and the cost."""
    from servesim.capacity.config import validate_capacity
    from servesim.capacity.output import LAUNCH_FILES, json_safe, write_capacity
    from servesim.capacity.plan import decode_limits_only, plan_capacity

    flags = {"model": model, "hardware": hardware, "tp": tp, "pp": pp, "dp": dp, "ep": ep, "policy": policy,
             "replicas": replicas, "kind": kind, "splits": splits, "gpu_budget": gpu_budget,
             "ttft": ttft, "tpot": tpot, "e2e": e2e, "percentile": percentile, "attainment": attainment,
             "lengths": lengths, "arrival": arrival, "requests": requests, "replications": replications,
             "precision": precision, "target_rate": target_rate, "prices": price,
             "decode_context": decode_context, "seed": seed}
    check_plotlyjs_early(plotlyjs)
    source = config or "flags"
    base_dir = find_capacity_config(config).parent if config else None
    cfg = validate_capacity(build_document(config, overrides, flags), source)
    if limits_only:
        records = decode_limits_only(cfg, base_dir)
        if as_json:
            print(json.dumps(json_safe(records), indent=2))
            return
        console.print(f"[bold]{cfg.model}[/]: decode-batch limits ({escape(cfg.slo.describe())})")
        _print_limits(records)
        return
    out_dir = out or Path("runs") / f"capacity-{cfg.name}"
    make_output_dir(out_dir)
    if not as_json:
        console.print(f"[bold]{cfg.name}[/]: {cfg.model}, SLO {escape(cfg.slo.describe())}; "
                      f"{cfg.search.replications} replications x {cfg.requests_per_run} requests per rate, "
                      f"precision {cfg.search.precision:.0%}, {workers} worker(s)")
    answer = plan_capacity(cfg, base_dir, workers)
    write_capacity(answer, out_dir)
    written = ["capacity.json", "capacity.csv"]
    if answer.get("launch"):
        written += list(LAUNCH_FILES.values())
    if report:
        from servesim.report.capacity_report import write_capacity_report
        from servesim.report.page import check_plotlyjs

        write_capacity_report(out_dir, answer=answer, plotlyjs=check_plotlyjs(plotlyjs))
        written.append("report.html")
    if as_json:
        print(json.dumps(json_safe(answer), indent=2))
        return
    render(answer)
    console.print(f"wrote {out_dir}/ ({', '.join(written)})")


def _money(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"${value:,.{digits}f}"


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def render(answer: dict[str, Any]) -> None:
    from servesim.capacity.output import candidate_row

    target, budget = answer["target_rate"], answer.get("gpu_budget")
    table = Table(show_edge=False, box=None, pad_edge=False)
    fleet_price = ("$/1M tok @target" if target is not None
                   else "$/1M tok @budget" if budget is not None else "$/1M tok @max")
    columns: list[tuple[str, JustifyMethod]] = [
        ("#", "right"), ("candidate", "left"), ("GPUs", "right"), ("max rate", "right")]
    if budget is not None:
        columns.append(("fleet rate", "right"))
    columns += [("$/hour", "right"), (fleet_price, "right")]
    if target is not None or budget is not None:
        columns.append(("$/1M tok @max", "right"))
    columns += [("SLO margins", "left"), ("breaks first", "left"), ("bound", "left"), ("KV", "left")]
    if target is not None or budget is not None:
        columns.append(("verified", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name in ("candidate", "SLO margins"))
    for record in answer["candidates"]:
        row = candidate_row(record)
        if not record.get("feasible"):
            table.add_row(str(row["rank"]), escape(row["candidate"]), "-", "infeasible",
                          *["-"] * (len(columns) - 4))
            continue
        margins = (record["knee"].get("passing") or {}).get("margins") or {}
        margin_text = ", ".join(f"{k.removesuffix('_s').upper()} {v:+.0%}" for k, v in margins.items())
        kv = "-" if row["kv_limited"] is None else ("limited" if row["kv_limited"] else
                                                     f"ok ({row['peak_kv_use']:.0%})")
        cells = [str(row["rank"]), escape(row["candidate"]) + (" *" if row["on_frontier"] else ""),
                 str(row["gpus"] if row["gpus"] is not None else "-"), _num(row["max_rate"])]
        if budget is not None:
            cells.append(_num(row["fleet_rate"]))
        cells += [_money(row["usd_per_hour"]), _money(row["usd_per_1m_output_tokens_fleet"], 3)]
        if target is not None or budget is not None:
            cells.append(_money(row["usd_per_1m_output_tokens_at_max_rate"], 3))
        cells += [margin_text or "-", row["breaks_first"] or "-", row["step_bound"] or "-", kv]
        if target is not None or budget is not None:
            cells.append("yes" if row["verified"] else "no")
        table.add_row(*cells)
    console.print(table)
    if target is not None:
        fleet = (f"GPUs, $/hour and $/1M tok @target: the fleet sized for {target:g} req/s, at that rate")
    elif budget is not None:
        fleet = (f"GPUs, fleet rate, $/hour and $/1M tok @budget: the whole replica sets that fit {budget} "
                 "GPUs, at the highest rate they sustain together (idle GPUs are paid for)")
    else:
        fleet = "GPUs, $/hour and $/1M tok: one replica set at its max rate"
    console.print(f"[dim]max rate: highest req/s one replica set sustains within the SLOs; {fleet}; "
                  "$/1M tok @max: one replica set at its own max rate; SLO margins: headroom at the max "
                  "rate; * on the cost-rate Pareto frontier[/]")
    _print_limits(answer["candidates"])
    console.print("[bold]why[/]")
    for record in answer["candidates"]:
        why = escape(record.get("why", ""))
        console.print(f"  {record.get('rank')}. {escape(record['candidate'])}: {why}")
        for warning in record.get("warnings", []):
            console.print(f"     [yellow]warning:[/] {escape(warning)}")
    launch = answer.get("launch")
    if launch:
        console.print(f"[bold]launch the winner as simulated[/] ({escape(launch['candidate'])}, "
                      f"{launch['replica_sets']} replica set(s)); SGLang in launch-sglang.sh, "
                      "TensorRT-LLM in launch-trtllm.sh")
        console.print(escape(launch["vllm"]["text"]), highlight=False)


def _print_limits(records: list[dict[str, Any]]) -> None:
    from servesim.capacity.limits import describe_limits

    console.print("[bold]decode batch limits[/] (cost model, one replica)")
    for record in records:
        name = escape(record["candidate"])
        if record.get("feasible"):
            console.print(f"  {name}: {describe_limits(record['decode_batch_limits'])}")
        else:
            console.print(f"  {name}: infeasible: {escape(record['infeasible_reason'])}")
