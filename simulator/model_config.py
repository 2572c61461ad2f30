"""Reading models: a Hugging Face ``config.json`` (a local file or folder), a Hugging Face model
id (``meta-llama/Meta-Llama-3-8B``: from the local cache or downloaded, see
:mod:`servesim.inputs.hf_hub`), or a catalogue name.

The catalogue is ``configs/models/<name>.json``, written from each model's published
architecture in the Hugging Face format, so a user's own fine-tune loads the same way. Keys that
do not affect serving cost are ignored; missing or malformed ones raise a one-line
:class:`~servesim.errors.ServesimError` naming the key.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from servesim.errors import ServesimError
from servesim.inputs.files import file_version, read_json
from servesim.inputs.hf_hub import find_config, looks_like_hf_id
from servesim.model_spec import LinearAttentionSpec, MLASpec, ModelSpec, MoESpec, SparseAttentionSpec
from servesim.resources import model_configs_dir

NON_GATED_FAMILIES = frozenset(
    {"gpt2", "gpt_neox", "opt", "falcon", "gpt_bigcode", "bloom", "phi", "gptj", "starcoder2"})
"""Model types whose MLP is ``down(act(up(x)))``; every other family is gated (SwiGLU-style)."""

QWEN3_5_FAMILIES = frozenset({"qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_text"})
"""Qwen3.5's model types (the multimodal config's and its language model's)."""
QK_NORM_FAMILIES = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "qwen3_next", *QWEN3_5_FAMILIES})
"""Families with a learned RMSNorm over each query and key head (Llama 4's is weightless)."""
SANDWICH_NORM_FAMILIES = frozenset({"gemma2", "gemma3", "gemma3_text"})
"""Families that normalise before and after attention and MLP: four norms per layer."""
NORMS_PER_LAYER = {**dict.fromkeys(SANDWICH_NORM_FAMILIES, 4), "nemotron_h": 1}
"""RMSNorms per layer where not two: sandwich norms (four), Nemotron-H's one per block."""
ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention", "none")
"""``none``: a layer without a token mixer (Nemotron-H's MLP and MoE blocks)."""
NEMOTRON_H_BLOCKS = {"M": "linear_attention", "*": "full_attention", "-": "none", "E": "none"}
"""Nemotron-H's ``hybrid_override_pattern`` characters -> each block's mixer: Mamba2, attention,
or none (an MLP or a MoE block)."""
GATED_ATTENTION_FAMILIES = frozenset({"qwen3_next", *QWEN3_5_FAMILIES})
"""Families whose full-attention layers gate their output (``attn_output_gate``, on by default in
their transformers config classes)."""

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6,
                    "tie_word_embeddings": True},
}
"""Keys a family's published config.json may leave out because transformers' config class supplies
them (Gemma3TextConfig's defaults: google/gemma-3-27b-it lists no vocab_size or sliding pattern)."""


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys of a multimodal config (Llama 4, Gemma 3: ``text_config``), with
    the family's defaults under them; a text-only config as it is."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        merged = {**config, **inner}
        merged.pop("text_config", None)
    else:
        merged = dict(config)
    defaults = FAMILY_DEFAULTS.get(str(merged.get("model_type", "")).lower(), {})
    return {**defaults, **{k: v for k, v in merged.items() if v is not None}}


MAX_DIMENSION = 2**31 - 1
"""Widths, vocabularies and context lengths above this are not a real model's (and would overflow
the cost model's integer arithmetic)."""
MAX_LAYERS = 10_000
"""More layers than this is a typo (the deepest published models have a few hundred)."""
FIX = "fix the value in the config.json"


def _first(config: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> tuple[str, Any]:
    """(the first of ``keys`` the config sets, its value), or (``keys[0]``, ``default``)."""
    for key in keys:
        if config.get(key) is not None:
            return key, config[key]
    return keys[0], default


def _whole(value: Any, key: str, where: str, minimum: int, maximum: int = MAX_DIMENSION) -> int:
    """``value`` as an integer in [minimum, maximum]; JSON true/false, 8.5, "8" and 8.0 are
    errors (a float count would be truncated silently)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        if maximum != MAX_DIMENSION:
            kind = f"a whole number in [{minimum}, {maximum:,}]"
        else:
            kind = "a positive integer" if minimum == 1 else f"a whole number >= {minimum}"
        raise ServesimError(f"{where}: {key}", f"must be {kind}, got {value!r}", FIX)
    return value


def _positive_int(config: dict[str, Any], keys: tuple[str, ...], where: str,
                  default: Any = None, maximum: int = MAX_DIMENSION) -> int:
    key, value = _first(config, keys, default)
    if value is None:
        raise ServesimError(f"{where}: {keys[0]}", "missing",
                            "add it to the config.json (it is in every Hugging Face config)")
    return _whole(value, key, where, 1, maximum)


def _optional_int(config: dict[str, Any], key: str, where: str, minimum: int = 0) -> int | None:
    """An optional count: absent or null is None."""
    value = config.get(key)
    return None if value is None else _whole(value, key, where, minimum)


def _flag(config: dict[str, Any], key: str, where: str, default: bool) -> bool:
    """A JSON boolean; absent or null is ``default``. A string such as ``"false"`` is an error
    (Python would read any non-empty string as true)."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ServesimError(f"{where}: {key}", f"must be true or false, got {value!r}",
                            "write a JSON boolean (true or false, unquoted)")
    return value


QK_NORM_TYPES = {"per_head": False, "per_layer": True}
"""``qk_norm_type`` (MiniMax-M2's config.json) -> whether the norm spans all heads."""


def _qk_norm(config: dict[str, Any], model_type: str, where: str) -> tuple[bool, bool]:
    """(has a QK-norm with weights, spans all heads): the families that always have one per head
    (Qwen3, Gemma 3), or a config that names its ``qk_norm_type`` (MiniMax-M2) and sets
    ``use_qk_norm``. Llama 4's ``use_qk_norm`` is a weightless L2 norm per head, not priced."""
    if "qk_norm_type" not in config:
        return model_type in QK_NORM_FAMILIES, False
    used = _flag(config, "use_qk_norm", where, True)
    kind = config["qk_norm_type"]
    if kind not in QK_NORM_TYPES:
        raise ServesimError(f"{where}: qk_norm_type", f"unknown QK-norm type {kind!r}",
                            "use per_head (one norm per head) or per_layer (one over all heads)")
    return used, used and QK_NORM_TYPES[kind]


def _extension(config: dict[str, Any], where: str) -> dict[str, Any]:
    """servesim's own block in a config.json (``_servesim: {gated_mlp, source}``)."""
    extra = config.get("_servesim")
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ServesimError(f"{where}: _servesim", f"must be a JSON object, got {extra!r}",
                            'write e.g. "_servesim": {"gated_mlp": true, "source": "..."}')
    return extra


def _layer_list(config: dict[str, Any], key: str, layers: int, where: str) -> list[int]:
    """A list of layer indices (``moe_layers``, ``mlp_only_layers``), each in range."""
    value = config.get(key) or []
    if not isinstance(value, list):
        raise ServesimError(f"{where}: {key}", f"must be a list of layer indices, got {value!r}", FIX)
    return [_whole(i, key, where, 0, layers - 1) for i in value]


def _moe_layer_indices(config: dict[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """Which layers are MoE, by each family's rule as its Hugging Face modelling code applies it:
    Llama 4 ``moe_layers``, else every ``interleave_moe_layer_step``-th layer counting from
    ``step - 1``; Qwen-MoE ``(i + 1) % decoder_sparse_step == 0`` minus ``mlp_only_layers``;
    DeepSeek ``i >= first_k_dense_replace and i % moe_layer_freq == 0``; Mixtral, gpt-oss every
    layer."""
    if isinstance(config.get("moe_layers"), list):
        return tuple(sorted(set(_layer_list(config, "moe_layers", layers, where))))
    interleave = _optional_int(config, "interleave_moe_layer_step", where, minimum=1)
    if interleave:
        return tuple(range(interleave - 1, layers, interleave))
    step = _optional_int(config, "decoder_sparse_step", where, minimum=1)
    if step:
        dense = set(_layer_list(config, "mlp_only_layers", layers, where))
        return tuple(i for i in range(layers) if (i + 1) % step == 0 and i not in dense)
    first = _optional_int(config, "first_k_dense_replace", where) or 0
    freq = _optional_int(config, "moe_layer_freq", where, minimum=1) or 1
    return tuple(i for i in range(layers) if i >= first and i % freq == 0)


def _sliding_window(config: dict[str, Any], max_context: int, where: str) -> int | None:
    """The attention window, or None for full attention (unset, null, 0, switched off with
    ``use_sliding_window: false``, or no narrower than the context)."""
    use = _flag(config, "use_sliding_window", where, True)
    window = config.get("sliding_window")
    if window is None or (window == 0 and not isinstance(window, bool)):
        return None
    window = _whole(window, "sliding_window", where, 1)
    return window if use and window < max_context else None


def _layer_types(config: dict[str, Any], layers: int, window: int | None, where: str) -> tuple[str, ...]:
    """Each layer's attention: Hugging Face's ``layer_types`` list (gpt-oss, Gemma 3, Qwen 3), Gemma
    3's older ``sliding_window_pattern`` (every n-th layer global), or Llama 4's chunked layers
    (``attention_chunk_size``; the NoPE layers, ``no_rope_layers`` 0 or every
    ``no_rope_layer_interval``-th, attend globally). Empty when every layer attends alike."""
    kinds: list[str] | None = None
    given = config.get("layer_types")
    if given is None and config.get("linear_num_value_heads") and config.get("full_attention_interval"):
        # Qwen3-Next's config.json lists no layer_types: every interval-th layer attends fully
        interval = _whole(config["full_attention_interval"], "full_attention_interval", where, 1)
        given = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if given is not None:
        if not isinstance(given, list) or len(given) != layers:
            raise ServesimError(f"{where}: layer_types", f"must list one type per layer ({layers})",
                                "fix the config.json")
        unknown = sorted({str(k) for k in given} - set(ATTENTION_TYPES))
        if unknown:
            raise ServesimError(f"{where}: layer_types", f"{', '.join(unknown)} is not modelled",
                                f"use {', '.join(ATTENTION_TYPES)}")
        kinds = [str(k) for k in given]
    elif config.get("sliding_window_pattern") and window:
        pattern = _whole(config["sliding_window_pattern"], "sliding_window_pattern", where, 1)
        kinds = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    elif config.get("attention_chunk_size"):
        rope = config.get("no_rope_layers")
        if not isinstance(rope, list) or len(rope) != layers:
            interval = _optional_int(config, "no_rope_layer_interval", where, minimum=1) or 4
            rope = [int((i + 1) % interval != 0) for i in range(layers)]
        kinds = ["chunked_attention" if r else "full_attention" for r in rope]
    if kinds is None:
        return ()
    if "linear_attention" in kinds and not config.get("linear_num_value_heads"):
        raise ServesimError(f"{where}: linear_num_value_heads", "layer_types has linear-attention layers "
                            "but no linear_* shapes", "add linear_num_key_heads, linear_num_value_heads, "
                            "linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim")
    if "sliding_attention" in kinds and not window:
        raise ServesimError(f"{where}: sliding_window", "layer_types has sliding layers but no window",
                            "add sliding_window to the config.json")
    uniform = "sliding_attention" if window else "full_attention"
    return () if all(kind == uniform for kind in kinds) else tuple(kinds)


SSM_STATE_BYTES = {"float32": 4.0, "fp32": 4.0, "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0}
FP32_STATE_FAMILIES = QWEN3_5_FAMILIES
"""Families whose transformers config class defaults ``mamba_ssm_dtype`` to float32 (Qwen3.5)."""


def _ssm_state_bytes(config: dict[str, Any], model_type: str, where: str) -> float:
    """Bytes per element of a linear-attention layer's state: ``mamba_ssm_dtype`` (Nemotron-H's
    ``mamba_ssm_cache_dtype``; its family's default where the config.json leaves it out: float32
    for Qwen3.5), else 16-bit."""
    value = config.get("mamba_ssm_dtype") or config.get("mamba_ssm_cache_dtype") \
        or ("float32" if model_type in FP32_STATE_FAMILIES else "bfloat16")
    if str(value).lower() not in SSM_STATE_BYTES:
        raise ServesimError(f"{where}: mamba_ssm_dtype", f"{value!r} is not a state dtype",
                            f"use one of {', '.join(SSM_STATE_BYTES)}")
    return SSM_STATE_BYTES[str(value).lower()]


def _nemotron_h(config: dict[str, Any], where: str) -> tuple[dict[str, Any], tuple[int, ...]]:
    """A Nemotron-H config.json in the keys the rest of the reader takes, and its mixer-only
    blocks. Each of its ``num_hidden_layers`` blocks is one character of
    ``hybrid_override_pattern`` (:data:`NEMOTRON_H_BLOCKS`): Mamba2 blocks read as linear-attention
    layers (``n_groups`` key heads of ``ssm_state_size``, ``mamba_num_heads`` value heads of
    ``mamba_head_dim``), ``E`` blocks are the MoE layers (with the shared expert of
    ``moe_shared_expert_intermediate_size``), ``-`` blocks dense MLPs; ``M`` and ``*`` blocks have no
    MLP. Its MLPs are ``down(relu(up(x))^2)``: not gated. One RMSNorm per block."""
    pattern = config.get("hybrid_override_pattern")
    layers = config.get("num_hidden_layers")
    if not isinstance(pattern, str) or not isinstance(layers, int) or len(pattern) != layers:
        raise ServesimError(f"{where}: hybrid_override_pattern",
                            f"must have one character per layer ({layers}), got {pattern!r}",
                            "fix the config.json")
    unknown = sorted(set(pattern) - set(NEMOTRON_H_BLOCKS))
    if unknown:
        raise ServesimError(f"{where}: hybrid_override_pattern", f"block type {unknown[0]!r} is not modelled",
                            f"use {', '.join(NEMOTRON_H_BLOCKS)} (Mamba2, attention, MLP, MoE)")
    if config.get("moe_latent_size"):
        raise ServesimError(f"{where}: moe_latent_size", "latent MoE (experts on a compressed projection, "
                            "Nemotron-3-Super) is not modelled", "use a Nemotron-H model without it")
    translated = {**config, "layer_types": [NEMOTRON_H_BLOCKS[c] for c in pattern],
                  "moe_layers": [i for i, c in enumerate(pattern) if c == "E"]}
    if "M" in pattern:  # its own key names in the errors, read before they are translated
        heads = _positive_int(config, ("mamba_num_heads",), where)
        groups = _positive_int(config, ("n_groups",), where)
        if heads % groups:
            raise ServesimError(f"{where}: mamba_num_heads",
                                f"{heads} is not a multiple of n_groups={groups}", "fix the config.json")
        translated.update(linear_num_key_heads=groups, linear_num_value_heads=heads,
                          linear_key_head_dim=_positive_int(config, ("ssm_state_size",), where),
                          linear_value_head_dim=_positive_int(config, ("mamba_head_dim",), where),
                          linear_conv_kernel_dim=_positive_int(config, ("conv_kernel",), where, 4))
    if config.get("moe_shared_expert_intermediate_size") is not None:
        translated["shared_expert_intermediate_size"] = config["moe_shared_expert_intermediate_size"]
    if "E" not in pattern:
        for key in ("n_routed_experts", "num_experts", "num_local_experts"):
            translated.pop(key, None)
    return translated, tuple(i for i, c in enumerate(pattern) if c in "M*")


def model_from_hf_config(config: dict[str, Any], name: str, where: str = "model") -> ModelSpec:
    """Build a :class:`ModelSpec` from the dict of a Hugging Face ``config.json`` (a multimodal
    config is read for its language model, ``text_config``)."""
    if not isinstance(config, dict):
        raise ServesimError(where, "config.json must hold a JSON object", "check the file")
    config = text_config(config)
    model_type = str(config.get("model_type", "")).lower()
    ffn_free: tuple[int, ...] = ()
    if model_type == "nemotron_h":
        config, ffn_free = _nemotron_h(config, where)
    extra = _extension(config, where)
    hidden = _positive_int(config, ("hidden_size", "n_embd", "d_model"), where)
    layers = _positive_int(config, ("num_hidden_layers", "n_layer", "num_layers"), where,
                           maximum=MAX_LAYERS)
    heads = _positive_int(config, ("num_attention_heads", "n_head", "num_heads"), where)
    kv_heads = _positive_int(config, ("num_key_value_heads", "num_kv_heads"), where, heads)
    head_dim = _positive_int(config, ("head_dim",), where, max(1, hidden // heads))
    intermediate = _positive_int(config, ("intermediate_size", "ffn_dim", "n_inner"), where,
                                 4 * hidden)
    # Llama 4: intermediate_size is the experts' (and shared expert's), the dense layers' is _mlp
    dense_intermediate = _positive_int(config, ("intermediate_size_mlp",), where, intermediate)
    vocab = _positive_int(config, ("vocab_size",), where)
    max_context = _positive_int(
        config, ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"),
        where, 4096)
    if heads % kv_heads:
        raise ServesimError(f"{where}: num_key_value_heads",
                            f"{kv_heads} does not divide num_attention_heads={heads}",
                            "fix the config.json")

    moe = None
    experts_key, num_experts = _first(config, ("num_local_experts", "n_routed_experts", "num_experts"))
    if num_experts is not None and num_experts != 0:
        num_experts = _whole(num_experts, experts_key, where, 1)
        top_k = _positive_int(config, ("num_experts_per_tok", "moe_top_k", "experts_per_token"), where)
        expert_i = _positive_int(config, ("moe_intermediate_size",), where, intermediate)
        shared_i = (_optional_int(config, "n_shared_experts", where) or 0) * expert_i
        shared_i = _optional_int(config, "shared_expert_intermediate_size", where) or shared_i
        if model_type.startswith("llama4"):
            shared_i = intermediate  # every Llama 4 MoE layer has one shared expert
        if top_k > num_experts:
            raise ServesimError(f"{where}: num_experts_per_tok",
                                f"{top_k} exceeds the {num_experts} experts", "fix the config.json")
        moe = MoESpec(num_experts=num_experts, top_k=top_k, expert_intermediate=expert_i,
                      shared_intermediate=shared_i, layers=_moe_layer_indices(config, layers, where))

    mla = None
    if config.get("kv_lora_rank") is not None:
        mla = MLASpec(q_lora_rank=_optional_int(config, "q_lora_rank", where, minimum=1),
                      kv_lora_rank=_positive_int(config, ("kv_lora_rank",), where),
                      qk_nope_head_dim=_positive_int(config, ("qk_nope_head_dim",), where),
                      qk_rope_head_dim=_positive_int(config, ("qk_rope_head_dim",), where),
                      v_head_dim=_positive_int(config, ("v_head_dim",), where))

    sparse = None
    if config.get("index_topk") is not None:
        if mla is None:
            raise ServesimError(f"{where}: index_topk", "sparse attention (DSA) is modelled over MLA only",
                                "give the MLA keys (kv_lora_rank, ...) or drop index_topk")
        sparse = SparseAttentionSpec(index_heads=_positive_int(config, ("index_n_heads",), where),
                                     index_head_dim=_positive_int(config, ("index_head_dim",), where),
                                     top_k=_positive_int(config, ("index_topk",), where))

    window = _sliding_window(config, max_context, where)
    kinds = _layer_types(config, layers, window, where)
    chunk = (_optional_int(config, "attention_chunk_size", where, minimum=1)
             if "chunked_attention" in kinds else None)
    if window and kinds and "sliding_attention" not in kinds:
        window = None
    gated_default = model_type not in NON_GATED_FAMILIES and str(config.get("mlp_hidden_act", "")) != "relu2"
    gated = _flag(extra, "gated_mlp", f"{where}: _servesim", gated_default)
    sharing = extra.get("cross_layer_kv_sharing", 1)
    if isinstance(sharing, bool) or not isinstance(sharing, int) or not 1 <= sharing <= layers:
        raise ServesimError(f"{where}: _servesim.cross_layer_kv_sharing",
                            f"must be a whole number of layers from 1 to {layers}, got {sharing!r}",
                            "give how many consecutive layers share one KV cache (2 halves it)")
    linear = None
    if "linear_attention" in kinds:
        linear = LinearAttentionSpec(
            num_key_heads=_positive_int(config, ("linear_num_key_heads",), where),
            num_value_heads=_positive_int(config, ("linear_num_value_heads",), where),
            key_head_dim=_positive_int(config, ("linear_key_head_dim",), where),
            value_head_dim=_positive_int(config, ("linear_value_head_dim",), where),
            conv_kernel=_positive_int(config, ("linear_conv_kernel_dim",), where, 4),
            ssm_state_bytes=_ssm_state_bytes(config, model_type, where),
            kind="mamba2" if model_type == "nemotron_h" else "gated_deltanet")
        if linear.num_value_heads % linear.num_key_heads:
            raise ServesimError(f"{where}: linear_num_value_heads",
                                f"{linear.num_value_heads} is not a multiple of linear_num_key_heads="
                                f"{linear.num_key_heads}", "fix the config.json")
    output_gate = _flag(config, "attn_output_gate", where, model_type in GATED_ATTENTION_FAMILIES)
    gpt_oss = model_type == "gpt_oss"
    attention_bias = _flag(config, "attention_bias", where, model_type == "qwen2")
    qk_norm, qk_norm_across_heads = _qk_norm(config, model_type, where)
    return ModelSpec(
        name=name, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=dense_intermediate, vocab_size=vocab,
        max_context=max_context, gated_mlp=gated,
        tie_word_embeddings=_flag(config, "tie_word_embeddings", where, False),
        attention_bias=attention_bias,
        sliding_window=window, moe=moe, mla=mla,
        source=str(extra.get("source", "")), layer_types=kinds,
        attention_chunk_size=chunk, kv_sharing=sharing,
        attention_output_bias=gpt_oss and attention_bias,
        attention_sinks=gpt_oss, qk_norm=qk_norm, qk_norm_across_heads=qk_norm_across_heads,
        norms_per_layer=NORMS_PER_LAYER.get(model_type, 2),
        expert_bias=gpt_oss, ffn_free_layers=ffn_free,
        mtp_layers=_optional_int(config, "num_nextn_predict_layers", where)
        or _optional_int(config, "mtp_num_hidden_layers", where) or 0,
        fp8_block_size=_fp8_block_size(config),
        linear_attention=linear, attention_output_gate=output_gate, sparse_attention=sparse,
    )


def _fp8_block_size(config: dict[str, Any]) -> int | None:
    """The K width of a block-scaled FP8 checkpoint's scale groups (``quantization_config`` with
    ``quant_method: fp8`` and ``weight_block_size: [N, K]``), else None. Other quantisation
    configs (MXFP4, compressed-tensors, ModelOpt) say nothing about how FP8 serving is scaled."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or str(quant.get("quant_method", "")).lower() != "fp8":
        return None
    block = quant.get("weight_block_size")
    if (isinstance(block, list) and len(block) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block)):
        return int(block[1])
    return None


def builtin_model_names() -> list[str]:
    return sorted(p.stem for p in model_configs_dir().glob("*.json"))


def _read_model(path: Path, name: str, where: str) -> ModelSpec:
    """The model in ``path``, parsed once while the file is unchanged (specs are immutable)."""
    version = file_version(path)
    try:
        if version is None:
            return model_from_hf_config(read_json(path, where), name, where)
        return _cached_model(path, name, version, where)
    except ServesimError as exc:
        if str(path) in str(exc):
            raise
        raise ServesimError(exc.field, exc.problem, f"{exc.fix} ({path})") from None


@lru_cache(maxsize=64)
def _cached_model(path: Path, name: str, version: tuple[str, int, int], where: str) -> ModelSpec:
    return model_from_hf_config(read_json(path, where), name, where)


def load_model(name_or_path: str | Path, where: str = "model") -> ModelSpec:
    """A built-in model by name (``llama-3-8b``), a local ``config.json`` (or its folder), or a
    Hugging Face model id (``org/name``) whose last part is not a catalogue name."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and looks_like_hf_id(text) and not (
            model_configs_dir() / f"{text.lower().split('/')[-1]}.json").exists():
        path = find_config(text, where)
        spec = model_from_hf_config(read_json(path, where), text.split("/")[-1], where)
        return spec if spec.source else replace(spec, source=f"{text}/config.json")
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ServesimError(where, f"no such file {path}",
                                "give a built-in model name or the path of a config.json")
        name = path.parent.name if path.name == "config.json" else path.stem
        return _read_model(path, name, where)
    key = text.lower().split("/")[-1]
    builtin = model_configs_dir() / f"{key}.json"
    if builtin.exists():
        return _read_model(builtin, key, where)
    names = builtin_model_names()
    close = [n for n in names if key.replace("_", "-") in n or n in key]
    hint = f"did you mean {close[0]}? " if close else ""
    raise ServesimError(where, f"unknown model {text!r}",
                        f"{hint}use one of {', '.join(names)}, a Hugging Face id (org/name) or a path to "
                        "a config.json")
