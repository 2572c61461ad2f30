"""Launch configurations: every engine argument the simulation ran with appears as the flag the
engine reads it from, and the commands quote back to the exact argument vectors."""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml

from servesim.config import validate_document
from servesim.launch import launch_plans
from servesim.resources import model_configs_dir
from servesim.topology.resolve import resolve_topology


def experiment(**deployment: Any) -> dict[str, Any]:
    return {"model": "llama-3-8b", "hardware": "h100-sxm-80gb", "engine": "vllm-v0",
            "deployment": {"tp": 2, "replicas": 3, **deployment},
            "workload": {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 10,
                         "lengths": {"preset": "azure-conversation"}}}


def plans(document: dict[str, Any], router: str = "round_robin") -> dict[str, Any]:
    config = validate_document(document)
    return launch_plans(resolve_topology(config), router, config.model)


def flags(argv: tuple[str, ...]) -> dict[str, str | None]:
    """``--flag value`` pairs (a bare flag maps to None)."""
    out: dict[str, str | None] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[arg] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def unquote(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "))


def test_vllm_flags_are_the_simulated_engine_arguments() -> None:
    doc = experiment(max_num_seqs=128, max_num_batched_tokens=4096, gpu_memory_utilization=0.85,
                     enable_prefix_caching=True, num_gpu_blocks=5000)
    doc["policy"] = {"name": "chunked_prefill"}
    doc["precision"] = {"kv_cache": "fp8"}
    server = plans(doc)["vllm"].servers[0]
    assert server.argv[:3] == ("vllm", "serve", "meta-llama/Meta-Llama-3-8B")
    assert (server.copies, server.gpus_each, server.hardware) == (3, 2, "h100-sxm-80gb")
    assert flags(server.argv) == {
        "--tensor-parallel-size": "2", "--dtype": "bfloat16", "--kv-cache-dtype": "fp8",
        "--gpu-memory-utilization": "0.85", "--max-model-len": "8192", "--max-num-seqs": "128",
        "--max-num-batched-tokens": "4096", "--block-size": "16", "--enable-chunked-prefill": None,
        "--enable-prefix-caching": None, "--num-gpu-blocks-override": "5000"}
    assert dict(server.env) == {"VLLM_USE_V1": "0"}
    assert unquote(server.shell()) == ["VLLM_USE_V1=0", *server.argv]


def test_a_hybrid_models_raised_block_is_left_to_vllm() -> None:
    """vLLM raises a hybrid model's KV block itself (1,056 tokens for Qwen3.5-35B on one GPU), and
    its CLI accepts only block sizes up to 256: the command leaves the flag out and says why."""
    doc = {**experiment(tp=1, replicas=1, max_model_len=8192), "model": "qwen3.5-35b-a3b",
           "hardware": "h200-sxm-141gb", "engine": "vllm"}
    server = plans(doc)["vllm"].servers[0]
    assert "--block-size" not in flags(server.argv)
    assert any("raises this hybrid model's KV block to 1056 tokens" in note for note in server.notes)
    sglang = plans(doc)["sglang"].servers[0]  # nor is it SGLang's page
    assert "--page-size" not in flags(sglang.argv)
    assert any("1056-token KV block is vLLM's" in note for note in sglang.notes)


def test_async_scheduling_is_written_where_it_is_not_the_release_default() -> None:
    """vLLM schedules asynchronously by default from 0.14: the command says so only where the
    simulation ran otherwise."""
    def argv(engine: dict[str, Any]) -> tuple[str, ...]:
        return plans({**experiment(), "engine": {"name": "vllm", **engine}})["vllm"].servers[0].argv

    assert not {"--async-scheduling", "--no-async-scheduling"} & set(argv({}) + argv({"version": "0.12"}))
    assert argv({"async_scheduling": False})[-1] == "--no-async-scheduling"
    assert argv({"version": "0.12", "async_scheduling": True})[-1] == "--async-scheduling"


def test_priority_swap_and_unmodelled_policies_become_flags_or_notes() -> None:
    doc = experiment()
    doc["policy"] = {"name": "priority", "preemption_mode": "swap", "swap_space_gib": 8}
    argv = plans(doc)["vllm"].servers[0].argv
    assert flags(argv)["--scheduling-policy"] == "priority"
    assert flags(argv)["--preemption-mode"] == "swap" and flags(argv)["--swap-space"] == "8"
    assert "--no-enable-chunked-prefill" in argv and "--no-enable-prefix-caching" in argv
    doc["policy"] = {"name": "sjf"}
    vllm = plans(doc)["vllm"].servers[0]
    assert "--scheduling-policy" not in vllm.argv
    assert any("shortest-job-first" in note for note in vllm.notes)


def test_sglang_names_and_the_static_memory_fraction_by_hand() -> None:
    """--mem-fraction-static = (runtime reserve + weights + KV pool) / HBM of the simulated memory
    plan, so SGLang's KV pool (free memory after loading, less the total times one minus the
    fraction) comes out the size that was simulated."""
    config = validate_document(experiment(max_num_seqs=64))
    topology = resolve_topology(config)
    memory = topology.groups[0].memory
    server = launch_plans(topology, "prefix_affinity", config.model)["sglang"]
    argv = flags(server.servers[0].argv)
    expected = int(1000 * (memory.reserved_bytes + memory.weight_bytes + memory.kv_cache_bytes)
                   / memory.capacity_bytes) / 1000
    assert 0.8 < expected < 0.9
    assert argv["--mem-fraction-static"] == f"{expected:g}"
    assert argv["--tp-size"] == "2" and argv["--max-running-requests"] == "64"
    assert argv["--context-length"] == "8192" and argv["--page-size"] == "16"
    assert argv["--chunked-prefill-size"] == "-1" and argv["--max-prefill-tokens"] == "8192"
    assert "--disable-radix-cache" in argv and argv["--model-path"] == "meta-llama/Meta-Llama-3-8B"
    assert server.router_argv[-2:] == ("--policy", "cache_aware")


def test_data_parallel_attention_is_sglangs_dp_attention_over_every_gpu() -> None:
    """servesim's dp is attention DP inside one replica: SGLang runs it as --enable-dp-attention
    with --tp-size counting all of the stage's GPUs (a bare --dp-size would start 8 one-GPU
    replicas), and its --ep-size divides that; vLLM's --data-parallel-size with
    --enable-expert-parallel is the same layout."""
    doc = {**experiment(tp=1, dp=8, ep=8, replicas=1), "model": "deepseek-v3", "hardware": "h200-sxm-141gb",
           "precision": {"weights": "fp8", "activations": "fp8"}}
    launch = plans(doc)
    sglang = flags(launch["sglang"].servers[0].argv)
    assert (sglang["--tp-size"], sglang["--dp-size"], sglang["--ep-size"]) == ("8", "8", "8")
    assert "--enable-dp-attention" in sglang and sglang["--enable-dp-attention"] is None
    assert launch["sglang"].servers[0].gpus_each == 8
    vllm = flags(launch["vllm"].servers[0].argv)
    assert (vllm["--tensor-parallel-size"], vllm["--data-parallel-size"]) == ("1", "8")
    assert "--enable-expert-parallel" in vllm
    # a hybrid layout (SGLang's --ep-size below --tp-size): 2 attention ranks of TP 4, EP 2
    hybrid = {**doc, "engine": "sglang", "deployment": {"tp": 4, "dp": 2, "ep": 2, "replicas": 1}}
    both = plans(hybrid)
    argv = flags(both["sglang"].servers[0].argv)
    assert (argv["--tp-size"], argv["--dp-size"], argv["--ep-size"]) == ("8", "2", "2")
    assert any("vLLM's --enable-expert-parallel spreads them over all 8" in note
               for note in both["vllm"].servers[0].notes)


def test_trtllm_serve_takes_the_simulated_limits_and_its_options_yaml() -> None:
    """trtllm-serve's flags carry the parallelism and limits; the options YAML written before it
    carries attention DP, the KV cache and the CUDA-graph sizes; its KV fraction is the simulated
    pool over the memory free after loading (TensorRT-LLM's free_gpu_memory_fraction), by hand."""
    doc = {**experiment(tp=1, dp=8, ep=2, replicas=1, max_num_seqs=64), "model": "deepseek-v3",
           "hardware": "h200-sxm-141gb", "engine": "trtllm",
           "precision": {"weights": "fp8", "activations": "fp8", "kv_cache": "fp8"}}
    config = validate_document(doc)
    topology = resolve_topology(config)
    launch = launch_plans(topology, "round_robin", config.model)["trtllm"]
    server = launch.servers[0]
    argv = flags(server.argv)
    assert server.argv[:2] == ("trtllm-serve", "deepseek-ai/DeepSeek-V3")
    assert (argv["--tp_size"], argv["--pp_size"], argv["--ep_size"]) == ("8", "1", "2")
    assert (argv["--max_batch_size"], argv["--backend"]) == ("64", "pytorch")
    m = topology.groups[0].memory
    free = m.capacity_bytes - m.reserved_bytes - m.weight_bytes - m.activation_bytes
    fraction = int(1000 * m.kv_cache_bytes / free) / 1000
    assert argv["--kv_cache_free_gpu_memory_fraction"] == f"{fraction:g}"
    assert 0.5 < fraction <= 0.9  # TensorRT-LLM's default 0.9 of the free memory, as simulated
    path, text = server.files[0]
    assert argv["--extra_llm_api_options"] == path == "extra-llm-api-options.yaml"
    options = yaml.safe_load(text)
    assert options["enable_attention_dp"] is True
    assert options["kv_cache_config"]["dtype"] == "fp8"
    assert options["cuda_graph_config"]["batch_sizes"][:3] == [1, 2, 3]
    assert "pre-quantised checkpoint" in " ".join(server.notes)
    script = launch.text()
    assert f"cat > {path} <<'EOF'" in script and script.index("EOF") < script.index("trtllm-serve")


def test_disaggregated_groups_get_their_kv_roles() -> None:
    doc = experiment()
    doc["deployment"] = {"kind": "disaggregated", "tp": 1, "prefill": {"replicas": 3},
                         "decode": {"replicas": 1, "tp": 2}}
    launch = plans(doc)
    prefill, decode = launch["vllm"].servers
    assert (prefill.role, prefill.copies, prefill.gpus_each) == ("prefill", 3, 1)
    assert (decode.role, decode.copies, decode.gpus_each) == ("decode", 1, 2)
    assert json.loads(flags(prefill.argv)["--kv-transfer-config"] or "")["kv_role"] == "kv_producer"
    assert json.loads(flags(decode.argv)["--kv-transfer-config"] or "")["kv_role"] == "kv_consumer"
    assert launch["vllm"].gpus == 5
    assert any("a 3:1 split needs vLLM V1's NixlConnector" in note for note in launch["vllm"].notes)
    sglang = launch["sglang"]
    assert [flags(s.argv)["--disaggregation-mode"] for s in sglang.servers] == ["prefill", "decode"]
    assert "--pd-disaggregation" in sglang.router_argv


def test_a_local_config_json_serves_its_folder(tmp_path) -> None:
    folder = tmp_path / "my-finetune"
    folder.mkdir()
    source = json.loads((model_configs_dir() / "llama-3-8b.json").read_text())
    source.pop("_servesim")
    (folder / "config.json").write_text(json.dumps(source))
    doc = experiment()
    doc["model"] = str(folder / "config.json")
    assert plans(doc)["vllm"].servers[0].argv[2] == str(folder)
