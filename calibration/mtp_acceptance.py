"""The MTP acceptance of a serving file's speculating rows, fitted to their measured TPOT.

The serving file records neither that a row decoded speculatively nor how often its proposals
were accepted (:mod:`~servesim.calibration.serving_speculation` says which rows ran MTP). How
often depends on the text: the benchmark's prompts are random tokens and its outputs run past
the end of text (``--ignore-eos``), which no published acceptance was measured on. So the
acceptance is fitted here, as one number: every proposal accepted with the same probability
``p`` given the ones before it were (i.i.d. acceptance, ``speculative.acceptance.rate``; three
MTP layers then emit ``1 + p + p^2 + p^3`` tokens per step).

:func:`acceptance_curves` replays every speculating row with tensor-parallel attention at each
rate of a grid (engines as shipped); :func:`fit_rate` picks the rate at which the rows' median
log error of the mean TPOT is zero, reading each row's error linearly between the grid's rates;
:func:`leave_one_group_out` fits it without each group of rows (a campaign: release, day and
GPU) and scores that group, the held-out error. Run it with
``python -m servesim.calibration.mtp_acceptance FILE [--workers N]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.calibration.replay_pool import replay_map
from servesim.calibration.serving_data import ServingRow, read_serving_file
from servesim.calibration.serving_validate import MEASURED, WARMUP, replayed_means
from servesim.errors import run_script

GRID = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
"""The rates every row is replayed at."""
FINE = np.round(np.arange(GRID[0], GRID[-1] + 1e-9, 0.005), 3)
"""The rates the fit reads between them."""


def speculating(rows: Sequence[ServingRow]) -> list[ServingRow]:
    """The rows that decode speculatively with tensor-parallel attention (several proposals a
    step: what the acceptance moves most)."""
    return [r for r in rows if r.speculative is not None and r.dp == 1 and r.prefill is None]


def _replay(args: tuple[ServingRow, float]) -> tuple[int, float, float]:
    row, rate = args
    document = row.document(WARMUP + MEASURED)
    document["speculative"] = {**document["speculative"], "acceptance": {"rate": rate}}
    _, tpot = replayed_means(document, row.concurrency, WARMUP)
    return row.row, rate, tpot


def acceptance_curves(rows: Sequence[ServingRow], grid: Sequence[float] = GRID,
                      workers: int = 1) -> pd.DataFrame:
    """One line per row: its campaign, measured TPOT and the log error of its replayed TPOT at
    every rate of ``grid`` (columns named by the rate)."""
    jobs = [(row, rate) for row in rows for rate in grid]
    replays = replay_map(_replay, jobs, workers, "replaying rows at each rate")
    measured = {r.row: r.tpot_s for r in rows}
    table = pd.DataFrame(replays, columns=["row", "rate", "tpot_s"])
    table["log_error"] = np.log(table["tpot_s"] / table["row"].map(measured))
    curves = table.pivot(index="row", columns="rate", values="log_error")
    meta = pd.DataFrame([{"row": r.row, "campaign": f"{r.version} {r.measured_on} {r.gpu}",
                          "measured_tpot_s": r.tpot_s} for r in rows]).set_index("row")
    return meta.join(curves)


def _log_errors(curves: pd.DataFrame, rates: np.ndarray) -> np.ndarray:
    """Log error of every row (rows) at every rate (columns), linear between the grid's rates."""
    grid = np.array([c for c in curves.columns if isinstance(c, float)])
    values = curves[list(grid)].to_numpy(float)
    return np.array([np.interp(rates, grid, row) for row in values])


def _errors(curves: pd.DataFrame, rates: np.ndarray) -> np.ndarray:
    return np.abs(_log_errors(curves, rates))


def fit_rate(curves: pd.DataFrame) -> float:
    """The rate of :data:`FINE` at which the rows' median log error is closest to zero: as many
    rows replay too slow as too fast (the lowest such rate on a tie). A median-unbiased fit,
    steadier than the rate of least median absolute error, whose minimum can sit between two
    clusters of rows."""
    medians = np.abs(np.median(_log_errors(curves, FINE), axis=0))
    return float(FINE[int(np.argmin(medians))])


def median_ape(curves: pd.DataFrame, rate: float) -> float:
    """Median absolute percentage error of the rows' TPOT replayed at ``rate``."""
    return float(np.median(np.expm1(_errors(curves, np.array([rate]))[:, 0])) * 100)


def _folds(curves: pd.DataFrame, by: str) -> list[tuple[object, pd.DataFrame, float]]:
    """Per group of ``by``: the group, its rows and the rate fitted to the other groups."""
    return [(group, held, fit_rate(curves[curves[by] != group])) for group, held in curves.groupby(by)]


def leave_one_group_out(curves: pd.DataFrame, by: str = "campaign",
                        folds: list[tuple[object, pd.DataFrame, float]] | None = None) -> pd.DataFrame:
    """Per group of ``by``: its rows, the rate fitted to the other groups and its error there."""
    return pd.DataFrame([{by: group, "rows": len(held), "rate_fitted_without": rate,
                          "median_ape_%": median_ape(held, rate)}
                         for group, held, rate in (folds or _folds(curves, by))])


def held_out_ape(curves: pd.DataFrame, by: str = "campaign",
                 folds: list[tuple[object, pd.DataFrame, float]] | None = None) -> float:
    """Median absolute percentage error of every row at the rate fitted without its group."""
    errors = [np.expm1(_errors(held, np.array([rate]))[:, 0])
              for _, held, rate in (folds or _folds(curves, by))]
    return float(np.median(np.concatenate(errors)) * 100)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    rows = speculating(read_serving_file(args.path).rows)
    print(f"{len(rows)} speculating rows with tensor-parallel attention", file=sys.stderr)
    curves = acceptance_curves(rows, workers=args.workers)
    rate = fit_rate(curves)
    print(f"fitted i.i.d. acceptance rate: {rate} (median TPOT error {median_ape(curves, rate):.1f}% "
          f"in sample)")
    folds = _folds(curves, "campaign")  # each campaign's rate fitted once, for both figures
    print(leave_one_group_out(curves, folds=folds).to_string(index=False))
    print(f"held out (each campaign at the rate fitted to the others): median TPOT error "
          f"{held_out_ape(curves, folds=folds):.1f}%")


if __name__ == "__main__":
    run_script(main)
