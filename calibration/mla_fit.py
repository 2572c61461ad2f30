"""MLA's prefill attention, measured inside AIConfigurator's MLA module tables.

MLA's expanded prefill (DeepSeek-V3, Kimi-K2: 128 heads with 192-wide query-key and 128-wide
value heads, every head its own K and V) runs its own kernel, not the GQA kernel that the
``attention_prefill`` class was fitted to. AIConfigurator times it only inside DeepSeek-V3's whole
attention module (``mla_context_module_perf``, vLLM 0.24: the q/kv projections, RoPE, the latent
norms, the attention and ``o_proj`` of one layer with ``num_heads`` heads on one GPU). Its
attention is what is left of a row's time once the module's GEMMs are priced (the profile's
fitted GEMM class: held-out median 5-8%), and where the attention is most of the priced module
(over 40%: 2,048-65,536 tokens, 16-128 heads, bf16 GEMMs and KV) that remainder measures the
kernel. :func:`fit_mla_prefill_scale` fits one time multiplier on the attention class's price
(``Efficiency.mla_prefill_time_scale``) to every other prompt length's rows, keeps it only if
it lowers the held-out rows' error, and reports both.

What it finds (2026-11-29): on B200 the module's attention runs in 0.75 of the dense class's
price for its shape (held-out median error 35.2% -> 4.9%): Blackwell's MLA prefill kernel is
faster than its GQA kernel at the same FLOPs. On H100 and H200 the dense class already prices
it (H200 held-out 6.2%, 7.5% with a scale; H100 10.2%, 11.6%), so no scale is kept. (The H100 and
H200 module tables ran PyTorch's RMSNorm as several kernels, about 35-50 us per layer more than
serving runs: small beside the attention of these rows.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.calibration.aiconfigurator import VERSIONS
from servesim.cost import BatchShape, CostModel
from servesim.dtypes import Precision
from servesim.hardware import HardwareProfile
from servesim.model_config import load_model

MODULE_MODEL = "deepseek-v3"
"""The module the tables time (DeepSeek-V3's ``DeepseekV2MLAAttention``, 128 heads in all)."""
MIN_HEADS = 16
"""Fewer heads per GPU (TP above 8) leave the module's GEMMs too large a share to subtract."""
TOKENS = (2048, 65536)
"""Prompt tokens per row (batch x ISL) kept: long enough for the attention to dominate."""
MIN_ATTENTION_SHARE = 0.4
"""A row measures the kernel only where the priced attention is this share of the priced module."""


@dataclass(frozen=True)
class MlaFit:
    """The fitted time multiplier (None: not kept) and the held-out error before and after."""

    scale: float | None
    fitted: float
    rows_fit: int
    rows_held_out: int
    before: tuple[float, float]
    """Held-out (median, p90) absolute % error of the module's attention, unscaled."""
    after: tuple[float, float]
    """The same with ``fitted`` applied."""

    @property
    def kept(self) -> tuple[float, float]:
        """The held-out error of what the profile keeps (``after`` with a scale, else ``before``)."""
        return self.after if self.scale is not None else self.before


def module_table(root: Path, gpu: str) -> pd.DataFrame | None:
    """The bf16 rows of a GPU's MLA context-module table (vLLM 0.24), or None without one."""
    path = root / gpu / "mla" / "vllm" / VERSIONS.get(gpu, "0.24.0") / "mla_context_module_perf.parquet"
    if not path.is_file():
        return None
    raw = pd.read_parquet(path)
    keep = ((raw["kv_cache_dtype"] == "bfloat16") & (raw["mla_dtype"] == "bfloat16")
            & (raw["gemm_type"] == "bfloat16") & (raw["num_heads"] >= MIN_HEADS)
            & (raw["batch_size"] * raw["isl"]).between(*TOKENS) & (raw["step"] == 0))
    rows = raw[keep]
    return pd.DataFrame({"heads": rows["num_heads"].to_numpy(int), "batch": rows["batch_size"].to_numpy(int),
                         "isl": rows["isl"].to_numpy(int), "time_s": rows["latency"].to_numpy(float) * 1e-3})


def attention_parts(table: pd.DataFrame, profile: HardwareProfile) -> pd.DataFrame:
    """Per row: the priced attention and GEMMs of one layer (``CostModel`` of the module's model
    at TP 128 / heads, bf16), and the measured time less the GEMMs."""
    model = load_model(MODULE_MODEL)
    unscaled = profile.model_copy(update={"efficiency": profile.efficiency.model_copy(
        update={"mla_prefill_time_scale": None})})
    models: dict[int, CostModel] = {}
    attention, gemms = [], []
    for heads, isl, batch in zip(table["heads"].tolist(), table["isl"].tolist(), table["batch"].tolist(),
                                 strict=True):
        tp = model.num_heads // int(heads)
        cost = models.setdefault(tp, CostModel(model, unscaled, tp, Precision()))
        parts = cost.step(BatchShape.prefill(*[int(isl)] * int(batch))).breakdown
        attention.append(parts["attn_prefill"] / model.num_layers)
        gemms.append((parts["qkv_proj"] + parts["o_proj"]) / model.num_layers)
    out = table.assign(attention_s=attention, gemm_s=gemms)
    return out.assign(implied_s=out["time_s"] - out["gemm_s"])


def _stats(errors: np.ndarray) -> tuple[float, float]:
    return float(np.median(errors) * 100), float(np.percentile(errors, 90) * 100)


def fit_mla_prefill_scale(table: pd.DataFrame, profile: HardwareProfile) -> MlaFit | None:
    """The time multiplier of MLA's prefill attention on ``profile`` (see the module docstring), or
    None when no row measures the kernel."""
    parts = attention_parts(table, profile)
    parts = parts[(parts["attention_s"] > MIN_ATTENTION_SHARE * (parts["attention_s"] + parts["gemm_s"]))
                  & (parts["implied_s"] > 0)]
    if parts.empty:
        return None
    lengths = np.sort(parts["isl"].unique())
    held = parts["isl"].isin(lengths[1::2]).to_numpy()
    if held.all() or not held.any():
        return None
    ratio = (parts["implied_s"] / parts["attention_s"]).to_numpy()
    fitted = float(f"{np.median(ratio[~held]):.3g}")
    before = _stats(np.abs(1.0 / ratio[held] - 1.0))
    after = _stats(np.abs(fitted / ratio[held] - 1.0))
    keep = after[0] < before[0]
    return MlaFit(fitted if keep else None, fitted, int((~held).sum()), int(held.sum()), before, after)


def with_mla_fit(profile: HardwareProfile, fit: MlaFit, source: str, date: str) -> HardwareProfile:
    """``profile`` with the fitted multiplier (or none) and its provenance."""
    efficiency = profile.efficiency.model_copy(update={"mla_prefill_time_scale": fit.scale})
    verdict = (f"{fit.scale:g}" if fit.scale is not None else
               f"not set: a multiplier of {fit.fitted:g} would not lower the held-out error")
    provenance = dict(profile.provenance)
    provenance["efficiency.mla_prefill_time_scale"] = (
        f"fitted {date} by servesim calibrate from {source} [mla_context_module_perf, bf16, {MIN_HEADS}-128 "
        f"heads, {TOKENS[0]:,}-{TOKENS[1]:,} tokens, rows whose priced attention is over "
        f"{MIN_ATTENTION_SHARE:.0%} of the priced module]: {verdict}; the median of (measured module "
        "- its priced GEMMs) / the attention class's price over every other prompt length "
        f"({fit.rows_fit} rows), held out on the others ({fit.rows_held_out} rows): median / p90 error "
        f"{fit.before[0]:.1f} / {fit.before[1]:.1f}% unscaled, {fit.after[0]:.1f} / {fit.after[1]:.1f}% "
        "scaled (servesim.calibration.mla_fit)")
    return profile.model_copy(update={"efficiency": efficiency, "provenance": provenance})
