"""Reading models: a Hugging Face ``config.json`` (a local file or folder) or a catalogue name.

The catalogue is ``configs/models/<name>.json``, written from each model's published
architecture in the Hugging Face format, so a user's own fine-tune loads the same way. Keys that
do not affect serving cost are ignored; missing or malformed ones raise a one-line
:class:`~servesim.errors.ServesimError` naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servesim.errors import ServesimError
from servesim.inputs.files import read_json
from servesim.model_spec import MLASpec, ModelSpec, MoESpec
from servesim.resources import model_configs_dir

NON_GATED_FAMILIES = frozenset(
    {"gpt2", "gpt_neox", "opt", "falcon", "gpt_bigcode", "bloom", "phi", "gptj", "starcoder2"})
"""Model types whose MLP is ``down(act(up(x)))``; every other family is gated (SwiGLU-style)."""


def _first(config: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _positive_int(config: dict[str, Any], keys: tuple[str, ...], where: str,
                  default: Any = None) -> int:
    value = _first(config, keys, default)
    if value is None:
        raise ServesimError(f"{where}: {keys[0]}", "missing",
                            "add it to the config.json (it is in every Hugging Face config)")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ServesimError(f"{where}: {keys[0]}", f"must be a positive integer, got {value!r}",
                            "fix the value in the config.json")
    return value


def _moe_layer_indices(config: dict[str, Any], layers: int) -> tuple[int, ...]:
    """Which layers are MoE, by each family's rule as its Hugging Face modelling code applies it:
    Qwen-MoE ``(i + 1) % decoder_sparse_step == 0`` minus ``mlp_only_layers``; DeepSeek
    ``i >= first_k_dense_replace and i % moe_layer_freq == 0``; Mixtral every layer."""
    if config.get("decoder_sparse_step"):
        step = int(config["decoder_sparse_step"])
        dense = set(config.get("mlp_only_layers") or ())
        return tuple(i for i in range(layers) if (i + 1) % step == 0 and i not in dense)
    first = int(config.get("first_k_dense_replace") or 0)
    freq = int(config.get("moe_layer_freq") or 1)
    return tuple(i for i in range(layers) if i >= first and i % freq == 0)


def model_from_hf_config(config: dict[str, Any], name: str, where: str = "model") -> ModelSpec:
    """Build a :class:`ModelSpec` from the dict of a Hugging Face ``config.json``."""
    if not isinstance(config, dict):
        raise ServesimError(where, "config.json must hold a JSON object", "check the file")
    model_type = str(config.get("model_type", "")).lower()
    extra = config.get("_servesim", {}) or {}
    hidden = _positive_int(config, ("hidden_size", "n_embd", "d_model"), where)
    layers = _positive_int(config, ("num_hidden_layers", "n_layer", "num_layers"), where)
    heads = _positive_int(config, ("num_attention_heads", "n_head", "num_heads"), where)
    kv_heads = _positive_int(config, ("num_key_value_heads", "num_kv_heads"), where, heads)
    head_dim = _positive_int(config, ("head_dim",), where, hidden // heads)
    intermediate = _positive_int(config, ("intermediate_size", "ffn_dim", "n_inner"), where,
                                 4 * hidden)
    vocab = _positive_int(config, ("vocab_size",), where)
    max_context = _positive_int(
        config, ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"),
        where, 4096)
    if heads % kv_heads:
        raise ServesimError(f"{where}: num_key_value_heads",
                            f"{kv_heads} does not divide num_attention_heads={heads}",
                            "fix the config.json")

    moe = None
    num_experts = _first(config, ("num_local_experts", "n_routed_experts", "num_experts"))
    if num_experts:
        top_k = _positive_int(config, ("num_experts_per_tok", "moe_top_k"), where)
        expert_i = _positive_int(config, ("moe_intermediate_size",), where, intermediate)
        shared_i = int(config.get("n_shared_experts") or 0) * expert_i
        shared_i = int(config.get("shared_expert_intermediate_size") or shared_i)
        if top_k > num_experts:
            raise ServesimError(f"{where}: num_experts_per_tok",
                                f"{top_k} exceeds the {num_experts} experts", "fix the config.json")
        moe = MoESpec(num_experts=int(num_experts), top_k=top_k, expert_intermediate=expert_i,
                      shared_intermediate=shared_i, layers=_moe_layer_indices(config, layers))

    mla = None
    if config.get("kv_lora_rank"):
        mla = MLASpec(q_lora_rank=config.get("q_lora_rank"),
                      kv_lora_rank=_positive_int(config, ("kv_lora_rank",), where),
                      qk_nope_head_dim=_positive_int(config, ("qk_nope_head_dim",), where),
                      qk_rope_head_dim=_positive_int(config, ("qk_rope_head_dim",), where),
                      v_head_dim=_positive_int(config, ("v_head_dim",), where))

    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False or not window or window >= max_context:
        window = None
    gated = bool(extra.get("gated_mlp", model_type not in NON_GATED_FAMILIES))
    return ModelSpec(
        name=name, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=intermediate, vocab_size=vocab,
        max_context=max_context, gated_mlp=gated,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        sliding_window=int(window) if window else None, moe=moe, mla=mla,
        source=str(extra.get("source", "")),
        mtp_layers=int(config.get("num_nextn_predict_layers") or 0),
    )


def builtin_model_names() -> list[str]:
    return sorted(p.stem for p in model_configs_dir().glob("*.json"))


def load_model(name_or_path: str | Path, where: str = "model") -> ModelSpec:
    """A built-in model by name (``llama-3-8b``) or a local ``config.json`` (or its folder)."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ServesimError(where, f"no such file {path}",
                                "give a built-in model name or the path of a config.json")
        name = path.parent.name if path.name == "config.json" else path.stem
        return model_from_hf_config(read_json(path, where), name, where)
    key = text.lower().split("/")[-1]
    builtin = model_configs_dir() / f"{key}.json"
    if builtin.exists():
        return model_from_hf_config(read_json(builtin, where), key, where)
    names = builtin_model_names()
    close = [n for n in names if key.replace("_", "-") in n or n in key]
    hint = f"did you mean {close[0]}? " if close else ""
    raise ServesimError(where, f"unknown model {text!r}",
                        f"{hint}use one of {', '.join(names)} or a path to a config.json")
