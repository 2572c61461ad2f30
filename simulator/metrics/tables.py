"""The per-request table, its latency definitions, and the ITL table.

Definitions (those of vLLM's ``benchmark_serving``, per request):
TTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1), undefined for
one-token outputs; ITL = the gap between consecutive output tokens (a distribution over all
tokens); E2E = finish - arrival; queueing delay = first scheduled - arrival. Each is defined once,
in :func:`request_latencies`, which the request table, the summary and the capacity planner read.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servesim.core.state import DONE, REJECT_REASONS, REJECTED, STATUS_NAMES, UNFINISHED_NAME, RequestState

LATENCY_COLUMNS = ("queueing_s", "ttft_s", "tpot_s", "e2e_s")


def request_latencies(r: RequestState) -> dict[str, np.ndarray]:
    """Per request (NaN until reached): queueing delay, TTFT, TPOT (NaN for one-token outputs)
    and end-to-end latency, in seconds."""
    output = r.output
    tpot = np.full(len(r), np.nan)
    multi = (output > 1) & np.isfinite(r.finish)
    tpot[multi] = (r.finish[multi] - r.first_token[multi]) / (output[multi] - 1)
    return {"queueing_s": r.first_scheduled - r.arrival, "ttft_s": r.first_token - r.arrival,
            "tpot_s": tpot, "e2e_s": r.finish - r.arrival}


def status_names(r: RequestState) -> np.ndarray:
    """Each request's status by name; neither completed nor rejected is ``unfinished``."""
    status = np.asarray(STATUS_NAMES, dtype=object)[r.status]
    status[(r.status != DONE) & (r.status != REJECTED)] = UNFINISHED_NAME
    return status


def request_frame(r: RequestState, extra: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """One row per request: what it was, what happened to it, and its latencies; ``extra``
    columns (a topology's own) are appended."""
    latency = request_latencies(r)
    frame = pd.DataFrame({
        "request_id": np.arange(len(r), dtype=np.int64),
        "replica": _int64(r.replica),
        "arrival_s": r.arrival,
        "prompt_tokens": r.prompt,
        "output_tokens": r.output,
        "priority": r.table.priority,
        "status": status_names(r),
        "reject_reason": np.asarray(REJECT_REASONS, dtype=object)[r.reject_reason],
        "first_scheduled_s": r.first_scheduled,
        "first_token_s": r.first_token,
        "finish_s": r.finish,
        "preemptions": _int64(r.preemptions),
        "swaps_out": _int64(r.swaps_out),
        "swaps_in": _int64(r.swaps_in),
        "cached_tokens": _int64(r.cached_tokens),
        "queueing_s": latency["queueing_s"],
        "ttft_s": latency["ttft_s"],
        "tpot_s": latency["tpot_s"],
        "max_itl_s": r.max_itl,
        "e2e_s": latency["e2e_s"],
    }, copy=False)  # the finished run's columns, read in place: a long run's table is not held twice
    for name, column in (extra or {}).items():
        frame[name] = column
    return frame


def _int64(column: np.ndarray) -> np.ndarray:
    """A request-state counter (held in int32 while the run runs) in the table's dtype."""
    return column.astype(np.int64, copy=False)


def itl_frame(r: RequestState) -> pd.DataFrame:
    values, counts = r.itl.arrays()
    return pd.DataFrame({"itl_s": values, "count": counts}, copy=False)  # arrays() made them
