"""``servesim sweep``: axis expansion, run names, resume, the confidence-interval maths, infeasible
points, determinism, and the Ray backend giving the local backend's bytes."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from test_cli import servesim

from servesim.config import validate_document
from servesim.engines import make_engine
from servesim.errors import ServesimError
from servesim.hardware_io import load_hardware
from servesim.model_config import load_model
from servesim.resources import configs_dir
from servesim.sweep import (
    ci95_halfwidth,
    expand,
    find_sweep,
    load_sweep,
    parse_sweep,
    plan_sweep,
    run_sweep,
    t_quantile,
)
from servesim.sweep.aggregate import flatten_metrics, t_two_sided
from servesim.sweep.hashing import canonical_json, digest, identity, point_hash, run_hash
from servesim.sweep.spec import SweepSpec

BASE = {
    "name": "tiny", "seed": 5, "model": "llama-3-8b", "hardware": "h100-sxm-80gb",
    "workload": {"arrival": {"process": "poisson", "rate": 30.0}, "num_requests": 60,
                 "lengths": {"preset": "azure-conversation"}},
    "slo": {"ttft_s": 0.2, "tpot_s": 0.02},
}


def sweep_of(**parts: object) -> dict:
    return {"name": "t", "base": BASE, **parts}


def write_sweep(tmp_path: Path, document: dict, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# ---------------------------------------------------------------------- axes
def test_grid_times_zip_times_random_in_file_order() -> None:
    spec = SweepSpec.model_validate({
        "base": "x",
        "grid": {"a": [1, 2], "b": ["x", "y", "z"]},
        "zip": [{"c": [10, 20], "d": ["p", "q"]}],
        "random": {"n": 2, "seed": 7, "axes": {"e": ["u", "v", "w"], "f": {"uniform": [1.0, 2.0]}}},
    })
    points = expand(spec)
    assert len(points) == 2 * 3 * 2 * 2
    # The same draws by hand: sample by sample, key by key, from one generator seeded 7.
    rng = np.random.default_rng(7)
    samples = []
    for _ in range(2):
        e = ["u", "v", "w"][int(rng.integers(3))]
        samples.append({"e": e, "f": float(rng.uniform(1.0, 2.0))})
    assert points[0] == {"a": 1, "b": "x", "c": 10, "d": "p", **samples[0]}
    assert points[1] == {"a": 1, "b": "x", "c": 10, "d": "p", **samples[1]}  # last axis fastest
    assert points[2] == {"a": 1, "b": "x", "c": 20, "d": "q", **samples[0]}  # zip keys move together
    assert points[4]["b"] == "y" and points[12]["a"] == 2
    assert points[-1] == {"a": 2, "b": "z", "c": 20, "d": "q", **samples[1]}
    # Every (a, b, zip entry, sample) combination occurs exactly once.
    assert len({json.dumps(p, sort_keys=True) for p in points}) == 24


def test_zip_alone_and_one_mapping_is_one_group() -> None:
    spec = SweepSpec.model_validate({"base": "x", "zip": {"deployment.tp": [1, 2, 4],
                                                          "deployment.replicas": [4, 2, 1]}})
    assert expand(spec) == [{"deployment.tp": 1, "deployment.replicas": 4},
                            {"deployment.tp": 2, "deployment.replicas": 2},
                            {"deployment.tp": 4, "deployment.replicas": 1}]
    assert expand(SweepSpec.model_validate({"base": "x"})) == [{}]  # the base alone


def test_random_ranges_respect_their_bounds_and_shapes() -> None:
    spec = SweepSpec.model_validate({"base": "x", "random": {"n": 4000, "seed": 1, "axes": {
        "i": {"randint": [1, 3]}, "u": {"uniform": [0, 10]}, "l": {"loguniform": [1, 100]}}}})
    points = expand(spec)
    ints = [p["i"] for p in points]
    assert set(ints) == {1, 2, 3} and all(isinstance(i, int) for i in ints)  # both ends included
    uniform = np.array([p["u"] for p in points])
    assert uniform.min() >= 0 and uniform.max() <= 10 and abs(uniform.mean() - 5) < 0.2
    # log-uniform on [1, 100]: the median is the geometric mean 10, a quarter lies below sqrt(10).
    logs = np.array([p["l"] for p in points])
    assert logs.min() >= 1 and logs.max() <= 100
    assert abs(np.median(logs) / 10 - 1) < 0.1
    assert abs((logs < math.sqrt(10)).mean() - 0.25) < 0.03
    assert expand(spec) == points  # seeded


@pytest.mark.parametrize(("parts", "field", "words"), [
    ({"zip": [{"deployment.tp": [1, 2], "deployment.replicas": [1]}]}, "zip[0]", "differ in length"),
    ({"grid": {"deployment.tp": [1]}, "zip": {"deployment.tp": [2]}}, "zip[0].deployment.tp",
     "already varied"),
    ({"grid": {"seed": [1, 2]}}, "grid.seed", "replications"),
    ({"set": {"deployment.tp": 2}, "grid": {"deployment.tp": [1]}}, "set.deployment.tp", "also varied"),
    ({"grid": {"deployment.tp": []}}, "grid.deployment.tp", "no values"),
    ({"grids": {"deployment.tp": [1]}}, "grids", "unknown key"),
    ({"random": {"n": 2, "axes": {"x": {"normal": [0, 1]}}}}, "random.axes.x", "neither a list"),
    ({"random": {"n": 2, "axes": {"x": {"loguniform": [0, 1]}}}}, "random.axes.x", "lo > 0"),
])
def test_malformed_sweep_files_are_one_line_errors(parts: dict, field: str, words: str) -> None:
    with pytest.raises(ServesimError) as caught:
        plan_sweep(parse_sweep(sweep_of(**parts), Path(".")))
    assert caught.value.field == field and words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_bad_axis_value_fails_up_front_naming_the_key_and_the_point(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, sweep_of(grid={"deployment.tp": [1, 0]}))
    result = servesim("sweep", str(path), "--out", str(tmp_path / "out"), "--quiet", "--no-report")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert "\n" not in line
    assert line.startswith("error: grid.deployment.tp: point 1 (deployment.tp=0)")
    assert "greater than or equal to 1" in line
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written
    with pytest.raises(ServesimError) as typo:
        plan_sweep(parse_sweep(sweep_of(grid={"deployment.tpp": [1]}), tmp_path))
    assert typo.value.field == "grid.deployment.tpp" and "unknown key" in str(typo.value)
    with pytest.raises(ServesimError) as unknown:
        plan_sweep(parse_sweep(sweep_of(grid={"hardware": ["h100-sxm-80gb", "h900"]}), tmp_path))
    assert unknown.value.field == "grid.hardware" and "point 1 (hardware=h900)" in str(unknown.value)


# ---------------------------------------------------------------------- names of runs
def test_canonical_json_hash_is_a_plain_sha256_of_sorted_compact_json() -> None:
    document = {"b": [1, 2.5, None], "a": {"y": "é", "x": 0.1}}
    assert canonical_json(document) == '{"a":{"x":0.1,"y":"\\u00e9"},"b":[1,2.5,null]}'
    expected = hashlib.sha256(b'{"a":{"x":0.1,"y":"\\u00e9"},"b":[1,2.5,null]}').hexdigest()[:16]
    assert digest(document) == digest({"a": {"x": 0.1, "y": "é"}, "b": [1, 2.5, None]}) == expected


def test_run_names_follow_what_decides_the_result() -> None:
    config = validate_document(dict(BASE))
    model, hardware = load_model(config.model), load_hardware(config.hardware)
    engine = make_engine("vllm-v0", {})
    ident = identity(config, model, hardware, engine)
    renamed = identity(config.model_copy(update={"name": "other"}), model, hardware, engine)
    assert run_hash(renamed) == run_hash(ident)  # the name decides nothing
    reseeded = identity(config.model_copy(update={"seed": 6}), model, hardware, engine)
    assert run_hash(reseeded) != run_hash(ident) and point_hash(reseeded) == point_hash(ident)
    priced = hardware.model_copy(update={"cost_per_gpu_hour": 4.0})
    assert run_hash(identity(config, model, priced, engine)) == run_hash(ident)
    slower = hardware.model_copy(update={"memory": hardware.memory.model_copy(
        update={"bandwidth_Bps": hardware.memory.bandwidth_Bps * 0.9})})
    assert run_hash(identity(config, model, slower, engine)) != run_hash(ident)  # recalibrated: rerun
    busier = make_engine("vllm-v0", {"step_overhead_s": 1e-3})
    assert run_hash(identity(config, model, hardware, busier)) != run_hash(ident)  # engine knobs count


def test_run_names_are_the_same_in_another_process(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, sweep_of(grid={"deployment.max_num_seqs": [64, 128]}, replications=2))
    here = [r.run_id for r in plan_sweep(load_sweep(path)).runs]
    code = ("import sys; from servesim.sweep import load_sweep, plan_sweep; "
            "print(' '.join(r.run_id for r in plan_sweep(load_sweep(sys.argv[1])).runs))")
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    there = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                           env=env, check=True).stdout.split()
    assert there == here and len(set(here)) == 4


# ---------------------------------------------------------------------- statistics
def test_student_t_quantiles_match_the_tables() -> None:
    assert t_quantile(0.975, 2) == pytest.approx(4.303, abs=5e-4)  # K = 3 replications
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=5e-4)
    assert t_quantile(0.975, 4) == pytest.approx(2.776, abs=5e-4)
    assert t_quantile(0.975, 30) == pytest.approx(2.042, abs=5e-4)
    assert t_two_sided(1.0, 1) == pytest.approx(0.5)  # Cauchy: P(|T| <= 1) = 1/2
    assert t_two_sided(3.0, 2) == pytest.approx(3 / math.sqrt(2 + 9))  # df 2: t / sqrt(2 + t^2)


def test_ci95_halfwidth_by_hand() -> None:
    # mean 2, s = 1, K = 3: 4.303 * 1 / sqrt(3) = 2.484
    assert ci95_halfwidth(np.array([1.0, 2.0, 3.0])) == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    assert ci95_halfwidth(np.array([7.0])) == 0.0


def test_flatten_keeps_numeric_leaves_but_not_the_deployment() -> None:
    flat = flatten_metrics({"ttft_s": {"p99": 0.5, "mean": None}, "completed": 3, "ok": True,
                            "deployment": {"tp": 2}, "slos": {"ttft_s": 1.0}, "label": "x"})
    assert flat.keys() == {"ttft_s.p99", "ttft_s.mean", "completed", "slos.ttft_s"}
    assert math.isnan(flat["ttft_s.mean"]) and flat["completed"] == 3.0


# ---------------------------------------------------------------------- running
def test_results_aggregate_replications_with_student_t(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, sweep_of(grid={"deployment.max_num_seqs": [32, 256]}, replications=3))
    outcome = run_sweep(load_sweep(path), tmp_path / "out", workers=1)
    assert (outcome.runs_total, outcome.runs_skipped, outcome.runs_done) == (6, 0, 6)
    results = pd.read_parquet(tmp_path / "out" / "results.parquet")
    runs = pd.read_parquet(tmp_path / "out" / "points.parquet")
    assert len(results) == 2 and len(runs) == 6
    assert list(runs["seed"]) == [5, 6, 7, 5, 6, 7]  # base seed + 0..K-1
    for column in ("point", "deployment.max_num_seqs", "replications", "gpus", "hardware", "model",
                   "policy.name", "cost_per_hour", "ttft_s.p99", "ttft_s.p99.ci95", "tpot_s.mean",
                   "itl_s.p99", "e2e_s.p50", "throughput.requests_per_s", "slo_attainment",
                   "goodput_requests_per_s", "completed", "rejected", "preemptions"):
        assert column in results, column
    assert not any(c.startswith("deployment.") and c != "deployment.max_num_seqs" for c in results)
    assert list(results["replications"]) == [3, 3] and list(results["gpus"]) == [1, 1]
    for _, row in results.iterrows():
        mine = runs[runs["point"] == row["point"]]["ttft_s.p99"].to_numpy()
        assert row["ttft_s.p99"] == pytest.approx(mine.mean())
        assert row["ttft_s.p99.ci95"] == pytest.approx(4.3027 * mine.std(ddof=1) / math.sqrt(3), rel=1e-4)
        assert row["ttft_s.p99.ci95"] > 0  # the seeds differ, so do the runs
        assert row["completed"] == 60
    # Each run folder is what `servesim run` writes for that config and seed.
    first = runs.iloc[0]
    folder = tmp_path / "out" / "points" / first["run"]
    resolved = yaml.safe_load((folder / "config.resolved.yaml").read_text())
    assert resolved["seed"] == 5 and resolved["deployment"]["max_num_seqs"] == 32
    assert json.loads((folder / "summary.json").read_text())["ttft_s"]["p99"] == first["ttft_s.p99"]
    assert not (folder / "requests.parquet").exists()  # output: summary by default


def test_resume_reruns_only_what_is_missing_and_gives_the_same_bytes(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, sweep_of(grid={"workload.arrival.rate": [10.0, 20.0]}, replications=2))
    out = tmp_path / "out"
    run_sweep(load_sweep(path), out, workers=1)
    before = (out / "results.parquet").read_bytes()
    folders = sorted(p.name for p in (out / "points").iterdir())
    assert len(folders) == 4
    # One run lost, one interrupted mid-write (a temp folder with part of its files), one kept.
    shutil.rmtree(out / "points" / folders[0])
    shutil.move(out / "points" / folders[1], out / "points" / f".tmp-{folders[1]}-x1y2")
    (out / "points" / f".tmp-{folders[1]}-x1y2" / "run.json").unlink()
    (out / "results.parquet").unlink()
    reran: list[str] = []
    outcome = run_sweep(load_sweep(path), out, workers=1, on_run=lambda run: reran.append(run.run_id))
    assert sorted(reran) == folders[:2]
    assert (outcome.runs_skipped, outcome.runs_done, outcome.stale_removed) == (2, 2, 1)
    assert sorted(p.name for p in (out / "points").iterdir()) == folders  # no temp folder left
    assert (out / "results.parquet").read_bytes() == before
    again = servesim("sweep", str(path), "--out", str(out), "--quiet", "--no-report")
    assert again.returncode == 0, again.stderr
    assert "skipped 4 finished runs" in again.stdout and "ran 0 runs" in again.stdout


def test_infeasible_points_are_recorded_not_fatal(tmp_path: Path) -> None:
    base = {**BASE, "model": "llama-2-70b", "workload": {**BASE["workload"], "num_requests": 20,
                                                         "arrival": {"process": "poisson", "rate": 2.0}}}
    path = write_sweep(tmp_path, {"base": base, "grid": {"deployment.tp": [1, 2]}, "replications": 2})
    outcome = run_sweep(load_sweep(path), tmp_path / "out", workers=1)
    assert outcome.runs_total == 2  # tp 1 never runs
    results = pd.read_parquet(tmp_path / "out" / "results.parquet")
    tp1, tp2 = results.iloc[0], results.iloc[1]
    # 70B parameters x 2 bytes = 128 GiB of weights, more than one 80 GB GPU holds.
    assert tp1["status"] == "infeasible" and tp1["replications"] == 0
    assert "llama-2-70b needs" in tp1["reason"] and "use deployment.tp: 2 or more" in tp1["reason"]
    assert math.isnan(tp1["ttft_s.p99"]) and tp1["gpus"] == 1
    assert tp2["status"] == "ok" and tp2["reason"] == "" and tp2["gpus"] == 2 and tp2["completed"] == 20


def test_same_sweep_twice_same_bytes_with_a_process_pool(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, sweep_of(grid={"policy.name": ["continuous"],
                                                "deployment.replicas": [1, 2]}, replications=2))
    run_sweep(load_sweep(path), tmp_path / "a", workers=2)
    run_sweep(load_sweep(path), tmp_path / "b", workers=1)
    for name in ("results.parquet", "points.parquet", "sweep.resolved.yaml"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    results = pd.read_parquet(tmp_path / "a" / "results.parquet")
    assert list(results["gpus"]) == [1, 2]


def test_full_output_keeps_the_tables(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, sweep_of(output="full"))
    run_sweep(load_sweep(path), tmp_path / "out", workers=1)
    (folder,) = (tmp_path / "out" / "points").iterdir()
    for name in ("requests.parquet", "steps.parquet", "itl.parquet", "summary.json", "run.json"):
        assert (folder / name).is_file(), name
    assert len(pd.read_parquet(folder / "requests.parquet")) == 60


def test_ray_backend_gives_the_local_bytes(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray not installed (pip install -e '.[ray]'); CI installs it")
    path = write_sweep(tmp_path, sweep_of(grid={"workload.arrival.rate": [10.0, 20.0]}, replications=2))
    run_sweep(load_sweep(path), tmp_path / "local", workers=1)
    outcome = run_sweep(load_sweep(path), tmp_path / "ray", backend="ray", workers=2)
    assert outcome.runs_done == 4
    for name in ("results.parquet", "points.parquet"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "ray" / name).read_bytes(), name


# ---------------------------------------------------------------------- the shipped sweeps
@pytest.mark.parametrize("name", ["tp-70b", "quantisation", "rates-h100", "compare-policies", "speculative"])
def test_builtin_sweeps_resolve_by_name_and_are_valid(name: str) -> None:
    path = find_sweep(name)
    folder = configs_dir() if name == "compare-policies" else configs_dir() / "sweeps"
    assert path == folder / f"{name}.yaml"
    plan = plan_sweep(load_sweep(path))
    # Small enough for two cores in a minute or two (rates-h100: 72 runs of 1,000 requests, 20 s).
    assert plan.runs and len(plan.runs) <= 80
    assert all(p.status == "ok" for p in plan.points) or name == "tp-70b"
    if name == "tp-70b":
        infeasible = {(p.values["hardware"], p.values["deployment.tp"]) for p in plan.points
                      if p.status == "infeasible"}
        assert infeasible == {("a100-sxm-80gb", 1), ("h100-sxm-80gb", 1)}


def test_dry_run_lists_points_by_builtin_name() -> None:
    result = servesim("sweep", "tp-70b", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "8 points, 6 runs" in result.stdout and result.stdout.count("infeasible") == 2
    # --set reaches the base: int4 weights (a quarter of bf16's bytes) fit 70B on one GPU.
    int4 = servesim("sweep", "tp-70b", "--dry-run", "--set", "precision.weights=int4")
    assert int4.returncode == 0, int4.stderr
    assert "8 points, 8 runs" in int4.stdout and "infeasible" not in int4.stdout


def test_cli_errors_keep_brackets_and_name_the_fix(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, sweep_of(zip={"deployment.tp": [1, 2], "deployment.replicas": [1]}))
    result = servesim("sweep", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: zip[0]: lists differ in length (deployment.tp has 2, "
                                    "deployment.replicas has 1)")


def test_ray_backend_without_ray_says_how_to_install_it(tmp_path: Path) -> None:
    try:
        import ray
    except ImportError:
        ray = None
    if getattr(ray, "remote", None) is not None:
        pytest.skip("ray is installed here")
    path = write_sweep(tmp_path, sweep_of())
    result = servesim("sweep", str(path), "--out", str(tmp_path / "out"), "--backend", "ray")
    assert result.returncode == 2 and not (tmp_path / "out").exists()
    assert ("pip install 'ray>=2.9' (or pip install -e '.[ray]' in the servesim checkout; servesim is "
            "not on PyPI)") in result.stderr


def test_impossible_precision_combinations_are_infeasible_not_typos(tmp_path: Path) -> None:
    """W16A8 has no kernel (caught while planning); W8A8 on an A100, which has no fp8 tensor
    cores, fails only in the cost model (caught by the worker): both are results. A misspelt
    dtype is the file's mistake."""
    base = {**BASE, "hardware": "a100-sxm-80gb", "workload": {**BASE["workload"], "num_requests": 20}}
    path = write_sweep(tmp_path, {"base": base, "zip": {"precision.weights": ["bf16", "bf16", "fp8"],
                                                        "precision.activations": ["bf16", "fp8", "fp8"]}})
    outcome = run_sweep(load_sweep(path), tmp_path / "out", workers=1)
    assert outcome.runs_total == 2  # W16A8 never runs
    results = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert list(results["status"]) == ["ok", "infeasible", "infeasible"]
    assert "W16A8" in results["reason"][1] and "no fp8 tensor cores" in results["reason"][2]
    assert list(results["replications"]) == [1, 0, 0]
    with pytest.raises(ServesimError) as typo:
        plan_sweep(parse_sweep({"base": base, "grid": {"precision.weights": ["bf61"]}}, tmp_path))
    assert typo.value.field == "grid.precision.weights"


def test_base_by_relative_path_or_builtin_name(tmp_path: Path) -> None:
    (tmp_path / "exps").mkdir()
    (tmp_path / "exps" / "mine.yaml").write_text(yaml.safe_dump(BASE))
    sweep = load_sweep(write_sweep(tmp_path, {"base": "exps/mine.yaml"}))
    assert sweep.base_document["seed"] == 5 and sweep.base_dir == tmp_path / "exps"
    builtin = load_sweep(write_sweep(tmp_path, {"base": "quickstart", "set": {"deployment.tp": 2}}, "b.yaml"))
    assert builtin.base_document["model"] == "llama-3-8b" and builtin.base_document["deployment"]["tp"] == 2
    with pytest.raises(ServesimError) as missing:
        load_sweep(write_sweep(tmp_path, {"base": "nowhere.yaml"}, "c.yaml"))
    assert missing.value.field == "base" and "quickstart" in str(missing.value)
