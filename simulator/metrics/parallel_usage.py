"""How busy a pipelined replica's stages were (the ``parallelism`` summary section)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class PipelineCounters(Protocol):
    """What a pipelined replica counts as it runs
    (:class:`~servesim.core.parallel_replica.ParallelReplica`)."""

    busy_s: list[float]
    rank_wait_s: float
    rank_busy_s: float


def pipeline_usage(label: str, stage_layers: Sequence[int], replicas: Sequence[PipelineCounters],
                   span: float) -> dict[str, Any]:
    """Per stage the share of the run it held a micro-batch (mean over replicas); the bubble, the
    idle share of the stages' time next to the busiest stage (``1 - mean / max`` of the busy
    times: zero when every stage is as busy as the bottleneck); and the share of rank-time in the
    stages that data-parallel ranks spent waiting for the slowest rank."""
    stages = len(stage_layers)
    busy = [sum(r.busy_s[s] for r in replicas) / len(replicas) for s in range(stages)]
    top = max(busy)
    wait = sum(r.rank_wait_s for r in replicas)
    rank_busy = sum(r.rank_busy_s for r in replicas)
    return {"label": label, "stage_layers": list(stage_layers),
            "stage_busy_s": busy,
            "stage_busy_fraction": [b / span if span > 0 else 0.0 for b in busy],
            "bubble_fraction": 1.0 - sum(busy) / (stages * top) if top > 0 else 0.0,
            "dp_wait_fraction": wait / rank_busy if rank_busy > 0 else 0.0}
