"""The engine flags of the deployments in AIConfigurator's serving files, where the file is silent.

A row of ``aiconfigurator_silicon_dev.csv`` records the model, GPU, engine, parallelism and
quantisation of a deployment, but none of the flags the engine was launched with. AIConfigurator
deploys what it measures with its own generator (``src/aiconfigurator/generator`` in
ai-dynamo/aiconfigurator: the ``rule_plugin/*.rule`` files, their ``benchmark/`` variants, and
``config/backend_config_mapping.yaml`` for each engine's flag names), and its benchmark template
(``backend_templates/benchmark/bench_run.sh.j2``) is the ``aiperf profile --concurrency N
--num-requests ... --warmup-request-count 2N`` command the file's README names. So the replay
takes the flags from those rules (read through servesim's ``search`` tool; the values below, not
the code, are what is used here):

- **Step budget** (``max_num_tokens`` -> vLLM ``--max-num-batched-tokens``, TensorRT-LLM
  ``build_config.max_num_tokens``): ``max_batch_size + isl + 1500`` for an aggregated worker,
  TensorRT-LLM's rounded up to whole KV blocks of 32 tokens (its ``tokens_per_block`` default
  there).
- **Seats** (``max_batch_size`` -> ``--max-num-seqs``, ``--max-running-requests``,
  ``build_config.max_batch_size``): the row's ``batch_size``, per attention-DP rank, which in
  the rows replayed here is the client concurrency divided by the ranks (rounded up).
- **CUDA graphs** (``cuda_graph_batch_sizes``): every batch size from 1 to ``max_batch_size``,
  so no decode step is padded.
- **KV cache dtype** (``kv_cache_dtype`` -> ``--kv-cache-dtype``, ``kv_cache_config.dtype``):
  AIConfigurator's ``kvcache_quant_mode``, which, unless set explicitly, it infers from the
  checkpoint (``sdk/models``, ``_infer_quant_modes_from_raw_config``): FP8 whenever the
  checkpoint's ``quant_algo`` is ``fp8``, ``fp8_block`` or ``nvfp4`` (or its
  ``kv_cache_quant_algo`` is FP8), bf16 otherwise. :data:`FP8_KV_CHECKPOINTS` lists the file's
  checkpoints that are quantised so. A TensorRT-LLM row with FP8 or FP4 GEMMs that names a bf16
  checkpoint (Qwen/Qwen3-32B) ran a pre-quantised one (TensorRT-LLM's PyTorch backend does not
  quantise at load time), so it gets an FP8 KV cache too. The data agree: Qwen3-32B FP8 on one
  H100 at 64-128 clients (TensorRT-LLM 1.0.0rc3) runs every client at once as measured (TPOT 62.9
  ms at 128 clients of 2,048 + 512 tokens; replayed with FP8 KV 64.3 ms, with bf16 KV 46.9 ms and
  a TTFT of 28 s, as the bf16 pool holds about half of them).

A disaggregated row's groups get the rules for its ``prefill`` and ``decode`` workers
(``benchmark/*.rule``):

- **prefill**: seats from the row's ``prefill_batch_size`` (1 when the row is silent, the rules'
  default; every row of the file that records it says 1), so a prefill rank takes one prompt at a
  time; step budget ``isl + 1500`` (vLLM, TensorRT-LLM; SGLang's ``max_prefill_tokens`` is not
  applied, as above).
- **decode**: seats from ``decode_batch_size`` (the rules' default 128 when silent) and a step
  budget of that many tokens (one per seat: vLLM, TensorRT-LLM).
- **CUDA graphs** 1 .. the decode seats (an experiment has one engine section: the capture sizes
  are the decode group's, which is where graphs replay).

TensorRT-LLM's ``disable_overlap_scheduler: true`` on prefill workers is not applied (one engine
section per experiment: the overlap is the engine's, for both groups).

Measured effect (75 replayable disaggregated rows of at most 256 clients, shipped coefficients):
TTFT median error 42.1% -> 46.7%, TPOT 21.6% -> 20.7%. Their TTFT is under-predicted either way
(ratio about 0.55: a gap of 50-500 ms at up to 8 clients that grows with the clients at long
prompts; the disaggregated hand-off is not modelled yet, and prefill capacity under load looks
over-estimated); the flags are kept as the deployments' facts.

**SGLang's aggregated rule, by date.** AIConfigurator first deployed aggregated SGLang workers
on 2025-11-05 (ai-dynamo/aiconfigurator PR #93, "support agg mode for SGLang"), and from 2026-01-19
its rules give them ``--enable-mixed-chunk`` and ``--max-prefill-tokens isl + 1500`` (PR #257,
"add sglang enable-mix-chunk for generator", merged that day). A row measured on or after that
day (:data:`SGLANG_MIXED_CHUNK_SINCE`; an undated row takes the earliest ``measured=`` day of the
file's rows of the same engine version, :func:`~servesim.calibration.serving_data.read_serving_file`)
is replayed with both: the ``prefill_first`` policy's ``mixed: true`` and the engine knob
``max_prefill_tokens``. Rows measured before, or of a release the file never dates (SGLang
0.5.1.post1's Qwen3-32B sweep), keep SGLang's defaults. On the 325 replayable aggregated SGLang rows
(engines as shipped, before the refit): TTFT median error 34.9% -> 28.5% (p90 215% -> 91%), TPOT
10.2% -> 8.7%; applied to every row instead, the Qwen3-32B sweep's TTFT error goes 9.0% -> 50.6%,
as the paragraph below found.

Before the rule's date was known it was applied to no row, for what the Qwen3-32B sweep shows:
with decodes mixed into every prefill batch the replay's closed-loop clients desynchronise after
the first round and their TTFT falls to the wait for one step, while those measured rows keep the
TTFT of a lockstep round (TP 2 on H100, 128 clients, 1,024 + 512 tokens: 3.67 s measured; replayed
without mixing 3.79 s in every round, with mixing 3.87 s in the first round and 0.70 s in each
later one). That sweep is of SGLang 0.5.1.post1, released months before the generator deployed
aggregated SGLang at all, so it keeps SGLang's default scheduler.
"""

from __future__ import annotations

from typing import Any

FP8_KV_CHECKPOINTS = frozenset({
    "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3",  # FP8, 128 x 128 blocks (fp8_block)
    "MiniMaxAI/MiniMax-M2.5",  # FP8, 128 x 128 blocks (fp8_block)
    "nvidia/Llama-3.1-8B-Instruct-FP8",  # ModelOpt FP8, FP8 KV cache
    "nvidia/DeepSeek-R1-NVFP4", "nvidia/DeepSeek-V3.1-NVFP4", "nvidia/Qwen3-32B-NVFP4",  # ModelOpt NVFP4
})
"""Checkpoints of the serving file whose own quantisation makes AIConfigurator deploy an FP8 KV
cache. The bf16 checkpoints (Qwen/Qwen3-32B, meta-llama/Llama-3.1-8B-Instruct) keep a bf16 cache
even where the row's GEMMs are FP8 (quantised at load time), and so does Kimi-K2.5, whose
compressed-tensors INT4 experts are not one of the three algorithms."""

TRTLLM_TOKENS_PER_BLOCK = 32
"""TensorRT-LLM's KV block in the generator's rules; its step budget is a whole number of them."""

PROMPT_HEADROOM = 1500
"""Tokens the rules add to the input length in a worker's step budget."""

CAPTURE_SIZE_KNOB = {"vllm": "cudagraph_capture_sizes", "trtllm": "cuda_graph_batch_sizes",
                     "sglang": "cuda_graph_bs"}
"""Each engine's knob for its captured decode batch sizes."""


PREQUANTISED_ONLY_ENGINES = frozenset({"trtllm"})
"""Engines that cannot quantise a bf16 checkpoint as they load it: TensorRT-LLM's PyTorch backend
runs FP8 and FP4 only from a pre-quantised (ModelOpt) checkpoint (its quantization guide, 1.0 on:
"Running Pre-quantized Models", else "quantize it offline using ModelOpt"). vLLM and SGLang
quantise at load time (``--quantization fp8``)."""


def kv_cache_dtype(hf_model: str, engine: str, precision: str) -> str:
    """The KV cache AIConfigurator deploys for this checkpoint: ``fp8`` or ``bf16``. A row whose
    engine only runs pre-quantised checkpoints and whose GEMMs are FP8 or FP4 ran the quantised
    checkpoint, not the bf16 one its row names; ModelOpt's FP8 and NVFP4 checkpoints carry an FP8
    KV cache (``kv_cache_quant_algo``), which AIConfigurator infers from them, so it is FP8."""
    if hf_model in FP8_KV_CHECKPOINTS:
        return "fp8"
    if engine in PREQUANTISED_ONLY_ENGINES and precision in ("fp8", "fp4"):
        return "fp8"
    return "bf16"


def step_budget(engine: str, isl: int, max_batch_size: int) -> int:
    """``max_num_tokens`` of a worker that prefills ``isl``-token prompts beside ``max_batch_size``
    decodes (0 for a prefill worker of a disaggregated deployment)."""
    tokens = max_batch_size + isl + PROMPT_HEADROOM
    if engine == "trtllm":
        tokens = -(-tokens // TRTLLM_TOKENS_PER_BLOCK) * TRTLLM_TOKENS_PER_BLOCK
    return tokens


SGLANG_MIXED_CHUNK_SINCE = "2026-01-19"
"""The day AIConfigurator's rules started giving aggregated SGLang workers ``--enable-mixed-chunk``
and ``--max-prefill-tokens isl + 1500`` (ai-dynamo/aiconfigurator PR #257, merged 2026-01-19)."""

DEFAULT_PREFILL_SEATS = 1
DEFAULT_DECODE_SEATS = 128
"""The rules' ``max_batch_size`` of a prefill and a decode worker when the row gives none."""
BUDGETED_ENGINES = ("vllm", "trtllm")
"""Engines whose rules set a step budget as ``max_num_batched_tokens`` (SGLang's is its
``max_prefill_tokens`` knob, dated above; a disaggregated prefill worker's is left out: with
one seat its budget only binds above SGLang's chunk)."""


KV_MEMORY_FRACTION = {"trtllm": 0.80}
"""The KV-cache memory fraction the generator's templates deploy where no rule sets one:
TensorRT-LLM's ``kv_cache_config.free_gpu_memory_fraction | default(0.80)`` in every
``backend_templates/trtllm/extra_engine_args*.yaml.j2`` (1.0.0rc3 to 1.3.0rc14), against
TensorRT-LLM's own default of 0.9. vLLM's template passes no ``--gpu-memory-utilization`` (vLLM's
0.9) and SGLang's passes ``--mem-fraction-static`` only when a rule sets it, which none does
(SGLang's own per-GPU default). Only rows of AIConfigurator's own campaigns get it
(:func:`generator_deployed`): the templates are its, not InferenceX's."""


def generator_deployed(source: str) -> bool:
    """Whether a row's ``silicon_data_source`` names one of AIConfigurator's own campaigns, whose
    workers its generator deployed: its gap-analysis files (``aic-auto-gap-analysis``,
    ``*-gap-analysis.csv``) and its benchmark database (``db-dump/``). The dated campaign files
    (``source_file=2026-03-25.csv; model=...; wip=...; image=...``: InferenceX's runs, whose
    TensorRT-LLM images and recipes ``serving_speculation`` reads) were deployed by their own
    scripts, so the templates' KV fraction is not applied to them."""
    return "gap-analysis" in source or source.startswith("db-dump/")


def _worker(engine: str, seats: int, budget: int, generated: bool = True) -> dict[str, Any]:
    """One worker's deployment keys: its seats, its step budget where the rules set one, and, for
    a worker the generator deployed, its KV-cache memory fraction where the templates set one."""
    keys: dict[str, Any] = {"max_num_seqs": seats}
    if engine in BUDGETED_ENGINES:
        keys["max_num_batched_tokens"] = budget
    if generated and engine in KV_MEMORY_FRACTION:
        keys["gpu_memory_utilization"] = KV_MEMORY_FRACTION[engine]
    return keys


def _graphs(engine: str, seats: int) -> dict[str, Any]:
    """The engine knob capturing a CUDA graph at every decode batch size up to ``seats``."""
    return {CAPTURE_SIZE_KNOB[engine]: list(range(1, seats + 1))}


def disaggregated_flags(engine: str, isl: int, prefill_batch: int | None, decode_batch: int | None,
                        generated: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """({"prefill": keys, "decode": keys}, engine knobs) of a disaggregated deployment
    (``generated``: deployed by AIConfigurator's generator, :func:`generator_deployed`)."""
    prefill_seats = prefill_batch or DEFAULT_PREFILL_SEATS
    decode_seats = decode_batch or DEFAULT_DECODE_SEATS
    groups = {"prefill": _worker(engine, prefill_seats, step_budget(engine, isl, 0), generated),
              "decode": _worker(engine, decode_seats, decode_seats, generated)}
    return groups, _graphs(engine, decode_seats)


def aggregated_flags(engine: str, isl: int, batch_size: int, measured_on: str = "",
                     generated: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(deployment keys, engine knobs) of an aggregated worker serving ``batch_size`` requests,
    deployed on ``measured_on`` (an ISO day; empty: unknown, so before any dated rule);
    ``generated``: by AIConfigurator's generator (:func:`generator_deployed`)."""
    knobs = _graphs(engine, batch_size)
    if mixes_chunks(engine, measured_on):
        knobs["max_prefill_tokens"] = isl + PROMPT_HEADROOM
    return _worker(engine, batch_size, step_budget(engine, isl, batch_size), generated), knobs


def aggregated_policy(engine: str, measured_on: str = "") -> dict[str, Any] | None:
    """The ``policy`` section of an aggregated worker deployed on ``measured_on``, where the
    rules change the engine's default scheduling (None: the engine's default policy)."""
    if mixes_chunks(engine, measured_on):
        return {"name": "prefill_first", "mixed": True}
    return None


def mixes_chunks(engine: str, measured_on: str) -> bool:
    """Whether the generator's rules of ``measured_on`` give an aggregated worker of ``engine``
    SGLang's ``--enable-mixed-chunk`` (and ``--max-prefill-tokens isl + 1500``)."""
    return engine == "sglang" and bool(measured_on) and measured_on >= SGLANG_MIXED_CHUNK_SINCE
