"""``render(result, out_dir)``: a run's files, each written whole or not at all.

A run directory holds ``summary.json``, ``config.resolved.yaml`` (the experiment with every
default the engine and topology derived written in; ``servesim run`` accepts it as is) and, for
``output: full``, ``requests.parquet``, ``steps.parquet``, ``itl.parquet`` (the inter-token
latencies as (value, count) pairs) and ``report.html`` (built from the result in memory).
:func:`result_files` gives the same files as bytes, which sweep workers send back instead of
writing a temporary folder.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from servesim.atomic_io import atomic_write_bytes, make_output_dir, write_error
from servesim.config import absolute_trace_paths

if TYPE_CHECKING:
    import pandas as pd

    from servesim.pipeline.result import RunResult

SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.resolved.yaml"
TABLE_FILES = ("requests.parquet", "steps.parquet", "itl.parquet")
REPORT_FILE = "report.html"
STAGING_PREFIX = ".tmp-render-"
OUTPUT_FILES = (*TABLE_FILES, REPORT_FILE)
"""Written for ``output: full``; removed from the folder otherwise, so none is left from an earlier
run beside the new summary."""


def resolved_config_yaml(result: RunResult) -> str:
    """The experiment as run: the engine, its version, and the engine arguments the topology
    derived are written in explicitly."""
    import yaml  # here: a plan (validate) writes nothing

    plan = result.plan
    topology = plan.topology
    document = plan.config.model_dump(mode="json")
    absolute_trace_paths(document["workload"], plan.base_dir)
    document["engine"] = topology.engine.knob_values()
    document["policy"]["name"] = document["policy"]["name"] or topology.engine.defaults.policy
    header = topology.resolved_deployment(document["deployment"])
    for key in ("prefill", "decode", "link", "groups"):  # the other topologies' keys
        if document["deployment"].get(key) is None:
            document["deployment"].pop(key, None)
    return f"# Resolved by servesim: {header}.\n" + yaml.safe_dump(document, sort_keys=False)


def _parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def result_files(result: RunResult) -> dict[str, bytes]:
    """The run's files (without the report) as bytes, by name."""
    files = {CONFIG_FILE: resolved_config_yaml(result).encode()}
    if result.plan.config.output == "full":
        files["requests.parquet"] = _parquet(result.requests)
        files["steps.parquet"] = _parquet(result.steps)
        files["itl.parquet"] = _parquet(result.itl)
        for name, frame in result.plan.topology.extra_tables(result.built).items():
            files[name] = _parquet(frame)
    files[SUMMARY_FILE] = (json.dumps(result.summary.to_dict(), indent=2) + "\n").encode()
    return files


def render(result: RunResult, out_dir: Path, report: bool = True, plotlyjs: str = "inline") -> list[Path]:
    """Write the run directory (see the module docstring); returns the files written. ``plotlyjs``
    is how the report loads plotly.js (``inline``, ``cdn`` or ``directory``; see
    :mod:`servesim.report.page`).

    Every file is first written into a staging folder inside ``out_dir``, so a full disk or an
    interrupt leaves an earlier run in ``out_dir`` untouched; only then are the files renamed into
    place, ``summary.json`` last. A folder with a ``summary.json`` is therefore always a whole
    run, and one without it never looks like one."""
    make_output_dir(out_dir)
    remove_stale_staging(out_dir)
    files = result_files(result)
    full = result.plan.config.output == "full"
    try:
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
    except OSError as exc:
        raise write_error(out_dir, exc) from None
    try:
        for name, content in files.items():
            atomic_write_bytes(staging / name, content)
        if report and full:
            # plotly loads only when a report is written
            from servesim.report.page import check_plotlyjs
            from servesim.report.run_data import RunData
            from servesim.report.run_report import write_run_report

            data = RunData.from_result(result, out_dir, files[CONFIG_FILE].decode())
            write_run_report(out_dir, out=staging / REPORT_FILE, data=data,
                             plotlyjs=check_plotlyjs(plotlyjs))
        return _publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, out_dir: Path) -> list[Path]:
    """Rename the staged files into ``out_dir`` (renames take no space), the summary last, and
    remove the outputs an earlier run left that this one does not write."""
    written = []
    try:
        (out_dir / SUMMARY_FILE).unlink(missing_ok=True)  # from here the folder is not a finished run
        staged = sorted(p.name for p in staging.iterdir() if p.name != SUMMARY_FILE)
        for name in OUTPUT_FILES:
            if name not in staged:
                (out_dir / name).unlink(missing_ok=True)
        for name in (*staged, SUMMARY_FILE):
            os.replace(staging / name, out_dir / name)
            written.append(out_dir / name)
    except OSError as exc:
        raise write_error(out_dir, exc) from None
    return written


def remove_stale_staging(out_dir: Path) -> None:
    """Delete staging folders an interrupted render left (kill -9 gives no chance to clean up)."""
    for folder in out_dir.glob(f"{STAGING_PREFIX}*") if out_dir.is_dir() else ():
        shutil.rmtree(folder, ignore_errors=True)
