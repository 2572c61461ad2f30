"""How long one iteration takes on one replica, and why.

:class:`CostModel` is a pure function of (model, hardware, tensor parallelism, precision, batch
shape) -> seconds. It knows nothing of SimPy or policies, so the engine, ``servesim step``,
calibration and notebooks all call the same code.

One step on one GPU of the TP group runs, per layer: the attention projections (QKV, or MLA's
low-rank projections), attention (a prefill kernel and a decode kernel, see
:mod:`simulator.cost.attention`), the output projection, the MLP (dense, or router + routed
experts + shared experts), the elementwise kernels (two fused residual-add + RMSNorm, RoPE, the
activation) and, with TP > 1, two all-reduces of the residual stream. Around the layers: the
embedding gather (plus its all-reduce under TP), the final norm, the LM head for the sequences
that sample a token, the logits all-gather, and a fixed per-step framework overhead.

Every operator is charged by :func:`simulator.cost.roofline.roofline`. Nothing overlaps:
vLLM-style engines run TP all-reduces between the layer's kernels, not under them.

Sharding (Megatron-style, as vLLM does it): QKV/gate/up are split by output columns, O/down by
input rows; KV heads are split across GPUs (replicated when there are fewer KV heads than GPUs);
the vocabulary is split for the embedding and the LM head; norms, MLA's down-projections
(``q_a``, ``kv_a``) and the MoE router are replicated. Routed experts are TP-sharded (every GPU
holds a 1/tp slice of every expert), vLLM's default without expert parallelism. Communication runs
in 16 bits even when the GEMMs run in 8.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.cost.attention import AttentionShape, decode_attention, prefill_attention
from simulator.cost.batch import BatchShape
from simulator.cost.communication import ring_allgather_s, ring_allreduce_s
from simulator.cost.roofline import OpCost, roofline
from simulator.dtypes import Precision
from simulator.hardware import HardwareProfile, OperatorEfficiency
from simulator.model_spec import ModelSpec

BREAKDOWN_KEYS = ("embedding", "qkv_proj", "attn_prefill", "attn_decode", "o_proj", "mlp", "moe",
                  "elementwise", "lm_head", "communication", "overhead")
"""Operator classes of :attr:`StepCost.breakdown`; stable names that other tools read."""

COMM_BYTES = 2.0
"""Bytes per element of TP collectives (bf16), whatever the GEMM precision."""


@dataclass(frozen=True)
class StepCost:
    """One iteration's predicted time with its anatomy.

    ``breakdown`` maps each operator class to seconds (kernel launch floors included) and sums to
    ``time_s``. ``bound`` says what the step spends most time on: ``compute`` (operators past the
    ridge), ``memory`` (operators under it), ``communication`` (TP collectives) or ``overhead``
    (kernel floors and the per-step framework cost).
    """

    time_s: float
    breakdown: dict[str, float]
    bound: str
    bound_s: dict[str, float]
    flops: float
    hbm_bytes: float
    ops: tuple[OpCost, ...] = field(repr=False)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per HBM byte over the whole step."""
        return self.flops / self.hbm_bytes if self.hbm_bytes else 0.0

    def to_dict(self) -> dict[str, object]:
        return {"step_time_s": self.time_s, "bound": self.bound, "breakdown": self.breakdown,
                "bound_s": self.bound_s, "flops": self.flops, "hbm_bytes": self.hbm_bytes,
                "arithmetic_intensity": self.arithmetic_intensity}


class CostModel:
    """Step-time predictor for one deployment (model x hardware x TP x precision)."""

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, tp: int = 1,
                 precision: Precision | None = None) -> None:
        model.check_tensor_parallel(tp)
        self.model = model
        self.hardware = hardware
        self.tp = tp
        self.precision = precision or Precision()
        self.peak_flops = hardware.peak(self.precision.math)
        self.bandwidth = hardware.memory.bandwidth_Bps
        self._gemm_eff = hardware.efficiency.gemm
        self._elem_eff = hardware.efficiency.elementwise
        self._act_bytes = self.precision.act_bytes
        self._kv_bytes = self.precision.kv_bytes
        self._weight_bytes = self.precision.weight_bytes
        self.attention = self._attention_shape()
        self._attn_gemms = self._attention_projection_shapes()
        self._token_cache: dict[tuple[int, int], tuple[tuple[OpCost, ...], float, float]] = {}

    # ------------------------------------------------------------------ per-GPU shapes
    def _attention_shape(self) -> AttentionShape:
        m, tp = self.model, self.tp
        heads = m.num_heads // tp
        kv_elements = m.kv_elements_per_token_per_layer(tp)
        prefill_per_pair = 2 * heads * (m.q_head_dim + m.v_head_dim)
        if m.mla is not None:
            decode_per_key = 2 * heads * (2 * m.mla.kv_lora_rank + m.mla.qk_rope_head_dim)
        else:
            decode_per_key = prefill_per_pair
        return AttentionShape(heads=heads, q_head_dim=m.q_head_dim, v_head_dim=m.v_head_dim,
                              kv_elements_per_token=kv_elements,
                              prefill_flops_per_pair=prefill_per_pair,
                              decode_flops_per_key=decode_per_key, window=m.sliding_window)

    def _attention_projection_shapes(self) -> list[tuple[int, int]]:
        """(K, N) of each attention input projection on one GPU."""
        m, tp, h = self.model, self.tp, self.model.hidden_size
        heads = m.num_heads // tp
        if m.mla is None:
            kv_heads = max(1, m.num_kv_heads // tp)
            return [(h, (heads + 2 * kv_heads) * m.head_dim)]
        a = m.mla
        q_width = heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
        shapes = ([(h, a.q_lora_rank), (a.q_lora_rank, q_width)] if a.q_lora_rank
                  else [(h, q_width)])
        shapes += [(h, a.cache_width), (a.kv_lora_rank, heads * (a.qk_nope_head_dim + a.v_head_dim))]
        return shapes

    # ------------------------------------------------------------------ operator helpers
    def _gemm(self, name: str, m: float, k: int, n: int, repeat: float,
              weight_bytes: float | None = None) -> OpCost:
        """``repeat`` GEMMs of (m x k) @ (k x n): weights read once, activations in and out."""
        weights = k * n * self._weight_bytes if weight_bytes is None else weight_bytes
        nbytes = weights + m * (k + n) * self._act_bytes
        return roofline(name, 2.0 * m * k * n, nbytes, peak_flops=self.peak_flops,
                        bandwidth=self.bandwidth, eff=self._gemm_eff, compute_axis=m,
                        repeat=repeat)

    def _elementwise(self, name: str, nbytes: float, tokens: float, kernels: float,
                     repeat: float, eff: OperatorEfficiency | None = None) -> OpCost:
        return roofline(name, 0.0, nbytes, peak_flops=self.peak_flops, bandwidth=self.bandwidth,
                        eff=eff or self._elem_eff, compute_axis=tokens, repeat=repeat,
                        kernels=kernels)

    def _mlp(self, tokens: float, intermediate: int, repeat: float, name: str) -> list[OpCost]:
        h, local = self.model.hidden_size, intermediate // self.tp
        up_width = 2 * local if self.model.gated_mlp else local
        return [self._gemm(name, tokens, h, up_width, repeat),
                self._gemm(name, tokens, local, h, repeat)]

    def _routed_experts(self, tokens: float, repeat: float) -> list[OpCost]:
        """Router GEMM plus the fused expert GEMMs of one MoE layer.

        ``tokens * top_k`` (token, expert) assignments spread over the experts; with uniform
        routing the expected number of distinct experts hit is ``E (1 - (1 - k/E)^T)``, and each
        one hit has its (1/tp slice of) weights read once. Its GEMM rows are the assignments per
        expert hit, which is what the efficiency curve sees.
        """
        moe, h = self.model.moe, self.model.hidden_size
        assert moe is not None
        experts, top_k = moe.num_experts, moe.top_k
        assignments = tokens * top_k
        hit = experts * (1.0 - (1.0 - top_k / experts) ** tokens)
        rows_per_expert = assignments / hit
        local = moe.expert_intermediate // self.tp
        up_width = 2 * local if self.model.gated_mlp else local
        expert_weights = h * (up_width + local)
        flops = 2.0 * assignments * expert_weights
        nbytes = (hit * expert_weights * self._weight_bytes
                  + assignments * (2 * h + up_width + local) * self._act_bytes)
        experts_cost = roofline("moe", flops, nbytes, peak_flops=self.peak_flops,
                                bandwidth=self.bandwidth, eff=self._gemm_eff,
                                compute_axis=rows_per_expert, repeat=repeat, kernels=2)
        router = self._gemm("moe", tokens, h, experts, repeat,
                            weight_bytes=h * experts * COMM_BYTES)
        return [router, experts_cost]

    # ------------------------------------------------------------------ the step
    def step(self, batch: BatchShape) -> StepCost:
        """Predicted time and anatomy of one iteration running ``batch``."""
        if batch.is_empty:
            zero = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
            return StepCost(0.0, zero, "idle", {"compute": 0.0, "memory": 0.0,
                                                 "communication": 0.0, "overhead": 0.0},
                            0.0, 0.0, ())
        token_ops, comm_s, token_s = self._token_part(batch.num_new_tokens, batch.num_logits)
        prefill, decode = self._attention_ops(batch)
        # The total is summed exactly as step_time() sums it, so both agree to the last bit.
        total = token_s + prefill.time_s + decode.time_s
        return self._assemble([*token_ops, prefill, decode], comm_s, total)

    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one iteration: the engine's fast path, same number as ``step().time_s``."""
        if batch.is_empty:
            return 0.0
        _, _, token_s = self._token_part(batch.num_new_tokens, batch.num_logits)
        prefill, decode = self._attention_ops(batch)
        return token_s + prefill.time_s + decode.time_s

    def _attention_ops(self, batch: BatchShape) -> tuple[OpCost, OpCost]:
        args = (self.hardware, self.peak_flops, self._act_bytes, self._kv_bytes, self.model.num_layers)
        return (prefill_attention(batch, self.attention, *args),
                decode_attention(batch, self.attention, *args))

    def _token_part(self, tokens: int, logits: int) -> tuple[tuple[OpCost, ...], float, float]:
        """Everything but attention, which depends only on the step's new tokens and logits rows:
        memoised, so a simulation pays for each distinct (tokens, logits) pair once."""
        key = (tokens, logits)
        cached = self._token_cache.get(key)
        if cached is None:
            ops = tuple(self._token_ops(float(tokens), float(logits)))
            comm_s = self._communication_s(float(tokens), float(logits))
            total = sum(op.time_s for op in ops) + comm_s + self.hardware.overhead.step_s
            cached = (ops, comm_s, total)
            if len(self._token_cache) < 1 << 16:
                self._token_cache[key] = cached
        return cached

    def _token_ops(self, tokens: float, logits: float) -> list[OpCost]:
        m, tp = self.model, self.tp
        h, layers, ab = m.hidden_size, m.num_layers, self._act_bytes
        heads = m.num_heads // tp
        ops = [self._elementwise("embedding", 2 * tokens * h * ab, tokens, 1, 1)]
        for k, n in self._attn_gemms:
            ops.append(self._gemm("qkv_proj", tokens, k, n, layers))
        ops.append(self._gemm("o_proj", tokens, heads * m.v_head_dim, h, layers))

        dense, sparse = m.num_dense_layers, m.num_moe_layers
        if dense:
            ops.extend(self._mlp(tokens, m.intermediate_size, dense, "mlp"))
        if sparse:
            assert m.moe is not None
            ops.extend(self._routed_experts(tokens, sparse))
            if m.moe.shared_intermediate:
                ops.extend(self._mlp(tokens, m.moe.shared_intermediate, sparse, "mlp"))

        # Two fused residual-add + RMSNorm (read x and residual, write both), RoPE on q and k,
        # and the MLP activation (read gate and up, write their product).
        rope_dim = m.mla.qk_rope_head_dim if m.mla else m.head_dim
        rope_heads = heads + (1 if m.mla else max(1, m.num_kv_heads // tp))
        per_layer = 8 * tokens * h + 2 * tokens * rope_heads * rope_dim
        gate = 3 if m.gated_mlp else 2
        if dense:
            ops.append(self._elementwise(
                "elementwise", (per_layer + gate * tokens * m.intermediate_size / tp) * ab,
                tokens, 4, dense))
        if sparse:
            assert m.moe is not None
            moe_rows = tokens * m.moe.top_k
            moe_act = gate * (moe_rows * m.moe.expert_intermediate
                              + tokens * m.moe.shared_intermediate) / tp
            # The expert GEMMs write one row per assignment (counted there); the weighted sum
            # over each token's experts reads them back and writes one row per token.
            permute = moe_rows * h + tokens * h
            ops.append(self._elementwise("elementwise", (per_layer + moe_act + permute) * ab,
                                         tokens, 6, sparse))
        ops.append(self._elementwise("elementwise", 2 * tokens * h * ab, tokens, 1, 1))
        vocab = m.vocab_size // tp  # the LM head stays 16-bit in quantised checkpoints
        ops.append(self._gemm("lm_head", logits, h, vocab, 1, weight_bytes=h * vocab * 2.0))
        return ops

    def _communication_s(self, tokens: float, logits: float) -> float:
        """TP collectives: two all-reduces of the residual stream per layer, one after the
        vocabulary-parallel embedding, and the all-gather of the logits."""
        if self.tp == 1:
            return 0.0
        link, m = self.hardware.interconnect, self.model
        residual = tokens * m.hidden_size * COMM_BYTES
        return ((2 * m.num_layers + 1) * ring_allreduce_s(residual, self.tp, link)
                + ring_allgather_s(logits * m.vocab_size * COMM_BYTES, self.tp, link))

    def _assemble(self, ops: list[OpCost], comm_s: float, total: float) -> StepCost:
        breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        bound_s = {"compute": 0.0, "memory": 0.0, "communication": comm_s, "overhead": 0.0}
        flops = hbm = 0.0
        for op in ops:
            breakdown[op.name] += op.time_s
            bound_s[op.bound] += op.roofline_s
            bound_s["overhead"] += op.fixed_s
            flops += op.flops
            hbm += op.bytes
        step_overhead = self.hardware.overhead.step_s
        breakdown["communication"] = comm_s
        breakdown["overhead"] = step_overhead
        bound_s["overhead"] += step_overhead
        bound = max(bound_s, key=bound_s.__getitem__)
        return StepCost(total, breakdown, bound, bound_s, flops, hbm, tuple(ops))
