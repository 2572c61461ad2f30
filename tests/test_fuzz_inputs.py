"""Property-based fuzzing of every schema and reader (issue #17): hypothesis mutates valid
experiments, sweeps, capacity files, ``--set`` overrides, Hugging Face configs, hardware
profiles, traces and run folders with hostile values (non-finite, absurd, wrongly typed, not
UTF-8, aliased, nested), and every case must be GOOD (see ``fuzz_corpus.py``): it works with a
finite result, or it is one error line naming the field and the fix, within a CPU-time limit.

The cases are written to ``$SERVESIM_FUZZ_CORPUS`` (else a temporary folder) with their verdicts
in ``index.jsonl``; ``SERVESIM_FUZZ_EXAMPLES`` raises the number of examples per schema (a
deterministic 30 by default, which keeps the suite fast).
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzz_corpus import Corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.capacity.config import load_capacity_document, validate_capacity
from servesim.capacity.plan import decode_limits_only
from servesim.config import load_experiment
from servesim.hardware_io import load_hardware, profile_to_yaml
from servesim.model_config import load_model
from servesim.pipeline import prepare, render, simulate
from servesim.report.run_data import load_run
from servesim.resources import configs_dir, model_configs_dir
from servesim.sweep import load_sweep, plan_sweep
from servesim.workloads.traces import read_trace

EXAMPLES = int(os.environ.get("SERVESIM_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
pytestmark = pytest.mark.timeout(600)

# ---------------------------------------------------------------------- hostile values
NUMBERS = [0, -1, 1, 2, 7, 8.5, 0.5, 1e-300, 1e300, 2**31, 2**63, 10**30, math.inf, -math.inf, math.nan]
OTHERS = [None, True, False, "", "x", "false", "8", "1e3", "../../x", "caf\u00e9", [], [1, 2], {}, {"a": 1},
          [[[[[[1]]]]]]]
HOSTILE = st.sampled_from(NUMBERS + OTHERS)
LATIN1 = b"caf\xe9"
BOMB = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "lol"] * 9) + "]\n" for i in range(9))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    folder = Path(os.environ.get("SERVESIM_FUZZ_CORPUS") or tmp_path_factory.mktemp("fuzz-corpus"))
    folder.mkdir(parents=True, exist_ok=True)
    return Corpus(folder)


def good(verdict: str) -> None:
    assert verdict.startswith("GOOD"), verdict


def leaves(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in a nested document (mappings and lists)."""
    paths = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            paths += leaves(value, (*prefix, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            paths += leaves(value, (*prefix, i))
    return paths


def mutate(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    changed = copy.deepcopy(document)
    node = changed
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return changed


def dump(document: Any) -> str:
    """YAML text of a document whose floats may be .inf/.nan (as a user would write them)."""
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


# ---------------------------------------------------------------------- running a case
SMALL_RUN = 200
"""Experiments with at most this many requests and 64 replicas are simulated too (bigger ones are
judged on validation and planning alone, to keep each case well inside its time limit)."""


def run_experiment(path: Path) -> Any:
    plan = prepare(load_experiment(path), base_dir=path.parent)
    replicas = sum(g.replicas for g in plan.topology.groups)
    if len(plan.workload) > SMALL_RUN or replicas > 64 or plan.workload.duration_s > 1e6:
        return None
    result = simulate(plan)
    summary = result.summary.to_dict()
    json.dumps(summary, allow_nan=False)
    return summary


QUICKSTART = yaml.safe_load((configs_dir() / "quickstart.yaml").read_text())
EXPERIMENT = {**QUICKSTART, "workload": {**QUICKSTART["workload"], "num_requests": 30}}
EXPERIMENT_PATHS = [*leaves(EXPERIMENT), ("deployment", "replicas"), ("deployment", "block_size"),
                    ("deployment", "max_model_len"), ("deployment", "num_gpu_blocks"),
                    ("deployment", "watermark"), ("slo", "e2e_s"), ("workload", "duration_s"),
                    ("workload", "arrival", "burstiness"), ("engine",), ("router",), ("output",),
                    ("precision", "group_size"), ("policy", "order"), ("workload", "shared_prefix"),
                    ("workload", "priority")]


@FUZZ
@given(path=st.sampled_from(EXPERIMENT_PATHS), value=HOSTILE)
def test_fuzz_experiment_values(corpus: Corpus, path: tuple[str, ...], value: Any) -> None:
    if path[-1] == "burstiness":
        document = mutate(mutate(EXPERIMENT, ("workload", "arrival", "process"), "gamma"), path, value)
    else:
        document = mutate(EXPERIMENT, path, value)
    good(corpus.judge("experiment", dump(document), ".yaml", run_experiment))


@FUZZ
@given(data=st.data())
def test_fuzz_experiment_text(corpus: Corpus, data: st.DataObject) -> None:
    """Damage at the text level: bytes that are not UTF-8, aliases, duplicated or cut lines,
    deep nesting."""
    text = dump(EXPERIMENT)
    lines = text.splitlines(keepends=True)
    how = data.draw(st.sampled_from(["latin1", "bomb", "duplicate", "cut", "deep", "flip", "knob"]))
    at = data.draw(st.integers(0, len(lines) - 1))
    if how == "latin1":
        payload = text.encode()[: at * 7] + LATIN1 + text.encode()[at * 7:]
    elif how == "bomb":
        payload = (BOMB + text.replace("name: continuous", "name: continuous\n  knob: *l8")).encode()
    elif how == "duplicate":
        payload = "".join(lines[: at + 1] + lines[at:]).encode()
    elif how == "cut":
        payload = text.encode()[: data.draw(st.integers(0, len(text)))]
    elif how == "deep":
        depth = data.draw(st.sampled_from([10, 65, 500, 30_000]))
        payload = (text + "extra: " + "[" * depth + "]" * depth + "\n").encode()
    elif how == "knob":
        payload = text.replace("name: continuous", "name: continuous\n  x: " + json.dumps(
            data.draw(st.sampled_from([1e308, "2023-13-45", "9" * 5000, "!!binary zz"])))).encode()
    else:
        raw = bytearray(text.encode())
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        payload = bytes(raw)
    good(corpus.judge("experiment-text", payload, ".yaml", run_experiment))


OVERRIDE_KEYS = ["deployment.tp", "deployment.replicas", "workload.arrival.rate", "slo.ttft_s", "seed",
                 "name", "policy.name", "precision.weights", "workload.num_requests", "hardware", "model",
                 "deployment", "workload.arrival", "a..b", "=", "policy.order"]


@FUZZ
@given(key=st.sampled_from(OVERRIDE_KEYS), value=st.sampled_from(
    [".inf", ".nan", "-1", "1e-300", "&a [*a]", "[", "yes", "../x", "{a: 1}", "", "2", "h100", "llama"]))
def test_fuzz_set_overrides(corpus: Corpus, key: str, value: str) -> None:
    override = f"{key}={value}"

    def call(path: Path) -> Any:
        plan = prepare(load_experiment(configs_dir() / "quickstart.yaml", [override,
                                                                           "workload.num_requests=30"]))
        return {"requests": len(plan.workload)}

    good(corpus.judge("set", override, ".txt", call))


# ---------------------------------------------------------------------- Hugging Face configs
MODELS = {name: json.loads((model_configs_dir() / f"{name}.json").read_text())
          for name in ("llama-3-8b", "mixtral-8x7b", "deepseek-v3", "mistral-7b", "qwen2.5-72b")}
MODEL_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "max_position_embeddings", "sliding_window",
              "use_sliding_window", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
              "n_shared_experts", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
              "first_k_dense_replace", "moe_layer_freq", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
              "v_head_dim", "tie_word_embeddings", "attention_bias", "_servesim", "model_type"]


def use_model(path: Path) -> Any:
    model = load_model(path)
    return {**model.summary(), "weights": model.weight_bytes("bf16"), "flops": model.flops_per_token(100)}


@FUZZ
@given(name=st.sampled_from(sorted(MODELS)), key=st.sampled_from(MODEL_KEYS), value=HOSTILE,
       encoding=st.sampled_from(["json", "json", "json", "latin1", "nan-literal"]))
def test_fuzz_hugging_face_configs(corpus: Corpus, name: str, key: str, value: Any, encoding: str) -> None:
    document = {**MODELS[name], key: value}
    text = json.dumps(document)  # writes Infinity / NaN for non-finite floats, as some tools do
    payload = text.encode()
    if encoding == "latin1":
        payload = payload.replace(b'"model_type"', b'"model_typ' + LATIN1 + b'"')
    elif encoding == "nan-literal":
        payload = text.replace('"vocab_size": ', '"vocab_size": NaN, "x": ').encode()
    good(corpus.judge("config.json", payload, ".json", use_model))


# ---------------------------------------------------------------------- hardware profiles
PROFILE = yaml.safe_load(profile_to_yaml(load_hardware("h100-sxm-80gb")))
PROFILE_PATHS = [p for p in leaves(PROFILE) if p[0] not in ("provenance",)]


@FUZZ
@given(path=st.sampled_from(PROFILE_PATHS), value=HOSTILE)
def test_fuzz_hardware_profiles(corpus: Corpus, path: tuple[Any, ...], value: Any) -> None:
    text = dump(mutate(PROFILE, path, value))

    def call(file: Path) -> Any:
        experiment = file.with_suffix(".experiment.yaml")
        experiment.write_text(dump({**EXPERIMENT, "hardware": str(file)}))
        return run_experiment(experiment)

    good(corpus.judge("hardware", text, ".yaml", call))


# ---------------------------------------------------------------------- traces
CELLS = st.sampled_from(["0", "1", "5", "-3", "2.5", "1e300", "inf", "nan", "", "x", "true", "1e30",
                         "9" * 30, "caf\u00e9"])


@FUZZ
@given(rows=st.lists(st.tuples(CELLS, CELLS, CELLS), min_size=0, max_size=6),
       fmt=st.sampled_from(["csv", "csv", "mooncake", "azure", "burstgpt"]), latin1=st.booleans())
def test_fuzz_traces(corpus: Corpus, rows: list[tuple[str, str, str]], fmt: str, latin1: bool) -> None:
    if fmt == "mooncake":
        lines = [f'{{"timestamp": {a or 0}, "input_length": {b or 1}, "output_length": {c or 1}, '
                 f'"hash_ids": [{b}]}}' for a, b, c in rows]
        text = "\n".join(lines) + "\n"
    else:
        header = {"csv": "arrival_s,prompt_tokens,output_tokens", "azure": "TIMESTAMP,ContextTokens,"
                  "GeneratedTokens", "burstgpt": "Timestamp,Model,Request tokens,Response tokens,"
                  "Total tokens,Log Type"}[fmt]
        body = [",".join(r) if fmt != "burstgpt" else f"{r[0]},GPT-4,{r[1]},{r[2]},0,x" for r in rows]
        text = header + "\n" + "\n".join(body) + "\n"
    payload = text.encode() + (LATIN1 if latin1 else b"")

    def call(path: Path) -> Any:
        table = read_trace(path, fmt)
        return {"n": len(table), "last": float(table.arrival_s[-1]) if len(table) else 0.0}

    good(corpus.judge(f"trace-{fmt}", payload, ".jsonl" if fmt == "mooncake" else ".csv", call))


# ---------------------------------------------------------------------- sweeps and capacity
SWEEP = {"name": "fuzz", "base": "quickstart", "set": {"workload.num_requests": 30},
         "grid": {"workload.arrival.rate": [4.0, 8.0]}, "replications": 2,
         "random": {"n": 2, "seed": 0, "axes": {"deployment.max_num_seqs": {"randint": [64, 256]}}}}
SWEEP_PATHS = [*leaves(SWEEP), ("zip",), ("output",), ("grid", "deployment.tp"), ("grid", "seed"),
               ("random", "axes", "workload.arrival.rate")]


@FUZZ
@given(path=st.sampled_from(SWEEP_PATHS), value=HOSTILE | st.sampled_from(
    [{"uniform": [1, math.inf]}, {"loguniform": [0, 1]}, {"randint": [0, 1e300]}, 10**9, [math.inf]]))
def test_fuzz_sweep_files(corpus: Corpus, path: tuple[Any, ...], value: Any) -> None:
    text = dump(mutate(SWEEP, path, value))

    def call(file: Path) -> Any:
        plan = plan_sweep(load_sweep(file))
        return {"points": len(plan.points), "runs": len(plan.runs)}

    good(corpus.judge("sweep", text, ".yaml", call))


CAPACITY = yaml.safe_load((configs_dir() / "capacity" / "llama3-8b-chat.yaml").read_text())
CAPACITY_PATHS = [*leaves(CAPACITY), ("decode_context",), ("target_rate",), ("prices",), ("name",)]


@FUZZ
@given(path=st.sampled_from(CAPACITY_PATHS), value=HOSTILE)
def test_fuzz_capacity_files(corpus: Corpus, path: tuple[Any, ...], value: Any) -> None:
    text = dump(mutate(CAPACITY, path, value))

    def call(file: Path) -> Any:
        config = validate_capacity(load_capacity_document(file))
        records = decode_limits_only(config, file.parent)
        return [r.get("decode_batch_limits", {}).get("largest_batch", 0) for r in records]

    good(corpus.judge("capacity", text, ".yaml", call))


# ---------------------------------------------------------------------- report inputs
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("report-run")
    path = folder / "x.yaml"
    path.write_text(dump(EXPERIMENT))
    render(simulate(prepare(load_experiment(path))), folder / "run", report=False)
    return folder / "run"


@FUZZ
@given(name=st.sampled_from(["summary.json", "steps.parquet", "requests.parquet", "itl.parquet",
                             "config.resolved.yaml"]),
       damage=st.sampled_from(["truncate", "latin1", "empty", "nan", "bomb", "flip"]),
       at=st.integers(0, 10_000))
def test_fuzz_report_inputs(corpus: Corpus, finished_run: Path, name: str, damage: str, at: int) -> None:
    original = (finished_run / name).read_bytes()
    if damage == "truncate":
        payload = original[: at % max(1, len(original))]
    elif damage == "latin1":
        payload = original[:40] + LATIN1 + original[40:]
    elif damage == "empty":
        payload = b""
    elif damage == "nan":
        payload = b'{"ttft_s": NaN}' if name.endswith(".json") else original[::-1]
    elif damage == "bomb":
        payload = BOMB.encode() + b"hardware: *l8\n"
    else:
        raw = bytearray(original)
        raw[at % len(raw)] ^= 0xFF
        payload = bytes(raw)

    def call(path: Path) -> Any:
        run_dir = path.parent / f"run-{path.stem}"
        run_dir.mkdir(exist_ok=True)
        for other in finished_run.iterdir():
            (run_dir / other.name).write_bytes(other.read_bytes())
        (run_dir / name).write_bytes(payload)
        data = load_run(run_dir)
        from servesim.report.run_report import render_run_report

        return {"html": len(render_run_report(data))}

    good(corpus.judge("report", payload, ".bin", call))
