"""How long one iteration takes on one replica, and why.

:class:`CostModel` is a pure function of (model, hardware, tensor parallelism, precision, batch
shape) -> seconds. It knows nothing of SimPy or policies, so the engine, ``servesim step``,
calibration and notebooks all call the same code.

One step on one GPU of the TP group runs, per layer: the attention projections (QKV, or MLA's
low-rank projections), attention (a prefill kernel and a decode kernel, see
:mod:`servesim.cost.attention`), the output projection, the MLP (dense, or router + routed
experts + shared experts), the elementwise kernels (two fused residual-add + RMSNorm, RoPE, the
activation) and, with TP > 1, two all-reduces of the residual stream. Around the layers: the
embedding gather (plus its all-reduce under TP), the final norm, the LM head for the sequences
that sample a token, the logits all-gather, and a fixed per-step framework overhead.

Every operator is charged by :func:`servesim.cost.roofline.roofline`. Nothing overlaps:
vLLM-style engines run TP all-reduces between the layer's kernels, not under them.

Sharding (Megatron-style, as vLLM does it): QKV/gate/up are split by output columns, O/down by
input rows; KV heads are split across GPUs (replicated when there are fewer KV heads than GPUs);
the vocabulary is split for the embedding and the LM head; norms, MLA's down-projections
(``q_a``, ``kv_a``) and the MoE router are replicated. MLA's two down-projections read the same
input and run as one GEMM (vLLM's and SGLang's ``fused_qkv_a_proj``, TensorRT-LLM's fused A
projection: one launch, one input read, one activation quantisation). Routed experts are TP-sharded (every GPU
holds a 1/tp slice of every expert), vLLM's default without expert parallelism. Widths that TP
does not divide are padded up (vLLM pads the vocabulary).

Precision: the layer GEMMs read weights in the weight format and inputs in the activation
format, and run on the peak of the activation format (8-bit for W8A8/FP8). Everything else moves
16-bit values: GEMM outputs, the residual stream, elementwise kernels, attention's Q and O, and
TP collectives. The LM head and the MoE router stay 16-bit in weights and math, as quantised
checkpoints leave them; attention math is 16-bit (FP8 attention kernels are not modelled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from servesim.cost.attention import (
    AttentionShape,
    decode_attention,
    decode_attention_of,
    decode_keys,
    prefill_attention,
)
from servesim.cost.batch import BatchShape
from servesim.cost.communication import (
    allgather_s,
    allreduce_s,
    domains_spanned,
    ring_allgather_s,
    ring_allreduce_s,
)
from servesim.cost.decode_run import DecodeRunPricer, MemoBudget
from servesim.cost.engine_runtime import EngineRuntime, StepTiming
from servesim.cost.expert_parallel import ExpertLayer
from servesim.cost.quantise import input_quantisation_s, one_pass_output_bytes, one_pass_quantisation_s
from servesim.cost.roofline import OpCost, memory_efficiency, padded_rows, roofline, roofline_at
from servesim.cost.routing import experts_hit
from servesim.dtypes import DType, Precision
from servesim.engines.base import RuntimeCosts, default_runtime
from servesim.hardware import HardwareProfile
from servesim.model_spec import ModelSpec, ceil_div
from servesim.parallelism import Parallelism, StageLayers, placement

BREAKDOWN_KEYS = ("embedding", "qkv_proj", "attn_prefill", "attn_decode", "o_proj", "mlp", "moe",
                  "elementwise", "lm_head", "communication", "overhead")
"""Operator classes of :attr:`StepCost.breakdown`; stable names that other tools read."""

IO_BYTES = 2.0
"""Bytes per element of the residual stream, GEMM outputs, elementwise kernels and TP collectives:
16-bit whatever the GEMM precision (FP8 GEMMs quantise their input on the fly and write bf16)."""
FP32_BYTES = 4.0
"""A QK-norm's sums of squares travel in fp32 (:meth:`CostModel._communication_s`)."""


BOUNDS = ("compute", "memory", "communication", "overhead")
"""What a step can be bound by, in the order :attr:`StepRecord.bound` indexes them."""

OP_CLASSES = ("gemm", "attn_prefill", "attn_decode", "elementwise", "communication", "overhead",
              "proposal")
"""The coarse operator classes the engine records per step (:meth:`CostModel.step_record`), in
record order: every weight GEMM (QKV/MLA projections, O, MLP, MoE router and experts, LM head),
the two attention kernels, the memory-bound elementwise kernels (embedding gather, norms, RoPE,
activation, MoE combine), TP collectives, the fixed per-step framework overhead, and the passes of
a speculative proposer (a draft model, EAGLE head or MTP layer: all its kernels together; zero
without speculative decoding, see :mod:`servesim.cost.speculative`). Each class holds its kernels'
launch floors, so the seven sum to the step time."""

OP_CLASS_OF = {"embedding": "elementwise", "qkv_proj": "gemm", "attn_prefill": "attn_prefill",
               "attn_decode": "attn_decode", "o_proj": "gemm", "mlp": "gemm", "moe": "gemm",
               "elementwise": "elementwise", "lm_head": "gemm", "communication": "communication",
               "overhead": "overhead"}
"""Which :data:`OP_CLASSES` entry each :data:`BREAKDOWN_KEYS` entry belongs to."""


class StepRecord(NamedTuple):
    """What the engine logs of one step (:meth:`CostModel.step_record`), without the breakdown:
    the time, what bounds it (an index into :data:`BOUNDS`), the work, the seconds of each of
    :data:`OP_CLASSES` (they sum to ``time_s``) and ``verify_extra_s``. The step log's columns are
    named from these fields (:mod:`servesim.core.step_log`)."""

    time_s: float
    bound: int
    flops: float
    hbm_bytes: float
    gemm_s: float
    attn_prefill_s: float
    attn_decode_s: float
    elementwise_s: float
    communication_s: float
    overhead_s: float
    proposal_s: float = 0.0
    """Speculative decoding: the proposer's passes (draft model, EAGLE head, MTP layer)."""
    verify_extra_s: float = 0.0
    """Speculative decoding: how much longer the target's pass took for verifying proposals than
    it would have taken decoding one token per request (inside the other classes, not added)."""


PrefillKey = tuple[tuple[int, ...], tuple[int, ...], tuple[bool, ...]]
"""A prefill-only batch: its chunks' new tokens, earlier context and whether each emits."""
PREFILL_MEMO_BATCH = 4
"""Prefill-only steps of at most this many chunks have their records memoised (admissions mostly
start one or two prompts; larger batches rarely repeat)."""
PREFILL_MEMO_ENTRIES = 1 << 16
"""At most this many memoised prefill records per cost model (a few MB)."""

IDLE_RECORD = StepRecord(0.0, BOUNDS.index("overhead"), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class _OpColumns:
    """What each of :class:`_TokenPart`'s sums adds up, operator by operator in order: a part
    assembled from its token half and its logits half (:meth:`CostModel._token_part`) then sums
    the very same sequences as one built from all its operators at once, so the same floats
    whatever ``sum`` does (Python 3.12 compensates)."""

    ops: tuple[OpCost, ...]
    times: tuple[float, ...]
    compute: tuple[float, ...]
    """``roofline_s`` of the compute-bound operators."""
    memory: tuple[float, ...]
    """``roofline_s`` of the memory-bound operators."""
    side: tuple[float, ...]
    fixed: tuple[float, ...]
    flops: tuple[float, ...]
    nbytes: tuple[float, ...]
    gemm: tuple[float, ...]
    """``time_s`` of the operators of the ``gemm`` class."""
    elementwise: tuple[float, ...]
    """``time_s`` of the operators of the ``elementwise`` class."""
    attn_prefill: tuple[float, ...] = ()
    attn_decode: tuple[float, ...] = ()
    """``time_s`` of the attention operators a part holds: a hybrid model's linear-attention
    kernels (:meth:`CostModel._linear_attention_ops`), which depend on the tokens and sequences
    alone; empty for every other model."""

    @classmethod
    def of(cls, ops: tuple[OpCost, ...]) -> _OpColumns:
        """The columns of ``ops``, in their order: one pass, each operator's ``roofline_s``,
        ``time_s`` and ``bound`` evaluated once (the same expressions as :class:`OpCost`'s
        properties, so the same floats; a memo miss of a prefill step builds several)."""
        times: list[float] = []
        compute: list[float] = []
        memory: list[float] = []
        side: list[float] = []
        fixed: list[float] = []
        flops: list[float] = []
        nbytes: list[float] = []
        gemm: list[float] = []
        elementwise: list[float] = []
        prefill: list[float] = []
        decode: list[float] = []
        class_of = OP_CLASS_OF
        for op in ops:
            compute_s, memory_s, fixed_s, side_s = op.compute_s, op.memory_s, op.fixed_s, op.side_s
            # OpCost.roofline_s (max keeps the first of equals) and OpCost.bound
            if compute_s >= memory_s:
                compute.append(compute_s)
                time_s = compute_s + fixed_s + side_s  # OpCost.time_s
            else:
                memory.append(memory_s)
                time_s = memory_s + fixed_s + side_s
            times.append(time_s)
            side.append(side_s)
            fixed.append(fixed_s)
            flops.append(op.flops)
            nbytes.append(op.bytes)
            kind = class_of[op.name]
            if kind == "gemm":
                gemm.append(time_s)
            elif kind == "elementwise":
                elementwise.append(time_s)
            elif kind == "attn_prefill":
                prefill.append(time_s)
            elif kind == "attn_decode":
                decode.append(time_s)
        return cls(ops, tuple(times), tuple(compute), tuple(memory), tuple(side), tuple(fixed),
                   tuple(flops), tuple(nbytes), tuple(gemm), tuple(elementwise), tuple(prefill),
                   tuple(decode))

    def then(self, other: _OpColumns) -> _OpColumns:
        """These operators followed by ``other``'s (each column concatenated)."""
        if not other.ops:
            return self
        return _OpColumns(self.ops + other.ops, self.times + other.times,
                          self.compute + other.compute, self.memory + other.memory,
                          self.side + other.side, self.fixed + other.fixed, self.flops + other.flops,
                          self.nbytes + other.nbytes, self.gemm + other.gemm,
                          self.elementwise + other.elementwise, self.attn_prefill + other.attn_prefill,
                          self.attn_decode + other.attn_decode)


NO_OPS = _OpColumns.of(())


@dataclass(frozen=True, slots=True)
class _BodyPart:
    """The operators and collectives that depend on the step's new tokens alone (all but the LM
    head and the logits' all-gather), memoised per token count: mixed prefill + decode steps
    repeat a token count with many logits counts."""

    columns: _OpColumns
    lead_s: float | None
    """The all-reduces (and QK-norm sums) of :meth:`CostModel._communication_s`; None without TP."""
    extra_s: float
    """Expert parallelism's all-reduce of the MoE output (0.0 without)."""


@dataclass(frozen=True, slots=True)
class _HeadPart:
    """The LM head and the logits' all-gather, memoised per logits count."""

    columns: _OpColumns
    gather_s: float


@dataclass(frozen=True, slots=True)
class _TokenPart:
    """The memoised operators that depend only on (new tokens, logits rows), with their sums."""

    ops: tuple[OpCost, ...]
    comm_s: float
    total_s: float
    compute_s: float
    memory_s: float
    overhead_s: float
    flops: float
    hbm_bytes: float
    gemm_s: float
    elementwise_s: float
    attn_prefill_s: float = 0.0
    attn_decode_s: float = 0.0
    """A hybrid model's linear-attention kernels (0.0 for every other model, so a record's
    attention sums start where they always did)."""

    @classmethod
    def of(cls, columns: _OpColumns, comm_s: float, step_s: float) -> _TokenPart:
        """The part of these operators, collectives and per-step constant, summed as ever."""
        return cls(columns.ops, comm_s, sum(columns.times) + comm_s + step_s,
                   compute_s=sum(columns.compute),
                   memory_s=sum(columns.memory) + sum(columns.side),
                   overhead_s=sum(columns.fixed) + step_s,
                   flops=sum(columns.flops), hbm_bytes=sum(columns.nbytes),
                   gemm_s=sum(columns.gemm), elementwise_s=sum(columns.elementwise),
                   attn_prefill_s=sum(columns.attn_prefill), attn_decode_s=sum(columns.attn_decode))


TOKEN_MEMO_ENTRIES = 1 << 16
"""At most this many token parts (about 0.5 kB each: their operators are the halves') and logits
halves per cost model."""
BODY_MEMO_ENTRIES = 1 << 14
"""At most this many token halves per cost model (about 3 kB each, so under 50 MB: a step's token
count rarely exceeds the engine's step budget, but a policy that does not chunk may see as many
as its prompts have lengths)."""
GEMM_AT_ENTRIES = 1 << 16
"""At most this many remembered values of the GEMM tokens curve per cost model (:meth:`CostModel._gemm`)."""
DECODE_OP_ENTRIES = 1 << 16
"""At most this many decode kernels (one operator each, about 0.2 kB) per cost model."""
CHUNK_MEMO_ENTRIES = 1 << 16
"""At most this many one-chunk prefill kernels (a tuple per chunk, one per attention kind, about
0.4 kB) per cost model."""


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
    """Step-time predictor for one deployment (model x hardware x TP x precision), as a serving
    engine runs it: ``runtime`` is the engine's software cost per step (default: the default
    engine's on this hardware; :meth:`RuntimeCosts.none` for the kernels alone)."""

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, tp: int = 1,
                 precision: Precision | None = None, runtime: RuntimeCosts | None = None,
                 parallelism: Parallelism | None = None, stage: StageLayers | None = None) -> None:
        """``parallelism`` beyond ``tp`` (expert parallelism, data-parallel ranks) and ``stage`` (one
        pipeline stage's layers) price one GPU of that layout; without them, one GPU of a TP group
        running every layer. With data-parallel ranks the routed experts are left out of
        :meth:`step` and priced once for all ranks' tokens by :meth:`moe_part`."""
        model.check_tensor_parallel(tp)
        self.parallelism = parallelism if parallelism is not None else Parallelism(tp=tp)
        assert self.parallelism.tp == tp, "tp and parallelism.tp disagree"
        self.stage = stage if stage is not None else StageLayers(0, 0, model.num_layers, True, True)
        counts = model.layer_counts(self.stage.start, self.stage.stop)
        self._layers = self.stage.layers
        self._linear_layers = counts.get("linear_attention", 0) if model.linear_attention is not None else 0
        """A hybrid model's linear-attention layers in this stage (:meth:`_linear_attention_ops`)."""
        self._attention_layers = self._layers - self._linear_layers - counts.get("none", 0)
        """Layers with softmax attention: their Q/K/V/O projections and attention kernels."""
        self._dense, self._sparse = counts["dense"], counts["moe"]
        self._residual_reduces = model.residual_reductions_in(self.stage.start, self.stage.stop)
        """All-reduces of the residual stream per step under TP (this stage's layers)."""
        self.model = model
        self.hardware = hardware
        self.tp = tp
        self.precision = precision or Precision()
        self.runtime = runtime if runtime is not None else default_runtime(hardware.name)
        self._flat = self.runtime.is_flat
        # A flat runtime (servesim 0.1's) adds its constant to the memoised token part, exactly as
        # before; any other is folded in per step by :mod:`servesim.cost.engine_runtime`.
        self._step_overhead_s = self.runtime.step_overhead_s if self._flat else 0.0
        self.peak_flops = hardware.peak(self.precision.math)
        self.bf16_peak = hardware.peak(DType.BF16)
        self.bandwidth = hardware.memory.bandwidth_Bps
        self._gemm_eff = hardware.efficiency.gemm_for(self.precision.math)
        self._moe_eff = hardware.efficiency.moe_for(self.precision.math, self.precision.expert_format)
        self._decode_tile = hardware.efficiency.decode_for(self.precision.kv_bytes).key_tile
        """The KV tile of the decode class this cache reads (``Efficiency.decode_for``), per step."""
        self._gemm16_eff = hardware.efficiency.gemm
        self._elem_eff = hardware.efficiency.elementwise
        self._quant_eff = hardware.efficiency.quantisation
        self._act_bytes = self.precision.act_bytes
        self._one_pass_bytes = one_pass_output_bytes(model.fp8_block_size, self.precision,
                                                     hardware.compute_capability)
        """Bytes per value a dense GEMM's one-pass input quantisation writes (FP4 activations, a
        block-scaled FP8 checkpoint on Blackwell), or None for the per-tensor two-pass price
        (:func:`servesim.cost.quantise.one_pass_output_bytes`)."""
        self._kv_bytes = self.precision.kv_bytes
        self._weight_bytes = self.precision.weight_bytes
        self.attention = self._attention_shape()
        self._attention_groups = self._attention_kinds(counts)
        self._kind_peaks = [self.bf16_peak] * len(self._attention_groups)
        """The peak each attention kind computes at: 16-bit, but DSA's indexer runs in FP8."""
        if model.sparse_attention is not None and self._attention_groups and DType.FP8 in hardware.peak_flops:
            self._kind_peaks[-1] = hardware.peak(DType.FP8)
        self._attn_gemms = self._attention_projection_shapes()
        self._experts = self._expert_layer()
        self._gemm_formats = tuple(
            (in_bytes, weight_element, peak, eff.compute.at,
             None if eff.outputs is None else eff.outputs.at, None if eff.depth is None else eff.depth.at,
             eff.memory.at, eff.memory.axis == "bytes", eff.fixed_s, self.bandwidth, eff.row_tile)
            for in_bytes, weight_element, peak, eff in (
                (self._act_bytes, self._weight_bytes, self.peak_flops, self._gemm_eff),
                (IO_BYTES, IO_BYTES, self.bf16_peak, self._gemm16_eff)))
        """What :meth:`_gemm` reads of the deployment's format (index 0) and of 16 bits (index 1, the
        ``sixteen_bit`` GEMMs): input and weight bytes per element, peak, the tokens curve's
        ``at``, the outputs and depth factors' (None where the class has none), the memory curve's,
        whether it reads bytes (else rows), the launch floor, the bandwidth, the row tile the
        kernels pad their rows to (1: none, :func:`~servesim.cost.roofline.padded_rows`)."""
        self._gemm_rows_at: dict[tuple[bool, float], float] = {}
        """The GEMM tokens curve's value by (16-bit, rows) (:meth:`_gemm`)."""
        self._gemm_depth_at: dict[tuple[bool, int], float] = {}
        """The GEMM depth factor by (16-bit, k) (:meth:`_gemm`)."""
        self._token_cache: dict[tuple[int, int], _TokenPart] = {}
        self._body_cache: dict[int, _BodyPart] = {}
        self._head_cache: dict[int, _HeadPart] = {}
        self._chunk_ops: dict[tuple[int, int], tuple[OpCost, ...]] = {}
        """:meth:`_one_chunk_ops` by (new tokens, context)."""
        self._decode_ops: dict[tuple[int, int, float], OpCost] = {}
        """:meth:`_decode_op` by (attention kind, decodes, keys read)."""
        self._prefill_records: dict[PrefillKey, StepRecord] = {}
        """:meth:`step_record` of small prefill-only batches, by their chunks (a pure function)."""
        self._moe_cache: dict[int, tuple[tuple[OpCost, ...], float]] = {}
        self._run_pricers: dict[int, DecodeRunPricer] = {}
        """Per batch size, what the steps of a run of that many decodes share (:meth:`decode_run_records`)."""
        self._run_memo = MemoBudget()
        self._ring = self.runtime.allreduce == "ring" and domains_spanned(tp, hardware) is None
        """Whether collectives take the interconnect's ring model (the runtime says so and the
        group stays inside one fast domain)."""
        self._engine = None if self._flat else EngineRuntime(self.runtime, model, hardware, tp,
                                                              self._attn_gemms)

    def _attention_kinds(self, counts: dict[str, int]) -> list[tuple[AttentionShape, int]]:
        """Each attention kind of this stage's layers with its layer count (one entry for a model
        whose layers attend alike, priced exactly as before kinds existed)."""
        m = self.model
        kinds = [kind for kind in ("full_attention", "sliding_attention", "chunked_attention")
                 if counts.get(kind)]
        if m.sparse_attention is not None:
            # DSA: MLA reads at most the indexer's top-k keys per query (a window's count, though
            # chosen from the whole context, which stays cached), in prefill too in its absorbed
            # form over the cached latents (FlashMLA's sparse prefill is MQA over 576-wide keys and
            # 512-wide values, as its decode is); the indexer scores every key
            mla = self.attention
            sparse = replace(mla, window=m.sparse_attention.top_k,
                             prefill_flops_per_pair=mla.decode_flops_per_key,
                             prefill_kv_elements_per_token=mla.cache_elements_per_token, mla=False)
            return [(sparse, self._layers), (self._indexer_shape(), self._layers)] if self._layers else []
        if not m.layer_types:
            return [(self.attention, self._layers)] if self._layers else []
        groups = []
        for kind in kinds:
            shape = self.attention
            if kind == "sliding_attention":
                shape = replace(shape, window=m.sliding_window)
            elif kind == "chunked_attention":
                shape = replace(shape, window=None, chunk=m.attention_chunk_size)
            else:
                shape = replace(shape, window=None)
            groups.append((shape, counts[kind]))
        return groups

    def _indexer_shape(self) -> AttentionShape:
        """DSA's lightning indexer as an attention kind: every GPU scores all ``index_heads`` (its
        weights are replicated) against each cached index key, one ``index_head_dim`` dot product
        per head and key (no value product; the per-head weights and the top-k are a small
        reduction over the scores); it reads its own cache of one key per token. Priced by the
        profile's attention classes at the FP8 peak (DeepGEMM's FP8 logits kernels; no indexer
        kernel has been measured: an estimate)."""
        m = self.model
        dsa = m.sparse_attention
        assert dsa is not None
        width = dsa.index_heads * dsa.index_head_dim
        per_key = 2 * width
        # the kernels price a key at the cache's bytes per element: this many "elements" make the
        # FP8 key and its scale (ModelSpec.index_cache_bytes_per_token_per_layer)
        elements = m.index_cache_bytes_per_token_per_layer / self._kv_bytes
        return AttentionShape(heads=dsa.index_heads, q_head_dim=dsa.index_head_dim, v_head_dim=0,
                              cache_elements_per_token=elements,  # type: ignore[arg-type]
                              prefill_kv_elements_per_token=elements,  # type: ignore[arg-type]
                              prefill_flops_per_pair=per_key, decode_flops_per_key=per_key,
                              decode_q_width=width, decode_o_width=dsa.index_heads, window=None)

    def _expert_layer(self) -> ExpertLayer | None:
        """The routed experts' layout when it differs from TP-sharding every expert on one group."""
        p = self.parallelism
        if self.model.moe is None or (p.ep == 1 and p.dp == 1):
            return None
        return ExpertLayer(self.model, self.hardware, p, placement(self.hardware, p),
                           self.precision, self._expert_weight_bytes())

    def _expert_weight_bytes(self) -> float:
        return self.precision.expert_weight_bytes

    # ------------------------------------------------------------------ per-GPU shapes
    def _attention_shape(self) -> AttentionShape:
        m, tp = self.model, self.tp
        heads = m.num_heads // tp
        cache = m.kv_elements_per_token_per_layer(tp)
        per_pair = 2 * heads * (m.q_head_dim + m.v_head_dim)
        if m.mla is not None:
            latent, rope = m.mla.kv_lora_rank, m.mla.qk_rope_head_dim
            return AttentionShape(
                heads=heads, q_head_dim=m.q_head_dim, v_head_dim=m.v_head_dim,
                cache_elements_per_token=cache,
                prefill_kv_elements_per_token=heads * (m.q_head_dim + m.v_head_dim),
                prefill_flops_per_pair=per_pair, decode_flops_per_key=2 * heads * (2 * latent + rope),
                decode_q_width=heads * (latent + rope), decode_o_width=heads * latent, window=None,
                mla=True)
        return AttentionShape(
            heads=heads, q_head_dim=m.head_dim, v_head_dim=m.head_dim,
            cache_elements_per_token=cache, prefill_kv_elements_per_token=cache,
            prefill_flops_per_pair=per_pair, decode_flops_per_key=per_pair,
            decode_q_width=heads * m.head_dim, decode_o_width=heads * m.head_dim,
            window=m.sliding_window)

    def _attention_projection_shapes(self) -> list[tuple[int, int]]:
        """(K, N) of each attention input projection on one GPU (MLA: ``q_a`` and ``kv_a`` fused
        into one, see the module docstring; a model without ``q_lora_rank`` projects its queries
        straight from the hidden state, beside ``kv_a``)."""
        m, tp, h = self.model, self.tp, self.model.hidden_size
        heads = m.num_heads // tp
        if m.mla is None:
            kv_heads = max(1, m.num_kv_heads // tp)
            q_heads = 2 * heads if m.attention_output_gate else heads  # the gate rides on q_proj
            return [(h, (q_heads + 2 * kv_heads) * m.head_dim)]
        a = m.mla
        q_width = heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
        if a.q_lora_rank:
            shapes = [(h, a.q_lora_rank + a.cache_width), (a.q_lora_rank, q_width)]
        else:
            shapes = [(h, q_width), (h, a.cache_width)]
        dsa = m.sparse_attention
        if dsa is not None:  # the indexer's query (from the query latent), its key and head weights
            shapes += [(a.q_lora_rank or h, dsa.index_heads * dsa.index_head_dim),
                       (h, dsa.index_head_dim + dsa.index_heads)]
        return [*shapes, (a.kv_lora_rank, self._mla_kv_up_width)]

    @property
    def _mla_kv_up_width(self) -> int:
        """Output width of MLA's ``kv_b`` up-projection on one GPU (K nope part and V)."""
        m = self.model
        assert m.mla is not None
        return m.num_heads // self.tp * (m.mla.qk_nope_head_dim + m.mla.v_head_dim)

    # ------------------------------------------------------------------ operator helpers
    def gemm(self, rows: float, k: int, n: int) -> OpCost:
        """One (rows x k) @ (k x n) GEMM on one GPU in this deployment's precision (for layers the
        model spec does not hold, such as a speculative head's fusion projection)."""
        return self._gemm("gemm", rows, k, n, 1)

    def _gemm(self, name: str, m: float, k: int, n: int, repeat: float,
              weight_bytes: float | None = None, sixteen_bit: bool = False) -> OpCost:
        """``repeat`` GEMMs of (m x k) @ (k x n): the weights read once, the input read in the
        activation format, the output written in 16 bits. ``sixteen_bit`` GEMMs (LM head, router)
        keep 16-bit weights, inputs and math whatever the deployment's precision.

        The roofline's curves are read here, the tokens curve's value remembered per (format,
        rows) and the depth factor per (format, k) (pure functions of those; a step's GEMMs share
        its rows, and a memo miss prices a dozen of them); the arithmetic is
        :func:`~servesim.cost.roofline.roofline_at`'s."""
        if m <= 0:
            return OpCost(name, 0.0, 0.0, 0.0, 0.0, 0.0)
        in_bytes, weight_element, peak, compute_at, outputs_at, depth_at, memory_at, by_bytes, fixed_s, \
            bandwidth, row_tile = self._gemm_formats[sixteen_bit]
        if weight_bytes is None:
            weight_bytes = k * n * weight_element
        nbytes = weight_bytes + m * k * in_bytes + m * n * IO_BYTES
        rows = m if row_tile == 1 else padded_rows(m, row_tile)  # what the compute side runs
        flops = 2.0 * m * k * n  # useful work: the padding shows as a lower efficiency
        efficiency = 1.0
        if flops > 0:
            # eff.compute_at(rows, rows * n, k): the tokens curve, times the outputs then depth factor
            key = (sixteen_bit, rows)
            rows_eff = self._gemm_rows_at.get(key)
            if rows_eff is None:
                rows_eff = compute_at(rows)
                if len(self._gemm_rows_at) < GEMM_AT_ENTRIES:
                    self._gemm_rows_at[key] = rows_eff
            efficiency = rows_eff
            if outputs_at is not None:
                efficiency *= outputs_at(rows * n)
            if depth_at is not None:
                key = (sixteen_bit, k)
                depth = self._gemm_depth_at.get(key)
                if depth is None:
                    depth = self._gemm_depth_at[key] = depth_at(k)
                efficiency *= depth
            if rows != m:  # roofline(..., useful=m / rows)
                efficiency *= m / rows
        return roofline_at(name, flops, nbytes, peak_flops=peak, bandwidth=bandwidth, compute_eff=efficiency,
                           memory_eff=memory_at(nbytes if by_bytes else m), fixed_s=fixed_s, repeat=repeat,
                           side_s=0.0 if in_bytes >= IO_BYTES else repeat * self._quantise_s(m, k))

    def _quantise_s(self, rows: float, k: int, per_row: bool = True) -> float:
        """The dynamic quantisation of a (rows x k) 16-bit input to the activation format that an
        8-bit GEMM runs first (:mod:`servesim.cost.quantise`; ``per_row`` false for the fused MoE's)."""
        if self._one_pass_bytes is not None and per_row:
            return one_pass_quantisation_s(rows, k, self._one_pass_bytes, self._quant_eff, self.bandwidth)
        return input_quantisation_s(rows, k, self._act_bytes, self._quant_eff, self.bandwidth, per_row)

    def _elementwise(self, name: str, elements: float, tokens: float, kernels: float,
                     repeat: float) -> OpCost:
        """``kernels`` memory-bound kernels moving ``elements`` 16-bit values in all (the
        roofline with no FLOPs)."""
        nbytes = elements * IO_BYTES
        if nbytes <= 0:
            return OpCost(name, 0.0, 0.0, 0.0, 0.0, 0.0)
        eff = self._elem_eff
        return roofline_at(name, 0.0, nbytes, peak_flops=self.bf16_peak, bandwidth=self.bandwidth,
                           compute_eff=1.0, memory_eff=memory_efficiency(eff, nbytes / kernels, tokens),
                           fixed_s=eff.fixed_s, repeat=repeat, kernels=kernels)

    def _mlp(self, tokens: float, intermediate: int, repeat: float, name: str) -> list[OpCost]:
        h, local = self.model.hidden_size, ceil_div(intermediate, self.tp)
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
        hit = experts_hit(experts, top_k / experts, tokens)
        rows_per_expert = assignments / hit
        local = ceil_div(moe.expert_intermediate, self.tp)
        up_width = 2 * local if self.model.gated_mlp else local
        expert_weights = h * (up_width + local)
        flops = 2.0 * assignments * expert_weights
        # Per assignment: read the token (activation format), write the up output (16-bit),
        # read the activated intermediate (activation format), write the expert's output row.
        io = assignments * ((h + local) * self._act_bytes + (up_width + h) * IO_BYTES)
        nbytes = hit * expert_weights * self.precision.expert_weight_bytes + io
        experts_cost = roofline("moe", flops, nbytes, peak_flops=self.peak_flops,
                                bandwidth=self.bandwidth, eff=self._moe_eff,
                                compute_axis=rows_per_expert, repeat=repeat, kernels=2)
        if self._act_bytes < IO_BYTES:  # the fused kernel quantises its input and intermediate
            side = (self._quantise_s(tokens, h, per_row=False)
                    + self._quantise_s(assignments, local, per_row=False))
            experts_cost = replace(experts_cost, side_s=repeat * side)
        router = self._gemm("moe", tokens, h, experts, repeat, sixteen_bit=True)
        return [router, experts_cost]

    # ------------------------------------------------------------------ the step
    def step(self, batch: BatchShape) -> StepCost:
        """Predicted time and anatomy of one iteration running ``batch``."""
        if batch.is_empty:
            zero = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
            return StepCost(0.0, zero, "idle", {"compute": 0.0, "memory": 0.0,
                                                 "communication": 0.0, "overhead": 0.0},
                            0.0, 0.0, ())
        if self._engine is not None:
            return self._step_with_engine(batch, self._engine)
        part = self._token_part(batch.num_new_tokens, batch.num_logits)
        batch_ops = self._batch_ops(batch)
        # The total is summed exactly as step_time() sums it, so both agree to the last bit.
        total = part.total_s
        for op in batch_ops:
            total += op.time_s
        return self._assemble([*part.ops, *batch_ops], part.comm_s, total)

    def _step_with_engine(self, batch: BatchShape, engine: EngineRuntime) -> StepCost:
        """:meth:`step` for an engine whose CPU work, overlap, CUDA graphs or launches shape the
        step: the kernels at the padded size, then the engine's exposed time as ``overhead``."""
        priced, mode = engine.plan(batch)
        part = self._token_part(priced, batch.num_logits)
        batch_ops = self._batch_ops(batch)
        kernels = part.total_s
        for op in batch_ops:
            kernels += op.time_s
        timing = engine.time(batch, kernels, mode)
        return self._assemble([*part.ops, *batch_ops], part.comm_s, timing.time_s,
                              step_overhead=timing.exposed_s)

    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one iteration: the engine's fast path, same number as ``step().time_s``."""
        if batch.is_empty:
            return 0.0
        engine = self._engine
        if engine is not None:
            priced, mode = engine.plan(batch)
            kernels = self._token_part(priced, batch.num_logits).total_s
            for op in self._batch_ops(batch):
                kernels += op.time_s
            return engine.time(batch, kernels, mode).time_s
        total = self._token_part(batch.num_new_tokens, batch.num_logits).total_s
        for op in self._batch_ops(batch):
            total += op.time_s
        return total

    def _batch_ops(self, batch: BatchShape) -> list[OpCost]:
        """The operators that depend on each request's context, not just on the token count."""
        layers = self._layers
        ops = []
        chunk = self._one_chunk_ops(batch) if batch.num_prefills == 1 else None
        for kind, (shape, count) in enumerate(self._attention_groups):
            args = (self.hardware, self._kind_peaks[kind], self._kv_bytes, count)
            if batch.num_prefills:
                ops.append(prefill_attention(batch, shape, *args) if chunk is None else chunk[kind])
            if batch.num_decodes:
                ops.append(self._decode_op(batch, kind, shape, count))
        mla = self.model.mla
        if mla is not None and self.model.sparse_attention is None and batch.num_prefills and layers:
            # MLA prefill over earlier context re-expands the cached latents into K and V (DSA's
            # sparse prefill reads the latents as they are).
            context_rows = float(batch.prefill_context.sum())
            ops.append(self._gemm("qkv_proj", context_rows, mla.kv_lora_rank, self._mla_kv_up_width, layers))
        return ops

    def _decode_op(self, batch: BatchShape, kind: int, shape: AttentionShape, layers: int) -> OpCost:
        """``decode_attention`` of the batch's decodes for attention kind ``kind``, memoised by
        (kind, decodes, keys read): the kernel's price is a function of those alone
        (``decode_attention_of``), and with KV tiles the key counts repeat (the decodes of chunked
        prefill's mixed steps; a fast-forwarded run's steps are priced by its run pricer).
        Speculative verification is priced directly."""
        hardware = self.hardware
        keys = decode_keys(batch, shape, self._decode_tile)
        if keys is None:
            return decode_attention(batch, shape, hardware, self._kind_peaks[kind], self._kv_bytes, layers)
        key = (kind, batch.num_decodes, keys)
        op = self._decode_ops.get(key)
        if op is None:
            op = decode_attention_of(float(batch.num_decodes), keys, shape, hardware, self._kind_peaks[kind],
                                     self._kv_bytes, layers)
            if len(self._decode_ops) < DECODE_OP_ENTRIES:
                self._decode_ops[key] = op
        return op

    def _one_chunk_ops(self, batch: BatchShape) -> tuple[OpCost, ...]:
        """The prefill kernel of each attention kind for a batch whose only prefill is one chunk:
        a function of the chunk's (new tokens, context) alone, memoised (a mixed step of chunked
        prefill mostly carries one chunk, and chunks repeat: the chunked core benchmark prices
        about one in five of them)."""
        key = (int(batch.prefill_tokens[0]), int(batch.prefill_context[0]))
        cached = self._chunk_ops.get(key)
        if cached is None:
            groups = zip(self._attention_groups, self._kind_peaks, strict=True)
            cached = tuple(prefill_attention(batch, shape, self.hardware, peak, self._kv_bytes, count)
                           for (shape, count), peak in groups)
            if len(self._chunk_ops) < CHUNK_MEMO_ENTRIES:
                self._chunk_ops[key] = cached
        return cached

    def _token_part(self, tokens: int, logits: int) -> _TokenPart:
        """Everything but attention, which depends only on the step's new tokens and logits rows:
        memoised, so a simulation pays for each distinct (tokens, logits) pair once, and a new
        pair only sums its token half and logits half (each memoised on its own)."""
        key = (tokens, logits)
        cached = self._token_cache.get(key)
        if cached is None:
            body, head = self._body_part(tokens), self._head_part(logits)
            lead = body.lead_s
            # _communication_s's expression: (all-reduces + norms) + gather + extra, in that order
            comm_s = body.extra_s if lead is None else lead + head.gather_s + body.extra_s
            cached = _TokenPart.of(body.columns.then(head.columns), comm_s, self._step_overhead_s)
            if len(self._token_cache) < TOKEN_MEMO_ENTRIES:
                self._token_cache[key] = cached
        return cached

    def _body_part(self, tokens: int) -> _BodyPart:
        """The token half of :meth:`_token_part` (memoised per token count)."""
        cached = self._body_cache.get(tokens)
        if cached is None:
            lead, extra = self._communication_body(float(tokens))
            cached = _BodyPart(_OpColumns.of(tuple(self._body_ops(float(tokens)))), lead, extra)
            if len(self._body_cache) < BODY_MEMO_ENTRIES:
                self._body_cache[tokens] = cached
        return cached

    def _head_part(self, logits: int) -> _HeadPart:
        """The logits half of :meth:`_token_part` (memoised per logits count)."""
        cached = self._head_cache.get(logits)
        if cached is None:
            ops = self._logits_ops(float(logits))
            cached = _HeadPart(_OpColumns.of(tuple(ops)) if ops else NO_OPS, self._gather_s(float(logits)))
            if len(self._head_cache) < TOKEN_MEMO_ENTRIES:
                self._head_cache[logits] = cached
        return cached

    def step_record(self, batch: BatchShape) -> StepRecord:
        """What the engine logs per step (see :class:`StepRecord`), without building the
        breakdown; same time and bound as :meth:`step`.

        The token part (everything but attention) is memoised with its class sums, so this costs
        one loop over the two or three attention operators, like :meth:`step_time`.
        """
        if batch.is_empty:
            return IDLE_RECORD
        if not batch.num_decodes and batch.num_prefills <= PREFILL_MEMO_BATCH:
            # A prefill-only step is priced by its chunks alone, and prompt lengths repeat.
            key = (tuple(batch.prefill_tokens.tolist()), tuple(batch.prefill_context.tolist()),
                   tuple(batch.prefill_emits.tolist()))
            record = self._prefill_records.get(key)
            if record is None:
                record = self._priced_record(batch)
                if len(self._prefill_records) < PREFILL_MEMO_ENTRIES:
                    self._prefill_records[key] = record
            return record
        return self._priced_record(batch)

    def _priced_record(self, batch: BatchShape) -> StepRecord:
        """:meth:`step_record` of a non-empty batch, priced."""
        engine = self._engine
        if engine is None:
            part = self._token_part(batch.num_new_tokens, batch.num_logits)
            return self._record(part, self._batch_ops(batch))
        priced, mode = engine.plan(batch)
        return self._record(self._token_part(priced, batch.num_logits), self._batch_ops(batch),
                            lambda kernels_s: engine.time(batch, kernels_s, mode))

    def _record(self, part: _TokenPart, batch_ops: list[OpCost],
                timing: Callable[[float], StepTiming] | None = None) -> StepRecord:
        """A step's record from its memoised token part and its context-dependent operators;
        ``timing`` folds the engine's runtime around the kernels (None: the flat runtime)."""
        total, compute_s, memory_s = part.total_s, part.compute_s, part.memory_s
        overhead_s, flops, nbytes = part.overhead_s, part.flops, part.hbm_bytes
        gemm_s, prefill_s, decode_s = part.gemm_s, part.attn_prefill_s, part.attn_decode_s
        for op in batch_ops:
            time_s = op.time_s
            total += time_s
            if op.compute_s >= op.memory_s:
                compute_s += op.compute_s
            else:
                memory_s += op.memory_s
            memory_s += op.side_s
            overhead_s += op.fixed_s
            flops += op.flops
            nbytes += op.bytes
            if op.name == "attn_decode":
                decode_s += time_s
            elif op.name == "attn_prefill":
                prefill_s += time_s
            else:  # MLA's re-expansion of cached latents is a GEMM
                gemm_s += time_s
        step_overhead = self._step_overhead_s
        if timing is not None:
            timed = timing(total)
            total, step_overhead = timed.time_s, timed.exposed_s
            overhead_s += step_overhead
        sums = (compute_s, memory_s, part.comm_s, overhead_s)
        return StepRecord(total, sums.index(max(sums)), flops, nbytes, gemm_s, prefill_s, decode_s,
                          part.elementwise_s, part.comm_s, step_overhead)

    def decode_run_records(self, decode_context: np.ndarray, steps: int, first_step: int = 0
                           ) -> np.ndarray | None:
        """:meth:`step_record` of ``steps`` pure-decode steps in which the same requests decode
        over ``decode_context + j`` cached tokens (step ``j``, from ``first_step``), in one
        vectorised computation, as rows of the :class:`StepRecord` fields (``steps x 12``): the
        batch's counts (so its token part, CUDA-graph size and mode, host time and collectives)
        are the same in every step, computed once per batch size into a
        :class:`~servesim.cost.decode_run.DecodeRunPricer`; only the attention keys grow, counted
        exactly per step (:func:`~servesim.cost.attention.decode_run_keys`: KV tiles, windows,
        chunks) and priced by the element-wise twin of the per-step formulas, so every row is the
        record :meth:`step_record` gives that step, bit for bit. Fast-forward
        (``servesim.core.fast_forward``) prices its runs with it; None for an empty run."""
        n = int(decode_context.size)
        if n == 0 or steps <= 0:
            return None
        pricer = self._run_pricers.get(n)
        if pricer is None:
            pricer = self._run_pricers[n] = self._decode_run_pricer(n)
        return pricer.records(decode_context, first_step, steps)

    def _decode_run_pricer(self, n: int) -> DecodeRunPricer:
        """What every step of a run of ``n`` decodes shares: the token part, the engine's host
        times for the batch's counts, each attention kind's constants."""
        batch = BatchShape.decode(n, 0)  # only its counts are read: the same in every step
        engine = self._engine
        host: tuple[EngineRuntime, float, float, float | None] | None = None
        if engine is None:
            part = self._token_part(n, n)
        else:
            priced, mode = engine.plan(batch)
            part = self._token_part(priced, batch.num_logits)
            launch, cpu = engine.host_s(batch, mode)
            host = (engine, launch, cpu, engine.serial_s(batch) if engine.runtime.has_serial else None)
        totals = (part.total_s, part.compute_s, part.memory_s, part.overhead_s, part.flops,
                  part.hbm_bytes, part.gemm_s, part.elementwise_s, part.comm_s, part.attn_prefill_s,
                  part.attn_decode_s)
        return DecodeRunPricer(n, totals, self._attention_groups, self.hardware, self._kind_peaks,
                               self._kv_bytes, self._step_overhead_s, host, self._run_memo)

    def _token_ops(self, tokens: float, logits: float) -> list[OpCost]:
        """Every operator of :meth:`_token_part`, in order: the token half, then the logits half."""
        return [*self._body_ops(tokens), *self._logits_ops(logits)]

    def _logits_ops(self, logits: float) -> list[OpCost]:
        """The operators that depend on the rows that sample: a hybrid model's recurrent-state
        traffic (one row per sequence that emits, :meth:`_linear_state_op`), then the LM head."""
        ops = []
        if self._linear_layers:
            ops.append(self._linear_state_op(logits))
        head = self._head_op(logits)
        if head is not None:
            ops.append(head)
        return ops

    def _body_ops(self, tokens: float) -> list[OpCost]:
        """The operators that depend on the new tokens alone, in order (all but the LM head)."""
        m, tp, stage = self.model, self.tp, self.stage
        h, layers = m.hidden_size, self._layers
        heads = m.num_heads // tp
        ops = [self._elementwise("embedding", 2 * tokens * h, tokens, 1, 1)] if stage.first else []
        if m.kv_sharing > 1 and m.mla is None:
            # CLA: every layer projects its queries, only the first of each group its keys/values
            kv_heads = max(1, m.num_kv_heads // tp)
            owners = m.kv_layers_in(stage.start, stage.stop)
            ops.append(self._gemm("qkv_proj", tokens, h, heads * m.head_dim, layers))
            ops.append(self._gemm("qkv_proj", tokens, h, 2 * kv_heads * m.head_dim, owners))
        else:
            for k, n in self._attn_gemms:
                ops.append(self._gemm("qkv_proj", tokens, k, n, self._attention_layers))
        ops.append(self._gemm("o_proj", tokens, heads * m.v_head_dim, h, self._attention_layers))
        if self._linear_layers:
            ops.extend(self._linear_attention_ops(tokens))

        dense, sparse = self._dense, self._sparse
        if dense:
            ops.extend(self._mlp(tokens, m.intermediate_size, dense, "mlp"))
        if sparse:
            assert m.moe is not None
            if self._experts is None:
                ops.extend(self._routed_experts(tokens, sparse))
            else:  # the router runs on this rank's tokens; the experts in moe_part
                ops.append(self._gemm("moe", tokens, h, m.moe.num_experts, sparse, sixteen_bit=True))
                if not self.shares_experts:
                    ops.extend(self.moe_part(int(tokens))[0])
            if m.moe.shared_intermediate:
                ops.extend(self._mlp(tokens, m.moe.shared_intermediate, sparse, "mlp"))

        # Two fused residual-add + RMSNorm (read x and residual, write both), RoPE on q and k
        # (MLA: on the rope parts only, plus the RMSNorms of its two latents), and the MLP
        # activation (read gate and up, write their product).
        if m.mla is not None:
            rope = 2 * tokens * (heads + 1) * m.mla.qk_rope_head_dim
            rope += 2 * tokens * ((m.mla.q_lora_rank or 0) + m.mla.kv_lora_rank)
        else:
            rope = 2 * tokens * (heads + max(1, m.num_kv_heads // tp)) * m.head_dim
        per_layer = 8 * tokens * h + rope
        gate = 3 if m.gated_mlp else 2
        if dense:
            activation = gate * tokens * ceil_div(m.intermediate_size, tp)
            ops.append(self._elementwise("elementwise", per_layer + activation, tokens, 4, dense))
        if sparse:
            assert m.moe is not None
            moe_rows = tokens * m.moe.top_k
            routed = 0.0 if self._experts is not None else moe_rows * ceil_div(m.moe.expert_intermediate, tp)
            activation = gate * (routed + tokens * ceil_div(m.moe.shared_intermediate, tp))
            # The expert GEMMs write one row per assignment (counted there); the weighted sum
            # over each token's experts reads them back and writes one row per token.
            combine = moe_rows * h + tokens * h
            ops.append(self._elementwise("elementwise", per_layer + activation + combine,
                                         tokens, 6, sparse))
        if stage.last:
            ops.append(self._elementwise("elementwise", 2 * tokens * h, tokens, 1, 1))
        return ops

    def _linear_attention_ops(self, tokens: float) -> list[OpCost]:
        """A hybrid model's Gated DeltaNet layers on ``tokens`` new tokens, per GPU (value heads,
        conv channels and projections split over TP): ``in_proj_qkvz`` and ``in_proj_ba``, the
        conv and the gated RMSNorm (memory-bound, two kernels), the delta rule's arithmetic
        (:meth:`~servesim.model_spec.LinearAttentionSpec.flops_per_token`, reading q, k, v and
        writing the output once; priced by the profile's prefill-attention class: no gated-delta
        kernel has been measured, an estimate) and ``out_proj``. The state each sequence reads and
        writes is :meth:`_linear_state_op`'s."""
        m, tp, h = self.model, self.tp, self.model.hidden_size
        la = m.linear_attention
        assert la is not None
        layers = self._linear_layers
        key, value = la.key_width // tp, la.value_width // tp
        heads = la.num_value_heads // tp
        conv = ceil_div(la.conv_width, tp)
        ops = [self._gemm("qkv_proj", tokens, h, 2 * key + 2 * value, layers),
               self._gemm("qkv_proj", tokens, h, la.head_scalars * heads, layers)]
        # conv: read and write q, k, v; gated norm: read the output and the gate z, write it
        ops.append(self._elementwise("elementwise", tokens * (2 * conv + 3 * value), tokens, 2, layers))
        flops = tokens * la.flops_per_token() / tp
        nbytes = tokens * (2 * key + 2 * value) * IO_BYTES
        ops.append(roofline("attn_prefill", flops, nbytes, peak_flops=self.bf16_peak,
                            bandwidth=self.bandwidth, eff=self.hardware.efficiency.attention_prefill,
                            compute_axis=tokens, repeat=layers))
        ops.append(self._gemm("o_proj", tokens, value, h, layers))
        return ops

    def _linear_state_op(self, rows: float) -> OpCost:
        """Each running sequence's recurrent state, read and written once per step in every
        linear-attention layer (``rows``: the sequences that emit a token; a prompt chunk that
        does not finish its prompt also touches its state, once per chunk, which is not counted:
        a small part of a chunk's time). Memory-bound, priced by the profile's decode-attention
        class (an estimate, like the arithmetic)."""
        m = self.model
        assert m.linear_attention is not None
        nbytes = 2.0 * rows * m.linear_attention.state_bytes(self.tp)
        return roofline("attn_decode", 0.0, nbytes, peak_flops=self.bf16_peak, bandwidth=self.bandwidth,
                        eff=self.hardware.efficiency.attention_decode, compute_axis=rows,
                        repeat=self._linear_layers)

    def _head_op(self, logits: float) -> OpCost | None:
        """The LM head over the rows that sample (None on a stage without it): the last operator."""
        if not self.stage.last:
            return None
        m = self.model
        return self._gemm("lm_head", logits, m.hidden_size, ceil_div(m.vocab_size, self.tp), 1,
                          sixteen_bit=True)

    # ------------------------------------------------------------------ expert parallelism
    @property
    def shares_experts(self) -> bool:
        """Whether the routed experts are priced apart from each rank's step (:meth:`moe_part`):
        data-parallel ranks send their tokens to experts shared by all of them."""
        return self._experts is not None and self.parallelism.dispatches_tokens

    def moe_part(self, tokens: int) -> tuple[tuple[OpCost, ...], float]:
        """The routed experts of this stage's MoE layers for ``tokens`` tokens entering them (every
        rank's together), on the busiest expert rank: (operators, seconds of dispatch and
        combine). Memoised per token count."""
        cached = self._moe_cache.get(tokens)
        if cached is None:
            assert self._experts is not None
            ops, comm = self._experts.cost(float(tokens), self._sparse, self._moe_eff, self._elem_eff,
                                          self._quant_eff)
            cached = (tuple(ops), comm)
            if len(self._moe_cache) < 1 << 16:
                self._moe_cache[tokens] = cached
        return cached

    def _communication_s(self, tokens: float, logits: float) -> float:
        """TP collectives: two all-reduces of the residual stream per layer, one after the
        vocabulary-parallel embedding, and the all-gather of the logits; with a QK-norm over all
        heads (:attr:`ModelSpec.qk_norm_across_heads`), one more per layer of each token's two
        fp32 sums of squares. The token half and the logits half are computed apart
        (:meth:`_communication_body`, :meth:`_gather_s`) and joined in this one order."""
        lead, extra = self._communication_body(tokens)
        if lead is None:
            return extra
        return lead + self._gather_s(logits) + extra

    def _communication_body(self, tokens: float) -> tuple[float | None, float]:
        """(the all-reduces plus the QK-norm sums, or None without TP; expert parallelism's
        all-reduce of the MoE output inside one TP group, else 0.0): what depends on the tokens."""
        if self._experts is not None and not self.shares_experts and self._sparse:
            # expert parallelism inside one TP group: no dispatch (every GPU holds every token),
            # the MoE output's all-reduce combines the experts' partial sums as before
            extra = self.moe_part(int(tokens))[1]
        else:
            extra = 0.0
        if self.tp == 1:
            return None, extra
        m, stage = self.model, self.stage
        reduces = self._residual_reduces + (1 if stage.first else 0)
        norms = self._layers * self._all_reduce(tokens * 2 * FP32_BYTES) if m.qk_norm_across_heads else 0.0
        return reduces * self._all_reduce(tokens * m.hidden_size * IO_BYTES) + norms, extra

    def _all_reduce(self, nbytes: float) -> float:
        """One all-reduce of ``nbytes`` over the TP group."""
        if self._ring:
            return ring_allreduce_s(nbytes, self.tp, self.hardware.interconnect)
        return allreduce_s(nbytes, self.tp, self.runtime, self.hardware)

    def _gather_s(self, logits: float) -> float:
        """The all-gather of the vocabulary-parallel logits (0.0 without TP or the LM head)."""
        if self.tp == 1 or not self.stage.last:
            return 0.0
        vocabulary = logits * self.model.vocab_size * IO_BYTES
        if self._ring:
            return ring_allgather_s(vocabulary, self.tp, self.hardware.interconnect)
        return allgather_s(vocabulary, self.tp, self.runtime, self.hardware)

    def _assemble(self, ops: list[OpCost], comm_s: float, total: float,
                  step_overhead: float | None = None) -> StepCost:
        breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        bound_s = {"compute": 0.0, "memory": 0.0, "communication": comm_s, "overhead": 0.0}
        flops = hbm = 0.0
        for op in ops:
            breakdown[op.name] += op.time_s
            bound_s[op.bound] += op.roofline_s
            bound_s["memory"] += op.side_s
            bound_s["overhead"] += op.fixed_s
            flops += op.flops
            hbm += op.bytes
        if step_overhead is None:
            step_overhead = self._step_overhead_s
        breakdown["communication"] = comm_s
        breakdown["overhead"] = step_overhead
        bound_s["overhead"] += step_overhead
        bound = max(bound_s, key=bound_s.__getitem__)
        return StepCost(total, breakdown, bound, bound_s, flops, hbm, tuple(ops))
