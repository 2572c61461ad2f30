"""The experiment file: overrides, defaults as vLLM sets them, and errors that name the key."""

from __future__ import annotations

import pytest
from engine_helpers import experiment

from servesim.errors import ServesimError
from servesim.inputs.overrides import apply_overrides, parse_override
from servesim.topology.resolve import resolve_topology


def test_overrides_parse_values_as_yaml_and_create_sections() -> None:
    assert parse_override("deployment.tp=2") == (["deployment", "tp"], 2)
    assert parse_override("slo.ttft_s=0.5") == (["slo", "ttft_s"], 0.5)
    assert parse_override("hardware=a100-sxm-80gb") == (["hardware"], "a100-sxm-80gb")
    document = apply_overrides({"model": "x"}, ["policy.name=continuous", "workload.arrival.rate=3"])
    assert document == {"model": "x", "policy": {"name": "continuous"}, "workload": {"arrival": {"rate": 3}}}
    with pytest.raises(ServesimError, match=r"path\.to\.key=value"):
        parse_override("deployment.tp")
    with pytest.raises(ServesimError, match="is a value, not a section"):
        apply_overrides({"model": "x"}, ["model.name=y"])


def test_vllm_defaults_are_filled_in() -> None:
    """Llama-3-8B's context is 8,192 tokens: max_model_len defaults to it, and the step budget to
    max(max_model_len, 2048) as vLLM does without chunked prefill; the KV pool in 16-token blocks
    is the memory plan's 449,661 tokens rounded down to whole blocks."""
    deployment = resolve_topology(experiment()).kv_group
    limits = deployment.limits
    assert limits.max_model_len == 8192
    assert limits.max_num_batched_tokens == 8192
    assert limits.num_blocks == deployment.memory.kv_token_capacity // 16
    assert limits.watermark_blocks == int(0.01 * limits.num_blocks)


def test_max_model_len_cannot_exceed_the_models_context() -> None:
    with pytest.raises(ServesimError, match=r"deployment\.max_model_len: 9000 exceeds llama-3-8b's context"):
        resolve_topology(experiment({"max_model_len": 9000}))
