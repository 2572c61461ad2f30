"""Reading NVIDIA AIConfigurator's per-operator timings as measurements.

``kernels/aiconfigurator/<gpu>/<family>/<backend>/<version>/*.parquet`` (see that folder's
README) hold what vLLM dispatches on one GPU, timed with CUDA events over CUDA-graph replays,
``latency`` in milliseconds per call:

- ``gemm_perf``: ``RowParallelLinear`` with input ``(m, k)`` and ``n`` outputs (``m`` tokens),
  ``gemm_dtype`` bfloat16, fp8 (per-tensor, activation quantisation inside the timed call),
  fp8_block, nvfp4 (B200);
- ``context_attention_perf``: ``batch_size`` sequences of ``isl`` new tokens each, no earlier
  cache, ``num_heads`` / ``num_key_value_heads`` per GPU, ``head_dim``, ``kv_cache_dtype``;
- ``generation_attention_perf``: one new token per sequence over ``step`` cached tokens;
- ``custom_allreduce_perf``: vLLM's ``tensor_model_parallel_all_reduce`` on 2-8 GPUs,
  ``message_size`` in elements of bf16, captured in a graph (``vllm_graph``) or eager;
- ``nccl_perf``: nccl-tests, ``message_size`` in elements of ``nccl_dtype``;
- ``moe_perf``: vLLM's ``FusedMoE.forward`` (routing, both expert GEMMs, activation and the sum
  over each token's experts) for ``num_tokens`` tokens, bf16, FP8 (per-tensor and block-scaled)
  and INT4 experts, balanced or power-law routing.

The tables come out in the :mod:`servesim.calibration.schema` format (seconds, bytes), plus the
two collective families :mod:`servesim.calibration.collective_fit` fits. Rows the cost model
cannot price the same way are left out and counted (:class:`AicTables.dropped`): GEMMs with a
side below 512 (no serving layer on one GPU is that narrow; the curve would bend to them),
block-scaled FP8 and FP4 GEMMs (one FP8 format is modelled; FP4 is not), attention with a
sliding window (the cost model caps windows, but the grids here are not what serving runs), and
attention over an fp8 KV cache (its dequantisation cost is not modelled, so those rows would bend
the bf16 curves; they are counted).
Nothing is copied into the repository.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.errors import ServesimError

GPUS = {"h100_sxm": "h100-sxm-80gb", "h200_sxm": "h200-sxm-141gb", "b200_sxm": "b200",
        "a100_sxm": "a100-sxm-80gb"}
"""AIConfigurator system name -> servesim profile."""
VERSIONS = {"h100_sxm": "0.24.0", "h200_sxm": "0.24.0", "b200_sxm": "0.24.0", "a100_sxm": "0.14.0"}
"""The vLLM version of each system's tables (the newest with real data, per the data's README)."""
NCCL_FOLDER = {"h100_sxm": "2.27.3", "h200_sxm": "2.26.2", "b200_sxm": "2.27.3", "a100_sxm": "2.27.3"}
"""The NCCL folder each system's spec names (``misc.nccl_version``), which AIConfigurator loads."""
MIN_GEMM_SIDE = 512
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "nvfp4": "nvfp4"}
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}
BF16_BYTES = 2


@dataclass
class AicTables:
    """One GPU's measurements, by family, and the rows left out, by reason."""

    gpu: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    moe_expert_parallel: pd.DataFrame | None = None
    """Fused-MoE rows of expert-parallel layouts (rank 0), validated apart from the fit."""
    moe_skewed: pd.DataFrame | None = None
    """Fused-MoE rows routed by the collector's power law (exponent 1.01), without expert
    parallelism: validated apart from the fit (:mod:`~servesim.calibration.moe_routing`)."""

    def drop(self, reason: str, count: int) -> None:
        if count:
            self.dropped[reason] = self.dropped.get(reason, 0) + int(count)


def _parquet(root: Path, gpu: str, family: str, backend: str, version: str, name: str) -> pd.DataFrame:
    path = root / gpu / family / backend / version / name
    if not path.is_file():
        raise ServesimError("aiconfigurator", f"{path} not found",
                            "give the kernels/aiconfigurator folder of the shared data (see its README)")
    return pd.read_parquet(path)


def gemm_tables(root: Path, gpu: str, out: AicTables) -> dict[str, pd.DataFrame]:
    """bf16 GEMMs (``gemm``), per-tensor fp8 GEMMs (``gemm_fp8``) and NVFP4 GEMMs (``gemm_fp4``, B200),
    fitted apart: low-precision kernels reach a different share of their peak (and include the
    activations' quantisation)."""
    table = _gemm_rows(root, gpu, out)
    tables = {}
    for family, dtype in (("gemm", "bf16"), ("gemm_fp8", "fp8"), ("gemm_fp4", "nvfp4")):
        rows = table["dtype"] == dtype
        if rows.any():
            tables[family] = table[rows].reset_index(drop=True)
    return tables


def _gemm_rows(root: Path, gpu: str, out: AicTables) -> pd.DataFrame:
    raw = _parquet(root, gpu, "gemm", "vllm", VERSIONS[gpu], "gemm_perf.parquet")
    known = raw["gemm_dtype"].isin(list(DTYPES))
    for dtype, count in raw.loc[~known, "gemm_dtype"].value_counts().items():
        out.drop(f"gemm {dtype} (format not modelled)", count)
    raw = raw[known]
    wide = (raw["n"] >= MIN_GEMM_SIDE) & (raw["k"] >= MIN_GEMM_SIDE)
    out.drop(f"gemm with n or k below {MIN_GEMM_SIDE}", int((~wide).sum()))
    raw = raw[wide]
    return pd.DataFrame({"m": raw["m"].to_numpy(), "n": raw["n"].to_numpy(), "k": raw["k"].to_numpy(),
                         "dtype": raw["gemm_dtype"].map(DTYPES).to_numpy(),
                         "time_s": raw["latency"].to_numpy() * 1e-3,
                         "source": f"aiconfigurator {gpu} gemm vllm {VERSIONS[gpu]}"})


def _attention_rows(raw: pd.DataFrame, gpu: str, name: str, out: AicTables,
                    keep_fp8: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows over a bf16 KV cache, rows over an fp8 one); the fp8 rows are counted as dropped
    unless ``keep_fp8`` (decode attention fits them as their own class)."""
    if "window_size" in raw.columns:
        windowed = raw["window_size"] > 0
        out.drop(f"{name} with a sliding window", int(windowed.sum()))
        raw = raw[~windowed]
    bf16 = raw["kv_cache_dtype"] == "bfloat16"
    fp8 = raw["kv_cache_dtype"] == "fp8"
    dropped = ~bf16 & ~fp8 if keep_fp8 else ~bf16
    out.drop(f"{name} with an fp8 KV cache (its dequantisation is not modelled)", int(dropped.sum()))
    return raw[bf16], raw[fp8] if keep_fp8 else raw.iloc[:0]


def attention_tables(root: Path, gpu: str, out: AicTables) -> dict[str, pd.DataFrame]:
    version = VERSIONS[gpu]
    source = f"aiconfigurator {gpu} attention vllm {version}"
    context, _ = _attention_rows(_parquet(root, gpu, "attention", "vllm", version,
                                          "context_attention_perf.parquet"), gpu, "context attention", out)
    generation, generation_fp8 = _attention_rows(
        _parquet(root, gpu, "attention", "vllm", version, "generation_attention_perf.parquet"), gpu,
        "generation attention", out, keep_fp8=True)

    def common(raw: pd.DataFrame) -> dict[str, np.ndarray | str]:
        return {"batch": raw["batch_size"].to_numpy(), "heads": raw["num_heads"].to_numpy(),
                "kv_heads": raw["num_key_value_heads"].to_numpy(), "head_dim": raw["head_dim"].to_numpy(),
                "kv_bytes": raw["kv_cache_dtype"].map(KV_BYTES).to_numpy(),
                "time_s": raw["latency"].to_numpy() * 1e-3, "source": source}

    prefill = pd.DataFrame({**common(context), "seq": context["isl"].to_numpy(), "context": 0})
    decode = pd.DataFrame({**common(generation), "context": generation["step"].to_numpy()})
    tables = {"attention_prefill": prefill, "attention_decode": decode}
    if not generation_fp8.empty:  # its own class: the kernel dequantises each tile it loads
        tables["attention_decode_fp8"] = pd.DataFrame({**common(generation_fp8),
                                                       "context": generation_fp8["step"].to_numpy()})
    return tables


def custom_allreduce_table(root: Path, gpu: str) -> pd.DataFrame:
    """vLLM's all-reduce per (bytes, world), graph-captured and eager times side by side."""
    raw = _parquet(root, gpu, "comm", "vllm", VERSIONS[gpu], "custom_allreduce_perf.parquet")
    raw = raw[raw["allreduce_dtype"] == "bfloat16"]
    table = raw.pivot_table(index=["message_size", "num_gpus"], columns="backend", values="latency",
                            aggfunc="first").reset_index()
    return pd.DataFrame({"bytes": table["message_size"].to_numpy(float) * BF16_BYTES,
                         "world": table["num_gpus"].to_numpy(int),
                         "time_s": table["vllm_graph"].to_numpy(float) * 1e-3,
                         "eager_s": table["vllm_eager"].to_numpy(float) * 1e-3,
                         "source": f"aiconfigurator {gpu} comm vllm {VERSIONS[gpu]} custom_allreduce"})


def nccl_table(root: Path, gpu: str) -> pd.DataFrame:
    """nccl-tests all-reduce of fp16 per (bytes, world); the first of repeated rows (as the
    AIConfigurator loader keeps)."""
    raw = _parquet(root, gpu, "comm", "nccl", NCCL_FOLDER[gpu], "nccl_perf.parquet")
    raw = raw[(raw["op_name"] == "all_reduce") & (raw["nccl_dtype"] == "half")]
    raw = raw.drop_duplicates(["num_gpus", "message_size"], keep="first")
    return pd.DataFrame({"bytes": raw["message_size"].to_numpy(float) * BF16_BYTES,
                         "world": raw["num_gpus"].to_numpy(int),
                         "time_s": raw["latency"].to_numpy(float) * 1e-3,
                         "source": f"aiconfigurator {gpu} comm nccl {NCCL_FOLDER[gpu]} all_reduce"})


MOE_FAMILIES = {"bfloat16": "moe", "fp8_block": "moe_fp8", "int4_wo": "moe_w4a16", "nvfp4": "moe_fp4"}
"""Which fused-MoE table each ``moe_dtype`` fits: 16-bit experts (vLLM's Triton kernel),
block-scaled FP8 (DeepSeek-style checkpoints, the FP8 MoE models servesim's catalogue serves)
weight-only INT4 (Marlin, e.g. Kimi K2's checkpoints) and NVFP4 (W4A4, B200 only)."""
MOE_ROUTING = ("balanced", "power_law_1.01")
"""Router-logit distributions fitted, in order of preference: the balanced rows, priced with the
experts their routing hits (:mod:`servesim.calibration.moe_routing`); A100's tables have only
power-law ones (1.01 is the mildest skew), priced as uniform routing."""


def moe_tables(root: Path, gpu: str, out: AicTables) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """(fused-MoE tables to fit by family, the expert-parallel rows to validate only); the
    power-law rows without expert parallelism go to ``out.moe_skewed``, validated only.

    ``FusedMoE.forward`` on one GPU with routing inside: ``num_tokens`` tokens entering, experts
    TP-sharded ``moe_tp_size`` ways. Rows with ``moe_ep_size > 1`` build rank 0 of an
    expert-parallel layout; they are not fitted (their time falls far less than ``1/ep``, which
    the cost model's per-rank share does not hold yet) and come back apart for the report."""
    raw = _parquet(root, gpu, "moe", "vllm", VERSIONS[gpu], "moe_perf.parquet")
    known = raw["moe_dtype"].isin(list(MOE_FAMILIES))
    for dtype, count in raw.loc[~known, "moe_dtype"].value_counts().items():
        out.drop(f"moe {dtype} (format not modelled)", count)
    raw = raw[known]
    routing = next(r for r in MOE_ROUTING if (raw["distribution"] == r).any())
    if routing == "balanced":
        validated = (raw["distribution"] == "power_law_1.01") & (raw["moe_ep_size"] == 1)
        out.moe_skewed = _moe_frame(raw[validated], gpu, "power_law_1.01", "power_law_1.01")
        out.drop("moe with power-law routing (validated, not fitted)", int(validated.sum()))
        raw = raw[~validated]
    skewed = raw["distribution"] != routing
    out.drop(f"moe with routing other than {routing}", int(skewed.sum()))
    table = _moe_frame(raw[~skewed], gpu, routing, "balanced" if routing == "balanced" else "uniform")
    expert_parallel = table["ep"] > 1
    out.drop("moe with expert parallelism (validated, not fitted)", int(expert_parallel.sum()))
    tables = {str(family): rows.drop(columns="family").reset_index(drop=True)
              for family, rows in table[~expert_parallel].groupby("family")}
    return tables, table[expert_parallel].reset_index(drop=True)


def _moe_frame(raw: pd.DataFrame, gpu: str, routing: str, priced: str) -> pd.DataFrame:
    """The fused-MoE rows ``raw``, measured with the collector's ``routing``, as the fit reads
    them, their experts hit priced as ``priced`` routes (a
    :data:`~servesim.calibration.moe_routing.ROUTINGS` name)."""
    return pd.DataFrame({"tokens": raw["num_tokens"].to_numpy(), "hidden": raw["hidden_size"].to_numpy(),
                         "inter": raw["inter_size"].to_numpy(), "topk": raw["topk"].to_numpy(),
                         "experts": raw["num_experts"].to_numpy(), "tp": raw["moe_tp_size"].to_numpy(),
                         "ep": raw["moe_ep_size"].to_numpy(), "routing": np.full(len(raw), priced),
                         "family": raw["moe_dtype"].map(MOE_FAMILIES).to_numpy(),
                         "time_s": raw["latency"].to_numpy() * 1e-3,
                         "source": f"aiconfigurator {gpu} moe vllm {VERSIONS[gpu]} ({routing} routing)"})


def aic_tables(root: Path, gpu: str) -> AicTables:
    """Every usable measurement of ``gpu`` (an AIConfigurator system name, e.g. ``h100_sxm``)."""
    root = Path(root)
    if gpu not in GPUS:
        raise ServesimError("aiconfigurator", f"unknown system {gpu!r}", f"use one of {', '.join(GPUS)}")
    if not (root / gpu).is_dir():
        raise ServesimError("aiconfigurator", f"{root / gpu} not found",
                            "give ../shared/data/kernels/aiconfigurator")
    out = AicTables(gpu)
    out.tables.update(gemm_tables(root, gpu, out))
    out.tables.update(attention_tables(root, gpu, out))
    moe, out.moe_expert_parallel = moe_tables(root, gpu, out)
    out.tables.update(moe)
    nccl = nccl_table(root, gpu)
    out.tables["allreduce"] = nccl  # the interconnect's ring model (servesim 0.1's all-reduce)
    out.tables["nccl"] = nccl
    out.tables["custom_allreduce"] = custom_allreduce_table(root, gpu)
    return out


def aic_system_of(profile_name: str) -> str:
    """The AIConfigurator system whose tables calibrate the profile ``profile_name``."""
    for system, profile in GPUS.items():
        if profile_name == profile:
            return system
    raise ServesimError("--profile", f"no AIConfigurator data for {profile_name}",
                        f"use one of {', '.join(GPUS.values())}")
