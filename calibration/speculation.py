"""Fit a serving engine's software overheads of speculative decoding to published step times.

A speculative step costs the target's pass over ``1 + k`` tokens, the proposer's ``k`` passes and
software around them that no kernel model sees: the engine prepares each proposer pass, launches
it and samples its proposal, and rejection-samples the verified tokens once per step. At batch 1
(every GEMM memory-bound, the step dominated by reading weights) published measurements give
those two costs directly::

    measured step(k) - measured plain step
        = [target(1 + k tokens) - target(1 token)] + proposer kernels(k)     servesim's roofline
        + step_overhead + k * pass_overhead                                  fitted here

with ``measured step(k) = TPOT * mean acceptance length`` (a step emits that many tokens). The
two constants are fitted by least squares over every (method, k) row; the plain step cancels, so
the target's own per-step overhead does not enter. ``benchmarks/speculative_published.py`` prints
the fit, its residuals and a leave-one-method-out check.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servesim.cost import BatchShape, CostModel
from servesim.cost.speculative import SpeculativeCost
from servesim.dtypes import Precision
from servesim.engines import RuntimeCosts
from servesim.hardware_io import load_hardware
from servesim.model_config import load_model
from servesim.speculative.proposer import resolve_proposer
from servesim.speculative.schema import SpeculativeConfig

MEASUREMENTS = Path(__file__).parent / "measurements" / "vllm-spec-decode-h100" / "llama-3.1-8b-mtbench.csv"
"""vLLM issue #20780: Llama-3.1-8B-Instruct with EAGLE-1 and EAGLE-3 heads, batch 1 (see its README)."""


@dataclass(frozen=True)
class StepRow:
    method: str
    k: int
    measured_extra_s: float
    """Measured speculative step minus measured plain step."""
    kernels_extra_s: float
    """The same difference as servesim's kernels price it (no software overheads)."""


@dataclass(frozen=True)
class OverheadFit:
    step_s: float
    pass_s: float
    rows: tuple[StepRow, ...]

    def predicted_extra_s(self, row: StepRow) -> float:
        return row.kernels_extra_s + self.step_s + self.pass_s * row.k

    def residuals_s(self) -> np.ndarray:
        return np.array([self.predicted_extra_s(r) - r.measured_extra_s for r in self.rows])


def read_measurements(path: Path = MEASUREMENTS) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def step_rows(path: Path = MEASUREMENTS, model: str = "llama-3-8b", hardware: str = "h100-sxm-80gb",
              context: int = 512) -> list[StepRow]:
    """Each speculative measurement against servesim's kernel price of the same step (one request
    decoding at ``context`` tokens: MT-bench prompts and answers are a few hundred tokens; the
    difference hardly depends on it). Llama-3-8B has Llama-3.1-8B's architecture."""
    records = read_measurements(path)
    plain = next(r for r in records if r["method"] == "none")
    plain_step_s = float(plain["tpot_ms"]) * float(plain["mean_acceptance_length"]) / 1e3
    target_spec, gpu = load_model(model), load_hardware(hardware)
    target = CostModel(target_spec, gpu, 1, Precision(), RuntimeCosts.none())
    plain_kernels_s = target.step_record(BatchShape.decode(1, context)).time_s
    rows = []
    for record in records:
        if record["method"] == "none":
            continue
        k = int(record["num_speculative_tokens"])
        config = SpeculativeConfig(method=record["method"], num_speculative_tokens=k,
                                   acceptance={"rate": 0.5})
        proposer = resolve_proposer(config, target_spec, gpu, 1, Precision())
        priced = SpeculativeCost(target, proposer.passes).step_record(
            BatchShape.build(decode_context=[context], decode_tokens=[1 + k]))
        measured_s = float(record["tpot_ms"]) * float(record["mean_acceptance_length"]) / 1e3
        rows.append(StepRow(record["method"], k, measured_s - plain_step_s, priced.time_s - plain_kernels_s))
    return rows


def fit_overheads(rows: list[StepRow]) -> OverheadFit:
    """Least-squares ``step_s`` and ``pass_s`` (each at least 0) over ``rows``."""
    design = np.array([[1.0, float(r.k)] for r in rows])
    target = np.array([r.measured_extra_s - r.kernels_extra_s for r in rows])
    (step_s, pass_s), *_ = np.linalg.lstsq(design, target, rcond=None)
    if pass_s < 0 or step_s < 0:  # one constant alone, the other at its bound
        step_s, pass_s = max(0.0, float(target.mean())), 0.0
    return OverheadFit(float(step_s), float(pass_s), tuple(rows))


def fit_speculation_overheads(path: Path = MEASUREMENTS) -> OverheadFit:
    """The overheads :class:`~servesim.engines.vllm_v0.VllmV0` carries, refitted from ``path``."""
    return fit_overheads(step_rows(path))
