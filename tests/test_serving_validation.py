"""End-to-end serving measurements: a file in AIConfigurator's silicon CSV format, written here,
is read with every row it cannot express counted by reason, replayed, and fitted; the engine's
CPU coefficients used to make the "measurements" are recovered."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from servesim.calibration.aic_flags import generator_deployed
from servesim.calibration.engine_fit import loss, weighted_mean
from servesim.calibration.replay import TRACE_FRONTEND_S, ZERO_CPU, Coefficients, simulate_document
from servesim.calibration.serving_data import ServingRow, catalogue_model, read_serving_file
from servesim.calibration.serving_validate import (
    by_concurrency,
    fit_serving,
    round_weights,
    trace_rows,
    validate_serving,
)
from servesim.calibration.stacked_means import StackedMeans
from servesim.config import validate_document
from servesim.errors import ServesimError
from servesim.pipeline import prepare

TRUTH = Coefficients(fixed_s=2e-2, per_seq_s=1e-3)
"""A host so slow that it shows through TensorRT-LLM's overlap scheduler: 20 ms per step plus
1 ms per sequence, against decode steps of a few milliseconds."""

ISL = 200
"""Prompt length of the file's rows: 8 clients' prompts (1,600 tokens) fit one step of the budget
AIConfigurator's rules give 8 seats (8 + 200 + 1500), so the aggregated rows' clients stay in
lockstep and are re-timed, not simulated."""

GROUP = ["batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"]
COLUMNS = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision",
           "mode", "isl", "osl", "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size",
           "attention_dp_size", "moe_tp_size", "moe_ep_size", *(f"prefill_{c}" for c in GROUP),
           *(f"decode_{c}" for c in GROUP), "silicon_ttft_ms", "silicon_tpot_ms"]


def line(model: str, tp: int, concurrency: int, ttft_ms: float, tpot_ms: float,
         **extra: Any) -> dict[str, Any]:
    source = f"db-dump/2026-04-27; silicon_concurrency={concurrency}; measured=2026-04-17"
    values = {"id": f"{model}-{tp}-{concurrency}-{len(extra)}", "silicon_data_source": source,
              "backend": "trtllm", "backend_version": "1.2.0rc6", "model_path": model,
              "system": "h100_sxm", "precision": "", "mode": "agg", "isl": ISL, "osl": 12,
              "gemm_quant_mode": "", "moe_quant_mode": "", "batch_size": concurrency, "tp_size": tp,
              "pp_size": 1, "attention_dp_size": 0, "moe_tp_size": tp, "moe_ep_size": 1,
              "silicon_ttft_ms": ttft_ms, "silicon_tpot_ms": tpot_ms}
    values.update(extra)
    return values


def measured(model_path: str, tp: int, concurrency: int) -> tuple[float, float]:
    """What the simulator says with the TRUTH coefficients (the file's "measurement")."""
    row = ServingRow(row=0, engine="trtllm", model=read_model(model_path), hf_model=model_path,
                     gpu="h100_sxm", tp=tp, precision="bf16", isl=ISL, osl=12, concurrency=concurrency,
                     ttft_s=1.0, tpot_s=1.0, version="")
    traced = trace_rows([row], warmup=1, measured=3)[0]
    ttft, tpot = traced.measurement(1).predicted(TRUTH)
    return float(ttft[0]) * 1e3, float(tpot[0]) * 1e3


def read_model(model_path: str) -> str:
    return {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "Qwen/Qwen3-32B": "qwen3-32b"}[model_path]


@pytest.fixture(scope="module")
def serving_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = []
    for model, tp in (("meta-llama/Llama-3.1-8B-Instruct", 1), ("Qwen/Qwen3-32B", 2)):
        for concurrency in (2, 8):
            lines.append(line(model, tp, concurrency, *measured(model, tp, concurrency)))
    duplicate = dict(lines[0], id="copy", silicon_data_source=lines[0]["silicon_data_source"] + "; again")
    lines.append(duplicate)
    lines += [line("Qwen/Qwen3-32B", 8, 16, 100, 10, mode="disagg"),
              line("Qwen/Qwen3-32B", 8, 16, 100, 10, precision="fp4"),
              line("Qwen/Qwen3-32B", 4, 16, 100, 10, system="mi355x"),
              line("acme/Unknown-1B", 4, 16, 100, 10),
              line("Qwen/Qwen3-32B", 4, 16, 100, 10, silicon_data_source="db-dump/2026-04-27"),
              # expressible, but 671B parameters in bf16 do not fit 8 H100s: the simulator refuses it
              line("deepseek-ai/DeepSeek-V3", 8, 16, 100, 10, moe_ep_size=8),
              # one prefill worker at TP 1 and one decode worker at TP 2: simulated, not re-timed
              line("Qwen/Qwen3-32B", 0, 4, 100, 10, mode="disagg", tp_size="", prefill_num_workers=1,
                   prefill_tp_size=1, decode_num_workers=1, decode_tp_size=2, decode_batch_size=4)]
    path = tmp_path_factory.mktemp("serving") / "silicon.csv"
    pd.DataFrame(lines, columns=COLUMNS).to_csv(path, index=False)
    return path


def test_every_row_is_replayed_or_counted_with_its_reason(serving_file: Path) -> None:
    data = read_serving_file(serving_file)
    assert (data.total, data.duplicates, len(data.rows)) == (12, 1, 6)
    assert data.skipped_by_reason() == {
        "disaggregated row without worker counts (AIConfigurator's own reader refuses these too)": 1,
        "fp4 on h100_sxm (no FP4 GEMMs)": 1, "GPU system mi355x has no profile": 1,
        "model acme/Unknown-1B not in the catalogue": 1, "no client concurrency recorded": 1,
        "repeats an earlier row's measurement (imported twice)": 1}
    row = data.rows[0]
    assert (row.model, row.tp, row.concurrency, row.isl, row.osl) == ("llama-3.1-8b", 1, 2, ISL, 12)
    document = row.document(4)
    assert document["workload"]["arrival"] == {"process": "closed", "concurrency": 2}
    assert document["workload"]["num_requests"] == 8
    assert document["engine"] == {"name": "trtllm", "cuda_graph_batch_sizes": [1, 2], "version": "1.2"}


def test_parallel_layouts_map_to_the_deployment() -> None:
    """AIConfigurator's columns -> servesim's deployment: attention DP 8 at TP 1 with EP 8 is
    tp 1 x dp 8 (8 GPUs) with ep 8; a disaggregated row is two groups of workers; NVFP4 is W4A4."""
    base = ServingRow(row=1, engine="trtllm", model="deepseek-v3", hf_model="deepseek-ai/DeepSeek-R1",
                      gpu="b200_sxm", tp=1, precision="fp4", isl=1024, osl=1024, concurrency=64,
                      ttft_s=1.0, tpot_s=0.1, version="", dp=8, ep=8)
    document = base.document(2)
    layout = {k: document["deployment"][k] for k in ("tp", "pp", "dp", "ep")}
    assert layout == {"tp": 1, "pp": 1, "dp": 8, "ep": 8}
    # DeepSeek-R1 is an FP8 checkpoint: AIConfigurator deploys it with an FP8 KV cache
    assert document["precision"] == {"weights": "nvfp4", "activations": "nvfp4", "kv_cache": "fp8"}
    split = ServingRow(**{**base.__dict__, "prefill": (2, 4, 1, 4), "decode": (1, 1, 8, 8)})
    deployment = split.document(2)["deployment"]
    assert deployment["kind"] == "disaggregated"
    layouts = {role: {k: deployment[role][k] for k in ("replicas", "tp", "dp", "ep")}
               for role in ("prefill", "decode")}
    assert layouts == {"prefill": {"replicas": 2, "tp": 4, "dp": 1, "ep": 4},
                       "decode": {"replicas": 1, "tp": 1, "dp": 8, "ep": 8}}


def test_each_row_replays_with_the_flags_aiconfigurator_deploys() -> None:
    """The file records no engine flags; the replay takes those of AIConfigurator's generator
    rules (calibration.aic_flags): step budget batch + ISL + 1500 for vLLM and TensorRT-LLM
    (TensorRT-LLM's in whole 32-token blocks), seats and CUDA graphs up to the batch, SGLang's own
    chunk size, an FP8 KV cache only for FP8/NVFP4 checkpoints; a disaggregated row's prefill
    group one prompt per rank (its prefill_batch_size) in ISL + 1500 tokens, its decode group
    decode_batch_size seats and as many tokens, CUDA graphs up to the decode seats."""
    base = ServingRow(row=1, engine="vllm", model="qwen3-32b", hf_model="Qwen/Qwen3-32B", gpu="h100_sxm",
                      tp=2, precision="fp8", isl=12000, osl=128, concurrency=64, ttft_s=1.0, tpot_s=0.1,
                      version="0.19.0")
    document = base.document(2)
    assert document["deployment"]["max_num_batched_tokens"] == 64 + 12000 + 1500
    assert document["deployment"]["max_num_seqs"] == 64
    assert document["engine"]["cudagraph_capture_sizes"] == list(range(1, 65))
    assert document["precision"]["kv_cache"] == "bf16"  # a bf16 checkpoint with FP8 GEMMs
    assert "gpu_memory_utilization" not in document["deployment"]  # vLLM's own 0.9
    trt = ServingRow(**{**base.__dict__, "engine": "trtllm", "concurrency": 65})
    assert trt.document(2)["deployment"]["max_num_batched_tokens"] == 13568  # 13565 -> 424 blocks of 32
    # the generator's templates deploy TensorRT-LLM with free_gpu_memory_fraction 0.80 (not its 0.9)
    assert trt.document(2)["deployment"]["gpu_memory_utilization"] == 0.8
    trt_groups = ServingRow(**{**trt.__dict__, "prefill": (1, 2, 1, 1), "decode": (1, 2, 1, 1)}).document(2)
    assert [trt_groups["deployment"][g]["gpu_memory_utilization"]
            for g in ("prefill", "decode")] == [0.8, 0.8]
    # the KV pool is 0.8 of what is free once the weights and the workspace are in, not 0.9
    # ... only where the generator deployed the worker: InferenceX's dated campaigns keep 0.9
    inferencex = ServingRow(**{**trt.__dict__, "generated": False})
    assert "gpu_memory_utilization" not in inferencex.document(2)["deployment"]
    assert generator_deployed("source_file=/x/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/a.csv; "
                              "silicon_concurrency=8")
    assert generator_deployed("db-dump/2026-04-27; config_id=199; silicon_concurrency=16")
    assert not generator_deployed("source_file=2026-04-06.csv; model=DeepSeek-R1; silicon_concurrency=256")
    trt_memory = prepare(validate_document(trt.document(2))).topology.kv_group.memory
    free = (trt_memory.capacity_bytes - trt_memory.reserved_bytes - trt_memory.weight_bytes
            - trt_memory.activation_bytes)
    assert trt_memory.kv_cache_bytes == pytest.approx(0.8 * free, rel=1e-12)
    # TensorRT-LLM runs FP8 only from a pre-quantised (ModelOpt) checkpoint, whose KV cache is FP8
    assert trt.document(2)["precision"]["kv_cache"] == "fp8"
    assert ServingRow(**{**trt.__dict__, "precision": "bf16"}).kv_cache() == "bf16"
    sglang = ServingRow(**{**base.__dict__, "engine": "sglang", "hf_model": "deepseek-ai/DeepSeek-R1",
                           "model": "deepseek-v3", "dp": 8, "concurrency": 60})
    sg = sglang.document(2)
    assert "max_num_batched_tokens" not in sg["deployment"] and sg["deployment"]["max_num_seqs"] == 8
    assert "gpu_memory_utilization" not in sg["deployment"]  # SGLang's own mem_fraction_static
    assert sg["engine"]["cuda_graph_bs"] == list(range(1, 9)) and sg["precision"]["kv_cache"] == "fp8"
    split_row = ServingRow(**{**base.__dict__, "prefill": (1, 2, 1, 1), "decode": (2, 2, 1, 1),
                              "prefill_batch": 1, "decode_batch": 32})
    split = split_row.document(2)
    assert split["deployment"]["prefill"] == {"replicas": 1, "tp": 2, "dp": 1, "ep": 1, "max_num_seqs": 1,
                                              "max_num_batched_tokens": 12000 + 1500}
    assert split["deployment"]["decode"] == {"replicas": 2, "tp": 2, "dp": 1, "ep": 1, "max_num_seqs": 32,
                                             "max_num_batched_tokens": 32}
    assert "max_num_batched_tokens" not in split["deployment"]
    assert split["engine"]["cudagraph_capture_sizes"] == list(range(1, 33))
    assert split_row.step_budget() == 13500
    silent = ServingRow(**{**split_row.__dict__, "engine": "sglang", "prefill_batch": None,
                           "decode_batch": None})
    assert silent.document(2)["deployment"]["decode"]["max_num_seqs"] == 128  # the rules' defaults
    assert silent.document(2)["deployment"]["prefill"]["max_num_seqs"] == 1
    assert silent.step_budget() == "engine default"
    split_plan = prepare(validate_document(split))
    prefill_group, decode_group = split_plan.topology.groups
    assert (prefill_group.limits.max_num_seqs, prefill_group.limits.max_num_batched_tokens) == (1, 13500)
    assert (decode_group.limits.max_num_seqs, decode_group.limits.max_num_batched_tokens) == (32, 32)
    # and the flags reach the engine's limits and runtime
    plan = prepare(validate_document(document))
    limits = plan.topology.kv_group.limits
    assert (limits.max_num_batched_tokens, limits.max_num_seqs) == (13564, 64)


def test_each_row_replays_the_engine_release_it_measured() -> None:
    """A row's backend_version reaches the engine as major.minor when that release is modelled:
    vLLM 0.12 (async scheduling off by default before 0.14) runs its host time serially, 0.19
    overlaps it; a nightly build, an empty field or a release not modelled keeps the default."""
    base = ServingRow(row=1, engine="vllm", model="qwen3-32b", hf_model="Qwen/Qwen3-32B", gpu="h100_sxm",
                      tp=2, precision="bf16", isl=1024, osl=128, concurrency=8, ttft_s=1.0, tpot_s=0.1,
                      version="0.12.0")
    assert base.engine_version() == "0.12" and base.document(2)["engine"]["version"] == "0.12"
    runtime = prepare(validate_document(base.document(2))).topology.kv_group.runtime
    assert not runtime.overlap
    current = ServingRow(**{**base.__dict__, "version": "0.19.0"})
    assert prepare(validate_document(current.document(2))).topology.kv_group.runtime.overlap
    for other in ("nightly-5b8c30d62b754b57", "", "0.9.2"):
        row = ServingRow(**{**base.__dict__, "version": other})
        assert row.engine_version() is None and "version" not in row.document(2)["engine"]
    trt = ServingRow(**{**base.__dict__, "engine": "trtllm", "version": "1.2.0rc6.post2"})
    assert trt.engine_version() == "1.2"
    assert ServingRow(**{**trt.__dict__, "version": "1.0.0rc3"}).engine_version() is None


def test_validate_serving_writes_the_comparison(serving_file: Path, tmp_path: Path) -> None:
    rows, summary, skipped, noise = validate_serving(serving_file, tmp_path, measured=3)
    assert len(rows) == 5 and len(skipped) == 7  # the duplicate is listed too
    assert noise.empty  # no replayed configuration is measured twice (the duplicate is dropped)
    assert list(rows["replay"]) == ["re-timed"] * 4 + ["simulated"]
    # the flags the replay assumed are in the rows: bf16 checkpoints keep a bf16 KV cache, an
    # aggregated TensorRT-LLM row's budget is its clients + ISL + 1500 in 32-token blocks
    assert set(rows["kv_cache"]) == {"bf16"}
    # each row names the release and day it was measured with, for reading the errors by campaign
    assert list(rows.columns[1:4]) == ["engine", "version", "measured_on"]
    aggregated = rows[rows["replay"] == "re-timed"]
    expected = [-(-(c + ISL + 1500) // 32) * 32 for c in aggregated["concurrency"]]
    assert list(aggregated["step_budget"]) == expected
    # the disaggregated row's prefill group: one prompt of ISL + 1500 tokens (in 32-token blocks)
    assert list(rows.loc[rows["replay"] == "simulated", "step_budget"]) == [-(-(ISL + 1500) // 32) * 32]
    assert skipped["reason"].str.startswith("the simulator refuses the deployment").sum() == 1
    for name in ("serving_rows.csv", "serving_summary.csv", "serving_by_concurrency.csv",
                 "serving_skipped.csv", "serving_noise.csv", "serving.html"):
        assert (tmp_path / name).is_file()
    page = (tmp_path / "serving.html").read_text()
    assert "TTFT predicted \\u002f measured by clients" in page  # the bias panels under the scatter
    overall = summary.set_index(["engine", "gpu"]).loc[("all", "all")]
    assert overall["rows"] == 5 and overall["share_of_file_%"] == pytest.approx(5 / 11 * 100)


def test_by_concurrency_reports_the_bias_per_band() -> None:
    """Four rows of one engine in two bands: at 4 and 8 clients predicted 0.9x and 1.3x the
    measured TTFT (median ratio 1.1, APE 10% and 30%: median 20%), at 256 and 512 clients 0.5x and
    0.7x (0.6; 50% and 30%: 40%); TPOT exact everywhere."""
    rows = pd.DataFrame({"engine": "vllm", "concurrency": [4, 8, 256, 512],
                         "measured_ttft_ms": 100.0, "predicted_ttft_ms": [90.0, 130.0, 50.0, 70.0],
                         "measured_tpot_ms": 10.0, "predicted_tpot_ms": 10.0})
    rows["ttft_ape_%"] = (rows["predicted_ttft_ms"] / rows["measured_ttft_ms"] - 1).abs() * 100
    rows["tpot_ape_%"] = 0.0
    bands = by_concurrency(rows).set_index(["engine", "concurrency"])
    assert list(bands.index) == [("all", "1-8"), ("all", "129+"), ("vllm", "1-8"), ("vllm", "129+")]
    assert bands.loc[("vllm", "1-8"), "rows"] == 2
    assert bands.loc[("vllm", "1-8"), "ttft_median_ratio"] == pytest.approx(1.1)
    assert bands.loc[("vllm", "1-8"), "ttft_median_ape_%"] == pytest.approx(20.0)
    assert bands.loc[("vllm", "129+"), "ttft_median_ratio"] == pytest.approx(0.6)
    assert bands.loc[("vllm", "129+"), "ttft_median_ape_%"] == pytest.approx(40.0)
    assert bands.loc[("all", "129+"), "tpot_median_ratio"] == pytest.approx(1.0)


def test_fit_serving_recovers_the_cpu_coefficients(serving_file: Path) -> None:
    """Two concurrencies per model tell the cost per step from the cost per sequence; leaving a
    model out, the other one's rows still recover them, so its prediction is exact."""
    result = fit_serving(serving_file, measured=3, engines=("trtllm",))
    fitted = result.coefficients["trtllm"]
    assert fitted.fixed_s == pytest.approx(TRUTH.fixed_s, rel=0.03)
    assert fitted.per_seq_s == pytest.approx(TRUTH.per_seq_s, rel=0.03)
    assert result.rows_used == {"trtllm": 4}
    retimed = result.lomo_rows[result.lomo_rows["replay"] == "re-timed"]
    assert len(retimed) == 4 and len(result.lomo_rows) == 5
    assert (retimed["tpot_ape_%"] < 1.0).all() and (retimed["ttft_ape_%"] < 2.0).all()
    assert np.isfinite(result.lomo_summary["tpot_median_ape_%"]).all()


def test_a_file_in_another_format_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ServesimError, match=r"missing column\(s\) backend, model_path"):
        read_serving_file(path)


def write_lines(path: Path, lines: list[dict[str, Any]]) -> Path:
    pd.DataFrame(lines, columns=COLUMNS).to_csv(path, index=False)
    return path


def test_one_measurement_filed_under_two_names_of_one_architecture_counts_once(tmp_path: Path) -> None:
    """The serving file holds DeepSeek-V3 measurements a second time as DeepSeek-R1's (another
    dump: the same day, its time of day kept instead of midnight, the same floats). Read once; the
    same floats measured on two days, or another architecture's row with the same numbers, are kept."""
    v3 = line("deepseek-ai/DeepSeek-V3", 8, 16, 402.452385154902, 9.5,
              silicon_data_source="db-dump/2026-04-27; config_id=87; silicon_concurrency=16; "
                                  "measured=2026-03-25T00:00:00.000Z")
    r1 = dict(v3, id="r1", model_path="deepseek-ai/DeepSeek-R1",
              silicon_data_source="source_file=2026-03-25.csv; model=DeepSeek-R1; silicon_concurrency=16; "
                                  "measured=2026-03-25T16:34:14Z")
    # the same floats under both names, but measured on two days: kept as two measurements
    v3_day = dict(v3, id="v3-8", batch_size=8,
                  silicon_data_source=v3["silicon_data_source"].replace("=16", "=8"))
    next_day = r1["silicon_data_source"].replace("=16", "=8").replace("03-25T", "03-26T")
    r1_next_day = dict(v3_day, id="r1-8", model_path="deepseek-ai/DeepSeek-R1", silicon_data_source=next_day)
    qwen = dict(v3, id="qwen", model_path="Qwen/Qwen3-32B")
    data = read_serving_file(write_lines(tmp_path / "s.csv", [v3, r1, v3_day, r1_next_day, qwen]))
    assert (data.total, data.duplicates, data.aliases) == (5, 1, 1)
    assert data.skipped.to_dict("records") == [
        {"row": 2, "backend": "trtllm", "model": "deepseek-ai/DeepSeek-R1", "system": "h100_sxm",
         "reason": "repeats an earlier row's measurement under another name of the same architecture"}]
    assert [(r.hf_model, r.concurrency) for r in data.rows] == [
        ("deepseek-ai/DeepSeek-V3", 16), ("deepseek-ai/DeepSeek-V3", 8), ("deepseek-ai/DeepSeek-R1", 8),
        ("Qwen/Qwen3-32B", 16)]


def test_a_measurement_re_exported_with_its_last_digit_changed_counts_once(tmp_path: Path) -> None:
    """The file holds measurements twice with the 17th digit of a float changed by the re-export
    (TPOT 15.873633393639292 and 15.873633393639293 ms, the same day): compared to 12 significant
    digits they are one measurement, imported twice, under one name or two (DeepSeek-V3 / R1), and
    also when the second name's row files its layout as DP times EP (its batch size following the
    filed ranks). A TPOT that differs in the 10th digit is another measurement."""
    deepseek = {"system": "b200_sxm", "precision": "fp8", "moe_ep_size": 8}
    first = line("deepseek-ai/DeepSeek-R1", 8, 32, 647.710724, "15.873633393639292", id="a",
                 moe_tp_size=1, **deepseek)
    again = dict(first, id="b", silicon_tpot_ms="15.873633393639293",
                 silicon_data_source=first["silicon_data_source"].replace("db-dump", "re-export"))
    other = dict(first, id="c", silicon_tpot_ms="15.87363340")
    dp8 = line("deepseek-ai/DeepSeek-R1", 1, 128, 797.781559, "21.333954", id="dp8", attention_dp_size=8,
               moe_tp_size=1, batch_size=16, **deepseek)
    dp64 = dict(dp8, id="dp64", model_path="deepseek-ai/DeepSeek-V3", attention_dp_size=64, moe_tp_size=8,
                batch_size=2, silicon_tpot_ms="21.333954000000001")
    data = read_serving_file(write_lines(tmp_path / "s.csv", [first, again, other, dp8, dp64]))
    assert (data.total, data.duplicates, data.aliases) == (5, 2, 1)
    assert data.skipped.sort_values("row")["reason"].tolist() == [
        "repeats an earlier row's measurement (imported twice)",
        "repeats an earlier row's measurement under another name of the same architecture"]
    assert data.skipped.sort_values("row")["row"].tolist() == [2, 5]
    assert sorted(round(r.tpot_s * 1e3, 8) for r in data.rows) == [15.87363339, 15.8736334, 21.333954]


def test_a_layout_filed_with_tp_or_dp_times_ep_is_read_as_its_twin_files_it(tmp_path: Path) -> None:
    """TP 64 / MoE TP 8 / EP 8 on an 8-GPU B200 node is the file's way of writing TP 8 / EP 8 (its 41
    such rows each repeat a TP 8 row's floats): the twin is dropped as the same measurement, a lone
    one is read as TP (or DP) / EP; multi-node dense TP and GB200's NVL72 layouts are left as filed."""
    deepseek = {"model_path": "deepseek-ai/DeepSeek-R1", "system": "b200_sxm", "precision": "fp8"}
    tp8 = line("x", 8, 64, 150.123456789, 12.3456789, id="tp8", moe_tp_size=1, moe_ep_size=8, **deepseek)
    tp64 = dict(tp8, id="tp64", tp_size=64, moe_tp_size=8, batch_size=1)
    tp16 = line("x", 16, 32, 140.0, 11.0, id="tp16", moe_tp_size=4, moe_ep_size=4, **deepseek)
    dp64 = line("x", 1, 128, 300.0, 20.0, id="dp64", attention_dp_size=64, moe_tp_size=8, moe_ep_size=8,
                batch_size=2, **deepseek)
    nvl72 = line("x", 72, 16, 200.0, 9.0, id="nvl72", moe_tp_size=72, moe_ep_size=1,
                 **{**deepseek, "system": "gb200"})
    dense16 = line("meta-llama/Llama-3.1-8B-Instruct", 16, 8, 50.0, 5.0, id="dense16", moe_tp_size=16)
    data = read_serving_file(write_lines(tmp_path / "s.csv", [tp8, tp64, tp16, dp64, nvl72, dense16]))
    assert (data.total, data.duplicates, data.ep_twins, data.ep_multiplied) == (6, 1, 1, 3)
    assert data.skipped_by_reason() == {
        "repeats another row's measurement, filed with its tp or attention dp multiplied by its ep": 1}
    assert data.skipped["row"].tolist() == [2]
    layouts = {(r.tp, r.dp, r.ep, r.concurrency) for r in data.rows}
    assert layouts == {(8, 1, 8, 64), (4, 1, 4, 32), (1, 8, 8, 128), (72, 1, 1, 16), (16, 1, 1, 8)}


def test_a_vllm_row_filing_dp_equal_to_tp_is_read_without_dp() -> None:
    """vLLM's MiniMax and Kimi rows filed ``tp T, dp T, ep T x T`` measure their ``tp T, ep T``
    siblings (115 pairs, TPOT within 5% in 95%): read so. Other DP layouts, and other engines'
    rows of that shape, stay as filed."""
    from servesim.calibration.serving_data import deflate_dp_as_tp, dp_as_tp

    minimax = {"model_path": "MiniMaxAI/MiniMax-M2.5", "system": "b200_sxm", "backend": "vllm",
               "backend_version": "0.19.0", "precision": "fp8", "moe_tp_size": 1}
    rows = pd.DataFrame([line("x", 4, 64, 500.0, 20.0, attention_dp_size=4, moe_ep_size=16, **minimax),
                         line("x", 2, 64, 500.0, 20.0, attention_dp_size=4, moe_ep_size=8, **minimax),
                         line("x", 4, 64, 500.0, 20.0, attention_dp_size=4, moe_ep_size=16,
                              **{**minimax, "backend": "trtllm"})], columns=COLUMNS).astype(str)
    found = dp_as_tp(rows)
    assert found.tolist() == [True, False, False]
    read = deflate_dp_as_tp(rows, found)
    assert read.loc[0, ["tp_size", "attention_dp_size", "moe_ep_size"]].tolist() == ["4", "1", "4"]
    assert read.loc[1:].equals(rows.loc[1:])


def test_a_disaggregated_row_without_workers_whose_floats_a_row_with_them_holds_counts_once(
        tmp_path: Path) -> None:
    """The file's 203 disaggregated DeepSeek-R1 rows without worker counts that hold a DeepSeek-V3
    row's very floats (same engine, GPU, lengths and clients) and that row's worker counts: one
    measurement, replayed once; a row without workers and floats of its own stays listed as such."""
    with_workers = line("deepseek-ai/DeepSeek-V3", 8, 16, 812.345678901, 9.87654321, id="v3", mode="disagg",
                        tp_size="", prefill_num_workers=1, prefill_tp_size=8, prefill_batch_size=1,
                        decode_num_workers=2, decode_tp_size=8, decode_batch_size=8)
    without = dict(with_workers, id="r1", model_path="deepseek-ai/DeepSeek-R1", prefill_num_workers="",
                   decode_num_workers="", prefill_batch_size="", decode_batch_size="")
    other = dict(without, id="other", silicon_tpot_ms=9.5)
    data = read_serving_file(write_lines(tmp_path / "s.csv", [with_workers, without, other]))
    assert (data.duplicates, data.workerless_twins, len(data.rows)) == (1, 1, 1)
    assert data.skipped.sort_values("row")["reason"].tolist() == [
        "repeats the measurement of a disaggregated row that records its worker counts (the same floats), "
        "without them",
        "disaggregated row without worker counts (AIConfigurator's own reader refuses these too)"]


def test_a_row_whose_throughput_exceeds_the_peak_is_listed_not_replayed(tmp_path: Path) -> None:
    """Little's law: c clients, each request 50 ms to its first token and 100 more tokens at 9.5 ms,
    complete c requests a second. Llama-3.1-8B multiplies 7,504,658,432 weights per token (32 x
    (4096 x 6144 + 4096 x 4096 + 3 x 4096 x 14336) + 4096 x 128256), so 1,000 + 101 tokens are
    at least 2 x 7,504,658,432 x 1,101 = 1.6525e13 FLOPs; one H100's bf16 dense peak (989.4
    TFLOP/s) does 59.87 of them a second: 59 clients fit under it, 60 (1.002x) do not."""
    rows = [line("meta-llama/Llama-3.1-8B-Instruct", 1, c, 50.0, 9.5, isl=1000, osl=101) for c in (59, 60)]
    data = read_serving_file(write_lines(tmp_path / "s.csv", rows))
    assert [r.concurrency for r in data.rows] == [59]
    assert data.skipped_by_reason() == {
        "measured throughput exceeds the GPUs' dense peak compute for its prompt and output tokens "
        "(cached prefixes reused?)": 1}


def test_the_first_round_weighs_one_twentieth_of_the_profiled_mean() -> None:
    """aiperf profiles 20 rounds of N requests after a drained warm-up: the replay's first round
    (all clients at once) is one of them, the three simulated after it stand for the other 19.
    First-round TTFT 10 s, later 2 s: 10 / 20 + 2 * 19 / 20 = 2.4 s."""
    weights = round_weights(concurrency=4, warmup=1, total=16)
    assert weights[:4] == pytest.approx([1 / 80] * 4) and weights[4:] == pytest.approx([19 / 240] * 12)
    ttft = np.array([10.0] * 4 + [2.0] * 12)
    assert weighted_mean(ttft, weights) == pytest.approx(2.4)
    ttft[5] = np.nan  # a request that did not complete is left out, the others keep their weights:
    # (4 * 10 / 80 + 11 * 2 * 19 / 240) / (4 / 80 + 11 * 19 / 240) = 2.2417 / 0.92083
    assert weighted_mean(ttft, weights) == pytest.approx(2.43439, rel=1e-5)


def test_the_stacked_loss_is_the_row_by_row_loss(serving_file: Path) -> None:
    """The fit's one-pass evaluation of many rows gives the loss of evaluating them one by one
    (to rounding), with serial and overlapped host terms, for TPOT alone and with TTFT."""
    data = read_serving_file(serving_file)
    traced = [t for t in trace_rows(data.rows, warmup=1, measured=3) if t.trace is not None]
    measurements = [t.measurement(1) for t in traced]
    stacked = StackedMeans.build(measurements, Coefficients().scales)
    assert stacked is not None
    for c in (Coefficients(), Coefficients(fixed_s=2e-2, per_seq_s=1e-3, serial_fixed_s=4e-4,
                                           serial_per_seq_s=2e-6)):
        for metrics in (("tpot",), ("ttft", "tpot")):
            assert stacked.loss(c, metrics) == pytest.approx(loss(measurements, c, metrics), rel=1e-9)


FRONT_END = 0.02
"""A front end of 20 ms per request, longer than the steps of these rows: where a request joins a
busy replica it misses steps, so only simulation says what it costs."""


def simulated_measurement(model_path: str, tp: int, concurrency: int) -> tuple[float, float]:
    """What simulating the row with TRUTH and a 20 ms front end says (mean TTFT and TPOT, ms)."""
    from servesim.calibration.serving_validate import _simulate

    row = ServingRow(row=0, engine="trtllm", model=read_model(model_path), hf_model=model_path,
                     gpu="h100_sxm", tp=tp, precision="bf16", isl=ISL, osl=12, concurrency=concurrency,
                     ttft_s=1.0, tpot_s=1.0, version="")
    _, ttft, tpot = _simulate((row, 1, 3, replace(TRUTH, frontend_s=FRONT_END)))
    return ttft * 1e3, tpot * 1e3


def test_fit_serving_finds_the_front_end_by_simulating_where_re_timing_cannot(tmp_path: Path) -> None:
    """Rows "measured" by simulating a 20 ms front end: the fit's latency, chosen on each row's
    TTFT at the grid's latencies (re-timed where exact, simulated where not), is 20 ms, and every
    model left out is predicted from the other's rows within 5%."""
    lines = [line(model, tp, concurrency, *simulated_measurement(model, tp, concurrency))
             for model, tp in (("meta-llama/Llama-3.1-8B-Instruct", 1), ("Qwen/Qwen3-32B", 2))
             for concurrency in (2, 8)]
    path = tmp_path / "silicon.csv"
    pd.DataFrame(lines, columns=COLUMNS).to_csv(path, index=False)
    result = fit_serving(path, measured=3, engines=("trtllm",))
    fitted = result.coefficients["trtllm"]
    assert fitted.frontend_s == pytest.approx(FRONT_END, rel=0.05)
    assert fitted.per_seq_s == pytest.approx(TRUTH.per_seq_s, rel=0.1)
    rows = result.lomo_rows
    assert (rows["ttft_ape_%"] < 5.0).all() and (rows["tpot_ape_%"] < 5.0).all()


def test_pick_front_end_refines_between_grid_points() -> None:
    from servesim.calibration.replay import TRACE_FRONTEND_S
    from servesim.calibration.serving_validate import FRONT_END_GRID_S, pick_front_end

    grid = np.asarray(FRONT_END_GRID_S)
    rows = [ServingRow(row=i, engine="trtllm", model="llama-3.1-8b", hf_model="m", gpu="h100_sxm", tp=1,
                       precision="bf16", isl=1, osl=2, concurrency=2, ttft_s=0.05 + 0.0123, tpot_s=0.01,
                       version="") for i in (1, 2)]
    curves = {1: 0.05 + grid, 2: 0.05 + grid}  # TTFT = 50 ms + latency: the answer is 12.3 ms
    assert pick_front_end(curves, rows) == pytest.approx(0.0123, abs=1e-3)
    assert pick_front_end(curves, []) == TRACE_FRONTEND_S
    # never below the latency the rows were traced with: at 0 an engine would run another schedule
    fast = [ServingRow(**{**rows[0].__dict__, "row": i, "ttft_s": 0.01}) for i in (1, 2)]
    assert pick_front_end(curves, fast) == TRACE_FRONTEND_S


HANDOFF = 0.06
"""The hand-off latency the disaggregated rows below are "measured" with."""


def disaggregated_line(model: str, tp: int, concurrency: int) -> dict[str, Any]:
    """A disaggregated row (one TP ``tp`` prefill worker, one decode worker) "measured" by
    simulating it with the TRUTH coefficients and a :data:`HANDOFF` hand-off."""
    from servesim.calibration.serving_validate import _simulate

    extra = {"mode": "disagg", "tp_size": "", "prefill_num_workers": 1, "prefill_tp_size": tp,
             "prefill_batch_size": 1, "decode_num_workers": 1, "decode_tp_size": tp,
             "decode_batch_size": concurrency}
    row = ServingRow(row=0, engine="trtllm", model=read_model(model), hf_model=model, gpu="h100_sxm", tp=tp,
                     precision="bf16", isl=ISL, osl=12, concurrency=concurrency, ttft_s=1.0, tpot_s=1.0,
                     version="", prefill=(1, tp, 1, 1), decode=(1, tp, 1, 1), prefill_batch=1,
                     decode_batch=concurrency)
    _, ttft, tpot = _simulate((row, 1, 3, replace(TRUTH, frontend_s=1e-5, handoff_s=HANDOFF)))
    return line(model, tp, concurrency, ttft * 1e3, tpot * 1e3, **extra)


def test_fit_serving_recovers_a_disaggregated_hand_off(tmp_path: Path) -> None:
    """Aggregated rows "measured" with the TRUTH coefficients and disaggregated rows measured with a
    60 ms hand-off on top: the fit finds the CPU coefficients on the first and 60 ms on the second
    (within one 10 ms grid step), for all models and for each model left out, whose disaggregated
    TTFT is then predicted within 5%."""
    models = (("meta-llama/Llama-3.1-8B-Instruct", 1), ("Qwen/Qwen3-32B", 2))
    lines = [line(model, tp, concurrency, *measured(model, tp, concurrency))
             for model, tp in models for concurrency in (2, 8)]
    lines += [disaggregated_line(model, tp, concurrency) for model, tp in models for concurrency in (2, 4)]
    path = tmp_path / "silicon.csv"
    pd.DataFrame(lines, columns=COLUMNS).to_csv(path, index=False)
    result = fit_serving(path, measured=3, engines=("trtllm",), front_end=False)
    assert result.coefficients["trtllm"].handoff_s == pytest.approx(HANDOFF, abs=0.0101)
    rows = result.lomo_rows
    split = rows[rows["layout"].str.startswith("P")]
    assert len(split) == 4 and (split["replay"] == "simulated").all()
    assert (split["ttft_ape_%"] < 5.0).all(), split[["model", "measured_ttft_ms", "predicted_ttft_ms"]]


def test_pick_handoff_is_the_grid_latency_closest_in_log_error() -> None:
    """Simulated TTFTs without a hand-off of 100 and 300 ms, measured 170 and 370 ms: 70 ms."""
    from servesim.calibration.serving_validate import pick_handoff

    rows = [ServingRow(row=i, engine="sglang", model="llama-3.1-8b", hf_model="m", gpu="b200_sxm", tp=1,
                       precision="bf16", isl=1, osl=2, concurrency=2, ttft_s=measured_s, tpot_s=0.01,
                       version="") for i, measured_s in ((1, 0.17), (2, 0.37))]
    assert pick_handoff({1: 0.1, 2: 0.3}, rows) == pytest.approx(0.07)
    assert pick_handoff({1: 0.1, 2: 0.3}, []) == 0.0
    assert pick_handoff({1: 0.2, 2: 0.4}, rows) == 0.0  # already slower than measured: none


def test_fit_serving_writes_profiles_that_name_their_source(serving_file: Path, tmp_path: Path) -> None:
    """``servesim calibrate fit-serving FILE --source TEXT`` writes each engine's fitted host time
    with provenance naming the data as asked (the shipped profiles cite the commit the file came
    from), beside the coefficients the fit recovered."""
    import yaml
    from typer.testing import CliRunner

    from servesim.cli.app import build_app

    out = tmp_path / "engines"
    source = "silicon.csv (acme/bench@0123abcd)"
    done = CliRunner().invoke(build_app("calibrate"), ["calibrate", "fit-serving", str(serving_file),
                                                       "--out-dir", str(out), "--source", source])
    assert done.exit_code == 0, done.output
    written = yaml.safe_load((out / "trtllm.yaml").read_text())
    costs = written["cpu_costs"]["default"]
    assert f"measured closed-loop deployments of {source} (single-group" in costs["provenance"]
    assert costs["fixed_s"] == pytest.approx(TRUTH.fixed_s, rel=0.03)
    assert costs["per_seq_s"] == pytest.approx(TRUTH.per_seq_s, rel=0.03)


def sglang_row(isl: int, osl: int) -> ServingRow:
    """An SGLang 0.5.9 row of Llama-3.1-8B on one H100 at 4 clients."""
    return ServingRow(row=1, engine="sglang", model="llama-3.1-8b",
                      hf_model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100_sxm", tp=1, precision="bf16",
                      isl=isl, osl=osl, concurrency=4, ttft_s=1.0, tpot_s=0.1, version="0.5.9")


def test_a_length_spread_replays_output_lengths_around_the_osl() -> None:
    """``length_spread`` draws each request's output length uniformly within +/- that fraction of
    the OSL (rounded, at least one token) and makes room for the longest in ``max_model_len``;
    0 keeps every request at exactly the OSL."""
    row = sglang_row(isl=1000, osl=1000)
    assert row.document(2)["workload"]["output"] == {"dist": "fixed", "value": 1000}
    assert row.document(2)["deployment"]["max_model_len"] == 2000
    spread = replace(row, length_spread=0.02).document(2)
    assert spread["workload"]["output"] == {"dist": "uniform", "low": 980, "high": 1020}
    assert spread["deployment"]["max_model_len"] == 2020
    assert replace(row, length_spread=1e-6).output_spread() == 1
    assert replace(row, osl=2, length_spread=0.4).output_spread() == 1  # never a zero-token output


def test_a_length_spread_breaks_a_prefill_first_lock_step() -> None:
    """SGLang runs every waiting prompt before any decode, so fixed lengths finish a whole round of
    closed-loop clients in one step and send the next round at one instant, for ever: every later
    round repeats the first (the same TTFTs). With output lengths spread by 5% the clients finish
    in different steps, their next prompts arrive apart and wait behind fewer others."""
    row = sglang_row(isl=4000, osl=64)
    knobs = {**ZERO_CPU, "frontend_latency_s": TRACE_FRONTEND_S}

    def rounds(r: ServingRow) -> tuple[np.ndarray, np.ndarray]:
        requests = simulate_document(r.document(6, knobs)).requests
        ttft = (requests["first_token_s"] - requests["arrival_s"]).to_numpy().reshape(6, 4)
        return ttft, requests["arrival_s"].to_numpy().reshape(6, 4)

    locked_ttft, locked_arrivals = rounds(row)
    assert np.ptp(locked_arrivals[1:], axis=1).max() < 1e-9  # each later round sent at one instant
    for later in locked_ttft[1:]:
        np.testing.assert_allclose(np.sort(later), np.sort(locked_ttft[1]), rtol=1e-9)
    spread_ttft, spread_arrivals = rounds(replace(row, length_spread=0.05))
    assert np.ptp(spread_arrivals[2:], axis=1).min() > 0.0
    assert spread_ttft[2:].mean() < 0.8 * locked_ttft[2:].mean()


def test_fit_serving_names_its_length_spread(serving_file: Path, tmp_path: Path) -> None:
    """``--length-spread 0.02`` reaches the profiles' provenance (a bad spread: tests/test_cli.py)."""
    import yaml
    from typer.testing import CliRunner

    from servesim.cli.app import build_app

    app, out = build_app("calibrate"), tmp_path / "engines"
    done = CliRunner().invoke(app, ["calibrate", "fit-serving", str(serving_file), "--out-dir", str(out),
                                    "--length-spread", "0.02"])
    assert done.exit_code == 0, done.output
    provenance = yaml.safe_load((out / "trtllm.yaml").read_text())["cpu_costs"]["default"]["provenance"]
    assert "output lengths uniform within +/-2.0% of its OSL (--length-spread)" in provenance


def test_sglang_rows_measured_once_the_generator_mixed_chunks_replay_with_them(tmp_path: Path) -> None:
    """AIConfigurator's rules give aggregated SGLang workers --enable-mixed-chunk and
    --max-prefill-tokens isl + 1500 from 2026-01-19 (ai-dynamo/aiconfigurator PR #257): a row
    measured that day replays prefill_first with decodes mixed in and a step budget of 1,000 +
    1,500 = 2,500 tokens on a B200 (SGLang's own chunk there is 16,384; with 4 decodes riding
    along, 2,496 are left for prompts); a row of the day before keeps SGLang's defaults. An
    undated row takes the earliest day its release was measured in the file (0.5.9: the 19th), a
    release the file never dates keeps the defaults, and vLLM rows of the same day are untouched."""
    def sglang(concurrency: int, version: str, day: str) -> dict[str, Any]:
        source = f"db-dump/2026-04-27; silicon_concurrency={concurrency}" + (f"; measured={day}T00:00:00.000Z"
                                                                           if day else "")
        return line("meta-llama/Llama-3.1-8B-Instruct", 1, concurrency, 100.0, 10.0, backend="sglang",
                     backend_version=version, system="b200_sxm", isl=1000, silicon_data_source=source,
                     id=f"sglang-{concurrency}")

    lines = [sglang(4, "0.5.9", "2026-01-19"), sglang(5, "0.5.8", "2026-01-18"), sglang(6, "0.5.9", ""),
             sglang(7, "0.5.1.post1", ""),
             dict(sglang(8, "0.19.0", "2026-01-19"), backend="vllm", id="vllm-8")]
    rows = {r.concurrency: r for r in read_serving_file(write_lines(tmp_path / "s.csv", lines)).rows}
    assert [rows[c].measured_on for c in (4, 5, 6, 7, 8)] == [
        "2026-01-19", "2026-01-18", "2026-01-19", "", "2026-01-19"]
    mixing = rows[4].document(2)
    assert mixing["policy"] == {"name": "prefill_first", "mixed": True}
    assert mixing["engine"]["max_prefill_tokens"] == 2500
    assert rows[4].step_budget() == "max_prefill_tokens 2500"
    group = prepare(validate_document(mixing)).topology.kv_group
    assert group.limits.max_num_batched_tokens == 2500 and group.policy.options.mixed
    assert rows[6].document(2)["policy"] == mixing["policy"]
    for default in (rows[5], rows[7]):
        document = default.document(2)
        assert "policy" not in document and "max_prefill_tokens" not in document["engine"]
        limits = prepare(validate_document(document)).topology.kv_group.limits
        assert limits.max_num_batched_tokens == 16384  # SGLang's chunk on a GPU of 160 GB or more
    vllm = rows[8].document(2)
    assert "policy" not in vllm and vllm["deployment"]["max_num_batched_tokens"] == 8 + 1000 + 1500
    # decodes ride along the prompts' steps only when mixed
    steps = simulate_document(mixing).steps
    prompt_steps = steps[steps["prefill_tokens"] > 0]
    assert (prompt_steps["num_decodes"] > 0).any()
    assert (prompt_steps["prefill_tokens"] + prompt_steps["decode_tokens"] <= 2500).all()
    alone = simulate_document(rows[5].document(2)).steps
    assert (alone[alone["prefill_tokens"] > 0]["num_decodes"] == 0).all()


def test_checkpoints_of_catalogue_architectures_are_read_and_a_hybrid_model_replays(tmp_path: Path) -> None:
    """A serving file names models by checkpoint: a later release, a quantisation or a tuning of
    an architecture the catalogue has is that architecture (``catalogue_model``); a model of another
    architecture is its own entry or none. A Qwen3.5 row (linear-attention layers, 512 experts, FP8
    on four B200s under SGLang) replays like any other."""
    assert catalogue_model("Qwen/Qwen3.5-397B-A17B-FP8") == "qwen3.5-397b-a17b"
    assert catalogue_model("nvidia/Llama-3.3-70B-Instruct-FP8") == "llama-3.1-70b"
    assert catalogue_model("Qwen/Qwen3-235B-A22B-Thinking-2507") == "qwen3-235b-a22b"
    assert catalogue_model("nvidia/DeepSeek-R1-0528-FP4-v2") == "deepseek-v3"
    assert catalogue_model("deepseek-ai/DeepSeek-V3") == "deepseek-v3"  # the file's own table first
    assert catalogue_model("deepseek-ai/DeepSeek-V3.2") == "deepseek-v3.2"  # sparse attention: its own
    assert catalogue_model("zai-org/GLM-5-FP8") == "glm-5"
    assert catalogue_model("tiiuae/Falcon-H1-34B-Instruct") is None  # parallel SSM + attention: not modelled
    assert catalogue_model("nvidia/NVIDIA-Nemotron-Nano-9B-v2") == "nemotron-nano-9b-v2"
    assert catalogue_model("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8") == "qwen3-coder-480b-a35b"
    assert catalogue_model("Qwen/Qwen3-Coder-30B-A3B-Instruct") == "qwen3-30b-a3b"
    assert catalogue_model("zai-org/GLM-4.5-Air-FP8") == "glm-4.5-air"  # not GLM-4.5's 355B
    assert catalogue_model("zai-org/GLM-4.7-Flash") == "glm-4.7-flash"
    assert catalogue_model("deepseek-ai/DeepSeek-R1-Distill-Llama-70B") == "llama-3.1-70b"
    assert catalogue_model("Qwen/Qwen3-VL-32B-Instruct-FP8") == "qwen3-32b"  # its language model
    qwen35 = line("Qwen/Qwen3.5-397B-A17B", 4, 8, 170.0, 9.0, backend="sglang", backend_version="0.5.9",
                  system="b200_sxm", precision="fp8", gemm_quant_mode="fp8", moe_quant_mode="fp8_block",
                  moe_tp_size=4, isl=1024, osl=64)
    falcon = line("tiiuae/Falcon-H1-34B-Instruct", 8, 8, 1, 1)
    data = read_serving_file(write_lines(tmp_path / "s.csv", [qwen35, falcon]))
    assert [r.model for r in data.rows] == ["qwen3.5-397b-a17b"]
    assert data.skipped_by_reason() == {"model tiiuae/Falcon-H1-34B-Instruct not in the catalogue": 1}
    traced = trace_rows(data.rows, warmup=1, measured=1)[0]
    assert traced.problem is None
    ttft, tpot = traced.measurement(1).predicted(Coefficients())
    # decode of 8 sequences: the experts hit (about 8 x 10 of 512) read once per layer, so a few ms
    assert 2e-3 < float(tpot[0]) < 30e-3 and 0.02 < float(ttft[0]) < 2.0


def test_mxfp4_experts_replay_beside_sixteen_bit_layers_on_any_gpu(tmp_path: Path) -> None:
    """gpt-oss ships MXFP4 experts and 16-bit attention: a row whose MoE mode is ``w4a16_mxfp4``
    deploys exactly that (W4A16 experts run on Hopper too), not NVFP4 everywhere (which an H100
    row would be refused for)."""
    row = line("openai/gpt-oss-120b", 1, 16, 100.0, 5.0, backend="vllm", backend_version="0.19.0",
               precision="", gemm_quant_mode="bf16", moe_quant_mode="w4a16_mxfp4", moe_tp_size=1)
    data = read_serving_file(write_lines(tmp_path / "s.csv", [row]))
    assert [(r.model, r.precision) for r in data.rows] == [("gpt-oss-120b", "mxfp4")]
    assert data.rows[0].document(1)["precision"] == {"weights": "bf16", "activations": "bf16",
                                                     "expert_weights": "mxfp4", "kv_cache": "bf16"}
    assert trace_rows(data.rows, warmup=1, measured=1)[0].problem is None


def test_an_fp8_checkpoint_on_a_gpu_without_fp8_tensor_cores_runs_weight_only(tmp_path: Path) -> None:
    """AIConfigurator's A100 rows: an FP8 checkpoint there runs as FP8 weights with 16-bit math
    (vLLM's Marlin kernels), not refused for lacking FP8 tensor cores; on an H100 it stays W8A8."""
    a100 = line("meta-llama/Llama-3.1-8B-Instruct", 1, 8, 100.0, 10.0, backend="vllm",
                backend_version="0.14.0", system="a100_sxm", precision="fp8", gemm_quant_mode="fp8")
    h100 = dict(a100, id="h100", system="h100_sxm")
    data = read_serving_file(write_lines(tmp_path / "s.csv", [a100, h100]))
    formats = [(r.gpu, r.document(1)["precision"]["activations"]) for r in data.rows]
    assert formats == [("a100_sxm", "bf16"), ("h100_sxm", "fp8")]
    assert all(t.problem is None for t in trace_rows(data.rows, warmup=1, measured=1))
