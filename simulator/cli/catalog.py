"""``servesim models`` and ``servesim hardware``: what is built in, and where its numbers come from."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from servesim.cli.console import console as _console


def _print_table(title: str, rows: list[dict[str, object]]) -> None:
    table = Table(title=title, title_justify="left")
    for column in rows[0]:
        table.add_column(column, justify="left" if column in ("name", "gpu", "link") else "right")
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row.values()))
    _console.print(table)


def models_command(
    name: Annotated[str | None, typer.Argument(help="A model to describe in detail")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """List the built-in models, or describe one (a name or a path to a config.json)."""
    from servesim.model_config import builtin_model_names, load_model

    if name is not None:
        model = load_model(name)
        detail = {**model.summary(), "params": model.param_count,
                  "active_params": model.active_param_count,
                  "kv_bytes_per_token_bf16": model.kv_bytes_per_token("bf16"),
                  "weight_bytes_bf16": model.weight_bytes("bf16"),
                  "flops_per_token_at_context_0": model.flops_per_token(0),
                  "sliding_window": model.sliding_window, "source": model.source}
        if as_json:
            print(json.dumps(detail, indent=2))
        else:
            for key, value in detail.items():
                _console.print(f"[bold]{key:>30}[/]  {escape(str(value))}")
        return
    rows = [load_model(n).summary() for n in builtin_model_names()]
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table("Built-in models (configs/models/*.json, Hugging Face config.json format)", rows)


def hardware_command(
    name: Annotated[str | None, typer.Argument(help="A profile to describe with provenance")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """List the built-in hardware profiles, or show one with the source of every number."""
    from servesim.hardware_io import builtin_hardware_names, load_hardware

    if name is not None:
        profile = load_hardware(name)
        if as_json:
            print(json.dumps(profile.model_dump(mode="json"), indent=2))
            return
        for key, value in profile.summary().items():
            _console.print(f"[bold]{key:>22}[/]  {escape(str(value))}")
        _console.print("\n[bold]provenance[/]")
        for key, value in profile.provenance.items():  # its [...] are text, not console markup
            _console.print(f"  [bold]{key}[/]: {escape(str(value))}")
        return
    rows = [load_hardware(n).summary() for n in builtin_hardware_names()]
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table("Built-in hardware profiles (hardware_profiles/*.yaml); "
                     "spec-only = efficiencies not yet fitted to measurements", rows)
