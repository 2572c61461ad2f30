"""How fast is the engine? Simulates 100,000 requests and prints wall time, simulated requests per
wall second and peak memory. Run by hand or with ``make bench`` (never as a timed test).

The traffic is the Azure LLM inference 2023 conversation length mix: (prompt, output) pairs
resampled from ``../shared/data/traces/azure2023_AzureLLMInferenceTrace_conv.csv`` when the shared
data is present, else the ``azure-conversation`` preset fitted to it. The deployment is Llama-3-8B
on one H100 with continuous batching. "80% load" means 80% of the saturated throughput, which
the script first measures by offering a short run far more traffic than the replica can serve.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from servesim.config import validate_document
from servesim.pipeline import prepare, simulate

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
AZURE_CONV = SHARED_TRACES / "azure2023_AzureLLMInferenceTrace_conv.csv"


def experiment(rate: float, requests: int) -> dict:
    lengths = ({"trace": str(AZURE_CONV), "format": "azure"} if AZURE_CONV.is_file()
               else {"preset": "azure-conversation"})
    return {"name": "bench", "seed": 0, "model": "llama-3-8b", "hardware": "h100-sxm-80gb",
            "policy": {"name": "continuous"}, "output": "summary",
            "workload": {"arrival": {"process": "poisson", "rate": rate}, "num_requests": requests,
                         "lengths": lengths}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--load", type=float, default=0.8, help="fraction of saturated throughput")
    args = parser.parse_args()

    saturated = simulate(prepare(validate_document(experiment(1000.0, 3000))))
    capacity = saturated.summary.throughput.requests_per_s
    rate = args.load * capacity
    source = "Azure conv trace lengths" if AZURE_CONV.is_file() else "azure-conversation preset"
    print(f"saturated throughput {capacity:.2f} requests/s ({source}); offering {rate:.2f} requests/s")

    plan = prepare(validate_document(experiment(rate, args.requests)))
    started = time.perf_counter()
    result = simulate(plan)
    simulated = time.perf_counter() - started
    summary = result.summary
    total = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    steps = len(result.step_log)
    print(f"{args.requests:,} requests, {steps:,} steps, {result.sim_time_s:,.0f} simulated s")
    print(f"engine wall {simulated:.2f} s ({args.requests / simulated:,.0f} requests/s, "
          f"{simulated / steps * 1e6:.1f} us/step); with metrics {total:.2f} s; peak RSS {peak_mib:,.0f} MiB")
    ttft, tpot = summary.ttft_s, summary.tpot_s
    assert ttft.p50 is not None and ttft.p99 is not None and tpot.p50 is not None and tpot.p99 is not None
    print(f"p50/p99 TTFT {ttft.p50 * 1e3:.0f}/{ttft.p99 * 1e3:.0f} ms, "
          f"p50/p99 TPOT {tpot.p50 * 1e3:.1f}/{tpot.p99 * 1e3:.1f} ms, "
          f"mean batch {summary.batch.mean_size:.1f}, preemptions {summary.preemptions}")


if __name__ == "__main__":
    main()
