"""The engine flags of InferenceX's deployments in AIConfigurator's serving file, where the file is
silent.

The file's dated campaign rows (``source_file=2026-03-25.csv`` / ``2026-04-06.csv``: not
AIConfigurator's generator, :func:`~servesim.calibration.aic_flags.generator_deployed`) are
SemiAnalysis' InferenceX configurations, deployed by its own scripts
(``benchmarks/dsr1_*.sh`` and ``benchmarks/single_node/dsr1_*.sh`` in SemiAnalysisAI/InferenceX,
read through servesim's ``search`` tool, every stored version; the values, not the code, are used
here). Where a flag is the same in every version it is applied; the rest keep the generator's
rules (:mod:`~servesim.calibration.aic_flags`), as before.

- **TensorRT-LLM, DeepSeek-R1**: with attention DP, ``attention_dp_config`` (balancing, below);
  with MTP, ``--max_batch_size`` the concurrency (per DP rank) and ``max_num_tokens`` room for one
  prompt beside a batch of verifying decodes (:func:`inferencex_mtp_budget`).

SGLang's scripts are not applied, on the evidence. As read (``dsr1_fp8_b200.sh``: 128 running
requests and CUDA-graph seats, a 32,768-token chunk and prefill cap, ``--mem-fraction-static
0.82``, ``--scheduler-recv-interval`` 30 from 16 clients on, else 10; ``dsr1_fp4_b200.sh``: 256,
16,384, 0.85; ``dsr1_fp8_h200.sh``: 512 or 256, 32,768, 0.82; none with
``--enable-mixed-chunk``), they move the 135 replayable aggregated SGLang rows of those files
from a TTFT median error of 40.7% to 50.0% (TPOT 9.4% -> 8.7%; engines as shipped): 128 seats
hold every client beyond them back for a whole request, which the measurements at 256 and 512
clients do not show (those 6 rows replay at a median 9.7x their TTFT), and a round's prompts in
one 32,768-token prefill make every H200 TTFT worse. Without the generator's mixed
chunks alone (its rule of 2026-01-19), 46.1% (TPOT 8.7%). The stored script versions are not
dated, so which of them deployed a 2026-03-25 row is unknown; those rows keep the generator's
rules. (SGLang's ``--scheduler-recv-interval`` is an engine knob all the same:
``scheduler_recv_interval``.)
"""

from __future__ import annotations

from typing import Any

INFERENCEX_ATTENTION_DP = {"trtllm": {"attention_dp_balance": True, "attention_dp_timeout_iters": 60,
                                      "attention_dp_batching_wait_iters": 0}}
"""The engine knobs InferenceX's single-node scripts give a worker with attention DP: every
TensorRT-LLM DeepSeek-R1 script (``benchmarks/dsr1_*_trt*.sh`` in SemiAnalysisAI/InferenceX, each
stored version read, 2025-11 to 2026-04) appends ``attention_dp_config: {batching_wait_iters: 0,
enable_balance: true, timeout_iters: 60}`` when ``DP_ATTENTION`` is true. AIConfigurator's
generator sets no ``attention_dp_config`` (TensorRT-LLM's default: no balancing), so its own
campaigns' rows keep the engine's default."""


INFERENCEX_TOKEN_ROUNDING = 64
"""InferenceX's MTP scripts round ``max_num_tokens`` up to a multiple of 64 tokens."""
INFERENCEX_PROMPT_HEADROOM = 64
"""... after adding 64 tokens to the input length."""


def inferencex_mtp_budget(isl: int, max_batch_size: int, proposals: int) -> int:
    """``max_num_tokens`` of an InferenceX TensorRT-LLM worker decoding with ``proposals`` MTP
    layers: every stored version of its ``dsr1_*_trt_mtp.sh`` scripts sets
    ``MAX_NUM_TOKENS=(((MTP+1)*MAX_BATCH_SIZE+ISL+64+63)/64*64)``, room for one prompt beside a
    full batch of decodes each verifying its proposals, with ``--max_batch_size`` the client
    concurrency (over the ranks with attention DP)."""
    tokens = (proposals + 1) * max_batch_size + isl + INFERENCEX_PROMPT_HEADROOM
    return -(-tokens // INFERENCEX_TOKEN_ROUNDING) * INFERENCEX_TOKEN_ROUNDING


def inferencex_attention_dp(engine: str) -> dict[str, Any]:
    """The engine knobs of an InferenceX worker of ``engine`` with attention DP (none where its
    scripts add none)."""
    return dict(INFERENCEX_ATTENTION_DP.get(engine, {}))
