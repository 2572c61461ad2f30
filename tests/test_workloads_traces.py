"""Trace readers on small files written here, in each format exactly as published."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servesim.errors import ServesimError
from servesim.workloads import read_lengths, read_trace
from servesim.workloads.traces import TRACE_FORMATS


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000001,1,1
2023-11-16 18:16:46.6805900,2048,7
"""


def mooncake_lines() -> list[dict[str, object]]:
    return [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 2]},
        {"timestamp": 1500, "input_length": 100, "output_length": 5, "hash_ids": [3]},
        {"timestamp": 2750, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 4]},
    ]


def write_mooncake(tmp_path: Path, lines: list[dict[str, object]] | None = None) -> Path:
    rows = mooncake_lines() if lines is None else lines
    return write(tmp_path, "trace.jsonl", "".join(json.dumps(row) + "\n" for row in rows))


# --------------------------------------------------------------------------------------- formats
def test_csv_exact_values_and_priority(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,priority\n"
                 "0.0,100,10,1\n0.5,200,20,0\n2.25,300,30,-1\n")
    table = read_trace(path, "csv")
    np.testing.assert_array_equal(table.arrival_s, [0.0, 0.5, 2.25])
    np.testing.assert_array_equal(table.prompt_tokens, [100, 200, 300])
    np.testing.assert_array_equal(table.output_tokens, [10, 20, 30])
    np.testing.assert_array_equal(table.priority, [1, 0, -1])
    assert not table.has_prefixes
    assert "3 of 3 rows" in table.source


def test_csv_without_priority_defaults_to_zero(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n1.5,7,3\n")
    table = read_trace(path, "csv")
    assert table.arrival_s.tolist() == [1.5] and table.priority.tolist() == [0]


def test_azure_timestamps_with_seven_fractional_digits(tmp_path: Path) -> None:
    table = read_trace(write(tmp_path, "azure.csv", AZURE), "azure")
    np.testing.assert_allclose(table.arrival_s, [0.0, 4.314579, 4.3194101, 60.0], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(table.prompt_tokens, [374, 396, 1, 2048])
    np.testing.assert_array_equal(table.output_tokens, [44, 109, 1, 7])


def test_azure_2024_style_zoned_timestamps(tmp_path: Path) -> None:
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,2\n"
            "2024-05-10 00:00:01.509930+00:00,20,3\n")
    table = read_trace(write(tmp_path, "azure24.csv", text), "azure")
    np.testing.assert_allclose(table.arrival_s, [0.0, 1.5], atol=1e-9)


def test_mooncake_hash_ids_round_trip_through_csr(tmp_path: Path) -> None:
    table = read_trace(write_mooncake(tmp_path), "mooncake")
    rows = mooncake_lines()
    np.testing.assert_allclose(table.arrival_s, [0.0, 0.0, 1.5, 2.75])
    assert table.prefix_block_size == 512
    np.testing.assert_array_equal(table.prefix_block_offsets, [0, 2, 4, 5, 8])
    for i, row in enumerate(rows):
        assert table.prefix_blocks(i).tolist() == row["hash_ids"]
        assert table.prompt_tokens[i] == row["input_length"]
        assert table.output_tokens[i] == row["output_length"]
    # the CSR arrays stay aligned through a window
    window = read_trace(write_mooncake(tmp_path), "mooncake", start_s=1.0)
    assert window.prefix_blocks(0).tolist() == [3] and window.prefix_blocks(1).tolist() == [0, 1, 4]


BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,Conversation log
120,ChatGPT,1360,229,1589,API log
"""


def test_burstgpt_drops_failed_requests_and_reports_them(tmp_path: Path) -> None:
    table = read_trace(write(tmp_path, "burst.csv", BURSTGPT), "burstgpt")
    np.testing.assert_array_equal(table.arrival_s, [5.0, 118.0, 120.0])  # trace clock kept
    np.testing.assert_array_equal(table.prompt_tokens, [472, 417, 1360])
    np.testing.assert_array_equal(table.output_tokens, [18, 276, 229])
    assert "3 of 3 rows" in table.source
    assert "dropped 1 rows with 0 prompt or 0 output tokens (first at line 3)" in table.source


def test_burstgpt_model_filter(tmp_path: Path) -> None:
    path = write(tmp_path, "burst.csv", BURSTGPT)
    table = read_trace(path, "burstgpt", model="GPT-4")
    assert table.prompt_tokens.tolist() == [417] and "model GPT-4 only" in table.source
    with pytest.raises(ServesimError, match="ChatGPT, GPT-4"):
        read_trace(path, "burstgpt", model="Claude")
    with pytest.raises(ServesimError, match="burstgpt"):
        read_trace(write(tmp_path, "azure.csv", AZURE), "azure", model="GPT-4")


@pytest.mark.parametrize("fmt", ["vidur-stats", "arxiv"])
def test_length_stats_are_length_sources_not_traces(tmp_path: Path, fmt: str) -> None:
    path = write(tmp_path, f"{fmt}.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                 "74,918,992,0.0806100217864923\n290,905,1195,0.3204419889502762\n")
    sample = read_lengths(path, fmt)
    assert sample.prompt_tokens.tolist() == [74, 290] and sample.output_tokens.tolist() == [918, 905]
    with pytest.raises(ServesimError, match=r"lengths only.*length source"):
        read_trace(path, fmt)


def test_read_lengths_works_on_traces_with_arrivals(tmp_path: Path) -> None:
    sample = read_lengths(write_mooncake(tmp_path), "mooncake")
    assert sample.prompt_tokens.tolist() == [1000, 600, 100, 1536] and len(sample) == 4


def test_unsorted_rows_are_sorted_and_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n2,1,1\n1,2,2\n3,3,3\n1,4,4\n")
    table = read_trace(path, "csv")
    assert table.arrival_s.tolist() == [1, 1, 2, 3]
    assert table.prompt_tokens.tolist() == [2, 4, 1, 3]  # stable: ties keep file order
    assert "sorted 2 out-of-order rows" in table.source


def test_zero_prompt_rows_dropped_with_count(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,0,5\n1,3,0\n2,3,3\n")
    table = read_trace(path, "csv")
    assert len(table) == 1 and "dropped 2 rows" in table.source and "first at line 2" in table.source


# --------------------------------------------------------------------------------------- options
def make_csv(tmp_path: Path) -> Path:
    rows = "".join(f"{t},{10 + i},{1 + i}\n" for i, t in enumerate([0, 1, 2, 3, 4, 5, 6, 7]))
    return write(tmp_path, "opts.csv", "arrival_s,prompt_tokens,output_tokens\n" + rows)


def test_rate_scale_divides_arrival_times(tmp_path: Path) -> None:
    table = read_trace(make_csv(tmp_path), "csv", rate_scale=2.0)
    np.testing.assert_allclose(table.arrival_s, np.arange(8) / 2)
    assert table.mean_rate == pytest.approx(2.0)
    assert "rate x2" in table.source


def test_window_is_half_open_on_original_timeline_and_rebased(tmp_path: Path) -> None:
    table = read_trace(make_csv(tmp_path), "csv", start_s=2.5, end_s=6.0, rate_scale=2.0)
    # kept t = 3, 4, 5 (6 excluded); minus start 2.5 -> 0.5, 1.5, 2.5; then / 2
    np.testing.assert_allclose(table.arrival_s, [0.25, 0.75, 1.25])
    assert table.prompt_tokens.tolist() == [13, 14, 15]
    only_end = read_trace(make_csv(tmp_path), "csv", end_s=2.0)
    assert only_end.arrival_s.tolist() == [0.0, 1.0]  # no start_s: timeline kept


def test_max_requests_applies_after_the_window(tmp_path: Path) -> None:
    table = read_trace(make_csv(tmp_path), "csv", start_s=3.0, max_requests=2)
    assert table.arrival_s.tolist() == [0.0, 1.0] and table.prompt_tokens.tolist() == [13, 14]
    assert len(read_trace(make_csv(tmp_path), "csv", max_requests=100)) == 8


def test_empty_window_and_bad_options(tmp_path: Path) -> None:
    path = make_csv(tmp_path)
    with pytest.raises(ServesimError, match=r"holds no requests.*spans 0 to 7"):
        read_trace(path, "csv", start_s=100.0)
    with pytest.raises(ServesimError, match="end_s"):
        read_trace(path, "csv", start_s=5.0, end_s=5.0)
    with pytest.raises(ServesimError, match="rate_scale"):
        read_trace(path, "csv", rate_scale=0.0)
    with pytest.raises(ServesimError, match="max_requests"):
        read_trace(path, "csv", max_requests=0)


# ------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("body", "column", "line", "shown"), [
    ("0,10,5\n1,-3,5\n", "prompt_tokens", 3, "-3"),
    ("0,10,5\n1,10,5\n2,10,2.5\n", "output_tokens", 4, "2.5"),
    ("0,10,5\n1,ten,5\n", "prompt_tokens", 3, "'ten'"),
    ("0,10,5\n1,,5\n", "prompt_tokens", 3, "a missing value"),
    ("0,10,5\n-1,10,5\n", "arrival_s", 3, "-1"),
    ("0,10,5\n\n\nx,10,5\n", "arrival_s", 5, "'x'"),  # blank lines still counted
])
def test_bad_csv_rows_name_column_file_and_line(tmp_path: Path, body: str, column: str, line: int,
                                                shown: str) -> None:
    path = write(tmp_path, "bad.csv", "arrival_s,prompt_tokens,output_tokens\n" + body)
    with pytest.raises(ServesimError) as info:
        read_trace(path, "csv")
    message = str(info.value)
    assert message.startswith(f"{column}: {shown} at {path} line {line} ")
    assert "fix or delete that row" in message and "\n" not in message


def test_missing_column_names_it_and_the_expected_header(tmp_path: Path) -> None:
    path = write(tmp_path, "azure.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    with pytest.raises(ServesimError, match=r"^GeneratedTokens: .*missing from the header of .* line 1.*"
                       "TIMESTAMP,ContextTokens,GeneratedTokens"):
        read_trace(path, "azure")


def test_unparsable_azure_timestamp(tmp_path: Path) -> None:
    text = AZURE.replace("2023-11-16 18:15:51.0000001", "yesterday at noon")
    with pytest.raises(ServesimError,
                       match=r"^TIMESTAMP: 'yesterday at noon' at .* line 4 is not a datetime"):
        read_trace(write(tmp_path, "azure.csv", text), "azure")


def test_ragged_csv_row(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,2,3,4\n")
    with pytest.raises(ServesimError, match="line 3"):
        read_trace(path, "csv")


def test_malformed_json_line(tmp_path: Path) -> None:
    good = json.dumps(mooncake_lines()[0])
    path = write(tmp_path, "t.jsonl", f"{good}\n\n{good}\n{{\"timestamp\": 5, \"input_length\": 3,\n")
    with pytest.raises(ServesimError, match=r"malformed JSON at .*t\.jsonl line 4"):
        read_trace(path, "mooncake")


@pytest.mark.parametrize(("change", "message"), [
    ({"output_length": -1}, r"^output_length: -1 at .* line 3 is not a whole number"),
    ({"input_length": 7.5}, r"^input_length: 7\.5 at .* line 3"),
    ({"timestamp": "soon"}, r"^timestamp: 'soon' at .* line 3 is not a time"),
    ({"hash_ids": [1, "a"]}, r"^hash_ids: 'a' at .* line 3"),
    ({"hash_ids": 5}, r"^hash_ids: 5 at .* line 3 is not a list"),
])
def test_bad_mooncake_values(tmp_path: Path, change: dict[str, object], message: str) -> None:
    rows = mooncake_lines()
    rows[2] = {**rows[2], **change}
    with pytest.raises(ServesimError, match=message):
        read_trace(write_mooncake(tmp_path, rows), "mooncake")


def test_mooncake_missing_key(tmp_path: Path) -> None:
    rows = mooncake_lines()
    del rows[1]["hash_ids"]
    with pytest.raises(ServesimError, match=r"^hash_ids: missing at .* line 2"):
        read_trace(write_mooncake(tmp_path, rows), "mooncake")


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(ServesimError, match="no such trace file"):
        read_trace(tmp_path / "nope.csv", "csv")
    with pytest.raises(ServesimError) as info:
        read_trace(make_csv(tmp_path), "parquet")
    assert str(info.value) == ("format: unknown trace format 'parquet'; use one of "
                               + ", ".join(TRACE_FORMATS))


def test_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ServesimError, match="is empty"):
        read_trace(write(tmp_path, "e.csv", ""), "csv")


# ------------------------------------------------------- the plain reader against the pandas one
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def both_readers(path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """``_parse`` of one file by the plain reader and by pandas (the plain one switched off)."""
    from servesim.workloads import traces

    plain = traces._parse(path, fmt, None)
    with monkeypatch.context() as patch:
        patch.setattr(traces, "_parse_plain", lambda text, fmt: None)
        pandas = traces._parse(path, fmt, None)
    return plain, pandas


def assert_same_rows(plain: object, pandas: object) -> None:
    for name in ("lines", "prompt", "output", "arrival_s"):
        a, b = getattr(plain, name), getattr(pandas, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name  # bit for bit
    assert plain.notes == pandas.notes


@pytest.mark.parametrize(("name", "fmt"), [
    ("azure2023_AzureLLMInferenceTrace_conv.csv", "azure"),
    ("azure2023_AzureLLMInferenceTrace_code.csv", "azure"),
    ("sharegpt_8k_filtered_stats_llama2_tokenizer.csv", "vidur-stats"),
    ("arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", "arxiv"),
])
def test_plain_reader_equals_pandas_on_the_shared_traces(name: str, fmt: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared/data is not beside this checkout)")
    from servesim.inputs.files import read_text
    from servesim.workloads import traces

    assert traces._parse_plain(read_text(path, "path", 2**30), fmt) is not None  # it read it plainly
    assert_same_rows(*both_readers(path, fmt, monkeypatch))


def test_plain_reader_equals_pandas_on_generated_azure_stamps(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Random nanosecond stamps over three days, written with 0-9 fractional digits (pandas may
    parse them at another resolution), and lengths with leading zeros."""
    rng = np.random.default_rng(7)
    base = np.datetime64("2023-11-16T00:00:00", "ns")
    rows = []
    for k in range(3000):
        stamp = str(base + np.timedelta64(int(rng.integers(0, 3 * 86_400 * 10**9)), "ns"))
        digits = int(rng.integers(0, 10))
        whole, _, fraction = stamp.partition(".")
        stamp = whole.replace("T", " " if k % 2 else "T") + (f".{fraction[:digits]}" if digits else "")
        rows.append(f"{stamp},{int(rng.integers(0, 5000)):05d},{int(rng.integers(1, 900))}")
    path = write(tmp_path, "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    plain, pandas = both_readers(path, "azure", monkeypatch)
    assert_same_rows(plain, pandas)
    assert plain.arrival_s.min() == 0.0 and plain.arrival_s.max() > 86_400


def test_plain_reader_reads_windows_line_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from servesim.workloads import traces

    path = tmp_path / "azure.csv"
    path.write_bytes(AZURE.replace("\n", "\r\n").encode())
    assert traces._parse_plain(path.read_bytes().decode(), "azure") is not None
    plain, pandas = both_readers(path, "azure", monkeypatch)
    assert_same_rows(plain, pandas)
    assert plain.prompt.tolist() == [374, 396, 1, 2048]


@pytest.mark.parametrize("text", [
    AZURE.replace(",374,", ",3.0,"),  # a decimal length
    AZURE.replace(",374,", ", 374,"),  # a space
    AZURE.replace(",374,", ",,"),  # a missing value
    AZURE + "\n",  # a blank line
    AZURE.replace("\n", "\r", 1),  # a lone carriage return
    AZURE.replace("2023-11-16 18:15:50.9951690", "2024-05-10 00:00:00.009930+00:00"),  # zoned
    AZURE.replace("2023-11-16 18:15:50", "2023-13-16 18:15:50"),  # month 13
    AZURE.replace(",44\n", ",44,1\n"),  # ragged
    AZURE.replace("TIMESTAMP", '"TIMESTAMP"'),  # quoted
])
def test_plain_reader_declines_what_pandas_must_judge(text: str) -> None:
    """Each of these goes to the pandas reader (which reads, fixes up or refuses it with its
    one-line error); the plain reader must not guess."""
    from servesim.workloads import traces

    assert traces._parse_plain(text, "azure") is None


def test_a_plain_azure_read_does_not_import_pandas(tmp_path: Path) -> None:
    path = write(tmp_path, "azure.csv", AZURE)
    code = ("import sys\nfrom servesim.workloads import read_trace\n"
            f"table = read_trace({str(path)!r}, 'azure')\n"
            "assert table.prompt_tokens.tolist() == [374, 396, 1, 2048], table.prompt_tokens\n"
            "print('pandas' in sys.modules)\n")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
