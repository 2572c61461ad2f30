"""One benchmark run as ``from-benchmark`` replays it, whichever client wrote it
(:mod:`~servesim.calibration.benchmark_result`: vLLM and SGLang; :mod:`~servesim.calibration.
aiperf_result`: aiperf)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BenchmarkRun:
    """The successful requests of one benchmark run, in the order they were sent."""

    source: str
    tool: str
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    """Mean inter-token gap per request (NaN for one-token outputs)."""
    max_concurrency: int | None
    request_rate: float
    burstiness: float
    start_s: np.ndarray | None
    failed: int
    model: str

    def __len__(self) -> int:
        return int(self.prompt_tokens.size)
