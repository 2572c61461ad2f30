"""The run's numbers under ``vllm bench serve``'s names and units, beside servesim's own.

``summary.json`` keeps its stable keys (seconds, nested: ``ttft_s.p99``) and adds, at its end,
the flat keys ``vllm bench serve --save-result`` writes (``vllm/benchmarks/serve.py``), so one
script reads a simulated run and a real benchmark alike::

    duration, failed, total_input_tokens, total_output_tokens, request_throughput,
    request_goodput, output_throughput, total_token_throughput, max_output_tokens_per_s,
    max_concurrent_requests, and per metric (ttft, tpot, itl, e2el) in milliseconds:
    mean_<m>_ms, median_<m>_ms, std_<m>_ms, p<P>_<m>_ms for each P of --metric-percentiles

(``completed`` is already a stable key with vLLM's meaning.) Definitions follow vLLM's: over the
completed requests; TPOT only for outputs longer than one token; ITL pooled over every gap;
``std`` the population standard deviation (``np.std``); percentiles by linear interpolation;
``P`` written as vLLM writes it (``p99``, ``p99.9``). ``max_output_tokens_per_s`` counts output
tokens per whole second since the first arrival, each token at the moment it was emitted (a
request's first token at its first-token time, a decode step's tokens at the step's end), and
``max_concurrent_requests`` is the most completed requests in flight at once (arrival to
finish, a finish before an arrival at the same instant). A statistic of no value is ``null``
(vLLM writes 0 there).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from servesim.core.step_log import StepColumns
from servesim.metrics.columns import Table, column, select
from servesim.metrics.stats import merge_weighted, weighted_mean_std, weighted_percentile

DEFAULT_PERCENTILES = (99.0,)
"""vLLM's ``--metric-percentiles`` default."""
BENCH_METRICS = ("ttft", "tpot", "itl", "e2el")
FIXED_KEYS = ("duration", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
              "request_goodput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
              "max_concurrent_requests")
STAT_KEY = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def is_benchmark_key(key: str) -> bool:
    """Whether ``key`` of a summary is one of vLLM's benchmark names (these are not sweep metrics:
    they restate servesim's own in other units)."""
    return key in FIXED_KEYS or STAT_KEY.match(key) is not None


def percentile_word(p: float) -> str:
    """``99`` -> ``"99"``, ``99.9`` -> ``"99.9"`` (vLLM's ``p_word``)."""
    return str(int(p)) if int(p) == p else str(p)


def _stats(values: np.ndarray, counts: np.ndarray | None, name: str, percentiles: tuple[float, ...]
           ) -> dict[str, float | None]:
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms",
            *(f"p{percentile_word(p)}_{name}_ms" for p in percentiles)]
    keep = np.isfinite(values) if counts is None else np.isfinite(values) & (counts > 0)
    if not keep.all():  # (a long run's values all count: no copy of them)
        values, counts = values[keep], None if counts is None else counts[keep]
    if values.size == 0:
        return dict.fromkeys(keys)
    mean, std = weighted_mean_std(values, counts)
    points = weighted_percentile(values, counts, np.asarray([50.0, *percentiles]))
    assert isinstance(points, np.ndarray)
    stats = [mean, float(points[0]), std, *(float(v) for v in points[1:])]
    return {key: value * 1e3 for key, value in zip(keys, stats, strict=True)}


def _completed(requests: Table, columns: list[str]) -> Table:
    """The completed requests' ``columns`` (a copy of what is read, not of the whole table; when
    every request completed, those columns as they are: a long run's are not copied)."""
    completed = column(requests, "status") == "completed"
    return select(requests, None if bool(completed.all()) else completed, columns)


BUCKET_CHUNK = 1 << 20
"""Steps bucketed at a time by :func:`max_output_tokens_per_s` (a long run's steps table is not
copied whole into temporaries)."""


def max_output_tokens_per_s(requests: Table, steps: Table) -> float:
    """Most output tokens emitted in one whole second since the first arrival (vLLM's buckets).

    Each bucket's sum is of whole token counts (exact in floats, in any order), so the steps are
    bucketed a chunk at a time and the chunks' sums added: the same number as one ``bincount``
    over every emission, without holding every step's end, bucket and weight at once."""
    done = _completed(requests, ["first_token_s"])
    if not len(done):
        return 0.0
    start = float(column(requests, "arrival_s").min())
    first = column(done, "first_token_s").astype(float, copy=False)
    totals = _bucket_sums(np.zeros(0), first, np.ones(len(done)), start)
    if len(steps):
        ends = _step_ends(steps)
        tokens = column(steps, "decode_tokens")
        for low in range(0, len(steps), BUCKET_CHUNK):
            high = low + BUCKET_CHUNK
            totals = _bucket_sums(totals, ends(low, high), tokens[low:high].astype(float), start)
    return float(totals.max()) if totals.size else 0.0


def _step_ends(steps: Table) -> Callable[[int, int], np.ndarray]:
    """Steps ``low:high``'s ends, ``start_s + duration_s``. The summary's steps of a run with one
    replica group (:class:`~servesim.core.step_log.StepColumns`) are added in the step log, which
    never holds both columns whole (at a million requests each is 29 MiB); a table's, a chunk at
    a time. The same floats either way."""
    if isinstance(steps, StepColumns):
        ends = steps.ends()
        return lambda low, high: ends[low:high]
    begins, durations = column(steps, "start_s"), column(steps, "duration_s")
    return lambda low, high: (begins[low:high] + durations[low:high]).astype(float, copy=False)


def _bucket_sums(totals: np.ndarray, times: np.ndarray, weights: np.ndarray, start: float) -> np.ndarray:
    """``totals`` plus the ``weights`` of the emissions at ``times`` summed per whole second since
    ``start`` (emissions before it, or of no token, are left out)."""
    buckets = np.floor(times - start).astype(np.int64)
    keep = (buckets >= 0) & (weights > 0)
    if not keep.any():
        return totals
    sums = np.bincount(buckets[keep], weights=weights[keep])
    if sums.size > totals.size:
        sums[:totals.size] += totals
        return sums
    totals = totals.copy()
    totals[:sums.size] += sums
    return totals


def max_concurrent_requests(requests: Table) -> int:
    """Most completed requests between arrival and finish at once (half-open intervals)."""
    done = _completed(requests, ["arrival_s", "finish_s"])
    if not len(done):
        return 0
    arrivals = np.sort(column(done, "arrival_s").astype(float, copy=False))
    finishes = np.sort(column(done, "finish_s").astype(float, copy=False))
    return _most_in_flight(arrivals, finishes)


def _most_in_flight(arrivals: np.ndarray, finishes: np.ndarray) -> int:
    """The most of the intervals in flight at once, from their sorted arrivals and finishes: the
    count peaks just after an arrival, where it is the arrivals so far less the finishes up to
    that instant (a finish at the very instant of an arrival goes first). This is the running sum
    of +1 per arrival and -1 per finish in time order, without sorting the two together (at a
    million requests that sort's arrays were five of two million values each)."""
    most = 0
    for low in range(0, arrivals.size, BUCKET_CHUNK):
        part = arrivals[low:low + BUCKET_CHUNK]
        in_flight = np.arange(low + 1, low + part.size + 1) - np.searchsorted(finishes, part, side="right")
        most = max(most, int(in_flight.max()))
    return most


def benchmark_names(requests: Table, itl: Table, steps: Table, span: float,
                    goodput: float | None, percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
                    ) -> dict[str, Any]:
    """The flat vLLM-named section of ``summary.json`` (see the module docstring)."""
    done = _completed(requests, ["prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s"])
    input_tokens = int(column(done, "prompt_tokens").sum())
    output_tokens = int(column(done, "output_tokens").sum())
    out: dict[str, Any] = {
        "duration": span,
        "failed": int(len(requests) - len(done)),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / span,
        "request_goodput": goodput,
        "output_throughput": output_tokens / span,
        "total_token_throughput": (input_tokens + output_tokens) / span,
        "max_output_tokens_per_s": max_output_tokens_per_s(requests, steps),
        "max_concurrent_requests": max_concurrent_requests(requests),
    }
    multi = column(done, "output_tokens") > 1

    def floats(table: Table, name: str) -> np.ndarray:
        return column(table, name).astype(float, copy=False)

    series = {"ttft": (floats(done, "ttft_s"), None),
              "tpot": (floats(done, "tpot_s")[multi], None),
              # the counts as they are (whole numbers: the same sums as floats, without a float copy)
              "itl": merge_weighted(floats(itl, "itl_s"), column(itl, "count")),
              "e2el": (floats(done, "e2e_s"), None)}
    for name in BENCH_METRICS:
        values, counts = series[name]
        out.update(_stats(np.asarray(values, float), None if counts is None else np.asarray(counts, float),
                          name, percentiles))
    return out
