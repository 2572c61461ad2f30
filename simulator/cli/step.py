"""``servesim step``: how long does this iteration take on this hardware, and why?"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import JustifyMethod
from rich.table import Table

from servesim.cli.console import console as _console
from servesim.errors import ServesimError

if TYPE_CHECKING:
    from servesim.step_report import StepReport

GIB = 2**30


def parse_token_list(text: str, option: str) -> list[int]:
    """``"512,2048"`` -> ``[512, 2048]``; an empty string is an empty list."""
    if not text.strip():
        return []
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ServesimError(option, f"{text!r} is not a comma-separated list of integers",
                            "write e.g. 512,2048") from None
    if any(v < 0 for v in values):
        raise ServesimError(option, f"{text!r} has a negative length", "use lengths >= 0")
    return values


Opt = typer.Option


def step_command(
    model: Annotated[str, Opt(help="Built-in model name or path to a config.json")] = "llama-3-8b",
    hardware: Annotated[str, Opt(help="Built-in profile (name or prefix) or YAML path")] = "h100-sxm-80gb",
    tp: Annotated[int, Opt(help="Tensor-parallel degree")] = 1,
    prefill_tokens: Annotated[str, Opt(help="New tokens of each prefill chunk, e.g. 512,2048")] = "",
    prefill_context: Annotated[
        str, Opt(help="Tokens each chunk's request computed earlier (chunked prefill), e.g. 0,4096")] = "",
    decode_batch: Annotated[int, Opt(help="Requests decoding one token each")] = 0,
    decode_context: Annotated[int, Opt(help="Tokens already in each decoding request's KV cache")] = 0,
    weight_dtype: Annotated[str, Opt(help="bf16, fp16, fp8, int8, int4, nvfp4, mxfp4")] = "bf16",
    act_dtype: Annotated[str, Opt(help="bf16, fp16, fp8 (W8A8), int8, nvfp4/mxfp4 (W4A4)")] = "bf16",
    kv_dtype: Annotated[str, Opt(help="bf16, fp16, fp8, int8, int4")] = "bf16",
    group_size: Annotated[int, Opt(help="Group size of int4 scales")] = 128,
    expert_dtype: Annotated[
        str | None, Opt(help="Routed experts' weights when they differ (e.g. mxfp4 for gpt-oss)")] = None,
    gpu_memory_utilization: Annotated[
        float | None, Opt(help="Fraction of HBM the engine may use (default: the engine's)")] = None,
    engine: Annotated[str | None, Opt(
        help="Serving engine whose step cost and defaults apply (default: the default engine)")] = None,
    ideal: Annotated[bool, Opt(help="Pure roofline: efficiency 1, no launch or engine step cost")] = False,
    as_json: Annotated[bool, Opt("--json", help="Print one JSON object")] = False,
) -> None:
    """Predict one iteration's time with a per-operator breakdown and its bound."""
    from servesim.inputs.flag_names import as_flags

    try:
        _step(model, hardware, tp, prefill_tokens, prefill_context, decode_batch, decode_context,
              weight_dtype, act_dtype, kv_dtype, group_size, expert_dtype, gpu_memory_utilization, engine,
              ideal, as_json)
    except ServesimError as exc:  # the core names YAML keys (precision.weights); here they are flags
        raise as_flags(exc) from None


def _step(model: str, hardware: str, tp: int, prefill_tokens: str, prefill_context: str, decode_batch: int,
          decode_context: int, weight_dtype: str, act_dtype: str, kv_dtype: str, group_size: int,
          expert_dtype: str | None, gpu_memory_utilization: float | None, engine: str | None, ideal: bool,
          as_json: bool) -> None:
    from servesim.cost import BatchShape
    from servesim.dtypes import Precision
    from servesim.engines import DEFAULT_ENGINE, RuntimeCosts, make_engine
    from servesim.hardware_io import load_hardware
    from servesim.model_config import load_model
    from servesim.step_report import analyse_step

    if decode_batch < 0:
        raise ServesimError("--decode-batch", f"must be >= 0, got {decode_batch}", "use 0 or more")
    if decode_context < 0:
        raise ServesimError("--decode-context", f"must be >= 0, got {decode_context}", "use 0 or more")
    chunks = parse_token_list(prefill_tokens, "--prefill-tokens")
    if any(c == 0 for c in chunks):
        raise ServesimError("--prefill-tokens", "a prefill chunk of 0 tokens", "drop it")
    contexts = parse_token_list(prefill_context, "--prefill-context") or [0] * len(chunks)
    if len(contexts) != len(chunks):
        raise ServesimError("--prefill-context", f"{len(contexts)} values for {len(chunks)} chunks",
                            "give one context per --prefill-tokens entry")
    spec = load_model(model, "--model")
    profile = load_hardware(hardware, "--hardware")
    if ideal:
        profile = profile.ideal()
    precision = Precision.from_names(weight_dtype, act_dtype, kv_dtype, group_size, expert_dtype)
    batch = BatchShape.build(chunks, contexts, [decode_context] * decode_batch)
    report = analyse_step(spec, profile, batch, tp, precision, gpu_memory_utilization,
                          engine=make_engine(engine or DEFAULT_ENGINE, {}, "--engine"),
                          runtime=RuntimeCosts.none() if ideal else None)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        render(report)


def render(report: StepReport) -> None:
    cost, b, p = report.cost, report.batch, report.precision
    _console.print(
        f"[bold]{report.model.name}[/] on {report.tp}x [bold]{report.hardware.name}[/] "
        f"(tp {report.tp}); weights {p.weight.value}, activations {p.activation.value}, "
        f"KV cache {p.kv_cache.value}")
    parts = []
    if b.num_prefills:
        parts.append(f"{b.num_prefills} prefill chunk(s), {b.num_prefill_tokens:,} tokens")
    if b.num_decodes:
        parts.append(f"{b.num_decodes} decodes at context {int(b.decode_context.mean()):,}")
    _console.print(f"batch: {' + '.join(parts)} -> {b.num_new_tokens:,} new tokens, "
                   f"{b.num_logits} sampled")

    table = Table(show_edge=False, box=None, pad_edge=False)
    columns: list[tuple[str, JustifyMethod]] = [("operator", "left"), ("time (ms)", "right"),
                                                ("share", "right"), ("bound", "left")]
    for column, justify in columns:
        table.add_column(column, justify=justify)
    bounds = report.operator_bounds()
    for name, seconds in cost.breakdown.items():
        if seconds > 0:
            table.add_row(name, f"{seconds * 1e3:.3f}", f"{seconds / cost.time_s:.0%}",
                          bounds.get(name, ""))
    table.add_row("[bold]step[/]", f"[bold]{cost.time_s * 1e3:.3f}[/]", "100%",
                  f"[bold]{cost.bound}[/]")
    _console.print(table)

    ridge = report.hardware.ridge_point(p.math)
    _console.print(f"throughput: {report.tokens_per_s:,.0f} new tokens/s"
                   + (f", {report.decode_tokens_per_s:,.0f} decode tokens/s" if b.num_decodes else ""))
    _console.print(f"arithmetic intensity: {cost.arithmetic_intensity:,.1f} FLOP/byte "
                   f"(ridge of {report.hardware.name} in {p.math.value}: {ridge:,.0f})")
    mem = report.memory
    _console.print(
        f"memory per GPU: weights {mem.weight_bytes / GIB:.1f} GiB, activations "
        f"{mem.activation_bytes / GIB:.1f} GiB"
        f"{' (outside the engine fraction)' if mem.budget_rule == 'weights_and_kv' else ''}, "
        f"{f'recurrent state {mem.state_bytes / GIB:.1f} GiB, ' if mem.state_bytes else ''}"
        f"KV pool {mem.kv_cache_bytes / GIB:.1f} GiB = "
        f"{mem.kv_token_capacity:,} tokens; this batch holds {report.batch_kv_tokens:,} "
        f"({report.batch_kv_tokens / max(1, mem.kv_token_capacity):.0%})")
    if report.hardware.spec_only:
        _console.print("[dim]profile is spec-only: efficiencies are defaults, not yet fitted to "
                       "measurements (servesim hardware NAME shows their sources)[/]")
