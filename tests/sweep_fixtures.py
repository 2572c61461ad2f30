"""A synthetic sweep folder with the sweep runner's ``results.parquet`` contract, for the sweep
report tests and the browser test.

Each (hardware, tp) deployment is an M/M/1-like server of capacity ``mu = base[hw] * tp^0.8``
requests/s at offered rate ``lam``: throughput ``min(lam, mu)``; p99 TTFT ``-ln(0.01) / (mu - lam)``
(the p99 of an M/M/1 sojourn time, exponential with rate mu - lam) below saturation, 60 s above;
p99 TPOT ``tpot0[hw] / tp^0.5 * (1 + lam / mu)``. One (a100, tp 1) point is infeasible.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

BASE_MU = {"h100-sxm-80gb": 10.0, "a100-sxm-80gb": 5.0}
TPOT0 = {"h100-sxm-80gb": 0.018, "a100-sxm-80gb": 0.030}
PRICE = {"h100-sxm-80gb": 4.0, "a100-sxm-80gb": 2.0}
RATES = (2.0, 4.0, 8.0, 12.0, 16.0)
TPS = (1, 2)
SLOS = {"ttft_s": 1.0, "tpot_s": 0.05}


def p99_ttft(lam: float, mu: float) -> float:
    return -math.log(0.01) / (mu - lam) if lam < mu else 60.0


def p99_tpot(lam: float, mu: float, hardware: str, tp: int) -> float:
    return TPOT0[hardware] / math.sqrt(tp) * (1 + min(lam / mu, 1.0))


def fabricate_sweep(
    sweep_dir: Path, *, with_cost: bool = True, with_slos: bool = True, replications: int = 3
) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for hardware in BASE_MU:
        for tp in TPS:
            mu = BASE_MU[hardware] * tp**0.8
            for lam in RATES:
                point = f"{hardware[:4]}-tp{tp}-r{lam:g}"
                row: dict = {
                    "point": point,
                    "status": "ok",
                    "reason": "",
                    "workload.arrival.rate": lam,
                    "deployment.tp": tp,
                    "hardware": hardware,
                    "replications": replications,
                    "gpus": tp,
                    "model": "llama-3-8b",
                    "policy.name": "continuous",
                    "cost_per_hour": PRICE[hardware] * tp if with_cost else math.nan,
                }
                if hardware == "a100-sxm-80gb" and tp == 1 and lam == 16.0:
                    row.update(
                        status="infeasible", reason="deployment: synthetic infeasible point", replications=0
                    )
                    rows.append(row)
                    continue
                ttft, tpot = p99_ttft(lam, mu), p99_tpot(lam, mu, hardware, tp)
                tput = min(lam, mu)
                met = (ttft <= SLOS["ttft_s"]) and (tpot <= SLOS["tpot_s"])
                attainment = 0.995 if met else 0.4
                metrics = {
                    "ttft_s.p99": ttft,
                    "ttft_s.p50": ttft / 6.6,
                    "tpot_s.p99": tpot,
                    "tpot_s.p50": tpot / 1.5,
                    "itl_s.p99": tpot * 1.2,
                    "e2e_s.p99": ttft + 200 * tpot,
                    "e2e_s.p50": ttft / 6.6 + 150 * tpot,
                    "throughput.requests_per_s": tput,
                    "throughput.output_tokens_per_s": 211 * tput,
                    "completed": 400.0,
                    "rejected": 0.0,
                    "preemptions": 0.0,
                    "offered_rate": lam,
                }
                if with_slos:
                    metrics.update(
                        {
                            "slo_attainment": attainment,
                            "goodput_requests_per_s": attainment * tput,
                            "slos.ttft_s": SLOS["ttft_s"],
                            "slos.tpot_s": SLOS["tpot_s"],
                        }
                    )
                for name, value in metrics.items():
                    row[name] = value
                    row[f"{name}.ci95"] = (
                        0.0 if name.startswith("slos.") else abs(value) * rng.uniform(0.01, 0.06)
                    )
                rows.append(row)
    frame = pd.DataFrame(rows)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(sweep_dir / "results.parquet", index=False)
    slo_yaml = "  slo:\n    ttft_s: 1.0\n    tpot_s: 0.05\n" if with_slos else ""
    (sweep_dir / "sweep.resolved.yaml").write_text(
        "name: synthetic\nbase:\n  model: llama-3-8b\n"
        + slo_yaml
        + "grid:\n  hardware: [h100-sxm-80gb, a100-sxm-80gb]\n  deployment.tp: [1, 2]\n"
        "  workload.arrival.rate: [2, 4, 8, 12, 16]\nreplications: 3\n",
        encoding="utf-8",
    )
    return frame
