"""How fast is the simulation core? (issue #18) Prints, with the machine's load:

- a bare SimPy loop of 100,000 timeouts in a fresh process (the unit the targets are counted in);
- the 10,000-request run of ``core-codellama34b.yaml`` (CodeLlama-34B, two A100s, Azure
  conversation lengths capped at 4,096 tokens, 2 requests/s) as a whole process, step by step and
  fast-forwarded, side by side (the minimum of ``--repeat`` runs each, wall and CPU);
- the 100,000-request version, both ways (one run each);
- with ``--million``: one million requests at 80% of the saturated throughput of Llama-3-8B on
  one H100 (``bench_engine.py``'s deployment), fast-forwarded, with its peak RSS.

Run with ``make bench`` (or ``make bench-core``); never as a timed test. The shared machine is
noisy: compare figures from one run of this script, and read the CPU seconds first.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIMPY_LOOP = ("import simpy\nenv = simpy.Environment()\n"
              "def loop(env):\n    for _ in range(100_000):\n        yield env.timeout(1.0)\n"
              "env.process(loop(env))\nenv.run()\n")


def timed(argv: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def best(argv: list[str], repeat: int) -> tuple[float, float, str]:
    runs = [timed(argv) for _ in range(repeat)]
    return min(r[0] for r in runs), min(r[1] for r in runs), runs[-1][2]


def field(output: str, name: str) -> str:
    found = re.search(rf"{name}=(\S+)", output)
    return found.group(1) if found else "?"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--million", action="store_true", help="also the 1,000,000-request run")
    parser.add_argument("--skip-100k", action="store_true")
    args = parser.parse_args()
    run = [sys.executable, str(HERE / "run_core.py")]
    print(f"machine: {load()}")
    wall, cpu, _ = best([sys.executable, "-c", SIMPY_LOOP], args.repeat)
    loop_wall, loop_cpu = wall, cpu
    print(f"bare SimPy loop, 100,000 timeouts, whole process: {wall:.2f} s wall, {cpu:.2f} s CPU")
    sizes = [10_000] if args.skip_100k else [10_000, 100_000]
    for requests in sizes:
        repeat = args.repeat if requests <= 10_000 else 1
        rows = {}
        for mode, extra in (("step by step", ["--step-by-step"]), ("fast-forward", [])):
            wall, cpu, out = best([*run, "--requests", str(requests), *extra], repeat)
            rows[mode] = (wall, cpu, out)
            print(f"{requests:>9,} requests, {mode:<12}: {wall:6.2f} s wall ({wall / loop_wall:5.1f} loops), "
                  f"{cpu:6.2f} s CPU ({cpu / loop_cpu:5.1f} loops); steps {field(out, 'steps')}, "
                  f"simulate {field(out, 'simulate_s')} s, peak RSS {field(out, 'peak_mib')} MiB")
        same = all(field(rows["step by step"][2], key) == field(rows["fast-forward"][2], key)
                   for key in ("steps", "ttft_p50", "tpot_p50", "e2e_p99"))
        print(f"{'':>9}  speed-up {rows['step by step'][1] / rows['fast-forward'][1]:.2f}x CPU; "
              f"same figures both ways: {same}")
    if args.million:
        wall, cpu, out = timed([*run, "--requests", "1000000", "--load", "0.8", "--model", "llama-3-8b",
                                "--hardware", "h100-sxm-80gb", "--tp", "1"])
        print(f"1,000,000 requests at 80% load (Llama-3-8B, one H100): {wall:.1f} s wall, {cpu:.1f} s CPU, "
              f"steps {field(out, 'steps')}, simulate {field(out, 'simulate_s')} s, "
              f"peak RSS {field(out, 'peak_mib')} MiB")
    print(f"machine: {load()}")


if __name__ == "__main__":
    main()
