"""The per-request table, its latency definitions, and the ITL table.

Definitions (those of vLLM's ``benchmark_serving``, per request):
TTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1), undefined for
one-token outputs; ITL = the gap between consecutive output tokens (a distribution over all
tokens); E2E = finish - arrival; queueing delay = first scheduled - arrival. Each is defined once,
in :func:`request_latencies`, which the request table, the summary and the capacity planner read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from servesim.core.state import DONE, REJECT_REASONS, REJECTED, STATUS_NAMES, UNFINISHED_NAME, RequestState
from servesim.metrics.columns import ColumnTable

if TYPE_CHECKING:
    import pandas as pd

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


SUMMARY_UNREAD = ("request_id", "priority", "reject_reason", "swaps_out", "swaps_in", "max_itl_s")
"""The request table's columns that no summary figure reads: the summary's table goes without
them (see :func:`summary_requests`)."""


def request_frame(r: RequestState, extra: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """One row per request: what it was, what happened to it, and its latencies; ``extra``
    columns (a topology's own) are appended."""
    import pandas as pd

    # the finished run's columns, read in place: a long run's table is not held twice
    frame = pd.DataFrame(_request_columns(r, summary=False), copy=False)
    for name, values in (extra or {}).items():
        frame[name] = values
    return frame


def summary_requests(r: RequestState, extra: dict[str, np.ndarray] | None = None) -> ColumnTable:
    """The request table the summary reads, which a run that writes only its summary builds
    instead of :func:`request_frame` (at a million requests the whole table's new columns are some
    100 MiB, and pandas is not imported for it): without :data:`SUMMARY_UNREAD`, and the counters
    in the int32 the run keeps them in (the summary sums and compares them: the same figures)."""
    table = ColumnTable(_request_columns(r, summary=True))
    for name, values in (extra or {}).items():
        table[name] = values
    return table


def _request_columns(r: RequestState, summary: bool) -> dict[str, np.ndarray]:
    """The request table's columns (see :func:`request_frame` and :func:`summary_requests`);
    every one an array (``RequestTable`` makes ``priority`` zeros when it is not given)."""
    latency = request_latencies(r)
    counter: Callable[[np.ndarray], np.ndarray] = np.asarray if summary else _int64
    columns: dict[str, Callable[[], np.ndarray]] = {
        "request_id": lambda: np.arange(len(r), dtype=np.int64),
        "replica": lambda: counter(r.replica),
        "arrival_s": lambda: r.arrival,
        "prompt_tokens": lambda: r.prompt,
        "output_tokens": lambda: r.output,
        "priority": lambda: np.asarray(r.table.priority),
        "status": lambda: status_names(r),
        "reject_reason": lambda: np.asarray(REJECT_REASONS, dtype=object)[r.reject_reason],
        "first_scheduled_s": lambda: r.first_scheduled,
        "first_token_s": lambda: r.first_token,
        "finish_s": lambda: r.finish,
        "preemptions": lambda: counter(r.preemptions),
        "swaps_out": lambda: counter(r.swaps_out),
        "swaps_in": lambda: counter(r.swaps_in),
        "cached_tokens": lambda: counter(r.cached_tokens),
        "queueing_s": lambda: latency["queueing_s"],
        "ttft_s": lambda: latency["ttft_s"],
        "tpot_s": lambda: latency["tpot_s"],
        "max_itl_s": lambda: r.max_itl,
        "e2e_s": lambda: latency["e2e_s"],
    }
    return {name: make() for name, make in columns.items() if not (summary and name in SUMMARY_UNREAD)}


def _int64(column: np.ndarray) -> np.ndarray:
    """A request-state counter (held in int32 while the run runs) in the table's dtype."""
    return column.astype(np.int64, copy=False)


def itl_frame(r: RequestState) -> pd.DataFrame:
    """Every inter-token gap as (value, count) pairs, the counts in the table's int64."""
    import pandas as pd

    values, counts = r.itl.arrays()
    return pd.DataFrame({"itl_s": values, "count": counts.astype(np.int64)}, copy=False)  # arrays() made them


def summary_itl(r: RequestState) -> ColumnTable:
    """The ITL pairs the summary reads (it weighs the values by the counts: the same figures),
    the counts in the log's int32."""
    values, counts = r.itl.arrays()
    return ColumnTable({"itl_s": values, "count": counts})
