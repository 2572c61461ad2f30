"""The datasets users benchmark with: raw ShareGPT JSON as vLLM's benchmark reads it, vLLM's
random dataset, the Azure 2024 trace format, and the renamed Vidur/Sarathi length statistics."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from servesim.errors import ServesimError
from servesim.workloads import build_workload, parse_workload_config, read_lengths, read_trace
from servesim.workloads.sharegpt import read_conversations


def words(tokens: int) -> str:
    """Text the estimate counts as ``tokens`` tokens (4 characters each)."""
    return "abcd" * tokens


def conversation(*turns: tuple[int, int]) -> dict:
    messages = []
    for user, answer in turns:
        messages += [{"from": "human", "value": words(user)}, {"from": "gpt", "value": words(answer)}]
    return {"id": "x", "conversations": messages}


@pytest.fixture
def sharegpt(tmp_path: Path) -> Path:
    data = [
        conversation((10, 20), (5, 7)),           # kept: first turn 10 -> 20
        conversation((3, 50)),                    # prompt under 4 tokens: pruned
        conversation((50, 3)),                    # answer under 4 tokens: pruned
        conversation((1025, 10)),                 # prompt over 1024: pruned
        conversation((1000, 1049)),               # 2049 in all: pruned
        conversation((1000, 1048), (1, 1)),       # 2048 exactly: kept
        {"id": "y", "conversations": [{"from": "human", "value": "hi"}]},   # one message: skipped
        {"id": "z"},                              # no conversations: skipped
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_first_turns_as_vllm_bench_reads_them(sharegpt: Path) -> None:
    sample = read_lengths(sharegpt, "sharegpt")
    assert sample.prompt_tokens.tolist() == [10, 1000] and sample.output_tokens.tolist() == [20, 1048]
    assert "ceil(characters / 4)" in sample.source and "2 kept by vLLM's filter" in sample.source


def test_sharegpt_conversations_keep_every_turn(sharegpt: Path) -> None:
    conversations = read_conversations(sharegpt)
    assert len(conversations) == 6 and conversations.turns.tolist() == [2, 1, 1, 1, 1, 2]
    assert conversations.user_tokens[:2].tolist() == [10, 5]
    assert conversations.output_tokens[:2].tolist() == [20, 7]
    assert "skipped 2 entries" in conversations.source


def test_sharegpt_with_a_local_tokenizer(sharegpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokenizer counts real tokens (here a fake one: one token per character plus BOS, so the
    first three conversations pass the filter: 41 -> 81, 13 -> 201, 201 -> 13)."""

    class Fake:
        @classmethod
        def from_pretrained(cls, name: str, local_files_only: bool) -> Fake:
            assert local_files_only
            return cls()

        def __call__(self, texts: list[str]) -> types.SimpleNamespace:
            return types.SimpleNamespace(input_ids=[[1] * (len(t) + 1) for t in texts])

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=Fake))
    sample = read_lengths(sharegpt, "sharegpt", tokenizer="my/llama")
    assert sample.prompt_tokens.tolist() == [41, 13, 201] and sample.output_tokens.tolist() == [81, 201, 13]
    assert "from the my/llama tokenizer" in sample.source


def test_sharegpt_tokenizer_needs_transformers(sharegpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ServesimError, match="needs the transformers package") as info:
        read_lengths(sharegpt, "sharegpt", tokenizer="my/llama")
    assert "\n" not in str(info.value)


def test_stats_file_under_the_old_sharegpt_name_says_how_to_migrate(tmp_path: Path) -> None:
    stats = tmp_path / "stats.csv"
    stats.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n74,918,992,0.08\n")
    with pytest.raises(ServesimError, match="use format: vidur-stats") as info:
        read_lengths(stats, "sharegpt")
    assert "Vidur/Sarathi length statistics" in str(info.value)
    assert read_lengths(stats, "vidur-stats").prompt_tokens.tolist() == [74]


def test_sharegpt_json_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"conversations": [')
    with pytest.raises(ServesimError, match="not valid JSON"):
        read_lengths(bad, "sharegpt")
    bad.write_text('[{"conversations": [{"from": "human"}, {"from": "gpt", "value": "x"}]}]')
    with pytest.raises(ServesimError, match="message 0 of entry 0"):
        read_lengths(bad, "sharegpt")


def test_vllm_random_dataset_bounds() -> None:
    """input_len 100, output_len 20, range_ratio 0.25: prompts uniform on 75..125 after a 16-token
    prefix shared by all, outputs on 15..25, both ends reached, means at the middle."""
    workload = parse_workload_config({
        "arrival": {"process": "poisson", "rate": 10}, "num_requests": 20_000,
        "lengths": {"random": {"input_len": 100, "output_len": 20, "range_ratio": 0.25, "prefix_len": 16}}})
    table = build_workload(workload, 0)
    assert (table.prompt_tokens.min(), table.prompt_tokens.max()) == (16 + 75, 16 + 125)
    assert (table.output_tokens.min(), table.output_tokens.max()) == (15, 25)
    assert table.prompt_tokens.mean() == pytest.approx(116, abs=0.5)
    assert table.prefix_block_size == 16 and np.all(table.prefix_block_ids == 0)
    fixed = build_workload(parse_workload_config({
        "arrival": {"process": "poisson", "rate": 10}, "num_requests": 5, "lengths": {"random": {}}}), 0)
    assert fixed.prompt_tokens.tolist() == [1024] * 5 and fixed.output_tokens.tolist() == [128] * 5


def test_azure_2024_format(tmp_path: Path) -> None:
    """The 2024 week-long traces write ISO 8601 times with a UTC offset and 6 or no fractional
    digits; both read, as seconds from the earliest row."""
    path = tmp_path / "AzureLLMInferenceTrace_conv_1week.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2024-05-12 00:00:00.001163+00:00,1452,3\n"
                    "2024-05-12 00:00:01+00:00,584,3\n"
                    "2024-05-13 00:00:00.248279+00:00,617,104\n")
    table = read_trace(path, "azure")
    assert table.arrival_s.tolist() == pytest.approx([0.0, 1 - 0.001163, 86_400.248279 - 0.001163])
    day = read_trace(path, "azure", start_s=80_000)
    assert len(day) == 1


def test_sessions_resample_sharegpt_conversations(sharegpt: Path) -> None:
    workload = parse_workload_config({
        "arrival": {"process": "poisson", "rate": 1}, "sessions": {
            "count": 200, "conversations": {"path": str(sharegpt)},
            "think_time_s": {"dist": "fixed", "value": 5}}})
    table = build_workload(workload, 0)
    links = table.links
    assert links is not None and links.num_sessions == 200
    two = np.flatnonzero(links.turn == 1)
    # a two-turn conversation: (10, 20) then (5, 7) -> prompts 10 and 10 + 20 + 5
    first = [r for r in two if table.prompt_tokens[r - 1] == 10]
    assert first and all(table.prompt_tokens[r] == 35 and table.output_tokens[r] == 7 for r in first)
