"""The SGLang fleet of a resolved topology: one ``python -m sglang.launch_server`` per group.

SGLang names the same settings differently (its server arguments,
https://docs.sglang.io/docs/advanced_features/server_arguments): ``--tp-size``,
``--max-running-requests`` (vLLM's max_num_seqs), ``--chunked-prefill-size`` (the step's token
budget when prefills are chunked; ``-1`` turns chunking off), ``--max-prefill-tokens`` (a
prefill batch's tokens), ``--context-length``, ``--page-size`` (tokens per KV block),
``--disable-radix-cache`` (prefix caching off) and ``--max-total-tokens`` (a fixed KV pool).

Memory is split differently: SGLang's ``--mem-fraction-static`` is the share of GPU memory for
the weights and the KV pool together (activations live outside it), where vLLM's
gpu_memory_utilization also covers activations. The fraction written is the simulated memory
plan's (weights + KV pool) / HBM, so the KV pool comes out the size that was simulated.

Disaggregated groups run with ``--disaggregation-mode prefill|decode`` and SGLang's router in
PD mode (https://docs.sglang.io/docs/advanced_features/pd_disaggregation).
"""

from __future__ import annotations

from collections.abc import Callable

from servesim.dtypes import DType
from servesim.launch.command import LaunchConfig, ServerCommand, parallelism_argv
from servesim.launch.routing import SGLANG_ROUTER_POLICY, routing_text
from servesim.parallelism import Parallelism
from servesim.topology.base import Topology
from servesim.topology.group import ReplicaGroup

PARALLELISM_FLAGS: dict[str, Callable[[int], list[str]]] = {
    "tp": lambda n: ["--tp-size", str(n)],
    "pp": lambda n: ["--pp-size", str(n)],
    "dp": lambda n: ["--dp-size", str(n), "--enable-dp-attention"] if n > 1 else [],
    "ep": lambda n: ["--ep-size", str(n)] if n > 1 else [],
}
"""servesim's parallelism keys -> SGLang's server arguments. servesim's ``dp`` is data-parallel
attention inside one replica, which SGLang runs as ``--enable-dp-attention`` with ``--dp-size``
ranks over a ``--tp-size`` that counts every GPU of the stage (:func:`sglang_degrees`); a bare
``--dp-size`` would start independent replicas instead."""


def sglang_degrees(parallelism: Parallelism) -> dict[str, int]:
    """A layout's degrees as SGLang counts them: its ``--tp-size`` is every GPU of the stage
    (``tp x dp``: the attention ranks share them, and the MoE layers span them, ``--ep-size``
    dividing it)."""
    return {**parallelism.describe(), "tp": parallelism.stage_gpus}


DTYPE_FLAG = {DType.BF16: "bfloat16", DType.FP16: "float16"}


def mem_fraction_static(group: ReplicaGroup) -> float:
    """(runtime reserve + weights + KV pool) / HBM of the simulated memory plan, rounded down to
    0.001: SGLang's KV pool is the memory free after loading (the reserve and the weights gone)
    less the total times one minus the fraction, so this fraction gives it the simulated size."""
    m = group.memory
    return int(1000 * (m.reserved_bytes + m.weight_bytes + m.kv_cache_bytes) / m.capacity_bytes) / 1000


def _group_argv(group: ReplicaGroup) -> tuple[list[str], list[str]]:
    s, policy, p = group.settings, group.policy, group.precision
    argv, notes = parallelism_argv(sglang_degrees(group.parallelism), PARALLELISM_FLAGS,
                                   "servesim.launch.sglang")
    if p.activation in DTYPE_FLAG:
        argv += ["--dtype", DTYPE_FLAG[p.activation]]
    if p.weight is DType.FP8 or p.activation is DType.FP8:
        argv += ["--quantization", "fp8"]
    elif p.weight in (DType.INT4, DType.INT8):
        notes.append(f"simulated {p.weight.value} weights: serve a quantised checkpoint (AWQ/GPTQ for "
                     "int4, W8A8 for int8); SGLang reads the method from it")
    if p.kv_cache is DType.FP8:
        argv += ["--kv-cache-dtype", "fp8_e4m3"]
    argv += ["--mem-fraction-static", f"{mem_fraction_static(group):g}",
             "--context-length", str(s.max_model_len), "--max-running-requests", str(s.max_num_seqs)]
    if group.engine.hybrid_block_size(group.model, group.parallelism.tp, p.kv_bytes) == s.block_size:
        notes.append(f"the simulated {s.block_size}-token KV block is vLLM's for this hybrid model; "
                     "SGLang keeps the state in a pool of its own and its own page size")
    else:
        argv += ["--page-size", str(s.block_size)]
    budget = str(s.max_num_batched_tokens)
    if policy.cls.chunks_prefills:
        argv += ["--chunked-prefill-size", budget, "--max-prefill-tokens", budget]
    else:
        argv += ["--chunked-prefill-size", "-1", "--max-prefill-tokens", budget]
    argv += ["--schedule-policy", "fcfs"]
    if not s.enable_prefix_caching:
        argv.append("--disable-radix-cache")
    if s.num_gpu_blocks is not None:
        argv += ["--max-total-tokens", str(group.limits.num_blocks * group.limits.block_size)]
    if policy.name in ("priority", "sjf", "static"):
        notes.append(f"simulated policy {policy.name}; SGLang's --schedule-policy has no equivalent "
                     "(fcfs written), so expect different latencies")
    notes.append("SGLang schedules differently from the simulated engine (it mixes prefill and decode "
                 "work in its own way); the limits above are the simulated ones")
    return argv, notes


def sglang_launch(topology: Topology, router: str, model: str) -> LaunchConfig:
    """The SGLang fleet of ``topology``, with SGLang's router where it has the simulated policy."""
    base = ["python", "-m", "sglang.launch_server", "--model-path", model]
    if len(topology.groups) == 1:
        group = topology.groups[0]
        argv, notes = _group_argv(group)
        server = ServerCommand("replica", group.replicas, group.parallelism.gpus_per_replica,
                               group.hardware.name, (*base, *argv), notes=tuple(notes))
        router_argv: tuple[str, ...] = ()
        if group.replicas > 1 and router in SGLANG_ROUTER_POLICY:
            router_argv = ("python", "-m", "sglang_router.launch_router", "--worker-urls",
                           "http://SERVER_1:30000", "...", "--policy", SGLANG_ROUTER_POLICY[router])
        return LaunchConfig("sglang", (server,), routing_text(router, group.replicas), router_argv)
    servers = []
    for group in (topology.groups[0], topology.groups[-1]):
        argv, notes = _group_argv(group)
        argv += ["--disaggregation-mode", group.name, "--disaggregation-transfer-backend", "nixl"]
        servers.append(ServerCommand(group.name, group.replicas, group.parallelism.gpus_per_replica,
                                     group.hardware.name, (*base, *argv), notes=tuple(notes)))
    router_argv = ("python", "-m", "sglang_router.launch_router", "--pd-disaggregation",
                   "--prefill", "http://PREFILL_1:30000", "--decode", "http://DECODE_1:30001")
    return LaunchConfig("sglang", tuple(servers), "SGLang's router in PD mode sends each request to a "
                        "prefill and a decode server", router_argv)
