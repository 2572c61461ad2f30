"""Reading a user's own benchmark run: ``vllm bench serve`` and SGLang ``bench_serving`` results
(and aiperf's artifact directory, :mod:`~servesim.calibration.aiperf_result`).

``vllm bench serve --save-result --save-detailed`` writes one JSON object
(``vllm/benchmarks/serve.py``): the run's settings (``request_rate``, a number or ``"inf"``;
``burstiness``; ``max_concurrency``, null when unbounded; ``model_id``; ``num_prompts``) and per
request ``input_lens``, ``output_lens``, ``ttfts`` (seconds), ``itls`` (a list of gaps in seconds
per request) and ``errors`` (empty when it succeeded); recent versions add ``start_times``. SGLang's
``python -m sglang.bench_serving --output-file F --output-details`` appends one JSON object per run
to a JSON-lines file with the same per-request keys and ``request_rate`` (``Infinity`` when
unbounded) and ``max_concurrency``; the last line is read. Failed requests are left out and
counted.

How the requests were sent decides how they are replayed: with ``max_concurrency`` by that many
closed-loop clients (both tools hold a semaphore of that size); at an infinite rate all at t = 0;
at a finite rate at the recorded ``start_times`` when present, else as the tools draw them
(gamma gaps with the run's burstiness, Poisson at 1), from a seed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from servesim.calibration.aiperf_result import is_aiperf, read_aiperf
from servesim.calibration.benchmark_run import BenchmarkRun
from servesim.errors import ServesimError
from servesim.inputs.files import read_text

PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls")


def _document(path: Path) -> tuple[dict[str, Any], str]:
    text = read_text(path, "benchmark result")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ServesimError(str(path), "is empty", "give the --save-result file of vllm bench serve or "
                            "the --output-file of sglang.bench_serving")
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        try:  # JSON lines (SGLang appends one run per line): the last run
            document = json.loads(lines[-1])
        except json.JSONDecodeError as exc:
            raise ServesimError(str(path), f"not JSON (line {exc.lineno}: {exc.msg})",
                                "give a vllm bench serve or sglang.bench_serving result file") from None
    if not isinstance(document, dict):
        raise ServesimError(str(path), "does not hold a JSON object", "give one benchmark result")
    tool = "vllm" if "model_id" in document or "endpoint_type" in document else "sglang"
    return document, tool


def _rate(value: Any, path: Path) -> float:
    if value is None or (isinstance(value, str) and value.lower() in ("inf", "infinity")):
        return math.inf
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise ServesimError(f"{path}: request_rate", f"{value!r} is not a rate",
                            "give a number or inf") from None
    if not rate > 0:
        raise ServesimError(f"{path}: request_rate", f"{rate} is not positive", "give a positive rate or inf")
    return rate


def read_benchmark(path: Path) -> BenchmarkRun:
    """The run in ``path`` (a vLLM JSON or SGLang JSON-lines result, detected from its keys, or an
    aiperf artifact directory or ``profile_export.jsonl``)."""
    path = Path(path)
    if is_aiperf(path):
        return read_aiperf(path)
    document, tool = _document(path)
    missing = [key for key in PER_REQUEST if key not in document]
    if missing:
        raise ServesimError(f"{path}", f"has no per-request {', '.join(missing)}",
                            "run the benchmark with --save-detailed (vLLM) or --output-details (SGLang)")
    n = len(document["input_lens"])
    for key in (*PER_REQUEST, "errors"):
        if key in document and len(document[key]) != n:
            raise ServesimError(f"{path}: {key}", f"has {len(document[key])} entries for {n} requests",
                                "give an unedited result file")
    errors = document.get("errors") or [""] * n
    prompt = np.asarray(document["input_lens"], dtype=float)
    output = np.asarray(document["output_lens"], dtype=float)
    ttft = np.asarray([t if t is not None else np.nan for t in document["ttfts"]], dtype=float)
    ok = np.array([not e for e in errors]) & (output >= 1) & (prompt >= 1) & np.isfinite(ttft) & (ttft > 0)
    if not ok.any():
        raise ServesimError(f"{path}", "has no successful request", "give the result of a run that worked")
    itls = [document["itls"][i] for i in np.flatnonzero(ok)]
    tpot = np.array([float(np.mean(gaps)) if len(gaps) else np.nan for gaps in itls])
    concurrency = document.get("max_concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise ServesimError(f"{path}: max_concurrency", f"{concurrency!r} is not a positive integer",
                            "give an unedited result file")
    start = document.get("start_times")
    start_s = None
    if start is not None and len(start) == n:
        start_s = np.asarray(start, dtype=float)[ok]
        start_s = start_s - start_s.min()
    return BenchmarkRun(
        source=str(path), tool=tool, prompt_tokens=prompt[ok].astype(np.int64),
        output_tokens=output[ok].astype(np.int64), ttft_s=ttft[ok], tpot_s=tpot,
        max_concurrency=concurrency, request_rate=_rate(document.get("request_rate"), path),
        burstiness=float(document.get("burstiness") or 1.0), start_s=start_s, failed=int((~ok).sum()),
        model=str(document.get("model_id") or document.get("model") or ""))
