"""The planner's fleet questions against queueing theory: colocated and disaggregated candidates in
one ranking, the fixed GPU budget, the two prices per token, and the short-run warning.

Every test uses the ./D/1 workload of ``test_capacity`` (512-token prompts, one output token, one
request per step of D seconds, constant arrivals): a colocated replica sustains exactly 1/D. A
disaggregated set of ``p`` prefill and ``d`` decode replicas runs the same prefill step on its
prefill replicas, then copies 512 tokens of KV (67 MB, 1.3 ms over InfiniBand) to a decode
replica, where the one-token request finishes on arrival; with round robin each prefill replica
sees every p-th arrival, so the set sustains p/D as long as the copies (one channel, 1.3 ms each,
spaced 1/r apart) never queue. Its TTFT is D plus the copy, within the 2D limit."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest
from test_capacity import SERVICE_S, one_at_a_time

from servesim.capacity import plan_capacity, validate_capacity
from servesim.capacity.candidate import Candidate, expand_candidates, experiment_for
from servesim.capacity.output import write_capacity
from servesim.config import PolicyConfig
from servesim.errors import ServesimError
from servesim.topology.resolve import resolve_topology

KNEE = 1 / SERVICE_S
TOLERANCE = 1 + 1 / 396  # the p99 request of 360 judged ones (test_capacity's D/D/1 argument)


def mixed(**extra: Any) -> dict[str, Any]:
    """Colocated tp1 and disaggregated 1:1 and 3:1 sets of H100s at $1/GPU-hour."""
    doc = one_at_a_time("constant", 2 * SERVICE_S, 99, 400, 1, prices={"h100-sxm-80gb": 1.0}, **extra)
    doc["candidates"] = {"hardware": ["h100-sxm-80gb"], "kind": ["colocated", "disaggregated"],
                         "splits": ["1:1", "3:1"]}
    return doc


@pytest.fixture(scope="module")
def target_answer() -> dict[str, Any]:
    return plan_capacity(validate_capacity(mixed(target_rate=2.5 * KNEE)))


def by_label(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["candidate"]: r for r in answer["candidates"]}


def test_disaggregated_sets_sustain_p_over_d_and_rank_beside_colocated(target_answer: dict[str, Any]) -> None:
    """Knees: colocated 1/D, 1:1 1/D, 3:1 3/D, each found within the 5% precision below it. For
    2.5/D: colocated needs 3 replicas (3 GPUs), 3:1 one set (4 GPUs), 1:1 three sets (6 GPUs);
    the cheapest fleet ranks first and every fleet is verified by simulation."""
    records = by_label(target_answer)
    expected = {"h100-sxm-80gb tp1 continuous": (1, 3, "colocated"),
                "h100-sxm-80gb tp1 disagg 1:1 continuous": (1, 6, "disaggregated"),
                "h100-sxm-80gb tp1 disagg 3:1 continuous": (3, 4, "disaggregated")}
    assert set(records) == set(expected)
    for label, (prefill_replicas, gpus, kind) in expected.items():
        record = records[label]
        knee = prefill_replicas * KNEE
        assert record["kind"] == kind
        assert knee / 1.05 <= record["search"]["max_rate"] <= knee * TOLERANCE, label
        assert record["target"]["gpus"] == gpus and record["target"]["verified"], label
        assert record["target"]["usd_per_hour"] == pytest.approx(gpus * 1.0)
    assert [r["candidate"] for r in target_answer["candidates"]] == [
        "h100-sxm-80gb tp1 continuous", "h100-sxm-80gb tp1 disagg 3:1 continuous",
        "h100-sxm-80gb tp1 disagg 1:1 continuous"]
    assert records["h100-sxm-80gb tp1 disagg 3:1 continuous"]["split"] == {"prefill": 3, "decode": 1}
    why = records["h100-sxm-80gb tp1 disagg 3:1 continuous"]["why"]
    assert "1.33x the cost of the best (4 vs 3 GPUs)" in why


def test_two_prices_per_token_by_hand(target_answer: dict[str, Any], tmp_path: Path) -> None:
    """One output token per request at $1/GPU-hour. Fleet: GPUs x $1 over the target's tokens
    (2.5/D x 1 x 3600 per hour); one set at its max rate: its GPUs x $1 over max_rate x 3600."""
    write_capacity(target_answer, tmp_path)
    rows = {r["candidate"]: r for r in csv.DictReader((tmp_path / "capacity.csv").open())}
    assert "usd_per_1m_output_tokens" not in next(iter(rows.values()))  # the ambiguous name is gone
    for record in target_answer["candidates"]:
        row = rows[record["candidate"]]
        fleet = record["target"]["gpus"] * 1.0 / (2.5 * KNEE * 3600) * 1e6
        one_set = record["gpus_per_set"] * 1.0 / (record["search"]["max_rate"] * 3600) * 1e6
        assert float(row["usd_per_1m_output_tokens_fleet"]) == pytest.approx(fleet)
        assert float(row["usd_per_1m_output_tokens_at_max_rate"]) == pytest.approx(one_set)
        assert float(row["fleet_rate"]) == pytest.approx(2.5 * KNEE)
    assert (tmp_path / "launch-vllm.sh").read_text().startswith("#!/bin/sh\n# servesim capacity")


def test_gpu_budget_fills_whole_sets_and_ranks_by_verified_rate() -> None:
    """On 5 GPUs: colocated tp1 runs 5 replicas (5/D), 3:1 one set of 4 GPUs with one idle (3/D),
    1:1 two sets and one idle GPU (2/D). Each fleet's rate is its sets x the set's rate,
    verified by simulating it; the idle GPU is paid for."""
    answer = plan_capacity(validate_capacity(mixed(gpu_budget=5)))
    records = by_label(answer)
    expected = {"h100-sxm-80gb tp1 continuous": (5, 5, 0, 5),
                "h100-sxm-80gb tp1 disagg 3:1 continuous": (1, 4, 1, 3),
                "h100-sxm-80gb tp1 disagg 1:1 continuous": (2, 4, 1, 2)}
    for label, (sets, gpus, idle, knees) in expected.items():
        budget = records[label]["budget"]
        assert (budget["sets"], budget["gpus"], budget["idle_gpus"]) == (sets, gpus, idle), label
        one_set = records[label]["search"]["max_rate"]
        assert budget["verified"] and budget["rate"] == pytest.approx(sets * one_set)
        assert knees * KNEE / 1.05 <= budget["rate"] <= knees * KNEE * TOLERANCE
        assert budget["usd_per_hour"] == pytest.approx(5.0)
        assert budget["usd_per_1m_output_tokens"] == pytest.approx(5.0 / (budget["rate"] * 3600) * 1e6)
    assert [r["candidate"] for r in answer["candidates"]] == list(expected)
    assert answer["gpu_budget"] == 5 and answer["launch"]["replica_sets"] == 5
    assert answer["launch"]["vllm"]["servers"][0]["copies"] == 5
    assert "60% of the best's rate on 5 GPUs" in records["h100-sxm-80gb tp1 disagg 3:1 continuous"]["why"]


def test_a_set_larger_than_the_budget_ranks_last_with_the_reason() -> None:
    doc = one_at_a_time("constant", 2 * SERVICE_S, 99, 200, 1, gpu_budget=1)
    doc["candidates"] = {"hardware": ["h100-sxm-80gb"], "tp": [1, 2]}
    answer = plan_capacity(validate_capacity({**doc, "search": {"replications": 1, "precision": 0.2}}))
    last = answer["candidates"][-1]
    assert last["tp"] == 2 and last["budget"]["sets"] == 0 and last["budget"]["rate"] is None
    assert "one replica set needs 2 GPUs, more than the budget" in last["why"]


def test_disaggregated_fleet_experiment_and_labels() -> None:
    config = validate_capacity(mixed())
    labels = [c.label for c in expand_candidates(config)]
    assert labels == ["h100-sxm-80gb tp1 continuous", "h100-sxm-80gb tp1 disagg 1:1 continuous",
                      "h100-sxm-80gb tp1 disagg 3:1 continuous"]
    candidate = Candidate(0, "h100-sxm-80gb", 2, PolicyConfig(name="continuous"), 4, (3, 1))
    assert candidate.gpus_per_set == 8 and candidate.kind == "disaggregated"
    topology = resolve_topology(experiment_for(config, candidate, sets=2))
    assert topology.kind == "disaggregated" and topology.num_gpus == 16
    assert [(g.name, g.replicas, g.tp) for g in topology.groups] == [("prefill", 6, 2), ("decode", 2, 2)]


@pytest.mark.parametrize(("splits", "message"), [
    (["3:1", "3:1"], "lists a split twice"),
    ([181], "quote it (\"3:1\")"),
    (["0:1"], "each side of a split needs at least one replica"),
    (["3-1"], "is not a prefill:decode split"),
])
def test_split_mistakes_are_one_line(splits: list[Any], message: str) -> None:
    doc = mixed()
    doc["candidates"]["splits"] = splits
    with pytest.raises(ServesimError) as error:
        validate_capacity(doc)
    assert message in str(error.value) and str(error.value).startswith("candidates.splits")


def test_splits_read_as_yaml_writes_them() -> None:
    for written in (["3:1"], [[3, 1]], [3, 1], "3:1", [{"prefill": 3, "decode": 1}]):
        doc = mixed()
        doc["candidates"]["splits"] = written
        assert validate_capacity(doc).candidates.splits == [(3, 1)], written


def test_target_and_budget_together_is_one_line() -> None:
    with pytest.raises(ServesimError, match=r"give target_rate .* or gpu_budget .*, not both"):
        validate_capacity(mixed(target_rate=10.0, gpu_budget=4))


def test_short_runs_are_flagged() -> None:
    """At 1/D, 200 requests arrive in 200 D (about 3 s): under 10 x a 1 s TTFT limit."""
    doc = one_at_a_time("constant", 1.0, 99, 200, 1)
    record = plan_capacity(validate_capacity({**doc, "search": {"replications": 1, "precision": 0.2}}))[
        "candidates"][0]
    span = 200 / record["search"]["max_rate"]
    assert span < 10
    assert record["warnings"] == [
        f"runs too short to judge {record['search']['max_rate']:.3g} req/s: 200 requests arrive in "
        f"{span:.2g} s, under 10x the 1 s latency limit, so a queue has no time to build and the highest "
        "rate is overestimated; raise search.requests_per_run (--requests)"]
    assert math.isfinite(span)


def test_a_budget_flag_replaces_the_files_target_rate() -> None:
    """llama3-8b-chat asks for 40 req/s; --gpu-budget asks the other question instead."""
    from servesim.cli.capacity import build_document, find_capacity_config

    flags = dict.fromkeys(("model", "hardware", "tp", "pp", "dp", "ep", "policy", "replicas", "kind",
                           "splits", "gpu_budget",
                           "ttft", "tpot", "e2e", "percentile", "attainment", "lengths", "arrival",
                           "requests", "replications", "precision", "target_rate", "prices",
                           "decode_context", "seed"))
    base = validate_capacity(build_document("llama3-8b-chat", None, flags), "llama3-8b-chat")
    assert base.target_rate == 40 and base.gpu_budget is None
    budget = validate_capacity(build_document("llama3-8b-chat", None, {**flags, "gpu_budget": 8}), "x")
    assert budget.target_rate is None and budget.gpu_budget == 8
    assert find_capacity_config("llama3-8b-chat").name == "llama3-8b-chat.yaml"
