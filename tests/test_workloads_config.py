"""The workload: section of an experiment YAML -> WorkloadConfig -> build_workload."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from servesim.errors import ServesimError
from servesim.workloads import RequestTable, WorkloadConfig, build_workload, parse_workload_config


def config(text: str) -> WorkloadConfig:
    return parse_workload_config(yaml.safe_load(text)["workload"])


PRESET_YAML = """
workload:
  arrival: {process: poisson, rate: 8.0}
  num_requests: 2000
  lengths: {preset: azure-conversation}
"""

GAMMA_YAML = """
workload:
  arrival: {process: gamma, rate: 4.0, burstiness: 0.5}
  num_requests: 1000
  prompt: {dist: lognormal, median: 600, sigma: 0.9, min: 4, max: 4096}
  output: {dist: fixed, value: 128}
"""


def test_generator_with_preset() -> None:
    table = build_workload(config(PRESET_YAML), seed=0)
    assert isinstance(table, RequestTable) and len(table) == 2000
    assert table.mean_rate == pytest.approx(8.0, rel=6 / np.sqrt(2000))  # CLT on 2000 gaps
    assert "azure-conversation" in table.source and "seed 0" in table.source
    assert "2000 requests" in table.describe()


def test_generator_with_distributions() -> None:
    table = build_workload(config(GAMMA_YAML), seed=3)
    assert len(table) == 1000 and np.all(table.output_tokens == 128)
    assert table.prompt_tokens.min() >= 4 and table.prompt_tokens.max() <= 4096


def test_duration_only_generator() -> None:
    cfg = parse_workload_config({"arrival": {"process": "constant", "rate": 2.0}, "duration_s": 10,
                                 "prompt": {"dist": "uniform", "low": 5, "high": 6},
                                 "output": {"dist": "fixed", "value": 1}})
    table = build_workload(cfg, seed=0)
    np.testing.assert_allclose(table.arrival_s, np.arange(1, 20) / 2)


def test_same_seed_same_table_and_different_seed_differs() -> None:
    cfg = config(GAMMA_YAML)
    a, b, c = build_workload(cfg, 7), build_workload(cfg, 7), build_workload(cfg, 8)
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


def test_changing_lengths_keeps_the_arrivals() -> None:
    """Independent random streams: only the changed knob changes."""
    data = yaml.safe_load(GAMMA_YAML)["workload"]
    base = parse_workload_config(data)
    other = parse_workload_config({**data, "output": {"dist": "uniform", "low": 1, "high": 9}})
    a, b = build_workload(base, 1), build_workload(other, 1)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)


def write_trace(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "t.csv"
    rows = "".join(f"{i * 0.5},{100 + i},{10 + i}\n" for i in range(20))
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return path


def test_trace_replay_resolves_relative_paths_against_base_dir(tmp_path: Path) -> None:
    write_trace(tmp_path / "traces")
    cfg = config("""
workload:
  trace: {path: traces/t.csv, format: csv, rate_scale: 2.0, start_s: 1.0, end_s: 6.0, max_requests: 4}
""")
    table = build_workload(cfg, seed=0, base_dir=tmp_path)
    np.testing.assert_allclose(table.arrival_s, [0.0, 0.25, 0.5, 0.75])
    assert table.prompt_tokens.tolist() == [102, 103, 104, 105]
    with pytest.raises(ServesimError, match="no such trace file"):
        build_workload(cfg, seed=0, base_dir=tmp_path / "elsewhere")


def test_lengths_resampled_from_a_trace(tmp_path: Path) -> None:
    write_trace(tmp_path)
    cfg = parse_workload_config({"arrival": {"process": "poisson", "rate": 3.0}, "num_requests": 500,
                                 "lengths": {"trace": "t.csv", "format": "csv"}})
    table = build_workload(cfg, seed=0, base_dir=tmp_path)
    assert np.all(table.output_tokens == table.prompt_tokens - 90)  # joint pairs kept
    assert set(table.prompt_tokens.tolist()) <= set(range(100, 120))
    override = parse_workload_config({**cfg.model_dump(exclude_none=True),
                                      "output": {"dist": "fixed", "value": 3}})
    assert np.all(build_workload(override, 0, tmp_path).output_tokens == 3)


@pytest.mark.parametrize(("data", "expected"), [
    ({"arrival": {"process": "poisson", "rat": 8.0}, "num_requests": 3},
     "workload.arrival.rat: unknown key; remove it or use one of: process, rate, burstiness"),
    ({"arrivals": {"process": "poisson", "rate": 8.0}},
     "workload.arrivals: unknown key; remove it or use one of: trace, arrival, num_requests"),
    ({"arrival": {"process": "poisson", "rate": 1}, "num_requests": 3, "prompt": {"dist": "fixed", "value": 3,
                                                                                 "mean": 2}},
     "workload.prompt.mean: unknown key; remove it or use one of: dist, value"),
    ({"arrival": {"process": "poison", "rate": 8.0}, "num_requests": 3, "lengths": {"preset": "sharegpt"}},
     "workload.arrival.process: Input should be 'poisson', 'gamma', 'constant' or 'closed'"),
    ({"arrival": {"process": "poisson", "rate": 8.0}, "num_requests": 3, "lengths": {"preset": "azure"}},
     "workload.lengths: unknown preset 'azure'; use one of azure-conversation, azure-code"),
    ({"arrival": {"process": "poisson", "rate": 8.0}, "num_requests": 3, "prompt": {"value": 3},
      "output": {"dist": "fixed", "value": 1}}, "workload.prompt: needs dist; use dist: one of fixed"),
    ({"arrival": {"process": "poisson", "rate": 8.0}, "lengths": {"preset": "sharegpt"}},
     "workload: a generated workload needs num_requests, duration_s, or both"),
    ({"arrival": {"process": "poisson", "rate": 8.0}, "num_requests": 3,
      "prompt": {"dist": "fixed", "value": 3}}, "workload: no output lengths"),
    ({"arrival": {"process": "poisson", "rate": 2.0, "burstiness": 0.5}, "num_requests": 3,
      "lengths": {"preset": "sharegpt"}}, "workload.arrival: burstiness applies to process gamma only"),
    ({"trace": {"path": "x.csv", "format": "sharegpt"}},
     "workload.trace: format sharegpt holds lengths only"),
    ({"trace": {"path": "x.csv", "format": "csv"}, "num_requests": 5},
     "workload: trace replays its own arrivals and lengths; remove num_requests"),
    ({"trace": {"path": "x.csv", "format": "parquet"}},
     "workload.trace.format: Input should be 'csv', 'azure'"),
    ({"trace": {"path": "x.csv", "format": "csv", "start_s": 5, "end_s": 1}}, "workload.trace: end_s (1.0)"),
    ({"arrival": {"process": "poisson", "rate": 8.0}, "num_requests": 3,
      "lengths": {"trace": "x.csv"}}, "workload.lengths: trace needs its format"),
    ({"arrival": {"process": "poisson", "rate": 0}, "num_requests": 3, "lengths": {"preset": "sharegpt"}},
     "workload.arrival.rate: Input should be greater than 0"),
    ({}, "workload: give either trace"),
])
def test_validation_errors_name_the_key(data: dict, expected: str) -> None:
    with pytest.raises(ServesimError) as info:
        parse_workload_config(data)
    assert str(info.value).startswith(expected), str(info.value)
    assert "\n" not in str(info.value)


def test_model_forbids_extra_keys_directly() -> None:
    with pytest.raises(ValidationError, match="extra"):
        WorkloadConfig.model_validate({"trace": {"path": "a", "format": "csv"}, "seed": 1})
