"""End-to-end serving measurements: a file in AIConfigurator's silicon CSV format, written here,
is read with every row it cannot express counted by reason, replayed, and fitted; the engine's
CPU coefficients used to make the "measurements" are recovered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from servesim.calibration.replay import Coefficients
from servesim.calibration.serving_data import ServingRow, read_serving_file
from servesim.calibration.serving_validate import fit_serving, trace_rows, validate_serving
from servesim.errors import ServesimError

TRUTH = Coefficients(fixed_s=2e-2, per_seq_s=1e-3)
"""A host so slow that it shows through TensorRT-LLM's overlap scheduler: 20 ms per step plus
1 ms per sequence, against decode steps of a few milliseconds."""

COLUMNS = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision",
           "mode", "isl", "osl", "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size",
           "attention_dp_size", "moe_tp_size", "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms"]


def line(model: str, tp: int, concurrency: int, ttft_ms: float, tpot_ms: float,
         **extra: Any) -> dict[str, Any]:
    source = f"db-dump/2026-04-27; silicon_concurrency={concurrency}; measured=2026-04-17"
    values = {"id": f"{model}-{tp}-{concurrency}-{len(extra)}", "silicon_data_source": source,
              "backend": "trtllm", "backend_version": "1.2.0rc6", "model_path": model,
              "system": "h100_sxm", "precision": "", "mode": "agg", "isl": 256, "osl": 12,
              "gemm_quant_mode": "", "moe_quant_mode": "", "batch_size": concurrency, "tp_size": tp,
              "pp_size": 1, "attention_dp_size": 0, "moe_tp_size": tp, "moe_ep_size": 1,
              "silicon_ttft_ms": ttft_ms, "silicon_tpot_ms": tpot_ms}
    values.update(extra)
    return values


def measured(model_path: str, tp: int, concurrency: int) -> tuple[float, float]:
    """What the simulator says with the TRUTH coefficients (the file's "measurement")."""
    row = ServingRow(row=0, engine="trtllm", model=read_model(model_path), hf_model=model_path,
                     gpu="h100_sxm", tp=tp, precision="bf16", isl=256, osl=12, concurrency=concurrency,
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
              line("deepseek-ai/DeepSeek-V3", 8, 16, 100, 10, moe_ep_size=8),
              line("Qwen/Qwen3-32B", 4, 16, 100, 10, system="b300_sxm"),
              line("MiniMaxAI/MiniMax-M2.5", 4, 16, 100, 10),
              line("Qwen/Qwen3-32B", 4, 16, 100, 10, silicon_data_source="db-dump/2026-04-27")]
    path = tmp_path_factory.mktemp("serving") / "silicon.csv"
    pd.DataFrame(lines, columns=COLUMNS).to_csv(path, index=False)
    return path


def test_every_row_is_replayed_or_counted_with_its_reason(serving_file: Path) -> None:
    data = read_serving_file(serving_file)
    assert (data.total, data.duplicates, len(data.rows)) == (11, 1, 4)
    assert data.skipped_by_reason() == {
        "disaggregated serving (validate-serving replays aggregated rows)": 1, "fp4 (not modelled)": 1,
        "expert parallelism (not modelled)": 1, "GPU system b300_sxm has no profile": 1,
        "model MiniMaxAI/MiniMax-M2.5 not in the catalogue": 1, "no client concurrency recorded": 1}
    row = data.rows[0]
    assert (row.model, row.tp, row.concurrency, row.isl, row.osl) == ("llama-3.1-8b", 1, 2, 256, 12)
    document = row.document(4)
    assert document["workload"]["arrival"] == {"process": "closed", "concurrency": 2}
    assert document["workload"]["num_requests"] == 8 and document["engine"] == {"name": "trtllm"}


def test_validate_serving_writes_the_comparison(serving_file: Path, tmp_path: Path) -> None:
    rows, summary, skipped = validate_serving(serving_file, tmp_path, measured=3)
    assert len(rows) == 4 and len(skipped) == 6
    for name in ("serving_rows.csv", "serving_summary.csv", "serving_skipped.csv", "serving.html"):
        assert (tmp_path / name).is_file()
    overall = summary.set_index(["engine", "gpu"]).loc[("all", "all")]
    assert overall["rows"] == 4 and overall["share_of_file_%"] == pytest.approx(40.0)


def test_fit_serving_recovers_the_cpu_coefficients(serving_file: Path) -> None:
    """Two concurrencies per model tell the cost per step from the cost per sequence; leaving a
    model out, the other one's rows still recover them, so its prediction is exact."""
    result = fit_serving(serving_file, measured=3, engines=("trtllm",))
    fitted = result.coefficients["trtllm"]
    assert fitted.fixed_s == pytest.approx(TRUTH.fixed_s, rel=0.03)
    assert fitted.per_seq_s == pytest.approx(TRUTH.per_seq_s, rel=0.03)
    assert result.rows_used == {"trtllm": 4}
    assert (result.lomo_rows["tpot_ape_%"] < 1.0).all() and (result.lomo_rows["ttft_ape_%"] < 2.0).all()
    assert np.isfinite(result.lomo_summary["tpot_median_ape_%"]).all()


def test_a_file_in_another_format_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ServesimError, match=r"missing column\(s\) backend, model_path"):
        read_serving_file(path)
