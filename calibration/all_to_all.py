"""Fitting the all-to-all of expert parallelism to NCCL's measured ``alltoall`` timings.

AIConfigurator's ``comm/nccl/<version>/nccl_perf.parquet`` (shared data; never copied into the
project) holds nccl-tests ``alltoall_perf`` times on 2-8 GPUs of one node. A rank's buffer of
``message_size`` half-precision elements is split evenly over the ranks, so each GPU sends
``(n - 1) / n`` of it to its peers. :mod:`servesim.cost.expert_parallel` prices a dispatch inside a
fast domain as ``latency + bytes_sent / (bandwidth x efficiency)`` on the profile's
``all_to_all`` link; this fits that latency and efficiency (the bandwidth is the spec's NVLink
figure) by grid search on every other message size, minimising the median absolute relative
error, and reports the error on the sizes held out. The all-reduce fit of the profile's
``interconnect`` is not reused: NCCL's all-to-all has a lower floor (about 8 us against 29 us on
H100) and a different achieved bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.errors import ServesimError

ELEMENT_BYTES = {"half": 2.0, "int8": 1.0}
LATENCIES_S = np.arange(2e-6, 40e-6, 0.5e-6)
EFFICIENCIES = np.arange(0.30, 1.0001, 0.005)


@dataclass(frozen=True)
class AllToAllFit:
    gpus: int
    latency_s: float
    efficiency: float
    rows_fitted: int
    rows_held_out: int
    fitted_median_error: float
    held_out_median_error: float
    held_out_p90_error: float


def read_alltoall(path: Path, gpus: int) -> pd.DataFrame:
    """(bytes each GPU sends to its peers, seconds) of the half-precision ``alltoall`` rows on
    ``gpus`` GPUs, one row per size (nccl-tests repeats: the first wins, as AIConfigurator's
    loader keeps it)."""
    if not path.is_file():
        raise ServesimError("all-to-all data", f"{path} not found",
                            "give an AIConfigurator nccl_perf.parquet")
    table = pd.read_parquet(path)
    rows = table[(table["op_name"] == "alltoall") & (table["nccl_dtype"] == "half")
                 & (table["num_gpus"] == gpus)].drop_duplicates("message_size")
    if rows.empty:
        raise ServesimError("all-to-all data", f"{path} has no half-precision alltoall rows on {gpus} GPUs",
                            "use a file with nccl-tests alltoall results")
    sent = rows["message_size"].to_numpy(dtype=float) * ELEMENT_BYTES["half"] * (gpus - 1) / gpus
    return pd.DataFrame({"bytes_sent": sent, "seconds": rows["latency"].to_numpy(dtype=float) * 1e-3}
                        ).sort_values("bytes_sent", ignore_index=True)


def predict(bytes_sent: np.ndarray, latency_s: float, bandwidth_Bps: float, efficiency: float) -> np.ndarray:
    return latency_s + bytes_sent / (bandwidth_Bps * efficiency)


def fit_all_to_all(rows: pd.DataFrame, bandwidth_Bps: float, gpus: int) -> AllToAllFit:
    """Latency and efficiency by grid search on the even-indexed sizes; errors on the odd ones."""
    fit, held = rows.iloc[::2], rows.iloc[1::2]
    x, y = fit["bytes_sent"].to_numpy(), fit["seconds"].to_numpy()
    best = (np.inf, 0.0, 0.0)
    for latency in LATENCIES_S:
        pred = latency + x[None, :] / (bandwidth_Bps * EFFICIENCIES[:, None])
        errors = np.median(np.abs(pred / y[None, :] - 1.0), axis=1)
        i = int(np.argmin(errors))
        if errors[i] < best[0]:
            best = (float(errors[i]), float(latency), float(EFFICIENCIES[i]))
    error, latency, efficiency = best
    out = np.abs(predict(held["bytes_sent"].to_numpy(), latency, bandwidth_Bps, efficiency)
                 / held["seconds"].to_numpy() - 1.0)
    return AllToAllFit(gpus, round(latency, 7), round(efficiency, 3), len(fit), len(held), error,
                       float(np.median(out)), float(np.percentile(out, 90)))
