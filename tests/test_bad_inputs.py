"""Every class of bad input a new or hostile user hands servesim is one line naming the file, the
field (or line and column) and the fix, never a traceback, a hang or a run that succeeds on
nonsense. One test per class (issue #17); ``test_fuzz_inputs.py`` searches the same space."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_cli import servesim

from servesim.capacity.config import validate_capacity
from servesim.config import load_experiment, validate_document
from servesim.errors import ServesimError
from servesim.hardware_io import load_hardware, profile_to_yaml
from servesim.inputs.files import load_yaml_text, read_json
from servesim.inputs.limits import MAX_DEPTH, MAX_DOCUMENT_BYTES
from servesim.model_config import load_model, model_from_hf_config
from servesim.pipeline import load_plan, prepare, render, simulate
from servesim.report.run_data import load_run
from servesim.resources import configs_dir, model_configs_dir
from servesim.sweep import load_sweep, parse_sweep, plan_sweep
from servesim.workloads.traces import read_trace

pytestmark = pytest.mark.timeout(120)

QUICKSTART: dict[str, Any] = yaml.safe_load((configs_dir() / "quickstart.yaml").read_text())
SMALL = {**QUICKSTART, "workload": {**QUICKSTART["workload"], "num_requests": 20}}
LLAMA = json.loads((model_configs_dir() / "llama-3-8b.json").read_text())
MIXTRAL = json.loads((model_configs_dir() / "mixtral-8x7b.json").read_text())
DEEPSEEK = json.loads((model_configs_dir() / "deepseek-v3.json").read_text())


def one_line(run: Any) -> str:
    assert run.returncode == 2, (run.returncode, run.stdout[-500:], run.stderr[-2000:])
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def refused(call: Any, *words: str) -> str:
    with pytest.raises(ServesimError) as error:
        call()
    text = str(error.value)
    assert "\n" not in text and ";" in text, text  # one line with a fix
    for word in words:
        assert word in text, (word, text)
    return text


def experiment(tmp_path: Path, change: dict[str, Any], name: str = "x.yaml") -> Path:
    document = json.loads(json.dumps(SMALL))
    for key, value in change.items():
        node = document
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return path


# ---------------------------------------------------------------------- not UTF-8, binary
LATIN1 = "caf\u00e9".encode("latin-1")


def test_every_reader_names_a_latin1_byte(tmp_path: Path) -> None:
    cases = {
        "experiment": ("x.yaml", quickstart_bytes().replace(b"quickstart", LATIN1),
                       lambda p: load_experiment(p)),
        "config.json": ("config.json", json.dumps(LLAMA).encode().replace(b'"llama"', b'"' + LATIN1 + b'"'),
                        lambda p: load_model(p)),
        "profile": ("gpu.yaml", profile_to_yaml(load_hardware("l40s")).encode().replace(
            b"NVIDIA", LATIN1), lambda p: load_hardware(p)),
        "jsonl trace": ("t.jsonl", b'{"timestamp": 0, "input_length": 5, "output_length": 2, '
                        b'"hash_ids": []}\n' + LATIN1 + b"\n", lambda p: read_trace(p, "mooncake")),
        "csv trace": ("t.csv", b"arrival_s,prompt_tokens,output_tokens\n0," + LATIN1 + b",3\n",
                      lambda p: read_trace(p, "csv")),
        "sweep": ("s.yaml", b"base: quickstart\nname: " + LATIN1 + b"\n", lambda p: load_sweep(p)),
        "binary": ("b.yaml", bytes(range(256)), lambda p: load_experiment(p)),
    }
    for what, (name, data, load) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        text = refused(lambda load=load, path=path: load(path), str(path), "not UTF-8", "save it as UTF-8")
        assert "line" in text, (what, text)


def quickstart_bytes() -> bytes:
    return (configs_dir() / "quickstart.yaml").read_bytes()


def test_report_inputs_that_are_not_utf8_or_not_json(tmp_path: Path) -> None:
    run = tmp_path / "run"
    render(simulate(load_plan(configs_dir() / "quickstart.yaml", ["workload.num_requests=30"])), run,
           report=False)
    (run / "summary.json").write_bytes(b'{"x": "' + LATIN1 + b'"}')
    refused(lambda: load_run(run), "summary.json is not UTF-8")
    (run / "summary.json").write_text('{"x": NaN}')
    refused(lambda: load_run(run), "summary.json", "NaN")
    (run / "summary.json").write_text("{}")
    (run / "config.resolved.yaml").write_bytes(LATIN1)
    refused(lambda: load_run(run), "config.resolved.yaml is not UTF-8")
    (run / "config.resolved.yaml").write_text("x: 1\n")
    (run / "steps.parquet").write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    line = one_line(servesim("report", str(run)))
    assert line.startswith("error: run_dir: steps.parquet is not a readable"), line


# ---------------------------------------------------------------------- YAML built to exhaust
BOMB = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "lol"] * 10) + "]\n" for i in range(9))


def test_an_alias_bomb_in_policy_knobs_is_refused_before_it_expands(tmp_path: Path) -> None:
    text = (configs_dir() / "quickstart.yaml").read_text().replace(
        "policy:\n  name: continuous\n", "policy:\n  name: continuous\n  knobs: *l8\n")
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB + text)
    line = one_line(servesim("validate", str(path)))
    assert f"{path}: its aliases (*name) expand to more than" in line and "reuse anchors fewer times" in line
    line = one_line(servesim("run", "quickstart", "--set", "policy.knobs=&a [*a]"))  # kept as text
    assert line.startswith("error: policy.knobs: unknown key"), line


def test_deep_large_and_ambiguous_yaml(tmp_path: Path) -> None:
    refused(lambda: load_yaml_text("x: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5), "f.yaml", "config"),
            "nested more than 64 levels", "flatten")
    refused(lambda: load_yaml_text("x: " + "[" * 5000 + "]" * 5000, "f.yaml", "config"), "nested too deeply")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * (MAX_DOCUMENT_BYTES + 10) + b"\n")
    refused(lambda: load_experiment(big), str(big), "MiB")
    refused(lambda: load_yaml_text("rate: 1\nrate: 2\n", "f.yaml", "config"),
            "f.yaml at line 2, column 1: the key 'rate' is given twice", "keep one of them")
    refused(lambda: load_yaml_text("day: 2023-13-45\n", "f.yaml", "config"), "line 1, column 6",
            "month must be in 1..12", "quote it")
    refused(lambda: load_yaml_text("n: " + "9" * 5000, "f.yaml", "config"), "cannot read the value")
    assert load_yaml_text("a: &a {x: 1}\nb:\n  <<: *a\n  x: 2\n", "f", "c") == {"a": {"x": 1}, "b": {"x": 2}}
    deep_json = tmp_path / "config.json"
    deep_json.write_text(json.dumps({"a": json.loads("[" * 80 + "]" * 80)}))
    refused(lambda: read_json(deep_json, "model"), "nested more than 64 levels")


# ---------------------------------------------------------------------- Hugging Face configs
@pytest.mark.parametrize(("base", "change", "words"), [
    (MISTRAL := json.loads((model_configs_dir() / "mistral-7b.json").read_text()),
     {"sliding_window": "4096"}, "sliding_window: must be a positive integer, got '4096'"),
    (MISTRAL, {"sliding_window": {"size": 4096}}, "sliding_window: must be a positive integer"),
    (MISTRAL, {"sliding_window": -4096}, "sliding_window: must be a positive integer, got -4096"),
    (MISTRAL, {"use_sliding_window": "false"}, "use_sliding_window: must be true or false, got 'false'"),
    (LLAMA, {"tie_word_embeddings": "false"}, "tie_word_embeddings: must be true or false"),
    (LLAMA, {"_servesim": "gated"}, "_servesim: must be a JSON object"),
    (LLAMA, {"_servesim": {"gated_mlp": "no"}}, "gated_mlp: must be true or false"),
    (MIXTRAL, {"num_local_experts": 8.5}, "num_local_experts: must be a positive integer, got 8.5"),
    (MIXTRAL, {"num_local_experts": "8"}, "num_local_experts: must be a positive integer, got '8'"),
    (MIXTRAL, {"num_experts_per_tok": {"k": 2}}, "num_experts_per_tok: must be a positive integer"),
    (DEEPSEEK, {"n_shared_experts": "1"}, "n_shared_experts: must be a whole number >= 0, got '1'"),
    (DEEPSEEK, {"first_k_dense_replace": -1}, "first_k_dense_replace: must be a whole number >= 0"),
    (DEEPSEEK, {"q_lora_rank": "1536"}, "q_lora_rank: must be a positive integer"),
    (DEEPSEEK, {"kv_lora_rank": 512.5}, "kv_lora_rank: must be a positive integer, got 512.5"),
    (DEEPSEEK, {"moe_layer_freq": 0}, "moe_layer_freq: must be a positive integer, got 0"),
    (MIXTRAL, {"decoder_sparse_step": "2"}, "decoder_sparse_step: must be a positive integer"),
    (MIXTRAL, {"decoder_sparse_step": 1, "mlp_only_layers": [0, 99]}, "mlp_only_layers: must be a whole"),
    (LLAMA, {"num_hidden_layers": 10**12}, "num_hidden_layers: must be a whole number in [1, 10,000]"),
    (LLAMA, {"hidden_size": True}, "hidden_size: must be a positive integer, got True"),
])
def test_wrong_types_in_a_hugging_face_config(tmp_path: Path, base: dict, change: dict, words: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **change}))
    refused(lambda: load_model(path), words, "config.json")


def test_a_window_switched_off_or_absent_is_full_attention() -> None:
    mistral = json.loads((model_configs_dir() / "mistral-7b.json").read_text())
    assert model_from_hf_config(mistral, "m").sliding_window == 4096
    assert model_from_hf_config({**mistral, "use_sliding_window": False}, "m").sliding_window is None
    assert model_from_hf_config({**mistral, "sliding_window": None}, "m").sliding_window is None
    assert model_from_hf_config({**mistral, "sliding_window": 0}, "m").sliding_window is None


# ---------------------------------------------------------------------- non-finite and absurd numbers
@pytest.mark.parametrize(("path", "value", "words"), [
    (("memory", "capacity_bytes"), math.inf, "memory.capacity_bytes: Input should be a finite number"),
    (("memory", "bandwidth_Bps"), math.nan, "memory.bandwidth_Bps: Input should be a finite number"),
    (("peak_flops", "bf16"), math.inf, "peak_flops.bf16: Input should be a finite number"),
    (("interconnect", "latency_s"), math.inf, "interconnect.latency_s: Input should be a finite number"),
    (("host_link", "bandwidth_Bps"), math.inf, "host_link.bandwidth_Bps: Input should be a finite"),
    (("cost_per_gpu_hour",), math.inf, "cost_per_gpu_hour: Input should be a finite number"),
    (("efficiency", "gemm", "compute", "y"), [0.5, math.nan], "efficiency.gemm.compute.y.1: Input should"),
    (("efficiency", "gemm", "compute", "x"), [64.0, 64.0], "strictly increasing"),
    (("spec_only",), 1.5, "spec_only"),
    (("memory", "bandwidth_Bps"), 3.35, "would take"),
    (("compute_capability",), 9.0, "compute_capability: quote it: compute_capability: '9.0'"),
    (("compute_capability",), "sm90", "compute_capability: String should match pattern"),
])
def test_non_finite_and_absurd_hardware_numbers(tmp_path: Path, path: tuple[str, ...], value: Any,
                                                words: str) -> None:
    profile = yaml.safe_load(profile_to_yaml(load_hardware("h100-sxm-80gb")))
    if path[-1] in ("x", "y"):
        profile["efficiency"]["gemm"]["compute"] = {"axis": "tokens", "x": [64.0, 128.0], "y": [0.5, 0.6]}
    node = profile
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    file = tmp_path / "gpu.yaml"
    file.write_text(yaml.safe_dump(profile))
    change = {"hardware": str(file)}
    refused(lambda: prepare(validate_document({**SMALL, **change})), words)


@pytest.mark.parametrize(("change", "words"), [
    ({"slo.ttft_s": math.inf}, "slo.ttft_s: must be a positive duration (got inf)"),
    ({"workload.arrival.rate": 1e-300}, "workload.arrival.rate: at 1e-300 requests/s request 19 arrives"),
    ({"workload.arrival.process": "gamma", "workload.arrival.burstiness": 1e-300},
     "workload.arrival.burstiness: Input should be greater than or equal to 0.01"),
    ({"deployment.block_size": 100_000}, "deployment.block_size: 100000 tokens per KV block exceeds"),
    ({"precision.weights": "int4", "precision.group_size": 100},
     "precision.group_size: 100 does not divide llama-3-8b's hidden_size (4096 rows)"),
    ({"deployment.tp": 64}, "deployment.tp: 64 does not divide llama-3-8b's 32 attention heads"),
    ({"deployment.tp": True}, "deployment.tp: Input should be a number, not true"),
    ({"seed": 2**70}, "seed: Input should be less than or equal to"),
    ({"workload.output": {"dist": "lognormal", "median": 100, "sigma": 1e300}}, ""),
    ({"workload.output": {"dist": "fixed", "value": 10**30}}, "workload.output.value: Input should be less"),
    ({"name": "../../escaped"}, "name: is not a safe folder name"),
    ({"name": "a/b"}, "write e.g. name: a-b"),
])
def test_non_finite_and_absurd_experiment_values(change: dict[str, Any], words: str, tmp_path: Path) -> None:
    path = experiment(tmp_path, change)
    if not words:  # an absurd spread is clipped, not garbage: such requests are rejected, not served
        plan = prepare(load_experiment(path))
        assert plan.workload.output_tokens.min() >= 1 and plan.rejections()
        return
    refused(lambda: prepare(load_experiment(path)), words)


def test_arrivals_beyond_the_clock_and_huge_counts_in_traces(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n1e300,5,5\n")
    refused(lambda: read_trace(trace, "csv"), "arrival_s: request 1 arrives at 1e+300 s", "rate_scale")
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n1,1e30,5\n")
    refused(lambda: read_trace(trace, "csv"), "prompt_tokens: 1e+30 at", "line 3")


def test_an_infinite_value_anywhere_in_a_sweep_is_one_line(tmp_path: Path) -> None:
    base = {"base": "quickstart"}
    grid = {"deployment.gpu_memory_utilization": [0.9, math.inf]}
    refused(lambda: plan_sweep(parse_sweep({**base, "grid": grid}, tmp_path)),
            "grid.deployment.gpu_memory_utilization", "finite")
    # rate: inf is the one infinity a workload takes (every request at t = 0, vllm bench's default)
    rates = plan_sweep(parse_sweep({**base, "grid": {"workload.arrival.rate": [1.0, math.inf]}}, tmp_path))
    assert len(rates.points) == 2
    loguniform = {"n": 2, "axes": {"workload.arrival.rate": {"loguniform": [1, math.inf]}}}
    refused(lambda: plan_sweep(parse_sweep({**base, "random": loguniform}, tmp_path)),
            "random.axes.workload.arrival.rate", "finite numbers")
    refused(lambda: plan_sweep(parse_sweep({**base, "random": {"n": 2, "axes": {"seedless": {
        "randint": [0, 1e300]}}}}, tmp_path)), "finite numbers")
    refused(lambda: plan_sweep(parse_sweep({**base, "grid": {"policy.order": [math.nan]}}, tmp_path)),
            "grid.policy.order")


def test_capacity_absurd_values(tmp_path: Path) -> None:
    document = yaml.safe_load((configs_dir() / "capacity" / "llama3-8b-chat.yaml").read_text())
    refused(lambda: validate_capacity({**document, "slo": {"ttft_s": math.inf}}), "slo.ttft_s",
            "positive duration (got inf)")
    refused(lambda: validate_capacity({**document, "prices": {"h100-sxm-80gb": math.nan}}),
            "prices", "finite")
    refused(lambda: validate_capacity({**document, "name": "../up"}), "name: is not a safe folder name")
    candidates = {**document["candidates"], "policy": 1}  # found by the fuzzer: was a TypeError
    refused(lambda: validate_capacity({**document, "candidates": candidates}), "candidates.policy.0")
    line = one_line(servesim("capacity", "llama3-8b-chat", "--decode-context", "100000000", "--limits-only"))
    assert "decode_context: 100,000,000 tokens of context is beyond max_model_len 8,192" in line


# ---------------------------------------------------------------------- sizes refused before work
def test_sizes_that_exhaust_memory_or_time_are_refused_with_the_figure(tmp_path: Path) -> None:
    refused(lambda: prepare(load_experiment(experiment(tmp_path, {"deployment.replicas": 10_000_000}))),
            "deployment.replicas: 10,000,000 replicas need about 45.0 GB of memory but this machine has")
    refused(lambda: prepare(load_experiment(experiment(tmp_path, {"workload.num_requests": 10**12}))),
            "workload.num_requests: 1,000,000,000,000 requests (4.5 KB each with output: full) need about",
            "output: summary")
    refused(lambda: prepare(load_experiment(experiment(tmp_path, {"workload.num_requests": None,
                                                                  "workload.duration_s": 1e300}))),
            "workload.duration_s:", "requests")
    base = {"base": "quickstart"}
    refused(lambda: parse_sweep({**base, "random": {"n": 10**9, "axes": {"workload.arrival.rate": [1, 2]}}},
                                tmp_path), "1,000,000,000 points x 1 replications", "split it")
    refused(lambda: parse_sweep({**base, "replications": 10**9}, tmp_path), "1 points x 1,000,000,000")
    grid = {"workload.arrival.rate": list(range(1, 501)), "deployment.max_num_seqs": list(range(1, 401))}
    refused(lambda: parse_sweep({**base, "grid": grid}, tmp_path), "200,000 points")


def test_a_sweep_reads_each_profile_and_model_once_while_planning(tmp_path: Path) -> None:
    from servesim.hardware_io import _cached_hardware_file
    from servesim.model_config import _cached_model

    profile = tmp_path / "gpu.yaml"
    profile.write_text(profile_to_yaml(load_hardware("h100-sxm-80gb")))
    _cached_hardware_file.cache_clear()
    _cached_model.cache_clear()
    sweep = parse_sweep({"base": {**SMALL, "hardware": str(profile)},
                         "grid": {"workload.arrival.rate": [float(r) for r in range(1, 201)]}}, tmp_path)
    assert len(plan_sweep(sweep).points) == 200
    assert _cached_hardware_file.cache_info().misses == 1 and _cached_model.cache_info().misses == 1
    profile.write_text(profile.read_text() + "# edited\n")  # an edited file is read again
    plan_sweep(sweep)
    assert _cached_hardware_file.cache_info().misses == 2


def test_run_names_never_leave_the_output_folders(tmp_path: Path) -> None:
    path = experiment(tmp_path, {"name": "../../outside"})
    line = one_line(servesim("run", str(path), "--quiet"))
    assert "name: is not a safe folder name" in line and "write e.g. name: outside" in line
    assert not (tmp_path.parent / "outside").exists()
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: quickstart\nname: ../up\n")
    assert "name: is not a safe folder name" in one_line(servesim("sweep", str(sweep), "--dry-run"))
    assert validate_document({**SMALL, "name": "my run (v2)"}).name == "my run (v2)"


def test_seeds_stay_within_the_int64_result_columns() -> None:
    refused(lambda: validate_document({**SMALL, "seed": 2**63}), "seed: Input should be less than or equal")


@pytest.mark.parametrize("script", ["servesim.calibration.burst_share",
                                    "servesim.calibration.mtp_acceptance"])
def test_calibration_scripts_refuse_a_bad_serving_file_in_one_line(tmp_path: Path, script: str) -> None:
    """The ``python -m`` analyses of a serving file print a missing file or a file of the wrong
    format as the CLI prints a mistake (``servesim.errors.run_script``), not as a traceback."""
    import subprocess
    import sys

    def run(path: Path) -> str:
        done = subprocess.run([sys.executable, "-m", script, str(path)], capture_output=True, text=True,
                              timeout=60)
        return one_line(done)

    assert "not found; check the path" in run(tmp_path / "missing.csv")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    assert "missing column(s) backend" in run(wrong)


@pytest.mark.parametrize("flag", ["--workers", "--measured"])
@pytest.mark.parametrize("command", ["validate-serving", "fit-serving"])
def test_serving_replays_need_a_worker_and_a_measured_round(tmp_path: Path, command: str, flag: str) -> None:
    """0 workers is no pool and 0 measured rounds would read each prediction off the burst alone:
    both refused before the file is read."""
    line = one_line(servesim("calibrate", command, str(tmp_path / "any.csv"), flag, "0"))
    assert line == f"error: {flag}: must be >= 1, got 0; use 1 or more"


@pytest.mark.parametrize("argv", [["sweep", "compare-policies", "--dry-run"], ["plan-day", "chat-day"],
                                  ["capacity", "llama3-8b-chat"]])
def test_every_command_with_workers_refuses_none_before_it_starts(argv: list[str]) -> None:
    """``--workers 0`` is one line, before a dry run lists the points or a day plan starts its
    probes (plan-day ran with none; a sweep's dry run passed it and only its real run refused)."""
    line = one_line(servesim(*argv, "--workers", "0"))
    assert line == "error: --workers: must be >= 1, got 0; use 1 or more"
