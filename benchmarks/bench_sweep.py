"""What does a sweep cost beyond its simulations? Runs the same small runs directly with
``prepare`` + ``simulate`` + ``render`` and as a sweep (in-process, a local pool, and Ray when installed),
and prints wall time per run and the overhead. Run by hand or with ``make bench-sweep``.

The runs: Llama-3-8B on one H100, conversation traffic, ``--requests`` requests per run, the
arrival rate varied over ``--points`` values with ``--replications`` seeds each.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from servesim.config import validate_document
from servesim.pipeline import prepare, render, simulate
from servesim.sweep import parse_sweep, run_sweep
from servesim.sweep.backends import default_workers


def sweep_document(points: int, replications: int, requests: int) -> dict:
    base = {"name": "bench-sweep", "seed": 0, "model": "llama-3-8b", "hardware": "h100-sxm-80gb",
            "workload": {"arrival": {"process": "poisson", "rate": 4.0}, "num_requests": requests,
                         "lengths": {"preset": "azure-conversation"}}}
    rates = [4.0 + 2.0 * i for i in range(points)]
    return {"name": "bench-sweep", "base": base, "grid": {"workload.arrival.rate": rates},
            "replications": replications}


def direct(document: dict, out: Path) -> float:
    """The same runs, one after another, without the sweep machinery."""
    started = time.perf_counter()
    for rate in document["grid"]["workload.arrival.rate"]:
        for replication in range(document["replications"]):
            config = {**document["base"], "seed": replication, "output": "summary",
                      "workload": {**document["base"]["workload"],
                                   "arrival": {"process": "poisson", "rate": rate}}}
            result = simulate(prepare(validate_document(config)))
            render(result, out / f"{rate}-{replication}", report=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--replications", type=int, default=2)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args()
    document = sweep_document(args.points, args.replications, args.requests)
    runs = args.points * args.replications
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base_s = direct(document, root / "direct")
        print(f"{runs} runs of {args.requests} requests; direct prepare + simulate + render: {base_s:.2f} s "
              f"({base_s / runs * 1e3:.0f} ms per run)")
        cases = [("sweep, 1 worker (in process)", "local", 1),
                 (f"sweep, local pool of {args.workers}", "local", args.workers)]
        try:
            import ray  # noqa: F401

            cases.append((f"sweep, Ray ({args.workers} CPUs, incl. start/stop)", "ray", args.workers))
        except ImportError:
            print("(ray not installed: pip install -e '.[ray]' in the checkout to time the Ray backend)")
        for i, (label, backend, workers) in enumerate(cases):
            sweep = parse_sweep(document, root)
            started = time.perf_counter()
            run_sweep(sweep, root / f"sweep{i}", backend=backend, workers=workers)  # type: ignore[arg-type]
            wall = time.perf_counter() - started
            print(f"{label}: {wall:.2f} s ({wall / runs * 1e3:.0f} ms per run, "
                  f"{wall / base_s:.2f}x direct)")
        sweep = parse_sweep(document, root)
        started = time.perf_counter()
        outcome = run_sweep(sweep, root / "sweep0", workers=1)
        print(f"resume with every run finished: {time.perf_counter() - started:.2f} s "
              f"({outcome.runs_skipped} skipped; planning, checking and rewriting the tables)")


if __name__ == "__main__":
    main()
