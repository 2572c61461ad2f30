"""Transformer architecture read from a Hugging Face ``config.json``, and the figures derived from it.

:class:`ModelSpec` keeps only what decides serving cost: widths, layer count, attention layout
(MHA, GQA, MQA or DeepSeek's multi-head latent attention), MLP shape (dense or mixture of
experts), vocabulary and context length. Everything the cost model and the memory planner need
(parameter counts, weight bytes, KV-cache bytes per token, FLOPs per token) is derived here, in
one place, by formulas short enough to check by hand.

Conventions:
- Norm weights are counted (2 per layer plus the final one); biases only where the architecture
  has them (Qwen2's q/k/v projections).
- The embedding is a gather (no FLOPs, one row read per token); the LM head is a GEMM unless its
  weights are tied to the embedding, in which case it is computed but not stored twice.
- DeepSeek-V3's multi-token-prediction layer is not counted: serving without speculative
  decoding does not run it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from simulator.dtypes import DType
from simulator.errors import ServesimError
from simulator.resources import model_configs_dir

NON_GATED_FAMILIES = frozenset(
    {"gpt2", "gpt_neox", "opt", "falcon", "gpt_bigcode", "bloom", "phi", "gptj", "starcoder2"})
"""Model types whose MLP is ``down(act(up(x)))``; every other family is gated (SwiGLU-style)."""


@dataclass(frozen=True)
class MoESpec:
    """Mixture of experts: ``num_experts`` routed experts, ``top_k`` per token, optional shared
    experts that every token uses, in the layers listed in ``layers``."""

    num_experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int = 0
    layers: tuple[int, ...] = ()
    """Indices of the MoE layers (the others have a dense MLP), by the family's own rule."""


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention: K and V are cached as one compressed latent of
    ``kv_lora_rank`` plus a shared RoPE key of ``qk_rope_head_dim`` per token and layer."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def cache_width(self) -> int:
        """Elements cached per token per layer (shared across heads)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelSpec:
    """The serving-relevant shape of a decoder-only transformer."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    gated_mlp: bool = True
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    sliding_window: int | None = None
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    source: str = ""

    # ----------------------------------------------------------------- attention layout
    @property
    def attention_kind(self) -> str:
        """``mla``, ``mha``, ``mqa`` or ``gqa``."""
        if self.mla is not None:
            return "mla"
        if self.num_kv_heads == self.num_heads:
            return "mha"
        if self.num_kv_heads == 1:
            return "mqa"
        return "gqa"

    @property
    def q_head_dim(self) -> int:
        """Width of one query/key head in the score product."""
        if self.mla is not None:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla is not None else self.head_dim

    # ----------------------------------------------------------------- layer composition
    @cached_property
    def num_moe_layers(self) -> int:
        return len(self.moe.layers) if self.moe is not None else 0

    @cached_property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ----------------------------------------------------------------- parameter counts
    @cached_property
    def attention_params_per_layer(self) -> int:
        """Q, K, V and O projections (and their biases and MLA's latent norms) of one layer."""
        h, nh = self.hidden_size, self.num_heads
        if self.mla is not None:
            m = self.mla
            q_width = nh * (m.qk_nope_head_dim + m.qk_rope_head_dim)
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * q_width if m.q_lora_rank else h * q_width
            kv_up = m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)
            kv = h * m.cache_width + m.kv_lora_rank + kv_up
            o = nh * m.v_head_dim * h
            return q + kv + o
        qkv_width = (nh + 2 * self.num_kv_heads) * self.head_dim
        bias = qkv_width if self.attention_bias else 0
        return h * qkv_width + bias + nh * self.head_dim * h

    def _mlp_params(self, intermediate: int) -> int:
        matrices = 3 if self.gated_mlp else 2
        return matrices * self.hidden_size * intermediate

    @cached_property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.intermediate_size)

    @cached_property
    def expert_params(self) -> int:
        """Weights of one routed expert."""
        return self._mlp_params(self.moe.expert_intermediate) if self.moe else 0

    @cached_property
    def shared_expert_params(self) -> int:
        return self._mlp_params(self.moe.shared_intermediate) if self.moe else 0

    @cached_property
    def router_params(self) -> int:
        return self.hidden_size * self.moe.num_experts if self.moe else 0

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        """Stored LM-head weights: zero when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def norm_params(self) -> int:
        return (2 * self.num_layers + 1) * self.hidden_size

    @cached_property
    def param_count(self) -> int:
        """Every stored parameter."""
        moe_layer = (self.router_params + self.moe.num_experts * self.expert_params
                     + self.shared_expert_params) if self.moe else 0
        return (self.embedding_params + self.lm_head_params + self.norm_params
                + self.num_layers * self.attention_params_per_layer
                + self.num_dense_layers * self.dense_mlp_params
                + self.num_moe_layers * moe_layer)

    @cached_property
    def active_param_count(self) -> int:
        """Parameters one token touches: all but the routed experts it is not sent to."""
        if self.moe is None:
            return self.param_count
        idle = self.moe.num_experts - self.moe.top_k
        return self.param_count - self.num_moe_layers * idle * self.expert_params

    @cached_property
    def matmul_params_per_token(self) -> int:
        """Active parameters that take part in a matrix product for one token: everything active
        except the embedding gather and the norm weights, plus the LM head even when tied."""
        return (self.active_param_count - self.embedding_params - self.norm_params
                - self.lm_head_params + self.vocab_size * self.hidden_size)

    @cached_property
    def replicated_params(self) -> int:
        """Parameters every TP rank holds whole: norms, the MoE router, MLA's down-projections
        (``q_a``, ``kv_a`` and their norms), as vLLM shards them."""
        params = self.norm_params + self.num_moe_layers * self.router_params
        if self.mla is not None:
            m, h = self.mla, self.hidden_size
            q_down = h * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0
            params += self.num_layers * (q_down + h * m.cache_width + m.kv_lora_rank)
        return params

    @cached_property
    def params_kept_16bit(self) -> int:
        """Parameters that quantised checkpoints (AWQ, GPTQ, FP8) leave in 16 bits: the embedding,
        the LM head, the norms and the router."""
        return (self.embedding_params + self.lm_head_params + self.norm_params
                + self.num_moe_layers * self.router_params)

    def weight_bytes(self, dtype: DType | str = DType.BF16, group_size: int = 128,
                     tp: int = 1) -> float:
        """Weight bytes on one GPU of a ``tp``-way group (``tp=1``: the whole model), with the
        matmul weights stored in ``dtype`` and :attr:`params_kept_16bit` in 16 bits."""
        dtype = DType.parse(dtype, "weight_dtype")
        per_elem = dtype.bytes_per_element(group_size)
        kept = self.params_kept_16bit
        kept_replicated = self.norm_params + self.num_moe_layers * self.router_params
        quant_replicated = self.replicated_params - kept_replicated + self._kv_replica_params(tp)
        quant_sharded = self.param_count - kept - (self.replicated_params - kept_replicated)
        kept_sharded = kept - kept_replicated
        return (quant_sharded / tp * per_elem + quant_replicated * per_elem
                + kept_sharded / tp * 2.0 + kept_replicated * 2.0)

    def _kv_replica_params(self, tp: int) -> float:
        """Extra K/V projection weights each GPU holds when there are fewer KV heads than GPUs
        (each GPU keeps a whole head instead of a 1/tp share of them all)."""
        if self.mla is not None or self.num_kv_heads >= tp:
            return 0.0
        per_head = 2 * self.head_dim * (self.hidden_size + (1 if self.attention_bias else 0))
        return self.num_layers * per_head * (1 - self.num_kv_heads / tp)

    # ----------------------------------------------------------------- KV cache
    def kv_elements_per_token_per_layer(self, tp: int = 1) -> int:
        """Cached elements per token and layer on one GPU at tensor parallelism ``tp``.

        GQA/MHA shard KV heads across GPUs; when there are fewer KV heads than GPUs each head is
        replicated (vLLM does this), so a GPU always holds at least one. MLA's latent is shared by
        all heads and so is replicated on every GPU.
        """
        if self.mla is not None:
            return self.mla.cache_width
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim

    def kv_bytes_per_token(self, dtype: DType | str = DType.BF16, tp: int = 1,
                           group_size: int = 128) -> float:
        """KV-cache bytes one token occupies on one GPU (all layers)."""
        dtype = DType.parse(dtype, "kv_dtype")
        per_layer = self.kv_elements_per_token_per_layer(tp)
        return per_layer * self.num_layers * dtype.bytes_per_element(group_size)

    # ----------------------------------------------------------------- FLOPs
    @property
    def attention_flops_per_context_token(self) -> int:
        """FLOPs per layer that one query spends on one context token: the score product
        (2 * q_head_dim per head) plus the weighted sum of values (2 * v_head_dim per head)."""
        return 2 * self.num_heads * (self.q_head_dim + self.v_head_dim)

    def flops_per_token(self, context: int = 0) -> float:
        """Forward FLOPs of one token attending over ``context`` earlier tokens (plus itself):
        ``2 * matmul params + layers * attention FLOPs per context token * (context + 1)``."""
        attended = context + 1
        if self.sliding_window:
            attended = min(attended, self.sliding_window)
        return (2.0 * self.matmul_params_per_token
                + self.num_layers * self.attention_flops_per_context_token * attended)

    # ----------------------------------------------------------------- parallelism
    def check_tensor_parallel(self, tp: int) -> None:
        """Reject a TP degree that does not split the heads evenly."""
        if tp < 1:
            raise ServesimError("tp", f"must be at least 1, got {tp}", "use 1, 2, 4 or 8")
        if self.num_heads % tp:
            raise ServesimError(
                "tp", f"{tp} does not divide {self.name}'s {self.num_heads} attention heads",
                "use a TP degree that divides the head count (e.g. 1, 2, 4, 8)")
        kv = self.num_kv_heads
        if self.mla is None and kv % tp and tp % kv:
            raise ServesimError(
                "tp", f"{tp} neither divides nor is a multiple of {self.name}'s {kv} KV heads",
                "use a TP degree that divides the KV-head count or is a multiple of it")

    def summary(self) -> dict[str, Any]:
        """Headline figures, for ``servesim models`` and reports."""
        return {
            "name": self.name,
            "params_b": round(self.param_count / 1e9, 2),
            "active_params_b": round(self.active_param_count / 1e9, 2),
            "layers": self.num_layers,
            "hidden": self.hidden_size,
            "attention": self.attention_kind,
            "heads": f"{self.num_heads}/{self.num_kv_heads if self.mla is None else 'latent'}",
            "mlp": (f"moe {self.moe.num_experts}x top-{self.moe.top_k}" if self.moe
                    else ("gated" if self.gated_mlp else "plain")),
            "kv_kib_per_token_bf16": round(self.kv_bytes_per_token("bf16") / 1024, 1),
            "max_context": self.max_context,
        }


# --------------------------------------------------------------------------- loading
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
    )


def builtin_model_names() -> list[str]:
    return sorted(p.stem for p in model_configs_dir().glob("*.json"))


def _read_json(path: Path, where: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ServesimError(where, f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})",
                            "fix the file") from None
    except OSError as exc:
        raise ServesimError(where, f"cannot read {path}: {exc.strerror}", "check the path") from None


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
        return model_from_hf_config(_read_json(path, where), name, where)
    key = text.lower().split("/")[-1]
    builtin = model_configs_dir() / f"{key}.json"
    if builtin.exists():
        return model_from_hf_config(_read_json(builtin, where), key, where)
    names = builtin_model_names()
    close = [n for n in names if key.replace("_", "-") in n or n in key]
    hint = f"did you mean {close[0]}? " if close else ""
    raise ServesimError(where, f"unknown model {text!r}",
                        f"{hint}use one of {', '.join(names)} or a path to a config.json")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "builtin_model_names",
    "ceil_div",
    "load_model",
    "math",
    "model_from_hf_config",
]
