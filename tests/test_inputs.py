"""The one input layer: any defect in a file a user hands servesim is one line naming the file, the
place and the fix (exit 2 from the CLI), and every schema words an unknown key the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_cli import servesim

from servesim.config import load_experiment
from servesim.errors import ServesimError
from servesim.hardware_io import load_hardware, profile_to_yaml
from servesim.inputs import read_json, read_text, read_yaml
from servesim.model_config import load_model
from servesim.resources import configs_dir

QUICKSTART = (configs_dir() / "quickstart.yaml").read_text()


def one_line(run: object) -> str:
    assert run.returncode == 2, (run.stdout, run.stderr)  # type: ignore[attr-defined]
    lines = run.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in run.stderr  # type: ignore[attr-defined]
    return lines[0]


def test_a_latin1_byte_in_an_experiment_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(QUICKSTART.replace("name: quickstart", "name: caf\u00e9").encode("latin-1"))
    line = one_line(servesim("validate", str(path)))
    assert f"{path} is not UTF-8 text (byte 0xe9 at line " in line and "save it as UTF-8" in line


def test_binary_and_missing_files(tmp_path: Path) -> None:
    blob = tmp_path / "profile.yaml"
    blob.write_bytes(bytes(range(256)))
    with pytest.raises(ServesimError, match=r"is not UTF-8 text \(byte 0x80 at line 2\)"):
        load_hardware(blob)
    with pytest.raises(ServesimError, match=r"^x: .*nothing\.json not found; check the path"):
        read_json(tmp_path / "nothing.json", "x")
    with pytest.raises(ServesimError, match=r"is a folder, not a file"):
        read_text(tmp_path, "x")
    config = tmp_path / "config.json"
    config.write_bytes(b'{"hidden_size": 4096, "name": "\xff"}')
    with pytest.raises(ServesimError, match=r"^--model: .*config\.json is not UTF-8"):
        load_model(config, "--model")


def test_syntax_errors_name_the_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nmodel: [llama\nhardware: h100\n")
    with pytest.raises(ServesimError) as error:
        load_experiment(path)
    assert f"{path}: malformed YAML at line " in str(error.value) and "at column " in str(error.value)
    bad_json = tmp_path / "config.json"
    bad_json.write_text('{"hidden_size": 4096,\n "layers": }')
    with pytest.raises(ServesimError, match=r"is not valid JSON \(line 2, column 12: Expecting value\)"):
        load_model(bad_json)


def test_documents_nested_beyond_the_parser_are_one_line(tmp_path: Path) -> None:
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("policy: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ServesimError, match=r"nested too deeply to read; flatten the document"):
        read_yaml(deep_yaml, "config")
    deep_json = tmp_path / "config.json"
    deep_json.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ServesimError, match=r"JSON nested too deeply to read"):
        load_model(deep_json)


def test_every_schema_words_an_unknown_key_alike(tmp_path: Path) -> None:
    """Experiment, workload, policy knobs, engine knobs, deployment groups, hardware profiles,
    sweeps and capacity files all go through one converter."""
    cases = {
        "deployment.tpp": {"deployment": {"tpp": 2}},
        "workload.arrival.rat": {"workload": {"arrival": {"process": "poisson", "rat": 2},
                                              "num_requests": 5, "lengths": {"preset": "sharegpt"}}},
        "policy.chunk": {"policy": {"name": "continuous", "chunk": 2}},
        "engine.speed": {"engine": {"name": "vllm-v0", "speed": 2}},
        "deployment.decode.rplicas": {"deployment": {"kind": "disaggregated", "decode": {"rplicas": 2}}},
    }
    base = yaml.safe_load(QUICKSTART)
    for field, change in cases.items():
        path = tmp_path / f"{field}.yaml"
        path.write_text(yaml.safe_dump({**base, **change}))
        line = one_line(servesim("validate", str(path)))
        assert line.startswith(f"error: {field}: unknown key; remove it or use one of: "), line
    profile = yaml.safe_load(profile_to_yaml(load_hardware("l40s")))
    profile["memory"]["bandwidht_Bps"] = 1
    path = tmp_path / "l40s.yaml"
    path.write_text(yaml.safe_dump(profile))
    with pytest.raises(ServesimError, match=r"l40s\.yaml: memory\.bandwidht_Bps: unknown key; remove it or "
                       r"use one of: capacity_bytes, bandwidth_Bps, reserved_bytes"):
        load_hardware(path)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(json.dumps({"base": "quickstart", "grdi": {}}))
    line = one_line(servesim("sweep", str(sweep), "--out", str(tmp_path / "out")))
    assert line.startswith("error: grdi: unknown key; remove it or use one of: name, base, set, grid"), line
