"""``servesim capacity``: the rate search against queueing theory, fleet sizing, cost ranking by
hand, infeasible candidates, the textbook decode-batch question, the CLI and its errors."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
from test_cli import servesim
from typer.testing import CliRunner

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.capacity import decode_batch_limits, plan_capacity, validate_capacity
from servesim.capacity.candidate import Candidate, experiment_for
from servesim.capacity.plan import decode_limits_only
from servesim.capacity.search import search_rate
from servesim.cli.app import app
from servesim.config import PolicyConfig
from servesim.errors import ServesimError
from servesim.topology.resolve import resolve_topology

PROMPT = 512
SERVICE_S = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb")).step_time(
    BatchShape.prefill(PROMPT))
"""D: one request (a 512-token prompt, one output token) is exactly one prefill step."""


def one_at_a_time(process: str, ttft_s: float, percentile: float, requests: int, replications: int,
                  **extra: Any) -> dict[str, Any]:
    """A replica serving one request at a time, each in one step of D seconds: a ./D/1 queue."""
    document = {
        "model": "llama-3-8b",
        "engine": "vllm-v0",  # D is priced by a bare CostModel: V0's runtime
        "workload": {"arrival": {"process": process, "rate": 1.0}, "num_requests": requests,
                     "prompt": {"dist": "fixed", "value": PROMPT}, "output": {"dist": "fixed", "value": 1}},
        "slo": {"ttft_s": ttft_s, "percentile": percentile},
        "candidates": {"hardware": ["h100-sxm-80gb"]},
        "deployment": {"max_num_seqs": 1},
        "search": {"replications": replications, "warmup_fraction": 0.1},
    }
    for key, value in extra.items():
        document[key] = {**document.get(key, {}), **value} if isinstance(value, dict) else value
    return document


def test_constant_arrivals_sustain_the_service_rate_and_size_the_fleet() -> None:
    """D/D/1: below 1/D every request waits 0 (TTFT = D); above it request i waits i (D - 1/r).
    With TTFT <= 2D at p99 over 400 requests (the 360 after warm-up judged), the p99 request
    (index ~396) must wait at most D, so the knee is 1/D to within 1/396. The search must land
    within its 5% precision below it. For a target of 2.5/D, ceil(2.5/D / rate) = 3 replicas;
    behind round robin each then sees a gap of 1.2 D, so the verification run passes."""
    knee = 1 / SERVICE_S
    config = validate_capacity(one_at_a_time("constant", 2 * SERVICE_S, 99, 400, 1,
                                             target_rate=2.5 * knee))
    answer = plan_capacity(config)
    record = answer["candidates"][0]
    search = record["search"]
    assert search["status"] == "found"
    assert knee / 1.05 <= search["max_rate"] <= knee * (1 + 1 / 396)
    assert search["failing_rate"] > knee
    assert (search["failing_rate"] - search["max_rate"]) / search["max_rate"] <= 0.05
    # Every simulated rate below the knee passed, every one above failed.
    for evaluation in search["evaluations"]:
        assert evaluation["passed"] == (evaluation["rate"] <= knee * (1 + 1 / 396))
    target = record["target"]
    assert target["computed_sets"] == target["sets"] == math.ceil(2.5 * knee / search["max_rate"]) == 3
    assert target["gpus"] == 3 and target["verified"] and target["router"] == "round_robin"
    assert target["margins"]["ttft_s"] == pytest.approx(0.5, rel=1e-9)  # TTFT = D against 2D
    assert record["knee"]["breaks_first"] == "TTFT"
    assert record["knee"]["queue_growth_per_s"] > 0


def test_poisson_arrivals_median_wait_knee_is_half_the_service_rate() -> None:
    """M/D/1: by PASTA a fraction 1 - rho of arrivals find the server idle and wait exactly 0, so
    the median TTFT equals D while rho <= 0.5 and exceeds it beyond. With a p50 TTFT limit of D
    the sustainable rate is 0.5/D. Three seeds of 3,000 requests: the idle fraction's sampling
    error is about 1.5% per seed, so the answer must fall within [0.85, 1.05] x 0.5/D."""
    config = validate_capacity(one_at_a_time("poisson", SERVICE_S * (1 + 1e-9), 50, 3000, 3))
    search = plan_capacity(config)["candidates"][0]["search"]
    assert search["status"] == "found"
    assert 0.85 * 0.5 / SERVICE_S <= search["max_rate"] <= 1.05 * 0.5 / SERVICE_S
    assert search["simulations"] == 3 * len(search["evaluations"])


def test_search_brackets_then_bisects_to_the_precision() -> None:
    """A synthetic verdict (pass below 7.3): from a guess of 100 the search halves to 6.25, then
    bisects geometrically until (fail - pass) / pass <= 2%."""
    result = search_rate(lambda r: {"rate": r, "passed": r <= 7.3, "replications": 1}, 100.0, 0.02)
    assert result.status == "found"
    assert [e["rate"] for e in result.evaluations][:5] == [100, 50, 25, 12.5, 6.25]
    assert 7.3 / 1.02 <= result.rate <= 7.3 < result.failing_rate <= result.rate * 1.02
    never = search_rate(lambda r: {"rate": r, "passed": False, "replications": 1}, 8.0, 0.05,
                        max_halvings=3)
    assert never.status == "unattainable" and never.rate == 0 and len(never.evaluations) == 4
    always = search_rate(lambda r: {"rate": r, "passed": True, "replications": 1}, 8.0, 0.05,
                         max_doublings=2)
    assert always.status == "ceiling" and always.rate == 32


def test_cost_ranking_with_overridden_prices_by_hand() -> None:
    """Two GPUs, the D/D/1 workload, a target of 50 req/s. Each fleet's cost is GPUs x the given
    price, $/1M output tokens is that over 50 x 1 token x 3600 s, and the cheaper fleet ranks
    first; swapping which GPU is cheap swaps the order when the fleets' sizes allow it."""
    def answer(prices: dict[str, float]) -> dict[str, Any]:
        doc = one_at_a_time("constant", 0.5, 99, 300, 1, target_rate=50.0, prices=prices)
        doc["candidates"] = {"hardware": ["h100-sxm-80gb", "a100-sxm-80gb"]}
        return plan_capacity(validate_capacity(doc))

    first = answer({"h100-sxm-80gb": 10.0, "a100-sxm-80gb": 1.0})
    by_hw = {r["hardware"]: r for r in first["candidates"]}
    for hw, price in (("h100-sxm-80gb", 10.0), ("a100-sxm-80gb", 1.0)):
        target = by_hw[hw]["target"]
        assert by_hw[hw]["usd_per_gpu_hour"] == price and by_hw[hw]["price_source"] == "prices"
        assert target["usd_per_hour"] == pytest.approx(target["gpus"] * price)
        assert target["usd_per_1m_output_tokens"] == pytest.approx(target["gpus"] * price / (50 * 3600) * 1e6)
    costs = [r["target"]["usd_per_hour"] for r in first["candidates"]]
    assert costs == sorted(costs)
    assert [r["rank"] for r in first["candidates"]] == [1, 2]
    h100_gpus, a100_gpus = by_hw["h100-sxm-80gb"]["target"]["gpus"], by_hw["a100-sxm-80gb"]["target"]["gpus"]
    assert first["candidates"][0]["hardware"] == ("a100-sxm-80gb" if a100_gpus * 1.0 < h100_gpus * 10.0
                                                  else "h100-sxm-80gb")
    second = answer({"h100-sxm-80gb": 1.0, "a100-sxm-80gb": 10.0})
    assert second["candidates"][0]["hardware"] == "h100-sxm-80gb"  # fewer GPUs and cheaper ones
    assert "x the cost of the best" in second["candidates"][1]["why"]


def test_infeasible_candidates_are_listed_with_their_reason_not_raised() -> None:
    doc = one_at_a_time("constant", 0.5, 99, 200, 1)
    doc["candidates"] = {"hardware": ["h100-sxm-80gb"], "tp": [1, 3]}
    answer = plan_capacity(validate_capacity(doc))
    feasible, infeasible = answer["candidates"]
    assert feasible["feasible"] and feasible["rank"] == 1
    assert not infeasible["feasible"] and infeasible["rank"] == 2
    assert "3 does not divide llama-3-8b's 32 attention heads" in infeasible["infeasible_reason"]
    assert infeasible["why"].startswith("infeasible: candidates.tp: 3")
    big = validate_capacity({**doc, "model": "llama-2-70b",
                             "candidates": {"hardware": ["a100-sxm-80gb"], "tp": [1, 2]}})
    limits = decode_limits_only(big)
    assert not limits[0]["feasible"] and "use candidates.tp: 2 or more" in limits[0]["infeasible_reason"]
    assert limits[1]["feasible"]


def test_textbook_llama2_70b_on_8_a100s_is_latency_limited() -> None:
    """Llama-2-70B (80 layers, 8 KV heads of 128, fp16) at TP 8 on A100-80GB, TPOT <= 50 ms, 2,048
    tokens of context. KV per token: 2 (K, V) x 80 x 8 x 128 x 2 B = 327,680 B, 40,960 B per GPU.
    Weights: 68.98e9 parameters x 2 B / 8 GPUs. The pool holds kv_bytes / 40,960 tokens; a
    sequence needs ceil(2,049 / 16) = 129 blocks. The decode batch is limited by latency: the
    largest batch within 50 ms (the cost model's step times bracket it) holds 31% of the pool (216
    of the 696 sequences it fits; 198 and 28% before the GEMM shape factors)."""
    workload = {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 100,
                "lengths": {"preset": "azure-conversation"}}
    doc = {"model": "llama-2-70b", "workload": workload,
           "slo": {"tpot_s": 0.05}, "candidates": {"hardware": ["a100-sxm-80gb"], "tp": [8]}}
    config = validate_capacity(doc)
    candidate = Candidate(0, "a100-sxm-80gb", 8, PolicyConfig(), 1)
    deployment = resolve_topology(experiment_for(config, candidate)).kv_group
    limits = decode_batch_limits(deployment, 2048, 0.05)
    assert limits["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680
    assert limits["kv_bytes_per_token_per_gpu"] == 40_960
    params = 2 * 32000 * 8192 + 80 * (8192 * (8192 + 2 * 1024) + 8192 * 8192 + 3 * 8192 * 28672)
    assert deployment.memory.weight_bytes == pytest.approx(params * 2 / 8, rel=1e-3)
    pool = deployment.memory.kv_cache_bytes
    assert limits["kv_pool_tokens_per_gpu"] == math.floor(pool / 40_960)
    assert limits["kv_blocks"] == math.floor(pool / (40_960 * 16))
    assert limits["kv_batch"] == limits["kv_blocks"] // 129
    cost = deployment.cost_model()
    b = limits["tpot_batch"]
    assert cost.step_time(BatchShape.decode(b, 2048)) <= 0.05 < cost.step_time(BatchShape.decode(b + 1, 2048))
    # 216 on the A100 profile fitted to AIConfigurator's vLLM 0.14 kernels (198 before the GEMM
    # shape factors: near the ridge, these GEMMs' compute side binds)
    assert 185 <= b <= 225
    assert limits["binding"] == "latency (TPOT)" and limits["largest_batch"] == b
    assert 600 <= limits["kv_batch"] <= 800 and 0.2 < limits["kv_use_at_tpot_batch"] < 0.35


runner = CliRunner()


def test_cli_textbook_limits_only_prints_the_answer() -> None:
    result = runner.invoke(app, ["capacity", "--model", "llama-2-70b", "--hardware", "a100-sxm-80gb",
                                 "--tp", "8", "--tpot", "50ms", "--decode-context", "2048", "--limits-only"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    # The default engine (vLLM V1): 216 sequences (a whole captured CUDA graph) take 49.4 ms, 217
    # replay the 224-row graph at 50.3 ms (servesim step --model llama-2-70b --hardware
    # a100-sxm-80gb --tp 8 ...; 208 before the GEMM shape factors).
    assert "max_num_seqs 256 -> largest 216" in text and "limited by latency (TPOT)" in text
    assert "the KV pool holds" in text


def small_cli_args(out: Path, *extra: str) -> list[str]:
    return ["capacity", "--model", "llama-3-8b", "--hardware", "h100-sxm-80gb,l40s", "--tp", "1",
            "--ttft", "1s", "--tpot", "50", "--requests", "150", "--replications", "1",
            "--precision", "0.2", "--target-rate", "20", "--price", "l40s=0.5", "--out", str(out), *extra]


def test_cli_writes_json_and_csv_deterministically(tmp_path: Path) -> None:
    first = runner.invoke(app, small_cli_args(tmp_path / "a"))
    assert first.exit_code == 0, first.output
    for text in ("decode batch limits", "why", "$/hour", "h100-sxm-80gb"):
        assert text in first.output
    answer = json.loads((tmp_path / "a" / "capacity.json").read_text())
    assert {"candidates", "frontier", "slo", "search", "prices_usd_per_gpu_hour"} <= answer.keys()
    assert answer["prices_usd_per_gpu_hour"]["l40s"] == 0.5
    for record in answer["candidates"]:
        assert record["search"]["evaluations"] and "decode_batch_limits" in record
    rows = list(csv.DictReader((tmp_path / "a" / "capacity.csv").open()))
    assert [int(r["rank"]) for r in rows] == [1, 2] and rows[0]["usd_per_hour"]
    parallel = runner.invoke(app, small_cli_args(tmp_path / "b", "--workers", "2"))
    assert parallel.exit_code == 0, parallel.output
    assert (tmp_path / "a" / "capacity.json").read_text() == (tmp_path / "b" / "capacity.json").read_text()


@pytest.mark.parametrize(("document", "message"), [
    ({"candidates": {"hardware": ["h100-sxm-80gb"], "tpp": [1]}},
     "candidates.tpp: unknown key; remove it or use one of: hardware, tp, pp, dp, ep, policy, replicas"),
    ({"slo": {"ttft_s": 1, "percentile": 120}}, "slo.percentile: Input should be less than or equal to 100"),
    ({"slo": {"percentile": 99}}, "slo: give at least one of ttft_s, tpot_s, e2e_s"),
    ({"candidates": {"hardware": ["h100-sxm-80gb"], "tp": [0]}}, "candidates.tp: must be integers >= 1"),
    ({"search": {"precision": 0}}, "search.precision: Input should be greater than 0"),
    ({"workload": {"arrival": {"process": "poisson"}, "num_requests": 10}}, "workload.arrival.rate"),
])
def test_config_mistakes_are_one_line(document: dict[str, Any], message: str) -> None:
    base = one_at_a_time("constant", 0.5, 99, 100, 1)
    with pytest.raises(ServesimError) as error:
        validate_capacity({**base, **document})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_cli_errors_are_one_line_with_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "cap.yaml"
    config.write_text("model: llama-3-8b\ncandidates: {hardware: [h100-sxm-80gb]}\nslo: {ttft_s: 1}\n"
                      "prices: {b200: 3}\n")
    for args, message in (
        ([str(config)], "error: prices.b200: is not among the candidate hardware"),
        ([str(config), "--price", "h100"], "error: --price: 'h100' is not NAME=USD_PER_GPU_HOUR"),
        (["--model", "llama-3-8b", "--hardware", "tpu", "--ttft", "1s"],
         "error: candidates.hardware: unknown hardware"),
        (["--hardware", "h100-sxm-80gb", "--ttft", "1s"], "error: model: is required; give --model NAME"),
        (["--model", "llama-3-8b", "--hardware", "h100-sxm-80gb", "--tpot", "0.05"],
         "error: --tpot: 0.05 under --tpot is 0.05 ms, implausible for TPOT (a bare number there is in "
         "milliseconds): write 0.05s if that is what you meant, or 0.05ms to keep it"),
    ):
        run = servesim("capacity", *args, "--out", str(tmp_path / "out"))
        assert run.returncode == 2, run.stderr
        assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
