"""End-to-end serving measurements in AIConfigurator's ``silicon`` CSV format, as experiments.

Each row of such a file (``serving/aiconfigurator_silicon_dev.csv``, see its README) is one
deployment of one engine, driven by closed-loop clients at a fixed concurrency (``silicon_
concurrency=N`` inside ``silicon_data_source``) with fixed input and output lengths, and the
measured TTFT and TPOT (milliseconds). Rows that repeat another row in every column but ``id``
and ``silicon_data_source`` are the same measurement imported twice and are dropped first.

:func:`read_serving_file` turns every row the simulator can express into an experiment document
(model, GPU, engine, tensor parallelism, precision, closed-loop workload) and every other row
into a reason, so that nothing is skipped silently: disaggregated serving, pipeline and
expert parallelism, attention data parallelism, FP4, GPUs without a profile, models not in the
catalogue, rows without a concurrency or a measurement.

Assumptions where the file is silent: the engine's default flags (the file does not record
``max_num_batched_tokens``, CUDA-graph sizes or the KV memory fraction), a bf16 KV cache,
``max_model_len`` set to the row's input + output length, and for TensorRT-LLM (chunked prefill
off by default) a step budget of at least the input length plus the concurrency, since a
deployment with less could not have served the measured prompts at that load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim.errors import ServesimError
from servesim.inputs.files import read_text

REQUIRED = ("backend", "model_path", "system", "mode", "isl", "osl", "tp_size", "silicon_data_source",
            "silicon_ttft_ms", "silicon_tpot_ms")
KEY_EXCLUDED = ("id", "silicon_data_source")
HARDWARE = {"h100_sxm": "h100-sxm-80gb", "h200_sxm": "h200-sxm-141gb", "b200_sxm": "b200"}
MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
          "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
          "Qwen/Qwen3-32B": "qwen3-32b",
          "deepseek-ai/DeepSeek-R1": "deepseek-v3", "deepseek-ai/DeepSeek-V3": "deepseek-v3"}
"""Hugging Face ids -> catalogue models of the same architecture (DeepSeek-R1 is DeepSeek-V3's)."""
ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}
CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")


@dataclass(frozen=True)
class ServingRow:
    """One expressible measurement: where it came from, the experiment that replays it, and
    what was measured."""

    row: int
    """Line of the file (1 = the first data row after the header)."""
    engine: str
    model: str
    hf_model: str
    gpu: str
    tp: int
    precision: str
    isl: int
    osl: int
    concurrency: int
    ttft_s: float
    tpot_s: float
    version: str

    def document(self, requests_per_client: int,
                 engine_knobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """The experiment replaying this row: ``concurrency`` closed-loop clients, each sending
        ``requests_per_client`` requests of ``isl`` + ``osl`` tokens."""
        fp8 = self.precision == "fp8"
        # Benchmark prompts are random tokens: no prefix is ever shared, so the prefix cache (on in
        # every engine here) would only cost simulation time.
        deployment: dict[str, Any] = {"tp": self.tp, "max_model_len": self.isl + self.osl,
                                      "enable_prefix_caching": False}
        if self.engine == "trtllm":
            # Without chunked prefill, TensorRT-LLM schedules a prompt only when it fits the step
            # budget beside one token per running request; the measured deployments served these
            # prompts, so their max_num_tokens (not recorded) held them.
            deployment["max_num_batched_tokens"] = max(8192, self.isl + self.concurrency)
        return {
            "name": f"row{self.row}", "model": self.model, "hardware": HARDWARE[self.gpu],
            "engine": {"name": self.engine, **(engine_knobs or {})},
            "deployment": deployment,
            "precision": {"weights": "fp8" if fp8 else "bf16", "activations": "fp8" if fp8 else "bf16",
                          "kv_cache": "bf16"},
            "workload": {"arrival": {"process": "closed", "concurrency": self.concurrency},
                         "num_requests": self.concurrency * requests_per_client,
                         "prompt": {"dist": "fixed", "value": self.isl},
                         "output": {"dist": "fixed", "value": self.osl}},
            "output": "summary"}


@dataclass
class ServingFile:
    """A serving file read: the rows to replay and the others, each with its reason."""

    path: Path
    total: int
    duplicates: int
    rows: list[ServingRow] = field(default_factory=list)
    skipped: pd.DataFrame = field(default_factory=pd.DataFrame)

    def skipped_by_reason(self) -> dict[str, int]:
        if self.skipped.empty:
            return {}
        return {str(k): int(v) for k, v in self.skipped["reason"].value_counts().items()}


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return number


def _reason(raw: pd.Series) -> str | None:
    """Why the simulator cannot replay this row, or None when it can."""
    if str(raw["mode"]) != "agg":
        return "disaggregated serving (validate-serving replays aggregated rows)"
    if str(raw["backend"]) not in ENGINES:
        return f"engine {raw['backend']} not modelled"
    if str(raw["system"]) not in HARDWARE:
        return f"GPU system {raw['system']} has no profile"
    quant = {str(raw.get(c, "")).lower() for c in ("precision", "gemm_quant_mode", "moe_quant_mode")}
    if any("fp4" in q for q in quant):
        return "fp4 (not modelled)"
    if "int4" in quant or "int4_wo" in quant:
        return "int4 weights in a model outside the catalogue"
    if _number(raw.get("pp_size")) > 1:
        return "pipeline parallelism (not modelled)"
    if _number(raw.get("attention_dp_size")) > 1:
        return "attention data parallelism (not modelled)"
    if _number(raw.get("moe_ep_size")) > 1:
        return "expert parallelism (not modelled)"
    if str(raw["model_path"]) not in MODELS:
        return f"model {raw['model_path']} not in the catalogue"
    if not CONCURRENCY.search(str(raw["silicon_data_source"])):
        return "no client concurrency recorded"
    for column in ("isl", "osl", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms"):
        if not np.isfinite(_number(raw[column])) or _number(raw[column]) <= 0:
            return f"no {column}"
    return None


def read_serving_file(path: Path) -> ServingFile:
    """The rows of ``path`` the simulator can replay, and the others with their reasons."""
    path = Path(path)
    read_text(path, "serving file")  # one-line errors for a missing or unreadable file
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ServesimError(str(path), f"not a CSV file ({exc.__class__.__name__})",
                            "give a file in AIConfigurator's silicon CSV format") from None
    missing = [c for c in REQUIRED if c not in raw.columns]
    if missing:
        raise ServesimError(str(path), f"missing column(s) {', '.join(missing)}",
                            "give a file in AIConfigurator's silicon CSV format (see serving/README.md)")
    raw.index = np.arange(1, len(raw) + 1)
    key = [c for c in raw.columns if c not in KEY_EXCLUDED]
    unique = raw[~raw.duplicated(subset=key, keep="first")]
    out = ServingFile(path, total=len(raw), duplicates=len(raw) - len(unique))
    skipped = []
    lines = unique.index.to_numpy(dtype=np.int64)
    for position in range(len(unique)):
        line = int(lines[position])
        row = unique.iloc[position]
        reason = _reason(row)
        if reason is not None:
            skipped.append({"row": line, "backend": row["backend"], "model": row["model_path"],
                            "system": row["system"], "reason": reason})
            continue
        match = CONCURRENCY.search(str(row["silicon_data_source"]))
        assert match is not None
        precision = str(row.get("precision") or "bf16").lower() or "bf16"
        out.rows.append(ServingRow(
            row=line, engine=ENGINES[str(row["backend"])], model=MODELS[str(row["model_path"])],
            hf_model=str(row["model_path"]), gpu=str(row["system"]), tp=int(_number(row["tp_size"])),
            precision="fp8" if "fp8" in precision or "FP8" in str(row["model_path"]) else "bf16",
            isl=int(_number(row["isl"])), osl=int(_number(row["osl"])), concurrency=int(match.group(1)),
            ttft_s=_number(row["silicon_ttft_ms"]) * 1e-3, tpot_s=_number(row["silicon_tpot_ms"]) * 1e-3,
            version=str(row.get("backend_version", ""))))
    out.skipped = pd.DataFrame(skipped, columns=["row", "backend", "model", "system", "reason"])
    return out
