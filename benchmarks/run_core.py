"""One core-benchmark simulation as a whole process (what ``bench_core.py`` times): read the
config, build the workload, simulate, print the step count, the times and a few figures.

    python benchmarks/run_core.py --requests 10000 [--rate 2.0 | --load 0.8] [--step-by-step]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "core-codellama34b.yaml"
AZURE_CONV = HERE.parents[1] / "shared" / "data" / "traces" / "azure2023_AzureLLMInferenceTrace_conv.csv"
CAP_TOKENS = 4096
"""Prompt + output of each resampled pair, at most (the prompt keeps at most CAP - 1)."""


def arguments() -> argparse.ArgumentParser:
    """The command line (``bench_memory.py`` takes the same one)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=None, help="requests/s (default: the config's)")
    parser.add_argument("--load", type=float, default=None,
                        help="offer this fraction of the saturated throughput (measured first)")
    parser.add_argument("--step-by-step", action="store_true", help="turn fast-forward off")
    parser.add_argument("--policy", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--hardware", default=None)
    parser.add_argument("--tp", type=int, default=None)
    return parser


def build_plan(args: argparse.Namespace) -> Any:
    """The run's plan (after measuring the saturated throughput first, with ``--load``)."""
    import numpy as np

    from servesim.config import ExperimentConfig, validate_document
    from servesim.inputs.files import yaml_mapping
    from servesim.pipeline import prepare, simulate
    from servesim.workloads.build import build_workload
    from servesim.workloads.requests import RequestTable

    def planned(document: dict[str, Any]) -> Any:
        """The plan, with the trace's lengths capped at CAP_TOKENS when the trace is used."""
        config: ExperimentConfig = validate_document(document)
        table = build_workload(config.workload, config.seed)
        if AZURE_CONV.is_file():
            prompt = np.minimum(table.prompt_tokens, CAP_TOKENS - 1)
            output = np.clip(table.output_tokens, 1, CAP_TOKENS - prompt)
            table = RequestTable(table.arrival_s, prompt, output, source=table.source)
        return prepare(config, workload=table)

    document = yaml_mapping(CONFIG, "config")
    workload = document["workload"]
    workload["num_requests"] = args.requests
    if args.rate is not None:
        workload["arrival"]["rate"] = args.rate
    if AZURE_CONV.is_file():
        workload["lengths"] = {"trace": str(AZURE_CONV), "format": "azure"}
    if args.policy is not None:
        document["policy"] = {"name": args.policy}
    for key, value in (("model", args.model), ("hardware", args.hardware)):
        if value is not None:
            document[key] = value
    if args.tp is not None:
        document["deployment"]["tp"] = args.tp
    if args.load is not None:  # saturated throughput: offer far more traffic than it serves
        probe = {**document, "workload": {**workload, "num_requests": 3000,
                                          "arrival": {"process": "poisson", "rate": 1000.0}}}
        capacity = simulate(planned(probe)).summary.throughput.requests_per_s
        workload["arrival"]["rate"] = args.load * capacity
        print(f"saturated {capacity:.2f} requests/s; offering {args.load * capacity:.2f}")
    return planned(document)


def main() -> None:
    args = arguments().parse_args()
    started = time.perf_counter()
    from servesim.pipeline import simulate

    plan = build_plan(args)
    simulated = time.perf_counter()
    result = simulate(plan, fast_forward=not args.step_by_step)
    summary = result.summary
    done = time.perf_counter()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fast_forwarded = sum(getattr(unit, "fast_forwarded_steps", 0)
                         for run in result.groups for unit in run.replicas)
    chained = sum(getattr(unit, "chained_runs", 0) for run in result.groups for unit in run.replicas)
    print(f"requests={args.requests} steps={len(result.step_log)} ff_steps={fast_forwarded} "
          f"chained={chained} setup_s={simulated - started:.3f} "
          f"simulate_s={done - simulated:.3f} cpu_s={time.process_time():.3f} peak_mib={peak_mib:.0f} "
          f"ttft_p50={summary.ttft_s.p50!r} tpot_p50={summary.tpot_s.p50!r} e2e_p99={summary.e2e_s.p99!r}")


if __name__ == "__main__":
    main()
