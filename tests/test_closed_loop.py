"""Closed-loop clients (``process: closed``) and ``rate: inf``, checked against queueing laws."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from engine_helpers import run, tabulate

from servesim import BatchShape
from servesim.config import validate_document
from servesim.errors import ServesimError
from servesim.topology.resolve import resolve_topology


def closed(concurrency: int, requests: int, prompt: int, output: int, think: float | None = None,
           engine: str = "vllm-v0", **deployment: Any) -> dict[str, Any]:
    arrival: dict[str, Any] = {"process": "closed", "concurrency": concurrency}
    if think is not None:
        arrival["think_time_s"] = think
    return {"model": "llama-3-8b", "hardware": "h100-sxm-80gb", "engine": engine,
            "deployment": deployment or {}, "workload": {
                "arrival": arrival, "num_requests": requests,
                "prompt": {"dist": "fixed", "value": prompt}, "output": {"dist": "fixed", "value": output}}}


@pytest.mark.parametrize("think", [0.0, 0.05])
def test_a_closed_loop_with_a_fixed_service_time_obeys_littles_law_exactly(think: float) -> None:
    """4 clients, 40 one-token requests of 256 prompt tokens: every cycle the 4 requests are
    admitted together and answered by one prefill step of 4 x 256 tokens, service time S. Each
    client then thinks Z and asks again, so 10 cycles take 10 S + 9 Z and the throughput is
    N / (S + Z) but for the last think time; the mean response time is S, and Little's law
    N = X (R + Z) holds over the cycles."""
    config = validate_document(closed(4, 40, 256, 1, think))
    result = run(config, None)
    tables = tabulate(result)
    service = resolve_topology(config).kv_group.cost_model().step_time(BatchShape.prefill(256, 256, 256, 256))
    requests = tables.requests
    assert (requests["status"] == "completed").all()
    assert requests["e2e_s"].to_numpy() == pytest.approx(np.full(40, service), rel=1e-12)
    arrivals = np.sort(requests["arrival_s"].unique())
    assert arrivals == pytest.approx(np.arange(10) * (service + think), rel=1e-12)
    span = 10 * service + 9 * think
    assert tables.summary["duration_s"] == pytest.approx(span, rel=1e-12)
    assert tables.summary["throughput"]["requests_per_s"] == pytest.approx(40 / span, rel=1e-12)
    cycle_rate = 4 / (service + think)  # N / (R + Z)
    assert 40 / (10 * (service + think)) == pytest.approx(cycle_rate)
    assert tables.summary["offered_rate"] == pytest.approx(39 / (9 * (service + think)), rel=1e-9)


def test_one_request_in_flight_per_client_at_every_moment() -> None:
    """8 clients and a workload of varied steps: at every step the requests in the system (arrived,
    not finished) never exceed 8, and exactly 8 while clients still have requests to send."""
    config = validate_document(closed(8, 200, 700, 60, engine="vllm"))
    tables = tabulate(run(config, None))
    requests = tables.requests
    arrival, finish = requests["arrival_s"].to_numpy(), requests["finish_s"].to_numpy()
    starts = tables.steps["start_s"].to_numpy()
    in_system = ((arrival[None, :] <= starts[:, None]) & (finish[None, :] > starts[:, None])).sum(axis=1)
    assert in_system.max() == 8
    last_send = arrival.max()
    assert (in_system[starts < last_send] == 8).all()
    assert (tables.steps["running"] + tables.steps["waiting"] <= 8).all()


def test_rejected_requests_free_their_client_at_once() -> None:
    """Requests longer than max_model_len are refused at arrival and their client sends the next."""
    config = validate_document(closed(2, 6, 600, 10, max_model_len=512))
    tables = tabulate(run(config, None))
    assert tables.summary["rejected"] == 6 and (tables.requests["arrival_s"] == 0).all()


def test_rate_inf_sends_everything_at_t0() -> None:
    document = closed(1, 5, 100, 4)
    document["workload"]["arrival"] = {"process": "poisson", "rate": "inf"}
    tables = tabulate(run(validate_document(document), None))
    assert (tables.requests["arrival_s"] == 0).all() and tables.summary["completed"] == 5


@pytest.mark.parametrize(("arrival", "extra", "message"), [
    ({"process": "closed"}, {}, r"workload.arrival.concurrency: is required for process closed"),
    ({"process": "closed", "concurrency": 4, "rate": 2}, {}, r"remove rate"),
    ({"process": "poisson", "rate": 2, "concurrency": 4}, {}, r"concurrency applies to process closed only"),
    ({"process": "closed", "concurrency": 4}, {"duration_s": 10}, r"give num_requests \(and no duration_s\)"),
    ({"process": "poisson"}, {}, r"workload.arrival.rate: is required for process poisson"),
    ({"process": "closed", "concurrency": 0}, {}, r"concurrency: .*greater than 0"),
])
def test_bad_arrivals_are_one_line_errors(arrival: dict[str, Any], extra: dict[str, Any],
                                          message: str) -> None:
    document = closed(1, 5, 100, 4)
    document["workload"]["arrival"] = arrival
    document["workload"].update(extra)
    with pytest.raises(ServesimError, match=message):
        validate_document(document)
