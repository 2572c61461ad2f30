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
- DeepSeek-V3's multi-token-prediction layers are not counted (``mtp_layers`` says how many the
  checkpoint has): serving without speculative decoding does not load them; with ``speculative:
  {method: mtp}`` :mod:`servesim.speculative.proposer` adds them.

Hybrid models (Qwen3-Next, Qwen3.5) interleave full-attention layers with *linear attention*
(Gated DeltaNet, :class:`LinearAttentionSpec`): those layers keep no KV cache but a fixed-size
recurrent state per sequence, so only the full-attention layers count in the KV bytes per token
(:attr:`ModelSpec.kv_layers`) and each running sequence holds
:meth:`ModelSpec.linear_state_bytes` besides.

Reading ``config.json`` files and the built-in catalogue is :mod:`servesim.model_config`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from servesim.dtypes import DType
from servesim.errors import ServesimError


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


CONV_STATE_BYTES = 2.0
"""A linear-attention layer's conv window is kept in the model's 16-bit dtype."""

NO_KV_TYPES = frozenset({"linear_attention", "none"})
"""Layer types that keep no KV cache: linear attention (a recurrent state) and no mixer at all."""


@dataclass(frozen=True)
class SparseAttentionSpec:
    """DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5): a lightning indexer scores every
    earlier token with ``index_heads`` small heads of ``index_head_dim`` over its own cached key
    (one ``index_head_dim`` vector per token and layer), and the MLA attention then reads only the
    ``top_k`` best tokens. Its weights (``wq_b`` from the query latent, ``wk``, the per-head
    weights and the key's LayerNorm) are replicated on every TP rank, as vLLM runs them."""

    index_heads: int
    index_head_dim: int
    top_k: int

    def params_per_layer(self, hidden: int, q_lora_rank: int | None) -> int:
        query_in = q_lora_rank or hidden
        width = self.index_heads * self.index_head_dim
        return query_in * width + hidden * self.index_head_dim + 2 * self.index_head_dim \
            + hidden * self.index_heads


@dataclass(frozen=True)
class LinearAttentionSpec:
    """Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5: ``linear_*`` keys of config.json).

    Per layer: ``in_proj_qkvz`` (hidden -> q, k of ``num_key_heads x key_head_dim`` each, v and the
    output gate z of ``num_value_heads x value_head_dim`` each), ``in_proj_ba`` (hidden -> beta
    and the decay, one per value head), a causal depthwise conv of ``conv_kernel`` taps over q, k,
    v, and ``out_proj``. Each sequence carries a ``key_head_dim x value_head_dim`` state per value
    head (read and written once per step it runs in) and the conv's last ``conv_kernel - 1``
    inputs.

    Mamba2 (Nemotron-H's ``M`` blocks) has the same shape and is read into it: ``n_groups`` key
    heads of ``ssm_state_size`` (its B and C), ``mamba_num_heads`` value heads of
    ``mamba_head_dim`` (x and the gate z), the conv over x, B and C, and a ``ssm_state_size x
    mamba_head_dim`` state per head; its in_proj emits one time step per head where Gated DeltaNet
    emits beta and a decay (``kind``)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_state_bytes: float = 2.0
    """Bytes per element of the delta rule's state matrices: the checkpoint's ``mamba_ssm_dtype``
    (Qwen3.5's config class says float32, 4 bytes; SGLang's ``--mamba-ssm-dtype`` and vLLM's
    ``--mamba-ssm-cache-dtype auto`` follow it), else the model's 16 bits. The conv's window is
    always 16-bit (:data:`CONV_STATE_BYTES`)."""
    kind: str = "gated_deltanet"
    """``gated_deltanet`` or ``mamba2``: what the per-head projections and parameters are."""

    @property
    def head_scalars(self) -> int:
        """Scalars per value head that the input projection emits besides q/k/v/z: Gated
        DeltaNet's beta and decay (``in_proj_ba``), Mamba2's time step ``dt``."""
        return 1 if self.kind == "mamba2" else 2

    @property
    def key_width(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_width(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_width(self) -> int:
        """Channels of the causal conv: q, k and v."""
        return 2 * self.key_width + self.value_width

    def params_per_layer(self, hidden: int) -> int:
        """``in_proj_qkvz``, ``in_proj_ba``, the conv taps, per-head decay and bias (``A_log``,
        ``dt_bias``), the gated RMSNorm's weight and ``out_proj``; Mamba2: one ``in_proj`` (x, z,
        B, C and dt), the conv's taps and bias, ``A_log``, ``D`` and ``dt_bias`` per head, the gated
        RMSNorm over every channel and ``out_proj``."""
        qkvz = hidden * (2 * self.key_width + 2 * self.value_width)
        scalars = hidden * self.head_scalars * self.num_value_heads
        conv = self.conv_width * self.conv_kernel
        if self.kind == "mamba2":
            return qkvz + scalars + conv + self.conv_width + 3 * self.num_value_heads + self.value_width \
                + self.value_width * hidden
        return qkvz + scalars + conv + 2 * self.num_value_heads + self.value_head_dim \
            + self.value_width * hidden

    def state_bytes(self, tp: int = 1) -> float:
        """Recurrent state of one sequence in one layer on one GPU (value heads and conv channels
        split over ``tp``): the delta rule's matrices plus the conv's window."""
        heads = max(1, self.num_value_heads // tp)
        conv = ceil_div(self.conv_width, tp) * (self.conv_kernel - 1)
        matrices = heads * self.key_head_dim * self.value_head_dim
        return matrices * self.ssm_state_bytes + conv * CONV_STATE_BYTES

    def flops_per_token(self) -> int:
        """The delta rule's arithmetic per token and layer (all heads): decay and read the state
        (``k^T S``), write it back (the rank-one update) and read the output (``q^T S``): three
        ``key_head_dim x value_head_dim`` products of two FLOPs per element per value head. Mamba2's
        recurrence (decay, the ``B x`` update, the ``C`` read) is counted alike: an estimate of its
        chunked scan, which also computes a chunk-local attention-like product."""
        return 6 * self.num_value_heads * self.key_head_dim * self.value_head_dim


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
    layer_types: tuple[str, ...] = ()
    """Attention of each layer, by Hugging Face's ``layer_types`` names: ``full_attention``,
    ``sliding_attention`` (over the last ``sliding_window`` tokens) or ``chunked_attention`` (within
    blocks of ``attention_chunk_size`` tokens, Llama 4's local layers). Empty: every layer alike
    (sliding when ``sliding_window`` is set, else full)."""
    attention_chunk_size: int | None = None
    kv_sharing: int = 1
    """Cross-layer KV sharing (CLA, Brandon et al. 2024): each group of this many consecutive layers
    caches one K/V, computed by its first layer and read by all of them. 1: none."""
    attention_output_bias: bool = False
    """O projection bias (gpt-oss; Qwen2's ``attention_bias`` covers q, k, v only)."""
    attention_sinks: bool = False
    """One learned sink logit per head and layer (gpt-oss): parameters, no measurable cost."""
    qk_norm: bool = False
    """RMSNorm over each query and key head (Qwen3, Gemma 3): ``2 x head_dim`` weights per layer."""
    qk_norm_across_heads: bool = False
    """The QK-norm spans all heads at once (MiniMax-M2's ``qk_norm_type: per_layer``: one RMS over
    each token's whole query, one over its whole key, a weight per element). Under tensor
    parallelism each GPU holds only its heads, so every layer all-reduces the two sums of squares
    before it can normalise (vLLM and SGLang run one fused all-reduce per layer for both; vLLM
    PR 31493, SGLang PR 14416): a latency-bound collective the cost model prices per layer."""
    norms_per_layer: int = 2
    """Gemma 3 normalises before and after both attention and MLP: 4."""
    expert_bias: bool = False
    """Biases on the routed experts' projections and the router (gpt-oss)."""
    mtp_layers: int = 0
    """Multi-token-prediction layers the checkpoint ships (``num_nextn_predict_layers``), used
    only by speculative decoding with ``method: mtp``."""
    fp8_block_size: int | None = None
    """The K width of a block-scaled FP8 checkpoint's scale groups (``quantization_config``:
    ``quant_method: fp8`` with ``weight_block_size: [128, 128]``, as DeepSeek-V3/R1, Kimi-K2 and
    MiniMax-M2 ship): served in FP8, its linear layers quantise their input per 1 x 128 group in
    one pass (``per_token_group_quant_fp8``), not per tensor (:mod:`servesim.cost.quantise`).
    None: no such checkpoint (FP8 then means quantised at load time, per tensor)."""
    sparse_attention: SparseAttentionSpec | None = None
    """DSA's indexer and top-k (an MLA model's every layer; :class:`SparseAttentionSpec`)."""
    linear_attention: LinearAttentionSpec | None = None
    """The Gated DeltaNet layers' shape (the layers ``layer_types`` marks ``linear_attention``)."""
    attention_output_gate: bool = False
    """Gated attention (Qwen3-Next, Qwen3.5): ``q_proj`` also emits a sigmoid gate per query
    element, which scales the attention output before ``o_proj``: the query projection is twice
    as wide."""
    ffn_free_layers: tuple[int, ...] = ()
    """Layers with a token mixer and no MLP or MoE: Nemotron-H's blocks each hold one of Mamba2
    (``M``), attention (``*``), an MLP (``-``) or a MoE (``E``); its ``M`` and ``*`` blocks are
    these, its ``-`` and ``E`` blocks are layers whose ``layer_types`` entry is ``none`` (no
    mixer). Every other family: each layer has both."""

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

    def attention_type(self, layer: int) -> str:
        """``full_attention``, ``sliding_attention``, ``chunked_attention``, ``linear_attention``
        or ``none`` (no mixer: a Nemotron-H MLP or MoE block) for layer ``layer``."""
        if self.layer_types:
            return self.layer_types[layer]
        return "sliding_attention" if self.sliding_window else "full_attention"

    def attention_window(self, kind: str) -> int | None:
        """The key window of one kind of layer (``None``: no window)."""
        return self.sliding_window if kind == "sliding_attention" else None

    def layer_counts(self, start: int = 0, stop: int | None = None) -> dict[str, int]:
        """Layers ``[start, stop)`` by kind: ``moe`` and ``dense`` MLPs (a mixer-only block has
        neither), and each attention type (``none``: an MLP- or MoE-only block)."""
        stop = self.num_layers if stop is None else stop
        moe = sum(1 for i in self.moe.layers if start <= i < stop) if self.moe is not None else 0
        bare = sum(1 for i in self.ffn_free_layers if start <= i < stop)
        counts = {"moe": moe, "dense": stop - start - moe - bare}
        for i in range(start, stop):
            kind = self.attention_type(i)
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    @cached_property
    def kv_layers(self) -> int:
        """Layers that own a KV cache: all of them, or one per CLA group (a linear-attention layer
        keeps a recurrent state instead, a layer without attention nothing)."""
        if self.linear_attention is not None or self.has_mixer_free_layers:
            return self.kv_layers_in(0, self.num_layers)
        return -(-self.num_layers // self.kv_sharing)

    @cached_property
    def has_mixer_free_layers(self) -> bool:
        """Whether some layer has no token mixer (``layer_types`` ``none``: Nemotron-H's MLP and
        MoE blocks)."""
        return "none" in self.layer_types

    def kv_layers_in(self, start: int, stop: int) -> int:
        """KV-owning layers among ``[start, stop)`` (the first layer of each CLA group owns it)."""
        hybrid = self.linear_attention is not None or self.has_mixer_free_layers
        return sum(1 for i in range(start, stop) if i % self.kv_sharing == 0
                   and not (hybrid and self.attention_type(i) in NO_KV_TYPES))

    def mixer_free_layers_in(self, start: int = 0, stop: int | None = None) -> int:
        """Layers among ``[start, stop)`` without a token mixer (``layer_types`` ``none``)."""
        if not self.has_mixer_free_layers:
            return 0
        stop = self.num_layers if stop is None else stop
        return sum(1 for i in range(start, stop) if self.layer_types[i] == "none")

    def linear_layers_in(self, start: int = 0, stop: int | None = None) -> int:
        """Linear-attention layers among ``[start, stop)``."""
        if self.linear_attention is None:
            return 0
        stop = self.num_layers if stop is None else stop
        return sum(1 for i in range(start, stop) if self.attention_type(i) == "linear_attention")

    def linear_state_bytes(self, tp: int = 1, start: int = 0, stop: int | None = None) -> float:
        """Recurrent state one running sequence holds on one GPU over layers ``[start, stop)``
        (:meth:`LinearAttentionSpec.state_bytes`)."""
        if self.linear_attention is None:
            return 0.0
        return self.linear_layers_in(start, stop) * self.linear_attention.state_bytes(tp)

    @cached_property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP: those with neither MoE nor only a mixer."""
        return self.num_layers - self.num_moe_layers - len(self.ffn_free_layers)

    def residual_reductions_in(self, start: int = 0, stop: int | None = None) -> int:
        """Tensor-parallel all-reduces of the residual stream in one forward pass over layers
        ``[start, stop)``: one after each mixer and one after each MLP or MoE (two per layer, one
        per Nemotron-H block)."""
        stop = self.num_layers if stop is None else stop
        bare = sum(1 for i in self.ffn_free_layers if start <= i < stop)
        return 2 * (stop - start) - self.mixer_free_layers_in(start, stop) - bare

    # ----------------------------------------------------------------- parameter counts
    @cached_property
    def kv_projection_params(self) -> int:
        """K and V projections of one layer (with biases): what a CLA-sharing layer does not hold."""
        if self.mla is not None:
            return 0
        width = 2 * self.num_kv_heads * self.head_dim
        return width * self.hidden_size + (width if self.attention_bias else 0)

    def attention_params_in(self, start: int, stop: int) -> float:
        """Attention weights of layers ``[start, stop)``: every layer's, less the K/V projections of
        layers that read a shared KV (CLA); a hybrid model's linear-attention layers hold their
        own (:meth:`LinearAttentionSpec.params_per_layer`)."""
        if self.linear_attention is not None or self.has_mixer_free_layers:
            linear = self.linear_layers_in(start, stop)
            softmax = stop - start - linear - self.mixer_free_layers_in(start, stop)
            own = linear * self.linear_attention.params_per_layer(self.hidden_size) \
                if self.linear_attention is not None else 0
            return softmax * self.attention_params_per_layer + own
        layers = stop - start
        return layers * self.attention_params_per_layer \
            - (layers - self.kv_layers_in(start, stop)) * self.kv_projection_params

    @cached_property
    def attention_params_per_layer(self) -> int:
        """Q, K, V and O projections (and their biases, sinks, q/k norms and MLA's latent norms) of
        one layer."""
        h, nh = self.hidden_size, self.num_heads
        if self.mla is not None:
            m = self.mla
            q_width = nh * (m.qk_nope_head_dim + m.qk_rope_head_dim)
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * q_width if m.q_lora_rank else h * q_width
            kv_up = m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)
            kv = h * m.cache_width + m.kv_lora_rank + kv_up
            o = nh * m.v_head_dim * h
            indexer = self.sparse_attention.params_per_layer(h, m.q_lora_rank) if self.sparse_attention else 0
            return q + kv + o + indexer
        qkv_width = (nh * (2 if self.attention_output_gate else 1) + 2 * self.num_kv_heads) * self.head_dim
        bias = qkv_width if self.attention_bias else 0
        extras = (h if self.attention_output_bias else 0) + (nh if self.attention_sinks else 0) \
            + self._qk_norm_params()
        return h * qkv_width + bias + nh * self.head_dim * h + extras

    def _qk_norm_params(self) -> int:
        """The QK-norm's weights per layer: one head's width each for queries and keys, or every
        head's element when the norm spans all heads."""
        if not self.qk_norm:
            return 0
        if self.qk_norm_across_heads:
            return (self.num_heads + self.num_kv_heads) * self.head_dim
        return 2 * self.head_dim

    def _mlp_params(self, intermediate: int) -> int:
        matrices = 3 if self.gated_mlp else 2
        return matrices * self.hidden_size * intermediate

    @cached_property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.intermediate_size)

    @cached_property
    def expert_params(self) -> int:
        """Weights of one routed expert (with its biases where the family has them)."""
        if not self.moe:
            return 0
        bias = 0
        if self.expert_bias:
            bias = (2 if self.gated_mlp else 1) * self.moe.expert_intermediate + self.hidden_size
        return self._mlp_params(self.moe.expert_intermediate) + bias

    @cached_property
    def shared_expert_params(self) -> int:
        return self._mlp_params(self.moe.shared_intermediate) if self.moe else 0

    @cached_property
    def router_params(self) -> int:
        if not self.moe:
            return 0
        return (self.hidden_size + (1 if self.expert_bias else 0)) * self.moe.num_experts

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        """Stored LM-head weights: zero when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @cached_property
    def norm_params(self) -> int:
        return (self.norms_per_layer * self.num_layers + 1) * self.hidden_size

    @cached_property
    def param_count(self) -> int:
        """Every stored parameter."""
        moe_layer = (self.router_params + self.moe.num_experts * self.expert_params
                     + self.shared_expert_params) if self.moe else 0
        return (self.embedding_params + self.lm_head_params + self.norm_params
                + int(self.attention_params_in(0, self.num_layers))
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
    def mla_down_params(self) -> int:
        """MLA's down-projections ``q_a`` and ``kv_a`` with their latent norms, and DSA's indexer:
        replicated on every TP rank, as vLLM shards them."""
        if self.mla is None:
            return 0
        m, h = self.mla, self.hidden_size
        q_down = h * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0
        indexer = self.sparse_attention.params_per_layer(h, m.q_lora_rank) if self.sparse_attention else 0
        return self.num_layers * (q_down + h * m.cache_width + m.kv_lora_rank + indexer)

    def weight_bytes(self, dtype: DType | str = DType.BF16, group_size: int = 128,
                     tp: int = 1, expert_dtype: DType | str | None = None) -> float:
        """Weight bytes on one GPU of a ``tp``-way group (``tp=1``: the whole model).

        Four disjoint classes: the embedding and LM head (16-bit in quantised checkpoints, split
        over the vocabulary), the norms and router (16-bit, replicated), MLA's down-projections
        and any replicated KV heads (``dtype``, replicated), and everything else (``dtype``,
        sharded). ``expert_dtype`` stores the routed experts in another format (gpt-oss ships
        MXFP4 experts beside 16-bit attention).
        """
        per_elem = DType.parse(dtype, "precision.weights").bytes_per_element(group_size)
        vocab_16bit = self.embedding_params + self.lm_head_params
        replicated_16bit = self.norm_params + self.num_moe_layers * self.router_params
        sharded = self.param_count - vocab_16bit - replicated_16bit - self.mla_down_params
        replicated = self.mla_down_params + self._kv_replica_params(tp)
        if expert_dtype is None:
            return (sharded / tp + replicated) * per_elem + (vocab_16bit / tp + replicated_16bit) * 2.0
        expert_elem = DType.parse(expert_dtype, "expert_weights").bytes_per_element(group_size)
        routed = self.routed_expert_params
        return ((sharded - routed) / tp + replicated) * per_elem + routed / tp * expert_elem \
            + (vocab_16bit / tp + replicated_16bit) * 2.0

    @cached_property
    def routed_expert_params(self) -> int:
        """Every routed expert's weights (what expert parallelism splits)."""
        return self.num_moe_layers * self.moe.num_experts * self.expert_params if self.moe else 0

    def norm_params_in(self, start: int, stop: int, last: bool) -> int:
        """Norm weights of layers ``[start, stop)``, plus the final norm on the last stage."""
        return (self.norms_per_layer * (stop - start) + (1 if last else 0)) * self.hidden_size

    def _kv_replica_params(self, tp: int) -> float:
        """Extra K/V projection weights each GPU holds when there are fewer KV heads than GPUs
        (each GPU keeps a whole head instead of a 1/tp share of them all)."""
        if self.mla is not None or self.num_kv_heads >= tp:
            return 0.0
        per_head = 2 * self.head_dim * (self.hidden_size + (1 if self.attention_bias else 0))
        return self.kv_layers * per_head * (1 - self.num_kv_heads / tp)

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

    @property
    def index_cache_bytes_per_token_per_layer(self) -> float:
        """DSA's indexer key of one token in one layer: ``index_head_dim`` FP8 values and one fp32
        scale, whatever the KV cache's dtype (vLLM's layout); 0 without DSA."""
        if self.sparse_attention is None:
            return 0.0
        return self.sparse_attention.index_head_dim * 1.0 + 4.0

    def kv_bytes_per_token(self, dtype: DType | str = DType.BF16, tp: int = 1,
                           group_size: int = 128) -> float:
        """KV-cache bytes one token occupies on one GPU (all layers)."""
        dtype = DType.parse(dtype, "precision.kv_cache")
        per_layer = self.kv_elements_per_token_per_layer(tp)
        return (per_layer * dtype.bytes_per_element(group_size)
                + self.index_cache_bytes_per_token_per_layer) * self.kv_layers

    # ----------------------------------------------------------------- FLOPs
    @property
    def attention_flops_per_context_token(self) -> int:
        """FLOPs per layer that one query spends on one context token: the score product
        (2 * q_head_dim per head) plus the weighted sum of values (2 * v_head_dim per head)."""
        return 2 * self.num_heads * (self.q_head_dim + self.v_head_dim)

    def flops_per_token(self, context: int = 0) -> float:
        """Forward FLOPs of one token attending over ``context`` earlier tokens (plus itself):
        ``2 * matmul params + attention FLOPs per context token * keys attended``, summed over the
        layers (a sliding layer sees at most its window, a chunked layer its chunk so far)."""
        keys = 0
        if self.sparse_attention is not None:  # MLA over the top-k, the indexer over every key
            dsa = self.sparse_attention
            index = 2 * dsa.index_heads * dsa.index_head_dim * (context + 1) * self.num_layers
            return 2.0 * self.matmul_params_per_token + self.attention_flops_per_context_token \
                * min(context + 1, dsa.top_k) * self.num_layers + index
        for kind, layers in self.layer_counts().items():
            if kind == "full_attention":
                keys += layers * (context + 1)
            elif kind == "sliding_attention":
                keys += layers * min(context + 1, self.sliding_window or context + 1)
            elif kind == "chunked_attention":
                keys += layers * (context % (self.attention_chunk_size or context + 1) + 1)
        linear = 0
        if self.linear_attention is not None:
            linear = self.linear_layers_in() * self.linear_attention.flops_per_token()
        return 2.0 * self.matmul_params_per_token + self.attention_flops_per_context_token * keys + linear

    # ----------------------------------------------------------------- parallelism
    def check_tensor_parallel(self, tp: int) -> None:
        """Reject a TP degree that does not split the heads evenly."""
        if tp < 1:
            raise ServesimError("deployment.tp", f"must be at least 1, got {tp}", "use 1, 2, 4 or 8")
        if self.num_heads % tp:
            raise ServesimError(
                "deployment.tp", f"{tp} does not divide {self.name}'s {self.num_heads} attention heads",
                "use a TP degree that divides the head count (e.g. 1, 2, 4, 8)")
        linear = self.linear_attention
        if linear is not None and (linear.num_key_heads % tp or linear.num_value_heads % tp):
            raise ServesimError(
                "deployment.tp", f"{tp} does not divide {self.name}'s {linear.num_key_heads} key and "
                f"{linear.num_value_heads} value heads of its linear-attention layers",
                "use a TP degree that divides both (e.g. 1, 2, 4, 8)")
        kv = self.num_kv_heads
        if self.mla is None and kv % tp and tp % kv:
            raise ServesimError(
                "deployment.tp", f"{tp} neither divides nor is a multiple of {self.name}'s {kv} KV heads",
                "use a TP degree that divides the KV-head count or is a multiple of it")

    def _attention_summary(self) -> str:
        """``servesim models``' attention column: the kind, and a hybrid's linear or Mamba2 layers."""
        if self.linear_attention is None:
            return self.attention_kind
        linear = self.linear_layers_in()
        if self.has_mixer_free_layers:  # Nemotron-H: blocks of one mixer or one FFN each
            softmax = self.num_layers - linear - self.mixer_free_layers_in()
            return f"{self.attention_kind} {softmax} + mamba2 {linear} (of {self.num_layers} blocks)"
        return f"{self.attention_kind} + linear ({linear} of {self.num_layers} layers)"

    def summary(self) -> dict[str, Any]:
        """Headline figures, for ``servesim models`` and reports."""
        return {
            "name": self.name,
            "params_b": round(self.param_count / 1e9, 2),
            "active_params_b": round(self.active_param_count / 1e9, 2),
            "layers": self.num_layers,
            "hidden": self.hidden_size,
            "attention": self._attention_summary(),
            "heads": f"{self.num_heads}/{self.num_kv_heads if self.mla is None else 'latent'}",
            "mlp": (f"moe {self.moe.num_experts}x top-{self.moe.top_k}" if self.moe
                    else ("gated" if self.gated_mlp else "plain")),
            "kv_kib_per_token_bf16": round(self.kv_bytes_per_token("bf16") / 1024, 1),
            "max_context": self.max_context,
        }


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
