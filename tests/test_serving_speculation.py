"""Rows of the serving file that decoded speculatively though the file does not say so
(``servesim.calibration.serving_speculation``): TensorRT-LLM ``1.2.0rc6.post3`` is InferenceX's
MTP image for DeepSeek-R1 (and 1.1.0rc2.post2 on 2026-01-14), so those rows replay with
InferenceX's recipe (3 MTP layers, 1 with attention DP) and the acceptance fitted to them (i.i.d.
0.75, ``servesim.calibration.mtp_acceptance``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_DATA

from servesim.calibration.serving_data import ServingRow, catalogue_model, read_serving_file
from servesim.calibration.serving_speculation import speculation
from servesim.calibration.serving_validate import replayed_means

SERVING = SHARED_DATA / "serving" / "aiconfigurator_silicon_dev.csv"


def test_the_mtp_image_speculates_with_inferencexs_recipe() -> None:
    tp = speculation("trtllm", "1.2.0rc6.post3", "deepseek-ai/DeepSeek-R1", dp=1)
    assert tp == {"method": "mtp", "num_speculative_tokens": 3, "acceptance": {"rate": 0.75}}
    dp = speculation("trtllm", "1.2.0rc6.post3", "deepseek-ai/DeepSeek-R1", dp=8)
    assert dp == {"method": "mtp", "num_speculative_tokens": 1, "acceptance": {"rate": 0.75}}
    # the single-token image, another checkpoint, another engine: one token per step
    assert speculation("trtllm", "1.2.0rc6.post2", "deepseek-ai/DeepSeek-R1", dp=1) is None
    assert speculation("trtllm", "1.2.0rc6.post3", "deepseek-ai/DeepSeek-V3", dp=1) is None
    assert speculation("sglang", "1.2.0rc6.post3", "deepseek-ai/DeepSeek-R1", dp=1) is None


def test_the_mtp_campaign_of_the_shared_image_speculates_and_its_twins_do_not() -> None:
    """1.1.0rc2.post2 served InferenceX's MTP and single-token configurations alike: the rows of
    2026-01-14 ran MTP, those of 2025-12-15 and 2026-01-28 one token per step."""
    mtp = {"method": "mtp", "num_speculative_tokens": 3, "acceptance": {"rate": 0.75}}
    assert speculation("trtllm", "1.1.0rc2.post2", "deepseek-ai/DeepSeek-R1", 1, "2026-01-14") == mtp
    assert speculation("trtllm", "1.1.0rc2.post2", "deepseek-ai/DeepSeek-R1", 8, "2026-01-14") == {
        "method": "mtp", "num_speculative_tokens": 1, "acceptance": {"rate": 0.75}}
    for day in ("2025-12-15", "2026-01-28", ""):
        assert speculation("trtllm", "1.1.0rc2.post2", "deepseek-ai/DeepSeek-R1", 1, day) is None
    assert speculation("trtllm", "1.1.0rc2.post2", "deepseek-ai/DeepSeek-V3", 1, "2026-01-14") is None


@pytest.mark.skipif(not SERVING.is_file(), reason=f"{SERVING} is not here (shared data)")
def test_the_file_reads_the_campaign_day_into_the_speculation() -> None:
    """Every 1.1.0rc2.post2 DeepSeek-R1 row of the file speculates exactly when measured on
    2026-01-14 (the day read from its ``measured=``)."""
    rows = [r for r in read_serving_file(SERVING).rows if r.version == "1.1.0rc2.post2"
            and r.hf_model == "deepseek-ai/DeepSeek-R1" and r.prefill is None]
    days = {r.measured_on for r in rows}
    assert {"2025-12-15", "2026-01-14", "2026-01-28"} <= days
    assert all((r.speculative is not None) == (r.measured_on == "2026-01-14") for r in rows)
    assert sum(r.speculative is not None for r in rows) > 30


@pytest.mark.skipif(not SERVING.is_file(), reason=f"{SERVING} is not here (shared data)")
def test_an_mtp_row_replays_closer_with_its_speculation_than_without() -> None:
    """DeepSeek-R1 FP8 on 8 B200s, TP 8, 4 clients of 1,024 + 1,024 tokens: measured TPOT 5.38 ms
    with the MTP image, 10.30 ms with the single-token one (the same deployment). One token per
    step replays at 1.72x the measurement; with 3 MTP layers at AIConfigurator's default acceptance
    (0.85, 0.3, 0: 2.1 tokens per step) at 1.46x; at the fitted i.i.d. 0.75 (2.73 tokens per step)
    at 1.13x."""
    file = read_serving_file(SERVING)
    wanted = ("trtllm", "1.2.0rc6.post3", "fp8", 8, 1, 1024, 1024, 4)
    row = next(r for r in file.rows
               if (r.engine, r.version, r.precision, r.tp, r.dp, r.isl, r.osl, r.concurrency) == wanted)
    assert row.speculative is not None and row.hf_model == "deepseek-ai/DeepSeek-R1"
    document = row.document(2)
    assert document["speculative"] == row.speculative
    single = {key: value for key, value in document.items() if key != "speculative"}
    default = {**document, "speculative": {**row.speculative, "acceptance": {"rates": [0.85, 0.3, 0.0]}}}
    fitted, aic, without = (replayed_means(d, row.concurrency, warmup=1)[1] / row.tpot_s
                            for d in (document, default, single))
    assert without > 1.6
    assert aic > 1.4
    assert abs(np.log(fitted)) < 0.2


def _inferencex_row(**fields: Any) -> ServingRow:
    """A DeepSeek-R1 row of InferenceX's MTP image (not deployed by AIConfigurator's generator)."""
    model = str(catalogue_model("deepseek-ai/DeepSeek-R1"))
    values: dict[str, Any] = dict(
        row=1, engine="trtllm", model=model, hf_model="deepseek-ai/DeepSeek-R1", gpu="b200_sxm", tp=8,
        precision="fp8", isl=1024, osl=1024, concurrency=64, ttft_s=1.0, tpot_s=0.01,
        version="1.2.0rc6.post3", generated=False)
    values.update(fields)
    values["speculative"] = speculation("trtllm", values["version"], values["hf_model"], values.get("dp", 1))
    return ServingRow(**values)


def test_an_inferencex_mtp_worker_gets_its_scripts_token_budget() -> None:
    """``MAX_NUM_TOKENS=(((MTP+1)*MAX_BATCH_SIZE+ISL+64+63)/64*64)``: 64 clients, 3 MTP layers,
    1,024-token prompts: (4 x 64 + 1,024 + 64 + 63) // 64 x 64 = 1,344 tokens, where the
    generator's rule gives 64 + 1,024 + 1,500 = 2,588, rounded up to 32-token blocks: 2,592."""
    document = _inferencex_row().document(2)
    assert document["deployment"]["max_num_batched_tokens"] == 1344
    assert document["deployment"]["max_num_seqs"] == 64
    generated = replace(_inferencex_row(), generated=True).document(2)
    assert generated["deployment"]["max_num_batched_tokens"] == 2592
    single = replace(_inferencex_row(), speculative=None).document(2)
    assert single["deployment"]["max_num_batched_tokens"] == 2592  # only the MTP scripts set it so


def test_an_inferencex_worker_with_attention_dp_balances_its_prompts() -> None:
    """With attention DP its scripts add ``attention_dp_config: {enable_balance: true,
    timeout_iters: 60, batching_wait_iters: 0}``; per rank 128 / 8 = 16 seats, one MTP layer:
    (2 x 16 + 1,024 + 64 + 63) // 64 x 64 = 1,152 tokens. The generator sets none."""
    row = _inferencex_row(tp=1, dp=8, ep=8, concurrency=128)
    document = row.document(2)
    assert document["engine"]["attention_dp_balance"] is True
    assert document["engine"]["attention_dp_timeout_iters"] == 60
    assert document["engine"]["attention_dp_batching_wait_iters"] == 0
    assert document["deployment"]["max_num_batched_tokens"] == 1152
    assert document["deployment"]["max_num_seqs"] == 16
    assert "attention_dp_balance" not in replace(row, generated=True).document(2)["engine"]
