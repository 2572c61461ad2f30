"""How much the burst round weighs in a serving file's measured TTFT: a check of the replay's
benchmark model, not a fit the replay uses.

The replay (:mod:`~servesim.calibration.serving_validate`) predicts a row's mean TTFT as the
profiled phase of AIConfigurator's recipe would measure it: one round in which every client
sends at once (the burst), weighing ``WARMUP / PROFILED_ROUNDS`` = 1/20 of the mean, then the
steady state. At high concurrency the burst's TTFT is many times the steady state's (the last
prompt of the burst waits for all the others), so that weight decides the prediction. If the
file's rows had been measured with a different share (the warm-up's burst counted too, 2/22;
10N requests profiled, 1/10), the best share would be the same for every model, and fitting it
on some models would predict the others.

:func:`round_means` replays a row (engines as shipped) and returns its burst and steady-state
means; :func:`best_share` is the share of :data:`SHARES` whose blend ``share * burst + (1 - share)
* steady`` has the least median absolute error against the measured TTFT; :func:`by_group` and
:func:`held_out` report it per engine and model and with each model's share fitted to the other
models. Run it with ``python -m servesim.calibration.burst_share FILE [--workers N]``.

What it showed on ``aiconfigurator_silicon_dev.csv`` (2026-11-29, README, Calibration): the best
share is 0.09 over all rows, but 0.00 for Kimi-K2.5, 0.13 for MiniMax-M2.5 and 0.24-0.30 for
DeepSeek-V3/R1; fitted without each model, it predicts that model no better than 1/20 does. The
share is not a property of the benchmark, so the replay keeps the recipe's 1/20.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.calibration.replay import simulate_document
from servesim.calibration.replay_pool import replay_map
from servesim.calibration.serving_data import HARDWARE, ServingRow, read_serving_file
from servesim.calibration.serving_validate import (
    MEASURED,
    PROFILED_ROUNDS,
    WARMUP,
    replayable,
    shipped_coefficients,
)
from servesim.errors import ServesimError, run_script

SHARES = np.round(np.arange(0.0, 0.3001, 0.01), 2)
"""The burst shares tried (0: the steady state alone; 0.05: the recipe's 1/20)."""
RECIPE_SHARE = WARMUP / PROFILED_ROUNDS


def round_means(row: ServingRow) -> dict[str, object] | None:
    """The row replayed as shipped: its burst round's and later rounds' mean TTFT (seconds), with
    the row's keys and measured TTFT; None when the simulator refuses the deployment."""
    coefficients = shipped_coefficients(row.engine, HARDWARE[row.gpu])
    try:
        requests = simulate_document(row.document(WARMUP + MEASURED, coefficients.knobs())).requests
    except ServesimError:
        return None
    ttft = (requests["first_token_s"] - requests["arrival_s"]).to_numpy(float)
    first = WARMUP * row.concurrency
    return {"row": row.row, "engine": row.engine, "model": row.hf_model.rsplit("/", 1)[-1],
            "gpu": row.gpu, "concurrency": row.concurrency, "measured_s": row.ttft_s,
            "burst_s": float(np.nanmean(ttft[:first])), "steady_s": float(np.nanmean(ttft[first:]))}


def replay_rounds(rows: Sequence[ServingRow], workers: int = 1) -> pd.DataFrame:
    """:func:`round_means` of every row the simulator accepts, one line each."""
    means = replay_map(round_means, rows, workers, "replaying rows")
    return pd.DataFrame([m for m in means if m is not None])


def errors(rounds: pd.DataFrame, share: float) -> np.ndarray:
    """Absolute percentage error of each row's TTFT blended with ``share`` of its burst."""
    blended = share * rounds["burst_s"] + (1 - share) * rounds["steady_s"]
    return np.abs(blended / rounds["measured_s"] - 1).to_numpy(float) * 100


def best_share(rounds: pd.DataFrame, shares: np.ndarray = SHARES) -> float:
    """The share of ``shares`` with the least median error over ``rounds`` (the lowest on a tie)."""
    medians = [float(np.median(errors(rounds, share))) for share in shares]
    return float(shares[int(np.argmin(medians))])


def by_group(rounds: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per value of ``column``: its rows, best share, and median error at the recipe's share and
    at its own best."""
    lines = []
    for group, rows in rounds.groupby(column):
        share = best_share(rows)
        lines.append({column: group, "rows": len(rows), "best_share": share,
                      "median_ape_recipe_%": float(np.median(errors(rows, RECIPE_SHARE))),
                      "median_ape_best_%": float(np.median(errors(rows, share)))})
    return pd.DataFrame(lines)


def held_out(rounds: pd.DataFrame, column: str = "model") -> pd.DataFrame:
    """Per value of ``column``: the share fitted to the other values' rows and this value's
    median error at it and at the recipe's share; the last line pools every row."""
    lines, pooled = [], []
    for group, rows in rounds.groupby(column):
        share = best_share(rounds[rounds[column] != group])
        held = errors(rows, share)
        pooled.append((held, errors(rows, RECIPE_SHARE)))
        lines.append({column: group, "rows": len(rows), "share_fitted_without": share,
                      "median_ape_held_out_%": float(np.median(held)),
                      "median_ape_recipe_%": float(np.median(pooled[-1][1]))})
    lines.append({column: "all", "rows": len(rounds), "share_fitted_without": float("nan"),
                  "median_ape_held_out_%": float(np.median(np.concatenate([h for h, _ in pooled]))),
                  "median_ape_recipe_%": float(np.median(np.concatenate([r for _, r in pooled])))})
    return pd.DataFrame(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="CSV of every row's round means")
    args = parser.parse_args(argv)
    rows = [r for r in read_serving_file(args.path).rows if replayable(r)]
    print(f"{len(rows)} single-group rows", file=sys.stderr)
    rounds = replay_rounds(rows, args.workers)
    if args.out is not None:
        rounds.to_csv(args.out, index=False)
    print(f"best share over all {len(rounds)} rows: {best_share(rounds)} (the recipe's: {RECIPE_SHARE})")
    with pd.option_context("display.width", 200):
        for column in ("engine", "model"):
            print(by_group(rounds, column).round(2).to_string(index=False))
        print(held_out(rounds).round(2).to_string(index=False))


if __name__ == "__main__":
    run_script(main)
