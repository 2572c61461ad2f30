"""Building small experiments for the engine tests without YAML files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from servesim.config import ExperimentConfig, validate_document
from servesim.pipeline import RunResult, prepare, simulate
from servesim.workloads.requests import RequestTable

PLACEHOLDER_WORKLOAD = {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 1,
                        "lengths": {"preset": "azure-conversation"}}


def experiment(deployment: dict[str, Any] | None = None, **top: Any) -> ExperimentConfig:
    # Pinned to vLLM V0 (the default engine before it became V1): the tests built on this helper
    # check V0 scheduling by hand; pass engine=... for another.
    document: dict[str, Any] = {"model": "llama-3-8b", "hardware": "h100-sxm-80gb", "engine": "vllm-v0",
                                "workload": PLACEHOLDER_WORKLOAD, **top}
    if deployment:
        document["deployment"] = deployment
    return validate_document(document)


def table(arrivals: list[float] | np.ndarray, prompts: list[int] | np.ndarray | int,
          outputs: list[int] | np.ndarray | int) -> RequestTable:
    n = len(arrivals)
    prompt = np.full(n, prompts) if np.isscalar(prompts) else np.asarray(prompts)
    output = np.full(n, outputs) if np.isscalar(outputs) else np.asarray(outputs)
    return RequestTable(np.asarray(arrivals, dtype=float), prompt, output)


def run(config: ExperimentConfig, workload: RequestTable | None) -> RunResult:
    return simulate(prepare(config, workload=workload))


@dataclass
class Tables:
    """A run's tables, with the summary as ``summary.json`` holds it (tests index it by key)."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    itl: pd.DataFrame
    summary: dict[str, Any]


def tabulate(result: RunResult) -> Tables:
    return Tables(result.requests, result.steps, result.itl, result.summary.to_dict())


def assert_conserved(result: RunResult, tables: Any, blocks: int, block_size: int,
                     max_num_seqs: int | None = None) -> np.ndarray:
    """The invariants every policy keeps on one replica, whatever the traffic: exactly the requests
    that can never fit are rejected and every other one completes; KV blocks never exceed the pool
    and are all free at the end; no step seats more than ``max_num_seqs``; each request generates
    its outputs, each emitted once (ITL count = outputs - 1); time runs forward per request.
    Returns the mask of completed requests for the caller's policy-specific checks."""
    requests, steps = tables.requests, tables.steps
    prompt, output = requests["prompt_tokens"].to_numpy(), requests["output_tokens"].to_numpy()
    never_fits = -(-(prompt + output - 1) // block_size) > blocks
    assert (requests["status"] == "rejected").to_numpy().tolist() == never_fits.tolist()
    done = (requests["status"] == "completed").to_numpy()
    assert done.sum() + never_fits.sum() == len(requests)
    assert tables.summary["unfinished"] == 0
    assert (steps["kv_blocks_used"] <= blocks).all()
    for state in result.replica_states:
        assert state.pool.free == state.pool.total and not state.pool.held.any()
    if max_num_seqs is not None:
        assert (steps["running"] <= max_num_seqs).all()
    assert (result.request_state.generated[done] == output[done]).all()
    assert tables.itl["count"].sum() == (output[done] - 1).sum()
    timed = requests[done]
    assert (timed["first_scheduled_s"] >= timed["arrival_s"]).all()
    assert (timed["first_token_s"] >= timed["first_scheduled_s"]).all()
    assert (timed["finish_s"] >= timed["first_token_s"]).all()
    return done
