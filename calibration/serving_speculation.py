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

The recipe is InferenceX's (``benchmarks/dsr1_fp8_b200_trt_mtp.sh`` and
``dsr1_fp4_b200_trt_mtp.sh``): ``speculative_config: {decoding_type: MTP,
num_nextn_predict_layers: 3}``, or 1 with attention data parallelism. The acceptance is not in the
file either: the replay takes AIConfigurator's own default MTP acceptance, ``nextn_accept_rates``
= 0.85, 0.3, 0, 0, 0 (the conditional acceptance of each successive prediction layer, as
AIConfigurator's ``calc_mtp_expectation`` reads it), an estimate from the tool that assembled the
file, not a value fitted to these rows. (The replay still over-predicts their TPOT at low
concurrency, 1.6x at 4 clients: the benchmark's text, random tokens, is likely more predictable
than that default.)
"""

from __future__ import annotations

from typing import Any

MTP_RELEASES = {("trtllm", "1.2.0rc6.post3"): "DeepSeek-R1"}
"""(engine, release) -> the checkpoint name (as it ends ``model_path``) of the rows it ran with
MTP: InferenceX's MTP image of TensorRT-LLM (see the module docstring)."""

MTP_LAYERS = 3
"""InferenceX's ``num_nextn_predict_layers`` with tensor-parallel attention ..."""
MTP_LAYERS_DP = 1
"""... and with attention data parallelism."""

AIC_NEXTN_ACCEPT_RATES = (0.85, 0.3, 0.0, 0.0, 0.0)
"""AIConfigurator's default ``nextn_accept_rates``: the conditional acceptance of each MTP layer's
proposal given the ones before it were accepted."""


def speculation(engine: str, version: str, hf_model: str, dp: int) -> dict[str, Any] | None:
    """The ``speculative`` section a row of ``engine`` ``version`` serving ``hf_model`` with
    ``dp`` attention ranks ran with, or None when it decoded one token per step."""
    checkpoint = MTP_RELEASES.get((engine, version))
    if checkpoint is None or hf_model.rsplit("/", 1)[-1] != checkpoint:
        return None
    layers = MTP_LAYERS_DP if dp > 1 else MTP_LAYERS
    return {"method": "mtp", "num_speculative_tokens": layers,
            "acceptance": {"rates": list(AIC_NEXTN_ACCEPT_RATES[:layers])}}
