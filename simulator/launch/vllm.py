"""The vLLM fleet of a resolved topology: one ``vllm serve`` command per replica group.

Every engine argument the simulation ran with becomes the flag vLLM reads it from (the engine
arguments of ``vllm serve --help``; servesim's deployment keys use the same names):
parallelism, ``--gpu-memory-utilization``, ``--max-model-len``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--block-size``, chunked prefill and prefix caching on or off
(written out, because vLLM's defaults for both changed between versions),
``--num-gpu-blocks-override``, the priority scheduler and its preemption mode, the precision
(``--dtype``, ``--quantization fp8``, ``--kv-cache-dtype fp8``), and ``--async-scheduling`` or
``--no-async-scheduling`` where the simulation's differs from the release's default. What no flag can say (a
scheduling order vLLM does not ship, an int4 checkpoint to pick) is a note beside the command.

Parallelism is mapped key by key from :meth:`Parallelism.describe`, so a new degree (pipeline,
data, expert) needs one line in :data:`PARALLELISM_FLAGS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from servesim.dtypes import DType
from servesim.engines.vllm import async_by_default
from servesim.launch.command import LaunchConfig, ServerCommand, parallelism_argv
from servesim.launch.routing import routing_text
from servesim.topology.base import Topology
from servesim.topology.group import ReplicaGroup

PARALLELISM_FLAGS: dict[str, Callable[[int], list[str]]] = {
    "tp": lambda n: ["--tensor-parallel-size", str(n)],
    "pp": lambda n: ["--pipeline-parallel-size", str(n)],
    "dp": lambda n: ["--data-parallel-size", str(n)],
    "ep": lambda n: ["--enable-expert-parallel"] if n > 1 else [],
}
"""servesim's parallelism keys -> vLLM's flags (``ep``: vLLM shards experts over TP x DP)."""

DTYPE_FLAG = {DType.BF16: "bfloat16", DType.FP16: "float16"}

ENGINE_ENV = {"vllm-v0": (("VLLM_USE_V1", "0"),)}
"""Environment that selects the simulated engine: vLLM 0.8-0.10 run V1 unless told otherwise
(0.6 and 0.7 have only V0, where the variable is ignored)."""


def _parallelism(group: ReplicaGroup) -> tuple[list[str], list[str]]:
    argv, notes = parallelism_argv(group.parallelism.describe(), PARALLELISM_FLAGS, "servesim.launch.vllm")
    par = group.parallelism
    if par.dp > 1 and 1 < par.ep < par.stage_gpus:
        notes.append(f"simulated ep {par.ep} over tp {par.tp} x dp {par.dp} GPUs (experts sliced "
                     f"{par.moe_tp} ways, as TensorRT-LLM and SGLang run it); vLLM's "
                     f"--enable-expert-parallel spreads them over all {par.stage_gpus}")
    return argv, notes


def _precision(group: ReplicaGroup) -> tuple[list[str], list[str]]:
    p = group.precision
    argv: list[str] = []
    notes: list[str] = []
    if p.activation in DTYPE_FLAG:
        argv += ["--dtype", DTYPE_FLAG[p.activation]]
    if p.weight is DType.FP8 or p.activation is DType.FP8:
        argv += ["--quantization", "fp8"]
        if p.activation is not DType.FP8:
            notes.append("simulated fp8 weight-only GEMMs; vLLM's fp8 runs W8A8 on GPUs with fp8 "
                         "tensor cores (faster than simulated) and weight-only elsewhere")
    elif p.weight is DType.INT4:
        notes.append(f"simulated int4 weights with group size {p.group_size}: serve an AWQ or GPTQ "
                     "checkpoint of the model (vLLM reads the method from its quantization_config)")
    elif p.weight is DType.INT8:
        notes.append("simulated int8 weights: serve an int8 (W8A8 or W8A16) checkpoint of the model")
    if p.kv_cache is DType.FP8:
        argv += ["--kv-cache-dtype", "fp8"]
    elif p.kv_cache not in DTYPE_FLAG:
        notes.append(f"vLLM has no {p.kv_cache.value} KV cache; the simulation assumed one")
    return argv, notes


BLOCK_SIZES = frozenset({1, 8, 16, 32, 64, 128, 256})
"""``--block-size`` values vLLM's CLI accepts (``CacheConfig.BlockSize``, 0.11-0.16)."""


def _scheduler(group: ReplicaGroup) -> tuple[list[str], list[str]]:
    s, policy = group.settings, group.policy
    argv = ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",
            "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
            "--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    notes: list[str] = []
    if s.block_size in BLOCK_SIZES:
        argv += ["--block-size", str(s.block_size)]
    else:  # a hybrid model's block, which vLLM raises to itself and its CLI would refuse
        notes.append(f"vLLM raises this hybrid model's KV block to {s.block_size} tokens itself "
                     "(attention page >= state page), as simulated; no --block-size flag")
    argv += ["--enable-chunked-prefill" if policy.cls.chunks_prefills else "--no-enable-chunked-prefill",
             "--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching"]
    if s.num_gpu_blocks is not None:
        argv += ["--num-gpu-blocks-override", str(s.num_gpu_blocks)]
    options = policy.options
    if policy.name == "priority":
        argv += ["--scheduling-policy", "priority"]
        mode = str(getattr(options, "preemption_mode", "recompute"))
        argv += ["--preemption-mode", mode]
        if mode == "swap":
            argv += ["--swap-space", f"{getattr(options, 'swap_space_gib', 4):g}"]
        notes.append("requests carry their priority in the request body (lower is served first)")
    elif policy.name == "sjf":
        notes.append("simulated shortest-job-first admission: vLLM has no such scheduler (it serves "
                     "FCFS), so expect the FCFS latencies of policy continuous")
    elif policy.name == "static":
        notes.append("simulated request-level (static) batching, which vLLM does not do: vLLM will "
                     "batch continuously and beat the simulated latencies")
    elif str(getattr(options, "order", "prefill_first")) == "decode_first":
        notes.append("simulated TGI's decode-first admission; vLLM admits prefill first")
    if group.engine.name == "vllm-v0" and s.watermark is not None and abs(s.watermark - 0.01) > 1e-12:
        notes.append(f"simulated a KV watermark of {s.watermark:g}; vLLM V0 keeps 0.01 (no flag)")
    return argv, notes


def group_command(group: ReplicaGroup, topology: Topology, model: str, role: str,
                  extra: list[str] | None = None) -> ServerCommand:
    """``vllm serve`` for every replica of ``group``."""
    argv = ["vllm", "serve", model]
    notes: list[str] = []
    for part in (_parallelism, _precision, _scheduler):
        flags, more = part(group)
        argv += flags
        notes += more
    argv += extra or []
    engine = topology.engine
    if engine.name == "vllm" and group.runtime.overlap != async_by_default(engine.version):
        # async scheduling as simulated, where it is not the release's default (on from 0.14)
        argv.append("--async-scheduling" if group.runtime.overlap else "--no-async-scheduling")
    if not engine.name.startswith("vllm"):
        notes.append(f"simulated with engine {engine.name} {engine.version}; these are its settings in "
                     "vLLM's names")
    return ServerCommand(role, group.replicas, group.parallelism.gpus_per_replica, group.hardware.name,
                         tuple(argv), ENGINE_ENV.get(engine.name, ()), tuple(notes))


def vllm_launch(topology: Topology, router: str, model: str) -> LaunchConfig:
    """The vLLM fleet of ``topology``: replicas behind a load balancer, or prefill and decode
    servers joined by a KV connector (vLLM V0's PyNccl connector for ``vllm-v0``, NIXL for V1)."""
    if len(topology.groups) == 1:
        group = topology.groups[0]
        return LaunchConfig("vllm", (group_command(group, topology, model, "replica"),),
                            routing_text(router, group.replicas))
    prefill, decode = topology.groups[0], topology.groups[-1]
    servers = []
    for group, role, rank in ((prefill, "kv_producer", 0), (decode, "kv_consumer", 1)):
        if topology.engine.name == "vllm-v0":
            connector = {"kv_connector": "PyNcclConnector", "kv_role": role, "kv_rank": rank,
                         "kv_parallel_size": 2}
        else:
            connector = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        extra = ["--kv-transfer-config", json.dumps(connector, separators=(",", ":"))]
        servers.append(group_command(group, topology, model, group.name, extra))
    link = "; ".join(topology.describe_links())
    routing = (f"{routing_text(router, prefill.replicas)} over the prefill servers; a proxy sends each "
               "prefilled request on to a decode server (vLLM's disaggregated-prefill proxy example)")
    notes = [f"simulated {link}" if link else ""]
    if topology.engine.name == "vllm-v0":
        notes.append("vLLM V0's PyNcclConnector joins one prefill and one decode server "
                     "(kv_parallel_size 2): give each pair its own kv_port"
                     + ("" if prefill.replicas == decode.replicas else
                        f"; a {prefill.replicas}:{decode.replicas} split needs vLLM V1's NixlConnector "
                        "(kv_role kv_both) instead"))
    return LaunchConfig("vllm", tuple(servers), routing, notes=tuple(n for n in notes if n))
