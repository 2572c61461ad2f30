"""Rows of the serving file that decoded speculatively though the file does not say so
(``servesim.calibration.serving_speculation``): TensorRT-LLM ``1.2.0rc6.post3`` is InferenceX's
MTP image for DeepSeek-R1, so those rows replay with InferenceX's recipe (3 MTP layers, 1 with
attention DP) and AIConfigurator's default acceptance (0.85, 0.3, 0, ...)."""

from __future__ import annotations

import pytest
from conftest import SHARED_DATA

from servesim.calibration.serving_data import read_serving_file
from servesim.calibration.serving_speculation import speculation
from servesim.calibration.serving_validate import replayed_means

SERVING = SHARED_DATA / "serving" / "aiconfigurator_silicon_dev.csv"


def test_the_mtp_image_speculates_with_inferencexs_recipe() -> None:
    tp = speculation("trtllm", "1.2.0rc6.post3", "deepseek-ai/DeepSeek-R1", dp=1)
    assert tp == {"method": "mtp", "num_speculative_tokens": 3, "acceptance": {"rates": [0.85, 0.3, 0.0]}}
    dp = speculation("trtllm", "1.2.0rc6.post3", "deepseek-ai/DeepSeek-R1", dp=8)
    assert dp == {"method": "mtp", "num_speculative_tokens": 1, "acceptance": {"rates": [0.85]}}
    # the single-token image, another checkpoint, another engine: one token per step
    assert speculation("trtllm", "1.2.0rc6.post2", "deepseek-ai/DeepSeek-R1", dp=1) is None
    assert speculation("trtllm", "1.2.0rc6.post3", "deepseek-ai/DeepSeek-V3", dp=1) is None
    assert speculation("sglang", "1.2.0rc6.post3", "deepseek-ai/DeepSeek-R1", dp=1) is None


@pytest.mark.skipif(not SERVING.is_file(), reason=f"{SERVING} is not here (shared data)")
def test_an_mtp_row_replays_closer_with_its_speculation_than_without() -> None:
    """DeepSeek-R1 FP8 on 8 B200s, TP 8, 4 clients of 1,024 + 1,024 tokens: measured TPOT 5.38 ms
    with the MTP image, 10.30 ms with the single-token one (the same deployment). One token per
    step replays at 9.9 ms (83% over); with 3 MTP layers at AIConfigurator's default acceptance
    (2.1 tokens per step) 8.3 ms (55% over): closer, still over, as the benchmark's text is
    likely more predictable than that default says (the acceptance is not in the file)."""
    file = read_serving_file(SERVING)
    wanted = ("trtllm", "1.2.0rc6.post3", "fp8", 8, 1, 1024, 1024, 4)
    row = next(r for r in file.rows
               if (r.engine, r.version, r.precision, r.tp, r.dp, r.isl, r.osl, r.concurrency) == wanted)
    assert row.speculative is not None and row.hf_model == "deepseek-ai/DeepSeek-R1"
    document = row.document(2)
    assert document["speculative"] == row.speculative
    single = {key: value for key, value in document.items() if key != "speculative"}
    with_mtp = replayed_means(document, row.concurrency, warmup=1)[1]
    without = replayed_means(single, row.concurrency, warmup=1)[1]
    assert without / row.tpot_s > 1.6
    assert 1.0 < with_mtp / row.tpot_s < without / row.tpot_s - 0.2
