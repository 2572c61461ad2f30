"""Reading an aiperf run: NVIDIA's benchmark client, the one AIConfigurator's and Dynamo's recipes
drive (``aiperf profile --concurrency N --isl ... --osl ... --streaming``).

aiperf writes an artifact directory; two of its files say what ``from-benchmark`` needs
(aiperf's "Working with Profile Export Files" tutorial):

- ``profile_export.jsonl``: one JSON object per request of the profiling phase, ``{"metadata":
  {..., "request_start_ns", "benchmark_phase"}, "metrics": {"input_sequence_length": {"value",
  "unit"}, "output_sequence_length", "time_to_first_token", "inter_token_latency", ...}, "error":
  null or {...}}``. Failed requests carry an ``error`` and are counted and left out; records of
  any phase other than ``profiling`` (warm-up) are left out without being counted.
- ``profile_export_aiperf.json``: the aggregates and ``input_config``, whose ``loadgen`` section
  holds ``concurrency`` and ``request_rate`` (aiperf says that section is not stable across
  versions, so the ``cli_command`` it also records, ``--concurrency N`` / ``--request-rate R``, is
  read when ``loadgen`` lacks them).

How the requests were sent decides how they are replayed, as for the other tools
(:mod:`~servesim.calibration.benchmark_result`): by ``concurrency`` closed-loop clients when it is
set (a rate beside it is not replayed, as for the other tools); at a rate alone, at the recorded
start times.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from servesim.calibration.benchmark_run import BenchmarkRun
from servesim.errors import ServesimError
from servesim.inputs.files import read_text

RECORDS = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"
PROFILING = "profiling"
SECONDS_PER = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
"""A metric's ``unit`` -> seconds per unit (aiperf reports latencies in ms)."""
FIX = "give aiperf's artifact directory (with profile_export.jsonl and profile_export_aiperf.json)"


def is_aiperf(path: Path) -> bool:
    """An aiperf artifact directory, or a JSON-lines file whose first record has aiperf's
    ``metadata`` and ``metrics``."""
    path = Path(path)
    if path.is_dir():
        return (path / RECORDS).is_file()
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as handle:
        first = next((line for line in handle if line.strip()), "")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and "metadata" in record and "metrics" in record


def _seconds(metric: Any, where: str) -> float:
    """A ``{"value", "unit"}`` latency in seconds (NaN when absent)."""
    if metric is None:
        return math.nan
    if not isinstance(metric, dict) or "value" not in metric:
        raise ServesimError(where, f"{metric!r} is not a {{value, unit}} metric",
                            "give an unedited aiperf export")
    unit = str(metric.get("unit", "ms"))
    if unit not in SECONDS_PER:
        raise ServesimError(where, f"unit {unit!r} is not a time unit", "give an unedited aiperf export")
    return float(metric["value"]) * SECONDS_PER[unit]


def _count(metrics: dict[str, Any], *names: str) -> float:
    for name in names:
        metric = metrics.get(name)
        if isinstance(metric, dict) and metric.get("value") is not None:
            return float(metric["value"])
    return math.nan


def _flag(command: str, flag: str) -> str | None:
    match = re.search(rf"{re.escape(flag)}[ =]\"?([0-9.eE+-]+|inf)", command)
    return match.group(1) if match else None


def _sent_order(session: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Records in the order aiperf sent them: by ``session_num`` (its request counter), else by
    start time, else as written (aiperf writes them as they complete). A closed loop's replay
    hands the requests to its clients in this order, so it decides which client sends which."""
    for key in (session, start):
        if np.isfinite(key).all():
            return np.argsort(key, kind="stable")
    return np.arange(session.size)


def load_settings(summary: Path) -> tuple[int | None, float]:
    """(concurrency or None, request rate or inf) from aiperf's ``profile_export_aiperf.json``."""
    if not summary.is_file():
        raise ServesimError(str(summary), "is missing: how aiperf sent the requests is unknown", FIX)
    try:
        document = json.loads(read_text(summary, "aiperf summary"))
    except json.JSONDecodeError as exc:
        raise ServesimError(str(summary), f"not JSON (line {exc.lineno}: {exc.msg})", FIX) from None
    config = document.get("input_config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise ServesimError(f"{summary}: input_config", "is missing", FIX)
    section = config.get("loadgen")
    loadgen: dict[str, Any] = section if isinstance(section, dict) else {}
    command = str(config.get("cli_command") or "")
    concurrency = loadgen.get("concurrency")
    if concurrency is None and (value := _flag(command, "--concurrency")) is not None:
        concurrency = float(value)
    rate = loadgen.get("request_rate")
    if rate is None and (value := _flag(command, "--request-rate")) is not None:
        rate = float(value)
    if concurrency is not None:
        if float(concurrency) != int(float(concurrency)) or int(float(concurrency)) < 1:
            raise ServesimError(f"{summary}: input_config.loadgen.concurrency",
                                f"{concurrency!r} is not a positive integer", FIX)
        concurrency = int(float(concurrency))
    request_rate = math.inf if rate is None else float(rate)
    if not request_rate > 0:
        raise ServesimError(f"{summary}: input_config.loadgen.request_rate", f"{rate!r} is not positive", FIX)
    if concurrency is None and math.isinf(request_rate):
        raise ServesimError(f"{summary}: input_config", "gives neither a concurrency nor a request rate", FIX)
    return concurrency, request_rate


def read_aiperf(path: Path) -> BenchmarkRun:
    """The profiling phase of the aiperf run at ``path`` (its artifact directory, or its
    ``profile_export.jsonl`` with ``profile_export_aiperf.json`` beside it)."""
    path = Path(path)
    records_path = path / RECORDS if path.is_dir() else path
    concurrency, request_rate = load_settings(records_path.parent / SUMMARY)
    rows: list[tuple[float, float, float, float, float, bool, float]] = []
    for number, line in enumerate(read_text(records_path, "aiperf records").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{records_path}: line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ServesimError(where, f"not JSON ({exc.msg})", FIX) from None
        metadata = record.get("metadata") if isinstance(record, dict) else None
        if not isinstance(metadata, dict):
            raise ServesimError(where, "has no metadata", FIX)
        if metadata.get("benchmark_phase", PROFILING) != PROFILING:
            continue
        metrics = record.get("metrics") or {}
        start_ns = metadata.get("request_start_ns")
        start = float(start_ns) * 1e-9 if start_ns is not None else math.nan
        prompt = _count(metrics, "input_sequence_length")
        output = _count(metrics, "output_sequence_length", "output_token_count")
        ttft = _seconds(metrics.get("time_to_first_token"), f"{where}: time_to_first_token")
        tpot = _seconds(metrics.get("inter_token_latency"), f"{where}: inter_token_latency")
        ok = (record.get("error") is None and not metadata.get("was_cancelled", False)
              and prompt >= 1 and output >= 1 and math.isfinite(ttft) and ttft > 0)
        session = metadata.get("session_num")
        sent = float(session) if session is not None else math.nan
        rows.append((start, prompt, output, ttft, tpot, ok, sent))
    if not rows:
        raise ServesimError(str(records_path), "holds no profiling record", FIX)
    table = np.array(rows, dtype=float)
    table = table[_sent_order(table[:, 6], table[:, 0])]
    ok = table[:, 5].astype(bool)
    if not ok.any():
        raise ServesimError(str(records_path), "has no successful request",
                            "give the export of a run that worked")
    good = table[ok]
    start_s = good[:, 0] - good[:, 0].min() if np.isfinite(good[:, 0]).all() else None
    gaps = np.where(good[:, 2] > 1, good[:, 4], np.nan)
    return BenchmarkRun(
        source=str(path), tool="aiperf", prompt_tokens=good[:, 1].astype(np.int64),
        output_tokens=good[:, 2].astype(np.int64), ttft_s=good[:, 3], tpot_s=gaps,
        max_concurrency=concurrency, request_rate=request_rate, burstiness=1.0, start_s=start_s,
        failed=int((~ok).sum()), model="")
