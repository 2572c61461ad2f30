"""Readers and presets against the real public traces in ../shared/data (skipped when absent)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from servesim.workloads import read_lengths, read_trace
from servesim.workloads.presets import PRESETS, fit_lognormal

TRACES = {  # file: (format, rows in the file == rows kept: none of these has a 0-length row)
    "azure2023_AzureLLMInferenceTrace_code.csv": ("azure", 8_819),
    "azure2023_AzureLLMInferenceTrace_conv.csv": ("azure", 19_366),
    "mooncake_conversation_trace.jsonl": ("mooncake", 12_031),
    "mooncake_synthetic_trace.jsonl": ("mooncake", 3_993),
    "sharegpt_8k_filtered_stats_llama2_tokenizer.csv": ("vidur-stats", 30_731),
    "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv": ("arxiv", 28_257),
}


@pytest.fixture(scope="module")
def traces(shared_data: Path) -> Path:
    return shared_data / "traces"


@pytest.mark.parametrize("name", sorted(TRACES))
def test_row_counts_and_load_time(traces: Path, name: str) -> None:
    fmt, rows = TRACES[name]
    start = time.perf_counter()
    sample = read_lengths(traces / name, fmt)
    elapsed = time.perf_counter() - start
    assert len(sample) == rows and "dropped" not in sample.source
    assert elapsed < 1.0  # ~5-60 ms measured
    if fmt not in ("vidur-stats", "arxiv"):
        table = read_trace(traces / name, fmt)
        assert len(table) == rows and table.arrival_s[0] == 0.0
        assert "sorted" not in table.source  # all four are already in arrival order


def test_azure_conversation_means_and_span(traces: Path) -> None:
    table = read_trace(traces / "azure2023_AzureLLMInferenceTrace_conv.csv", "azure")
    assert table.prompt_tokens.mean() == pytest.approx(1155, abs=1)
    assert table.output_tokens.mean() == pytest.approx(211, abs=1)
    assert table.duration_s == pytest.approx(3501.721937, abs=1e-6)  # 18:15:46.68059 -> 19:14:08.402527
    assert table.mean_rate == pytest.approx(5.53, abs=0.01)


def test_azure_code_means(traces: Path) -> None:
    table = read_trace(traces / "azure2023_AzureLLMInferenceTrace_code.csv", "azure")
    assert table.prompt_tokens.mean() == pytest.approx(2048, abs=1)
    assert table.output_tokens.mean() == pytest.approx(28, abs=0.5)


@pytest.mark.parametrize(("name", "fraction"), [("mooncake_conversation_trace.jsonl", 0.3664),
                                                ("mooncake_synthetic_trace.jsonl", 0.6396)])
def test_mooncake_repeated_block_fraction(traces: Path, name: str, fraction: float) -> None:
    """Repeated-block fraction = 1 - unique ids / total ids (README: 36.6% and 64%)."""
    table = read_trace(traces / name, "mooncake")
    assert table.prefix_block_ids is not None and table.prefix_block_offsets is not None
    ids = table.prefix_block_ids
    assert 1 - np.unique(ids).size / ids.size == pytest.approx(fraction, abs=5e-5)
    blocks = np.diff(table.prefix_block_offsets)
    np.testing.assert_array_equal(blocks, -(-table.prompt_tokens // 512))  # one id per 512 tokens


def test_mooncake_window_and_rate_scale(traces: Path) -> None:
    path = traces / "mooncake_conversation_trace.jsonl"
    full = read_trace(path, "mooncake")
    part = read_trace(path, "mooncake", start_s=600, end_s=1200, rate_scale=2.0, max_requests=500)
    inside = full.arrival_s[(full.arrival_s >= 600) & (full.arrival_s < 1200)][:500]
    np.testing.assert_allclose(part.arrival_s, (inside - 600) / 2)
    first = int(np.searchsorted(full.arrival_s, 600))
    np.testing.assert_array_equal(part.prefix_blocks(0), full.prefix_blocks(first))


@pytest.mark.parametrize(("preset", "name"), [
    ("azure-conversation", "azure2023_AzureLLMInferenceTrace_conv.csv"),
    ("azure-code", "azure2023_AzureLLMInferenceTrace_code.csv"),
    ("sharegpt", "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
])
def test_presets_are_the_fit_of_their_trace(traces: Path, preset: str, name: str) -> None:
    sample = read_lengths(traces / name, TRACES[name][0])
    fitted = PRESETS[preset]
    rng = np.random.default_rng(0)
    for values, fit in ((sample.prompt_tokens, fitted.prompt), (sample.output_tokens, fitted.output)):
        refit = fit_lognormal(values)
        assert (refit.median, refit.min, refit.max) == (fit.median, fit.min, fit.max)
        assert refit.sigma == pytest.approx(fit.sigma, abs=1e-4)
        assert fit.sample(400_000, rng).mean() == pytest.approx(values.mean(), rel=0.02)
