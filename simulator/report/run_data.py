"""What a run report shows: from a run in memory (:meth:`RunData.from_result`), or loaded from a
run directory exactly as it was saved (:func:`load_run`).

A report can be rebuilt from an archived run, so loading checks that the files and the columns the
report needs are there and turns anything missing into a one-line :class:`ServesimError` instead
of a pandas or pyarrow traceback. Files written by older versions may lack newer keys and
columns: the summary is read as a mapping with defaults, and optional columns get one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from servesim.core.step_log import OP_COLUMNS
from servesim.errors import ServesimError
from servesim.inputs.files import read_json, read_text
from servesim.report.hardware_roof import Roof, roof_of

if TYPE_CHECKING:
    from servesim.pipeline.result import RunResult

REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
ITL_FILE = "itl.parquet"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.resolved.yaml"
REPLICAS_FILE = "replicas.parquet"

REQUIRED_FILES = (REQUESTS_FILE, STEPS_FILE, ITL_FILE, SUMMARY_FILE)

# Columns the report reads; anything else in the files is ignored. Optional columns get a default.
REQUEST_COLUMNS = ("replica", "arrival_s", "output_tokens", "status", "first_token_s", "finish_s",
                   "ttft_s", "tpot_s", "e2e_s")
REQUEST_OPTIONAL = {"reject_reason": "", "max_itl_s": np.nan, "preemptions": 0, "prompt_tokens": np.nan}
STEP_COLUMNS = ("replica", "start_s", "duration_s", "num_prefills", "num_decodes", "prefill_tokens",
                "decode_tokens", "batch_size", "kv_blocks_used", "kv_blocks_total", "waiting", "running")
STEP_OPTIONAL: dict[str, str | float] = {
    "bound": "unknown", "preempted": 0, "flops": np.nan, "hbm_bytes": np.nan, "pool": "",
    **dict.fromkeys(OP_COLUMNS, np.nan),
    # runs written before speculative decoding existed did not speculate
    "op_proposal_s": 0.0, "proposed_tokens": 0, "accepted_tokens": 0, "verify_extra_s": 0.0}
ITL_COLUMNS = ("itl_s", "count")


@dataclass(frozen=True)
class RunData:
    """Everything one run report shows, as loaded from the run directory."""

    run_dir: Path
    requests: pd.DataFrame
    steps: pd.DataFrame
    itl_values: np.ndarray
    itl_counts: np.ndarray
    summary: dict[str, Any]
    config_text: str | None
    roof: Roof | str | None = None
    """The hardware roof of the steps (None: read from ``config_text``'s hardware)."""
    replicas: pd.DataFrame | None = None
    """A fleet's replica timeline (``replicas.parquet``); None for other runs."""

    @classmethod
    def from_result(cls, result: RunResult, run_dir: Path, config_text: str) -> RunData:
        """The report's data from a run in memory (no file is read back); ``config_text`` is its
        resolved configuration."""
        values, counts = result.request_state.itl.arrays()
        group = result.plan.topology.groups[0]
        requests = result.requests
        steps = result.steps
        for column, default in STEP_OPTIONAL.items():
            if column not in steps:
                steps = steps.assign(**{column: default})
        replicas = result.plan.topology.extra_tables(result.built).get(REPLICAS_FILE)
        return cls(run_dir=run_dir, requests=requests, steps=steps, itl_values=values.astype(float),
                   itl_counts=counts.astype(float), summary=result.summary.to_dict(),
                   config_text=config_text,
                   roof=roof_of(group.hardware, group.precision, group.tp), replicas=replicas)

    def completed(self) -> pd.DataFrame:
        """The completed requests: the population of the summary's latency statistics."""
        return self.requests[self.requests["status"] == "completed"]

    @property
    def num_replicas(self) -> int:
        """Replicas seen in the steps (or the deployment, if no step ran)."""
        if len(self.steps):
            return int(self.steps["replica"].nunique())
        deployment = self.summary.get("deployment") or {}
        return int(deployment.get("replicas") or 1)


def _missing_file(run_dir: Path, name: str) -> ServesimError:
    return ServesimError(
        "run_dir",
        f"{name} not found in {run_dir}",
        "run `servesim run` first and point the report at the run's output directory",
    )


def _unreadable(path: Path, exc: Exception) -> ServesimError:
    detail = " ".join(str(exc).split())[:120]
    return ServesimError("run_dir", f"{path.name} is not a readable Parquet file ({detail})",
                         "re-run the simulation to rewrite it")


def _read_table(path: Path, required: tuple[str, ...], optional: dict[str, Any]) -> pd.DataFrame:
    """Read only the needed columns; a column the engine did not write is an error or a default."""
    try:
        names = set(pq.read_schema(path).names)
    except Exception as exc:  # pyarrow raises several types for a corrupt or non-Parquet file
        raise _unreadable(path, exc) from None
    missing = [c for c in required if c not in names]
    if missing:
        raise ServesimError("run_dir", f"{path.name} lacks column(s) {', '.join(missing)}",
                            "re-run the simulation with this version of servesim")
    present_optional = [c for c in optional if c in names]
    try:
        frame = pq.read_table(path, columns=[*required, *present_optional]).to_pandas()
    except Exception as exc:  # a valid footer over corrupt pages
        raise _unreadable(path, exc) from None
    for column, default in optional.items():
        if column not in names:
            frame[column] = default
    return frame


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        summary = read_json(path, "run_dir")
    except ServesimError as exc:
        raise ServesimError("run_dir", exc.problem, "re-run the simulation to rewrite it") from None
    if not isinstance(summary, dict):
        raise ServesimError("run_dir", f"{path.name} does not hold a JSON object",
                            "re-run the simulation to rewrite it")
    return summary


def load_run(run_dir: Path) -> RunData:
    """Read a run directory; raise :class:`ServesimError` naming the first missing piece."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ServesimError("run_dir", f"{run_dir} is not a directory",
                            "run `servesim run` first and pass its output directory")
    for name in REQUIRED_FILES:
        if not (run_dir / name).is_file():
            if (run_dir / SUMMARY_FILE).is_file():  # a summary-only (or interrupted) run
                raise ServesimError("run_dir", f"{name} not found in {run_dir}",
                                    "re-run `servesim run` with output: full (--set output=full): a "
                                    "summary-only run keeps no tables to chart")
            raise _missing_file(run_dir, name)
    requests = _read_table(run_dir / REQUESTS_FILE, REQUEST_COLUMNS, REQUEST_OPTIONAL)
    steps = _read_table(run_dir / STEPS_FILE, STEP_COLUMNS, STEP_OPTIONAL)
    itl = _read_table(run_dir / ITL_FILE, ITL_COLUMNS, {})
    config_path = run_dir / CONFIG_FILE
    config_text = read_text(config_path, "run_dir") if config_path.is_file() else None
    replicas_path = run_dir / REPLICAS_FILE
    replicas = _read_table(replicas_path, ("time_s", "group", "ready", "provisioning", "draining"), {}) \
        if replicas_path.is_file() else None
    return RunData(
        run_dir=run_dir,
        requests=requests,
        steps=steps,
        itl_values=itl["itl_s"].to_numpy(dtype=float),
        itl_counts=itl["count"].to_numpy(dtype=float),
        summary=_read_summary(run_dir / SUMMARY_FILE),
        config_text=config_text,
        replicas=replicas,
    )
