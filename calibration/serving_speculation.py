"""Which rows of a serving file decode speculatively, where the file does not say so.

AIConfigurator's serving file records no speculative decoding (its README: "Engine flags beyond
the columns (... speculative decoding) are not recorded"), but some of its rows ran it. The
DeepSeek-R1 rows of TensorRT-LLM ``1.2.0rc6.post3`` on B200 (88 rows, 68 once the file's
duplicates are dropped; ``source_file=2026-03-25.csv`` and ``2026-04-06.csv``) come from
SemiAnalysis' InferenceX sweep, whose TensorRT-LLM DeepSeek-R1 configurations used two images:
``1.2.0rc6.post2`` for single-token decoding and ``1.2.0rc6.post3`` for MTP
(SemiAnalysisAI/InferenceX issue #135: "Unified TRT LLM image tag across STP and MTP configs
(previously used different .postN variants)"). The file agrees: at the same deployment, ``post3``
decodes about twice as fast as ``post2`` at 4 clients (FP8, TP 8, 1,024 + 1,024 tokens: TPOT 5.38
against 10.30 ms; 1,024 + 8,192: 4.37 against 10.13 ms) and only 1.3x at 128 (42.8 against 55.7 ms
at 8,192 + 1,024), which is speculation's signature (a memory-bound step verifies its proposals
almost for free; a compute-bound one pays for each). Replayed without it, the 46 of them with
tensor-parallel attention came out at a median 1.68x the measured TPOT (median error 67.8%); with
it, 36.5% (``validate-serving`` on those rows, engines as shipped; TTFT 34.7% -> 50.0%, its
low-concurrency floor of about 200 ms being unexplained either way). The other 22 use attention
data parallelism; since DP ranks speculate in the simulator (each rank verifies its own proposals
and runs its own MTP pass) they replay with the DP recipe below: TPOT median error 17.7%, against
16.7% as single-token decodes, so these rows neither confirm nor refute it.

The same configurations ran earlier on one image for both. InferenceX's ``nvidia-master.yaml`` of
about January 2026 (InferenceMAX/InferenceMAX at 525079ad) gives ``dsr1-fp4-b200-trt-mtp``,
``dsr1-fp8-b200-trt-mtp`` and ``dsr1-fp8-h200-trt-mtp`` the image ``release:1.1.0rc2.post2``, the
same as their single-token twins (H200 kept it for both into March), so that release does not tell
them apart; the day does (:data:`MTP_CAMPAIGNS`). The file's 1.1.0rc2.post2 DeepSeek-R1 rows come
from three days, and the rows of 2026-01-14 decode like the MTP image: H200, FP8, TP 8 / EP 8,
1,024 + 8,192 tokens at 64 clients measured 19.41 ms on 2026-01-14 and 32.16 ms on 2026-01-28
(1.66x, the MTP-to-single-token ratio the 1.2 images show at 64 clients); replayed as single-token
decodes (the leave-one-model-out predictions of session 30's fit, before this rule), the
tensor-parallel rows of 2025-12-15 came out at a median 1.00x their measured TPOT (7 rows) and
those of 2026-01-14 at 1.40x (39 rows), where the 1.2 MTP image's rows stood at 1.68x without
speculation. Its attention-DP rows neither confirm nor
refute it (the H200 DP 8 row at 256 clients, 1,024 + 8,192 tokens, measured 30.69 ms on
2026-01-14 and 30.40 ms on 2026-01-28: one MTP layer gains little there); they replay with the DP
recipe like every row of the campaign.

The recipe is InferenceX's (``benchmarks/dsr1_fp8_b200_trt_mtp.sh`` and
``dsr1_fp4_b200_trt_mtp.sh``): ``speculative_config: {decoding_type: MTP,
num_nextn_predict_layers: 3}``, or 1 with attention data parallelism; their ``--max_batch_size``
is the client concurrency (over the ranks with DP) and their ``max_num_tokens`` room for one
prompt beside a batch of verifying decodes (:func:`~servesim.calibration.inferencex_flags.
inferencex_mtp_budget`). The acceptance is not in the file either. Until 2026-11-29 the replay
took AIConfigurator's own default, ``nextn_accept_rates`` = 0.85, 0.3, 0, ... (2.1 tokens a step
with 3 layers), which left the 74 speculating rows with tensor-parallel attention at a median
1.28x their measured TPOT (median error 28.3%). The rate is now fitted to those rows
(:mod:`~servesim.calibration.mtp_acceptance`): every proposal accepted with probability
:data:`MTP_ACCEPTANCE_RATE` given the ones before it were (2.73 tokens a step with 3 layers):
median TPOT error 14.4% in sample, 16.0% held out by campaign (each release, day and GPU at the
rate fitted to the other three: 0.80, 0.75, 0.745, 0.735). What is left is structure one rate
cannot hold: the 1.1 image's B200 rows would take a lower rate than the 1.2 image's, and the
8,192-token outputs a higher one than the 1,024-token ones (text generated past its end, the
benchmark's ``--ignore-eos``, repeats itself, which a proposer predicts well).
"""

from __future__ import annotations

from typing import Any

MTP_RELEASES = {("trtllm", "1.2.0rc6.post3"): "DeepSeek-R1"}
"""(engine, release) -> the checkpoint name (as it ends ``model_path``) of the rows it ran with
MTP: InferenceX's MTP image of TensorRT-LLM (see the module docstring)."""

MTP_CAMPAIGNS = {("trtllm", "1.1.0rc2.post2", "2026-01-14"): "DeepSeek-R1"}
"""(engine, release, measured day) -> the checkpoint of the rows that campaign ran with MTP, where
the release alone does not say: InferenceX ran its MTP and single-token configurations on one
image before the 1.2 images split them (see the module docstring)."""

MTP_LAYERS = 3
"""InferenceX's ``num_nextn_predict_layers`` with tensor-parallel attention ..."""
MTP_LAYERS_DP = 1
"""... and with attention data parallelism."""

MTP_ACCEPTANCE_RATE = 0.75
"""The i.i.d. acceptance of each MTP proposal in the file's speculating rows: fitted 2026-11-29 by
``python -m servesim.calibration.mtp_acceptance ../shared/data/serving/aiconfigurator_silicon_dev.csv
--workers 2`` to the mean TPOT of its 74 DeepSeek-R1 rows of TensorRT-LLM's MTP campaigns with
tensor-parallel attention (the rate of zero median log error; engines as shipped); an effective
rate for the benchmark's random-token prompts and past-the-end outputs, not a property of the
model."""


def speculation(engine: str, version: str, hf_model: str, dp: int,
                measured_on: str = "") -> dict[str, Any] | None:
    """The ``speculative`` section a row of ``engine`` ``version`` serving ``hf_model`` with
    ``dp`` attention ranks, measured on ``measured_on`` (an ISO day), ran with, or None when it
    decoded one token per step."""
    checkpoint = MTP_RELEASES.get((engine, version)) or MTP_CAMPAIGNS.get((engine, version, measured_on))
    if checkpoint is None or hf_model.rsplit("/", 1)[-1] != checkpoint:
        return None
    layers = MTP_LAYERS_DP if dp > 1 else MTP_LAYERS
    return {"method": "mtp", "num_speculative_tokens": layers,
            "acceptance": {"rate": MTP_ACCEPTANCE_RATE}}
