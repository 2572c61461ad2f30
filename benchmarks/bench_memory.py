"""Where a long run's memory goes (issue #18): one core-benchmark run (``run_core.py``'s command
line) in this process, phase by phase, with the resident set after each phase and the peak
reached inside it (Linux: the kernel's high-water mark is reset before each phase through
``/proc/self/clear_refs``), and the bytes each table holds.

    python benchmarks/bench_memory.py --requests 100000 --load 0.8 --model llama-3-8b \\
        --hardware h100-sxm-80gb --tp 1

Phases: the plan (workload and topology), the simulation (request state, step log, ITL log),
the summary (what ``run_core.py`` and ``output: summary`` stop at: it builds only the columns of
each table that it reads, and keeps none), then what ``output: full`` adds: the request, ITL and
whole steps tables and the three parquet files as bytes.
Run it as a benchmark, never as a test.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_core import arguments, build_plan

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _mib(key: str) -> float:
    for line in STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> bool:
    """Reset the high-water mark of the resident set (5 = reset peak RSS; Linux 4.0 and later)."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def _frame_mib(frame: Any) -> float:
    return float(frame.memory_usage(index=True, deep=True).sum()) / 2**20


def main() -> None:
    args = arguments().parse_args()
    from servesim.pipeline import simulate
    from servesim.pipeline.render import _parquet

    one, five, fifteen = os.getloadavg()
    print(f"machine: load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs")
    resets = _reset_peak()
    if not resets:
        print("(the peak cannot be reset here: each phase's peak is the process's so far)")
    state: dict[str, Any] = {}
    peaks: list[float] = []
    print(f"{'phase':<24}{'RSS after MiB':>14}{'peak in phase MiB':>19}{'CPU s':>8}  holds")

    def phase(name: str, work: Callable[[], str]) -> None:
        _reset_peak()
        cpu = time.process_time()
        note = work()
        peaks.append(_mib("VmHWM"))
        cpu = time.process_time() - cpu
        print(f"{name:<24}{_mib('VmRSS'):>14.0f}{_mib('VmHWM'):>19.0f}{cpu:>8.2f}  {note}")

    def plan() -> str:
        state["plan"] = build_plan(args)
        return f"{len(state['plan'].workload.arrival_s):,} requests"

    def run() -> str:
        result = state["result"] = simulate(state["plan"], fast_forward=not args.step_by_step)
        r = result.request_state
        per_request = sum(v.nbytes for v in vars(r).values() if isinstance(v, np.ndarray))
        log = result.step_log
        return (f"{len(log):,} steps; step log {log.nbytes() / 2**20:.0f} MiB; "
                f"request state {per_request / 2**20:.0f} MiB; ITL log {r.itl.nbytes() / 2**20:.0f} MiB")

    def steps() -> str:
        return f"steps frame {_frame_mib(state['result'].steps):.0f} MiB"

    def requests() -> str:
        return f"requests frame {_frame_mib(state['result'].requests):.0f} MiB"

    def itl() -> str:
        return f"ITL frame {_frame_mib(state['result'].itl):.0f} MiB"

    def summary() -> str:
        return f"ttft p50 {state['result'].summary.ttft_s.p50!r}"

    def files() -> str:
        result = state["result"]
        sizes = {name: len(_parquet(getattr(result, name))) / 2**20 for name in ("steps", "requests", "itl")}
        return ", ".join(f"{name}.parquet {size:.0f} MiB" for name, size in sizes.items())

    for name, work in (("plan", plan), ("simulate", run), ("summary", summary), ("request table", requests),
                       ("ITL table", itl), ("steps table", steps), ("parquet files", files)):
        phase(name, work)
    print(f"peak RSS of the whole process {max(peaks):.0f} MiB; CPU {time.process_time():.1f} s")


if __name__ == "__main__":
    main()
