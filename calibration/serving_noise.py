"""How well one measurement of a deployment predicts another: the serving file's own noise floor.

A serving file often measures one configuration more than once (the same engine release, model,
GPU system, precision, parallelism, lengths and client concurrency, on other days or in other
campaigns), and the measurements disagree. No simulator, however faithful, predicts both
measurements of such a pair better than they predict each other: a deterministic replay gives
one TTFT and one TPOT per configuration. So the error of *one measurement taken as the
prediction of the others* is a floor under any simulator's error on these rows, and the share
of them within the aims (TTFT within 20%, TPOT within 10%) a ceiling on what any replay can
reach there.

For every measurement of a configuration measured ``n >= 2`` times with different results, the
prediction is the mean of its other ``n - 1`` measurements (leave one out); the absolute
percentage error is taken as :func:`~servesim.calibration.serving_validate.summarise` takes a
replay's. Rows repeated with identical figures are the same measurement imported twice and were
dropped by :func:`~servesim.calibration.serving_data.read_serving_file` first; a configuration
whose remaining measurements all agree exactly is counted with zero error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servesim.calibration.serving_data import CONCURRENCY, KEY_EXCLUDED

MEASURED_COLUMNS = ("silicon_ttft_ms", "silicon_tpot_ms")
"""The figures a re-measurement repeats; every other column (but ``KEY_EXCLUDED``) names the
configuration, with the client concurrency read from ``silicon_data_source``."""
TTFT_AIM_PCT = 20.0
TPOT_AIM_PCT = 10.0


def configuration_keys(unique: pd.DataFrame) -> pd.DataFrame:
    """Per row of a serving file (duplicates dropped): the columns that name its configuration,
    the concurrency included (it lives in ``silicon_data_source``, which also holds the day)."""
    key = unique.drop(columns=[c for c in (*KEY_EXCLUDED, *MEASURED_COLUMNS) if c in unique.columns])
    concurrency = unique["silicon_data_source"].map(
        lambda source: m.group(1) if (m := CONCURRENCY.search(str(source))) else "")
    return key.assign(concurrency=concurrency.to_numpy())


def leave_one_out_errors(unique: pd.DataFrame) -> pd.DataFrame:
    """One row per measurement of a re-measured configuration: its engine, the configuration's
    number of measurements, and the absolute % error of the mean of the others as its TTFT and
    TPOT prediction. Rows without a positive TTFT and TPOT take no part."""
    if unique.empty:
        return pd.DataFrame(columns=["group", "engine", "ttft_ape_%", "tpot_ape_%", "measurements"])
    ttft = pd.to_numeric(unique["silicon_ttft_ms"], errors="coerce").to_numpy(float)
    tpot = pd.to_numeric(unique["silicon_tpot_ms"], errors="coerce").to_numpy(float)
    usable = np.isfinite(ttft) & np.isfinite(tpot) & (ttft > 0) & (tpot > 0)
    keys = configuration_keys(unique[usable])
    group = keys.groupby(list(keys.columns), sort=False, dropna=False).ngroup().to_numpy()
    frame = pd.DataFrame({"group": group, "engine": unique.loc[usable, "backend"].to_numpy(),
                          "ttft": ttft[usable], "tpot": tpot[usable]})
    sizes = frame.groupby("group")["ttft"].transform("size").to_numpy()
    frame = frame[sizes >= 2].copy()
    n = frame.groupby("group")["ttft"].transform("size").to_numpy(float)
    for metric in ("ttft", "tpot"):
        total = frame.groupby("group")[metric].transform("sum").to_numpy(float)
        others = (total - frame[metric].to_numpy(float)) / (n - 1)
        frame[f"{metric}_ape_%"] = 100 * np.abs(others / frame[metric].to_numpy(float) - 1)
    frame["measurements"] = n.astype(int)
    return frame.drop(columns=["ttft", "tpot"]).reset_index(drop=True)


def noise_summary(unique: pd.DataFrame) -> pd.DataFrame:
    """Per engine (and all together): re-measured configurations, their measurements, the median
    and 90th-percentile error of predicting each from the others, and the share within both aims
    (see the module docstring). Empty when the file measures no configuration twice."""
    errors = leave_one_out_errors(unique)
    columns = ["engine", "configurations", "measurements", "ttft_median_ape_%", "tpot_median_ape_%",
               "ttft_p90_ape_%", "tpot_p90_ape_%", "within_tpot10_ttft20_%"]
    if errors.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for engine, group in [("all", errors), *errors.groupby("engine")]:
        within = (group["tpot_ape_%"] <= TPOT_AIM_PCT) & (group["ttft_ape_%"] <= TTFT_AIM_PCT)
        out.append({"engine": engine, "configurations": group["group"].nunique(),
                    "measurements": len(group),
                    "ttft_median_ape_%": group["ttft_ape_%"].median(),
                    "tpot_median_ape_%": group["tpot_ape_%"].median(),
                    "ttft_p90_ape_%": group["ttft_ape_%"].quantile(0.9),
                    "tpot_p90_ape_%": group["tpot_ape_%"].quantile(0.9),
                    "within_tpot10_ttft20_%": 100 * within.mean()})
    return pd.DataFrame(out, columns=columns)


def replayed_noise(unique: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """:func:`noise_summary` of the rows a replay predicted (``predicted["row"]``, the file's line
    numbers, which index ``unique``; a file read without its rows kept gives an empty floor): the
    configurations the file records fully enough to replay.
    Rows it does not (most disaggregated rows name no worker counts) can share every recorded
    column and still be different deployments, so they would count as noise what is not."""
    if unique.empty:
        return noise_summary(unique)
    return noise_summary(unique.loc[unique.index.intersection(pd.Index(predicted["row"].to_numpy()))])
