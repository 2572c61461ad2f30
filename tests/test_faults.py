"""Faults lose nothing, leave nothing half-written and hang nothing (issue #17): a full disk during
``run`` and ``sweep``, a sweep worker killed, two sweeps into one folder, a policy or engine bug
that stops progress, and Ctrl-C in every command."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from engine_helpers import experiment, run, table
from sweep_faults import DOOMED_ENV, die_on_doomed_run
from test_cli import servesim

from servesim.atomic_io import atomic_write_bytes
from servesim.core.kv_cache import BlockPool
from servesim.core.progress import StalledError
from servesim.errors import ServesimError
from servesim.pipeline import load_plan, render, simulate
from servesim.policies.base import POLICIES, Policy
from servesim.resources import configs_dir
from servesim.sweep import load_sweep, run_sweep
from servesim.sweep.execute import execute_run
from servesim.sweep.local_pool import WorkerPool
from servesim.sweep.lock import SweepLock
from servesim.sweep.plan import plan_sweep

pytestmark = pytest.mark.timeout(300)

SWEEP = {"name": "faults", "base": {
    "name": "tiny", "seed": 5, "model": "llama-3-8b", "hardware": "h100-sxm-80gb",
    "workload": {"arrival": {"process": "poisson", "rate": 30.0}, "num_requests": 40,
                 "lengths": {"preset": "azure-conversation"}}},
    "grid": {"workload.arrival.rate": [10.0, 20.0, 30.0]}, "replications": 2, "output": "full"}


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def one_line(result: Any, code: int = 2) -> str:
    assert result.returncode == code, (result.returncode, result.stdout[-800:], result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, lines
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith((".tmp-", ".summary")))


# ---------------------------------------------------------------------- disk full
def can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


def in_small_filesystem(mount: Path, script: str, size: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) with a ``size`` tmpfs mounted at ``mount``, in a private mount
    namespace (nothing outside the test sees it)."""
    mount.mkdir(exist_ok=True)
    setup = f"mount -t tmpfs -o size={size} tmpfs {mount} && "
    return subprocess.run(["unshare", "-rm", "sh", "-c", setup + script], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.mark.skipif(not can_mount_tmpfs(), reason="no private tmpfs here (the simulated ENOSPC test runs)")
def test_disk_full_during_run_and_sweep_on_a_real_small_filesystem(tmp_path: Path) -> None:
    """A 600 KB filesystem: a summary-only run fits, a full run (tables + report) does not, and
    a full-output sweep fills it midway; with space back the sweep resumes to the same bytes."""
    mount = tmp_path / "disk"
    py = f"{sys.executable} -m servesim"
    sweep_file = write(tmp_path / "sweep.yaml", SWEEP)
    reference = tmp_path / "reference"
    run_sweep(load_sweep(sweep_file), reference, workers=1)
    script = (
        f"{py} run quickstart --set workload.num_requests=300 --set output=summary --out {mount}/run --quiet "
        f"> /dev/null && cp {mount}/run/summary.json {tmp_path}/before.json && "
        f"{py} run quickstart --set workload.num_requests=300 --out {mount}/run --quiet > /dev/null "
        f"2> {tmp_path}/run.err; echo $? > {tmp_path}/run.rc; ls -a {mount}/run > {tmp_path}/run.ls; "
        f"cmp {mount}/run/summary.json {tmp_path}/before.json && echo same > {tmp_path}/kept; "
        f"rm -rf {mount}/run; {py} sweep {sweep_file} --out {mount}/sweep --workers 1 --quiet --no-report "
        f"> /dev/null 2> {tmp_path}/sweep.err; echo $? > {tmp_path}/sweep.rc; "
        f"ls -a {mount}/sweep/points > {tmp_path}/sweep.ls; "
        f"mount -o remount,size=64m {mount} && {py} sweep {sweep_file} --out {mount}/sweep --workers 1 "
        f"--quiet --no-report > {tmp_path}/resume.out 2>&1; echo $? > {tmp_path}/resume.rc; "
        f"cp {mount}/sweep/results.parquet {tmp_path}/resumed.parquet")
    done = in_small_filesystem(mount, script, "600k")
    assert done.returncode == 0, done.stderr
    # The run: one line naming the file and the fix; the earlier run is left whole.
    assert (tmp_path / "run.rc").read_text().strip() == "2"
    err = (tmp_path / "run.err").read_text().strip().splitlines()
    assert len(err) == 1 and "could not be written: No space left on device; free some space" in err[0], err
    assert (tmp_path / "kept").read_text().strip() == "same"
    assert ".tmp-render" not in (tmp_path / "run.ls").read_text()
    # The sweep: one line, no half-written run folder; resumed, the same results as with space.
    assert (tmp_path / "sweep.rc").read_text().strip() == "2"
    err = (tmp_path / "sweep.err").read_text().strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "/points/" in err[0], err
    assert ".tmp-" not in (tmp_path / "sweep.ls").read_text()
    assert (tmp_path / "resume.rc").read_text().strip() == "0", (tmp_path / "resume.out").read_text()
    assert "resuming: skipped" in (tmp_path / "resume.out").read_text()
    assert (tmp_path / "resumed.parquet").read_bytes() == (reference / "results.parquet").read_bytes()


def test_disk_full_simulated_at_the_write_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no private filesystem can be mounted: ENOSPC from the third file written."""
    plan = load_plan(configs_dir() / "quickstart.yaml", ["workload.num_requests=50"])
    result = simulate(plan)
    out = tmp_path / "run"
    render(result, out, report=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = {"n": 0}

    def full_disk(tmp: Path) -> None:
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        tmp.write_bytes(b"x")

    import servesim.atomic_io as atomic_io

    real = atomic_io.atomic_write

    def failing(path: Path, write: Any) -> None:
        real(path, full_disk)

    monkeypatch.setattr(atomic_io, "atomic_write", failing)
    with pytest.raises(ServesimError, match=r"could not be written: No space left on device; free some"):
        atomic_write_bytes(out / "a.bin", b"1")
        atomic_write_bytes(out / "b.bin", b"1")
        render(result, out, report=False)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name in before} == before
    assert leftovers(out) == []
    monkeypatch.undo()
    # A sweep whose disk fills: one line, the temp folder gone, and a resume finishes the rest.
    sweep = write(tmp_path / "sweep.yaml", SWEEP)
    folder = tmp_path / "sweep"
    import servesim.sweep.execute as execute

    stored = {"n": 0}
    real_mkdtemp = execute.tempfile.mkdtemp

    def mkdtemp(**kwargs: Any) -> str:
        stored["n"] += 1
        if stored["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkdtemp(**kwargs)

    monkeypatch.setattr(execute.tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(ServesimError, match=r"points/[0-9a-f]{16}: could not be written: No space left"):
        run_sweep(load_sweep(sweep), folder, workers=1)
    monkeypatch.undo()
    assert len(list((folder / "points").iterdir())) == 2 and leftovers(folder) == []
    outcome = run_sweep(load_sweep(sweep), folder, workers=1)
    assert (outcome.runs_skipped, outcome.runs_done) == (2, 4)


# ---------------------------------------------------------------------- sweep workers that die
def test_a_worker_that_always_dies_fails_its_run_once_retried_and_the_rest_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_sweep(load_sweep(write(tmp_path / "sweep.yaml", SWEEP)))
    doomed = plan.runs[2].run_id
    monkeypatch.setenv(DOOMED_ENV, doomed)
    finished: list[Any] = []
    pool = WorkerPool(2, execute=die_on_doomed_run)
    pool.run(plan.runs, finished.append)
    records = {f.run_id: f.record for f in finished}
    assert sorted(records) == sorted(t.run_id for t in plan.runs)  # nothing lost
    assert records[doomed]["status"] == "failed"
    assert "died 2 times (killed by SIGKILL (killed, e.g. by the out-of-memory killer))" in \
        records[doomed]["reason"]
    assert all(r["status"] == "ok" for run, r in records.items() if run != doomed)
    assert pool.deaths == [f"run {doomed}: worker killed by SIGKILL (killed, e.g. by the out-of-memory "
                           "killer); retried", f"run {doomed}: worker killed by SIGKILL (killed, e.g. by "
                           "the out-of-memory killer) again; recorded as failed"]
    # Results of the runs that finished are those of an undisturbed worker.
    alone = execute_run(plan.runs[0])
    assert next(f for f in finished if f.run_id == plan.runs[0].run_id).files["summary.json"] == \
        alone.files["summary.json"]


def sweep_workers(pid: int) -> list[int]:
    """The pool's worker processes of the driver ``pid`` (not multiprocessing's resource tracker)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                command = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in command:
                found.append(int(child))
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc to find the workers")
def test_kill_9_of_a_real_worker_mid_sweep_loses_nothing(tmp_path: Path) -> None:
    document = {**SWEEP, "base": {**SWEEP["base"], "workload": {**SWEEP["base"]["workload"],
                                                                "num_requests": 400}}}
    sweep = write(tmp_path / "sweep.yaml", document)
    reference = tmp_path / "reference"
    run_sweep(load_sweep(sweep), reference, workers=1)
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-m", "servesim", "sweep", str(sweep), "--out", str(out),
                               "--workers", "2", "--quiet", "--no-report"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 60
    while killed is None and time.monotonic() < deadline and driver.poll() is None:
        workers = sweep_workers(driver.pid)
        if len(workers) == 2:
            time.sleep(0.3)  # let it start a run
            killed = workers[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    stdout, stderr = driver.communicate(timeout=240)
    assert killed is not None, "the sweep finished before a worker could be killed"
    assert driver.returncode == 0, stderr
    assert "worker death(s)" in stdout and "killed by SIGKILL" in stdout and "retried" in stdout, stdout
    assert (out / "results.parquet").read_bytes() == (reference / "results.parquet").read_bytes()


# ---------------------------------------------------------------------- one sweep per folder
def test_a_second_sweep_into_a_busy_folder_says_who_holds_it(tmp_path: Path) -> None:
    sweep = write(tmp_path / "sweep.yaml", SWEEP)
    out = tmp_path / "out"
    out.mkdir()
    lock = SweepLock.acquire(out)
    line = one_line(servesim("sweep", str(sweep), "--out", str(out), "--quiet", "--no-report"))
    assert f"--out: {out} is in use by another sweep (pid {os.getpid()} on " in line
    assert "wait for it to finish, or run into another --out folder" in line
    lock.release()
    # A holder killed with -9 leaves no stale lock: the kernel drops it with the process.
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from servesim.sweep.lock import SweepLock; "
                               f"SweepLock.acquire(Path({str(out)!r})); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(ServesimError, match="is in use by another sweep"):
        SweepLock.acquire(out)
    holder.kill()
    holder.wait()
    SweepLock.acquire(out).release()


def test_a_different_sweep_into_a_folder_is_refused_without_force(tmp_path: Path) -> None:
    first = write(tmp_path / "a.yaml", SWEEP)
    second = write(tmp_path / "b.yaml", {**SWEEP, "grid": {"workload.arrival.rate": [20.0, 40.0]}})
    out = tmp_path / "out"
    run_sweep(load_sweep(first), out, workers=1)
    before = (out / "results.parquet").read_bytes()
    line = one_line(servesim("sweep", str(second), "--out", str(out), "--quiet", "--no-report"))
    assert f"--out: {out} holds another sweep: it holds sweep 'faults' with other grid" in line
    assert "run into a new --out folder, or add --force to replace it" in line
    assert (out / "results.parquet").read_bytes() == before  # untouched
    assert run_sweep(load_sweep(first), out, workers=1).runs_skipped == 6  # the same sweep: a resume
    forced = run_sweep(load_sweep(second), out, workers=1, force=True)  # what --force does
    assert (forced.runs_skipped, forced.runs_done) == (2, 2)  # rate 20 is shared
    assert len(list((out / "points").iterdir())) == 4  # the other runs are gone, not orphaned
    assert list(pd.read_parquet(out / "results.parquet")["workload.arrival.rate"]) == [20.0, 40.0]


# ---------------------------------------------------------------------- no progress: an error, not a hang
@pytest.fixture
def stuck_policies() -> Any:
    class NeverSchedules(Policy):
        name = "never_schedules"

        def schedule(self, now: float) -> None:
            return None

    class WakesForever(NeverSchedules):
        name = "wakes_forever"

        def wake_at(self, now: float) -> float:
            return now + 0.5

    for cls in (NeverSchedules, WakesForever):
        POLICIES[cls.name] = cls
    yield
    for cls in (NeverSchedules, WakesForever):
        del POLICIES[cls.name]


@pytest.mark.timeout(60)
def test_a_policy_that_never_schedules_is_an_error_naming_the_replica(stuck_policies: Any) -> None:
    config = experiment({"replicas": 2}, policy={"name": "never_schedules"}, engine="vllm-v0")
    with pytest.raises(StalledError, match=r"engine: stalled at t=\S+ s: replica 0: 2 waiting, 0 running, "
                       r"\d+ of \d+ KV blocks free; the head of its queue \(request 0\) needs 100 tokens"):
        run(config, table([0.0, 0.1, 0.2, 0.3], 100, 5))
    config = experiment(policy={"name": "wakes_forever"}, engine="vllm-v0")
    with pytest.raises(StalledError, match=r"replica 0: 1 waiting.*its policy woke it 100,000 times"):
        run(config, table([0.0], 100, 5))


@pytest.mark.timeout(60)
def test_a_block_leaked_per_release_stops_with_the_pool_state(monkeypatch: pytest.MonkeyPatch) -> None:
    real = BlockPool.release_many

    def leaky(self: BlockPool, ids: np.ndarray) -> None:
        real(self, ids)
        self.free -= 1  # one block never comes back

    monkeypatch.setattr(BlockPool, "release_many", leaky)
    config = experiment({"num_gpu_blocks": 40, "max_num_seqs": 4}, engine="vllm-v0")
    with pytest.raises(StalledError, match=r"replica 0: \d+ waiting, 0 running, \d of 40 KV blocks free; the "
                       r"head of its queue \(request \d+\) needs \d+ tokens and \d+ blocks"):
        run(config, table(np.arange(60) * 0.01, 64, 8))


# ---------------------------------------------------------------------- Ctrl-C
def interrupt_when(args: list[str], ready: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Start ``servesim ARGS``, send SIGINT once ``ready`` is printed, return the result."""
    process = subprocess.Popen([sys.executable, "-m", "servesim", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if ready in line:
            time.sleep(0.5)
            process.send_signal(signal.SIGINT)
            break
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(args, process.returncode, "".join(seen) + stdout, stderr)


def test_ctrl_c_during_run_and_capacity_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = interrupt_when(["run", "quickstart", "--set", "workload.num_requests=200000", "--out", str(out),
                             "--quiet"], "workload:", tmp_path)
    line = one_line(result, 130)
    assert line.startswith("interrupted: nothing was left half-written")
    assert not (out / "summary.json").exists() and leftovers(out) == []
    capacity = tmp_path / "capacity"
    result = interrupt_when(["capacity", "llama3-8b-chat", "--requests", "4000", "--out", str(capacity)],
                            "llama3-8b-chat", tmp_path)
    assert one_line(result, 130).startswith("interrupted:")
    assert not (capacity / "capacity.json").exists()


def test_ctrl_c_during_a_sweep_keeps_finished_runs_and_releases_the_folder(tmp_path: Path) -> None:
    sweep = write(tmp_path / "sweep.yaml", {**SWEEP, "base": {**SWEEP["base"], "workload": {
        **SWEEP["base"]["workload"], "num_requests": 3000}}})
    out = tmp_path / "out"
    result = interrupt_when(["sweep", str(sweep), "--out", str(out), "--workers", "2", "--no-report"],
                            "runs;", tmp_path)
    assert result.returncode == 130, result.stderr
    assert "interrupted: the" in result.stdout and "Traceback" not in result.stderr
    assert leftovers(out / "points") == []
    SweepLock.acquire(out).release()  # not left locked


def test_ctrl_c_during_calibrate_is_one_line(tmp_path: Path) -> None:
    """calibrate bench needs torch (CI's calibration step): the interrupt comes from inside the
    command instead, through the same handler every command has."""
    code = ("import sys, servesim.calibration.profiles as p\n"
            "from servesim.cli.interrupt import Interrupted\n"
            "def stop(*a, **k):\n    raise Interrupted\n"
            "p.fit_directory = stop\n"
            "sys.argv = ['servesim', 'calibrate', 'fit', '.', '--profile', 'x.yaml']\n"
            "from servesim.cli.app import main\nmain()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            timeout=60)
    assert one_line(result, 130).startswith("interrupted: nothing was left half-written")
    assert not (tmp_path / "x.yaml").exists()


def test_summary_json_is_always_valid_json(tmp_path: Path) -> None:
    """No infinity or NaN can reach summary.json: an SLO limit is finite, so is every metric."""
    out = tmp_path / "run"
    done = servesim("run", "quickstart", "--set", "workload.num_requests=40", "--set", "slo.ttft_s=1ms",
                    "--out", str(out), "--quiet", "--no-report")
    assert done.returncode == 0, done.stderr
    json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))
