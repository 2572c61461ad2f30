"""The TensorRT-LLM fleet of a resolved topology: one ``trtllm-serve`` per replica.

``trtllm-serve`` (PyTorch backend) takes the parallelism and the limits as flags: ``--tp_size``,
``--pp_size``, ``--ep_size`` (the MoE layers' expert-parallel size), ``--max_batch_size``
(vLLM's max_num_seqs), ``--max_num_tokens`` (the step's token budget), ``--max_seq_len`` and
``--kv_cache_free_gpu_memory_fraction``; the rest goes in the YAML its
``--extra_llm_api_options`` reads (``enable_attention_dp``, ``kv_cache_config``,
``enable_chunked_prefill``, ``cuda_graph_config``), written beside the command. Flag names:
TensorRT-LLM's ``trtllm-serve`` reference (nvidia.github.io/TensorRT-LLM, commands/trtllm-serve).

With data-parallel attention TensorRT-LLM counts every GPU of the stage in ``--tp_size`` and sets
``enable_attention_dp``; its MoE layers then run ``--ep_size`` expert groups of ``tp_size /
ep_size`` GPUs (``moe_tensor_parallel_size``), as servesim's ``ep`` with ``Engine.hybrid_experts``.

Memory: TensorRT-LLM's fraction is of the memory free once the weights and the workspace are
loaded (``servesim.memory``'s ``free_after_load``), so the fraction written is the simulated KV
pool (and any recurrent state) over that free memory, whichever engine was simulated.
"""

from __future__ import annotations

from servesim.dtypes import DType
from servesim.launch.command import LaunchConfig, ServerCommand
from servesim.launch.routing import routing_text
from servesim.topology.base import Topology
from servesim.topology.group import ReplicaGroup

EXTRA_OPTIONS = "extra-llm-api-options.yaml"
"""The file each command's YAML is written to (one per distinct group, suffixed by its role)."""


def free_memory_fraction(group: ReplicaGroup) -> float:
    """(KV pool + recurrent state) / the memory free after the reserve, the weights and the
    activation workspace: TensorRT-LLM's ``free_gpu_memory_fraction`` that gives the simulated
    pool, rounded down to 0.001."""
    m = group.memory
    free = m.capacity_bytes - m.reserved_bytes - m.weight_bytes - m.activation_bytes
    return int(1000 * min(1.0, (m.kv_cache_bytes + m.state_bytes) / free)) / 1000


def _degrees(group: ReplicaGroup) -> tuple[list[str], dict[str, object]]:
    """Parallelism flags and the YAML keys it needs."""
    p = group.parallelism
    argv = ["--tp_size", str(p.stage_gpus), "--pp_size", str(p.pp)]
    if p.ep > 1:
        argv += ["--ep_size", str(p.ep)]
    options: dict[str, object] = {"enable_attention_dp": True} if p.dp > 1 else {}
    return argv, options


def _group_command(group: ReplicaGroup, model: str, role: str, path: str) -> ServerCommand:
    s, policy, p = group.settings, group.policy, group.precision
    argv, options = _degrees(group)
    notes: list[str] = []
    argv = ["trtllm-serve", model, "--backend", "pytorch", *argv,
            "--max_batch_size", str(group.limits.max_num_seqs),
            "--max_num_tokens", str(group.limits.max_num_batched_tokens),
            "--max_seq_len", str(s.max_model_len),
            "--kv_cache_free_gpu_memory_fraction", f"{free_memory_fraction(group):g}"]
    kv_config: dict[str, object] = {"enable_block_reuse": bool(s.enable_prefix_caching),
                                    "tokens_per_block": s.block_size}
    if p.kv_cache is DType.FP8:
        kv_config["dtype"] = "fp8"
    options["kv_cache_config"] = kv_config
    options["enable_chunked_prefill"] = bool(policy.cls.chunks_prefills)
    sizes = [b for b in group.runtime.cuda_graph_sizes if b <= group.limits.max_num_seqs]
    if sizes:
        options["cuda_graph_config"] = {"batch_sizes": sizes}
    if p.weight is not DType.BF16 and p.weight is not DType.FP16:
        notes.append(f"simulated {p.weight.value} weights: TensorRT-LLM's PyTorch backend serves a "
                     "pre-quantised checkpoint (ModelOpt FP8 / NVFP4, or AWQ/GPTQ for int4); pass that "
                     "as the model")
    if group.engine.name != "trtllm":
        notes.append(f"simulated with engine {group.engine.name} {group.engine.version}; these are its "
                     "settings in TensorRT-LLM's names, and TensorRT-LLM schedules its own way")
    argv += ["--extra_llm_api_options", path]
    return ServerCommand(role, group.replicas, group.parallelism.gpus_per_replica, group.hardware.name,
                         tuple(argv), notes=tuple(notes), files=((path, _yaml(options)),))


def _yaml(options: dict[str, object]) -> str:
    import yaml

    return yaml.safe_dump(options, sort_keys=False, default_flow_style=None).rstrip("\n")


def trtllm_launch(topology: Topology, router: str, model: str) -> LaunchConfig:
    """The TensorRT-LLM fleet of ``topology``: replicas behind a load balancer, or its prefill
    and decode servers (``trtllm-serve disaggregated`` joins them; its config is not written)."""
    if len(topology.groups) == 1:
        group = topology.groups[0]
        return LaunchConfig("trtllm", (_group_command(group, model, "replica", EXTRA_OPTIONS),),
                            routing_text(router, group.replicas))
    servers = tuple(_group_command(group, model, group.name, f"{group.name}-{EXTRA_OPTIONS}")
                    for group in (topology.groups[0], topology.groups[-1]))
    return LaunchConfig("trtllm", servers, "trtllm-serve disaggregated sends each request to a context "
                        "(prefill) and a generation (decode) server",
                        notes=("write trtllm-serve disaggregated's config (context_servers, "
                               "generation_servers, their URLs) and add cache_transceiver_config to "
                               "each server's YAML; not generated here",))
