"""Writing a run's outputs: every file appears whole or not at all.

A run directory holds ``summary.json``, ``requests.parquet``, ``steps.parquet``, ``itl.parquet``
(the inter-token latencies as (value, count) pairs), ``config.resolved.yaml`` (the experiment with
every default filled in; ``servesim run`` accepts it as is) and ``report.html``. Each file is
written to a temporary name in the same folder and renamed into place, so an interrupted run never
leaves a truncated file that a later reader would trust.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from servesim.atomic_io import atomic_write, atomic_write_text, make_output_dir
from servesim.engine.simulation import SimulationResult
from servesim.metrics.tables import itl_frame, request_frame, summarise


@dataclass
class RunTables:
    requests: pd.DataFrame
    steps: pd.DataFrame
    itl: pd.DataFrame
    summary: dict[str, Any]


def tabulate(result: SimulationResult) -> RunTables:
    requests = request_frame(result)
    steps = result.steps.to_frame([s.limits.num_blocks for s in result.replica_states], result.pools)
    itl = itl_frame(result)
    return RunTables(requests, steps, itl, summarise(result, requests, itl, steps))


def resolved_config_yaml(result: SimulationResult) -> str:
    """The experiment as run: the engine limits vLLM would derive are written in explicitly."""
    document = result.config.model_dump(mode="json")
    _absolute_paths(document["workload"], result.base_dir)
    if result.pools is not None:
        return _resolved_disaggregated(result, document)
    limits = result.deployment.limits
    document["deployment"]["max_num_batched_tokens"] = limits.max_num_batched_tokens
    document["deployment"]["max_model_len"] = limits.max_model_len
    memory = result.deployment.memory
    header = (f"# Resolved by servesim: {limits.num_blocks:,} KV blocks of {limits.block_size} tokens "
              f"per replica ({memory.kv_token_capacity:,} tokens, "
              f"{memory.kv_cache_bytes / 2**30:.1f} GiB per GPU).\n")
    return header + yaml.safe_dump(document, sort_keys=False)


def _resolved_disaggregated(result: SimulationResult, document: dict[str, Any]) -> str:
    """Each pool's derived limits written into its section of ``policy``."""
    deployment = result.deployment
    header = "# Resolved by servesim (disaggregated):"
    document["policy"] = {"name": document["policy"]["name"],
                          **deployment.options.model_dump(mode="json")}  # type: ignore[attr-defined]
    for name in ("prefill", "decode"):
        pool = deployment.pool(name)  # type: ignore[attr-defined]
        limits, memory = pool.limits, pool.memory
        section = document["policy"][name]
        section.update({"max_num_batched_tokens": limits.max_num_batched_tokens,
                        "max_num_seqs": limits.max_num_seqs, "tp": pool.tp})
        header += (f" {name}: {limits.num_blocks:,} KV blocks of {limits.block_size} tokens per "
                   f"replica ({memory.kv_cache_bytes / 2**30:.1f} GiB per GPU);")
    document["deployment"]["max_model_len"] = deployment.prefill.limits.max_model_len  # type: ignore[attr-defined]
    return header.rstrip(";") + ".\n" + yaml.safe_dump(document, sort_keys=False)


def _absolute_paths(workload: dict[str, Any], base_dir: Path | None) -> None:
    """Trace paths as absolute paths, so the resolved file runs from its own folder too."""
    for section in ("trace", "lengths"):
        part = workload.get(section)
        key = "path" if section == "trace" else "trace"
        if isinstance(part, dict) and part.get(key):
            path = Path(part[key]).expanduser()
            part[key] = str((base_dir / path if base_dir and not path.is_absolute() else path).resolve())


OUTPUT_FILES = ("requests.parquet", "steps.parquet", "itl.parquet", "report.html")
"""Written for ``output: full``; removed from the folder otherwise, so none is left from an earlier
run beside the new summary."""


def write_run(result: SimulationResult, out_dir: Path, report: bool = True) -> RunTables:
    """Write a run directory (see the module docstring); returns the tables written."""
    make_output_dir(out_dir)
    tables = tabulate(result)
    atomic_write_text(out_dir / "config.resolved.yaml", resolved_config_yaml(result))
    if result.config.output == "full":
        for name, frame in (("requests", tables.requests), ("steps", tables.steps),
                            ("itl", tables.itl)):
            atomic_write(out_dir / f"{name}.parquet",
                         lambda tmp, frame=frame: frame.to_parquet(tmp, index=False))
    atomic_write_text(out_dir / "summary.json", json.dumps(tables.summary, indent=2) + "\n")
    if report and result.config.output == "full":
        from servesim.report import write_run_report

        write_run_report(out_dir)
    else:
        (out_dir / "report.html").unlink(missing_ok=True)
    if result.config.output != "full":
        for name in OUTPUT_FILES:
            (out_dir / name).unlink(missing_ok=True)
    return tables
