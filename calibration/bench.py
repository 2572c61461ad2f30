"""``servesim calibrate bench``: run every microbenchmark and write one CSV per kernel family.

The output folder holds ``gemm.csv``, ``attention_prefill.csv``, ``attention_decode.csv``,
``memory.csv`` (and ``allreduce.csv`` with several GPUs) plus ``metadata.json``: device name,
driver, torch version, date, clocks, threads and how long each family took.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import pandas as pd

from servesim.atomic_io import atomic_write_text
from servesim.calibration.schema import METADATA, write_family
from servesim.calibration.timing import Timing, import_torch
from servesim.errors import ServesimError

FAMILY_ORDER = ("memory", "gemm", "attention_prefill", "attention_decode", "allreduce")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _nvidia_smi(fields: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def device_metadata(device: str, quick: bool) -> dict[str, Any]:
    torch = import_torch()
    meta: dict[str, Any] = {"device": device, "torch": torch.__version__,
                            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                            "quick": quick, "host": platform.node(), "python": platform.python_version(),
                            "threads": torch.get_num_threads()}
    if device == "cuda":
        meta.update({"device_name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
                     "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                     "gpus_visible": torch.cuda.device_count(),
                     "driver": _nvidia_smi("driver_version"),
                     "clocks_sm_mem_mhz_now_max": _nvidia_smi(
                         "clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem")})
    else:
        mhz = [line.split(":")[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")] if Path("/proc/cpuinfo").exists() else []
        meta.update({"device_name": _cpu_name(), "driver": None, "clocks_mhz": sorted(set(mhz))})
    return meta


def run_bench(device: str, out: Path, quick: bool = False,
              families: tuple[str, ...] = FAMILY_ORDER, threads: int | None = None,
              reps: int | None = None, gemm_rows: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Benchmark ``families`` on ``device`` and write them to ``out``; returns the metadata.

    On CPU ``threads`` defaults to 1: a multi-threaded torch op waits at a barrier for its
    slowest thread, so one descheduled thread on a shared machine costs a whole scheduler
    time slice (we saw 6-12 ms spikes on 10 us kernels with 2 threads and a busy neighbour).
    The end-to-end check runs with the thread count recorded in the metadata. ``reps`` overrides
    the repetitions per kernel (the metadata records the timing used); ``gemm_rows`` times only
    the GEMMs, at those row counts instead of the grid's."""
    if gemm_rows:
        families = ("gemm",)
    torch = import_torch()
    if device == "cpu":
        torch.set_num_threads(threads or 1)
    if device not in ("cpu", "cuda"):
        raise ServesimError("--device", f"unknown device {device!r}", "use cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ServesimError("--device", "cuda requested but torch sees no GPU",
                            "use --device cpu, or a CUDA build of torch on a GPU machine")
    from servesim.calibration.bench_allreduce import bench_allreduce
    from servesim.calibration.bench_attention import bench_decode, bench_prefill
    from servesim.calibration.bench_gemm import bench_gemm
    from servesim.calibration.bench_memory import bench_memory

    timing = Timing.for_run(device, quick, reps)
    runners = {"memory": lambda: bench_memory(device, quick, timing),
               "gemm": lambda: bench_gemm(device, quick, timing, gemm_rows),
               "attention_prefill": lambda: bench_prefill(device, quick, timing),
               "attention_decode": lambda: bench_decode(device, quick, timing),
               "allreduce": lambda: bench_allreduce(quick) if device == "cuda" else None}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    meta = device_metadata(device, quick)
    meta["timing"] = {"warmup": timing.warmup, "reps": timing.reps}
    meta["seconds"] = {}
    start = time.perf_counter()
    for family in families:
        t0 = time.perf_counter()
        table: pd.DataFrame | None = runners[family]()
        if table is not None and len(table):
            write_family(out, family, table)
            meta["seconds"][family] = round(time.perf_counter() - t0, 2)
    meta["seconds"]["total"] = round(time.perf_counter() - start, 2)
    atomic_write_text(out / METADATA, json.dumps(meta, indent=2) + "\n")  # last: the run is whole
    return meta
