"""Compare two servesim output folders: are the results byte for byte the same?

    python benchmarks/compare_outputs.py RUN_A RUN_B       # two `servesim run` folders
    python benchmarks/compare_outputs.py SWEEP_A SWEEP_B   # two sweep folders of the same sweep
    python benchmarks/compare_outputs.py A B --allow-new-zero-columns

For runs: ``summary.json`` and the parquet tables must be identical bytes. For sweeps: every run's
``summary.json`` (matched by point index and replication, since run names hash the whole config
and change when the config schema does) and every metric column of ``results.parquet``. Used to
show that a refactoring changed no result; prints what differs and exits 1 if anything does.

``--allow-new-zero-columns``: a parquet table of B may differ from A's bytes by columns A lacks,
provided they are all zero and every column of A is equal in B (a new feature's columns, such as
the speculative-decoding ones of ``steps.parquet``, on a run that does not use it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

RUN_FILES = ("summary.json", "requests.parquet", "steps.parquet", "itl.parquet")


ALLOW_NEW_ZERO_COLUMNS = "--allow-new-zero-columns"


def same_but_new_zero_columns(fa: Path, fb: Path) -> list[str] | None:
    """The columns ``fb`` adds to ``fa``'s table if they are all zero and every column of ``fa``
    is equal in ``fb``; None otherwise."""
    ta, tb = pd.read_parquet(fa), pd.read_parquet(fb)
    if len(ta) != len(tb) or not set(ta.columns) <= set(tb.columns):
        return None
    if not all(ta[c].equals(tb[c]) for c in ta.columns):
        return None
    added = [c for c in tb.columns if c not in ta.columns]
    if not all((tb[c] == 0).all() for c in added):
        return None
    return added


def compare_runs(a: Path, b: Path, allow_new_zero_columns: bool = False) -> list[str]:
    problems = []
    for name in RUN_FILES:
        fa, fb = a / name, b / name
        if fa.is_file() != fb.is_file():
            problems.append(f"{name}: only in {a if fa.is_file() else b}")
        elif fa.is_file() and fa.read_bytes() != fb.read_bytes():
            added = (same_but_new_zero_columns(fa, fb) if allow_new_zero_columns
                     and name.endswith(".parquet") else None)
            if added is None:
                problems.append(f"{name}: differs")
            else:
                print(f"{name}: equal, plus all-zero columns {', '.join(added)}")
    return problems


def _runs(folder: Path) -> dict[tuple[int, int], Path]:
    points = pd.read_parquet(folder / "points.parquet")
    order = {point: i for i, point in enumerate(dict.fromkeys(points["point"]))}
    return {(order[row.point], int(row.replication)): folder / "points" / row.run
            for row in points.itertuples()}


def compare_sweeps(a: Path, b: Path, allow_new_zero_columns: bool = False) -> list[str]:
    problems = []
    runs_a, runs_b = _runs(a), _runs(b)
    if runs_a.keys() != runs_b.keys():
        return [f"different points: {sorted(runs_a)} vs {sorted(runs_b)}"]
    for key, folder in sorted(runs_a.items()):
        for name in ("summary.json", "requests.parquet", "steps.parquet", "itl.parquet"):
            fa, fb = folder / name, runs_b[key] / name
            if fa.is_file() and (not fb.is_file() or fa.read_bytes() != fb.read_bytes()):
                if (allow_new_zero_columns and fb.is_file() and name.endswith(".parquet")
                        and same_but_new_zero_columns(fa, fb) is not None):
                    continue
                problems.append(f"point {key[0]} replication {key[1]}: {name} differs")
    ra, rb = pd.read_parquet(a / "results.parquet"), pd.read_parquet(b / "results.parquet")
    metrics = [c for c in ra.columns if "." in c and c.split(".")[0] not in {
        "deployment", "policy", "workload", "precision", "engine", "router", "slo"}]
    for column in metrics:
        if column not in rb or not ra[column].equals(rb[column]):
            problems.append(f"results.parquet: {column} differs")
    print(f"compared {len(runs_a)} runs and {len(metrics)} metric columns")
    return problems


def main() -> None:
    allow = ALLOW_NEW_ZERO_COLUMNS in sys.argv[1:]
    a, b = (Path(arg) for arg in sys.argv[1:] if arg != ALLOW_NEW_ZERO_COLUMNS)
    for folder in (a, b):  # a failed run leaves no folder: "identical" would hide it
        if not any((folder / name).is_file() for name in (*RUN_FILES, "results.parquet")):
            sys.exit(f"{folder}: no run or sweep results here ({', '.join(RUN_FILES)} or results.parquet); "
                     "did the run fail?")
    problems = (compare_sweeps(a, b, allow) if (a / "results.parquet").is_file()
                else compare_runs(a, b, allow))
    for line in problems:
        print(line)
    print("identical" if not problems else f"{len(problems)} difference(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
