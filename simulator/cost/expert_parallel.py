"""The routed experts of an MoE layer under expert parallelism and data-parallel attention.

Without expert parallelism every GPU of a TP group holds a 1/tp slice of every expert
(:meth:`servesim.cost.step_cost.CostModel._routed_experts`). Here, with ``ep`` expert-parallel
ranks and ``moe_tp = tp x dp / ep``, each rank holds ``E / ep`` whole experts, each sliced
``moe_tp`` ways, and one MoE layer costs, on the busiest rank (every rank waits for it at the
combine, so it is the layer's time):

- **dispatch** (only with data-parallel ranks, which hold different tokens): the tokens go to the
  GPUs holding their experts, by the engine's backend
  (:data:`~servesim.parallelism.ALL2ALL_BACKENDS`):
  ``allgather_reducescatter`` gathers every rank's hidden states and router logits onto every GPU
  (a ring all-gather of ``T x (h x 2 + E x 4)`` bytes); DeepEP's high-throughput kernels send a
  token once to each remote GPU holding at least one of its ``k`` experts, its low-latency
  kernels once per remote expert (``k (ep - 1) / ep`` copies on average).
- **expert GEMMs** on the rank's share of the routed tokens: ``T k f / ep`` (token, expert)
  assignments, where ``f`` is the load of the busiest rank over the mean (1 with uniform routing);
  the weights read are those of the local experts hit at least once.
- **combine**: the outputs travel back (reduce-scatter, or the all-to-all reversed, in 16 bits).

The all-to-all is priced per GPU: the bytes it sends to peers inside its fast domain cross the
peer interconnect (the profile's ``all_to_all`` link where NCCL alltoall timings fitted one:
:mod:`servesim.calibration.all_to_all`), those to other domains its scale-out NIC; both run at
once, so the slower path sets the time, plus that path's latency. The receiving side of the
busiest rank carries ``f`` times the mean traffic.

Not modelled: DeepEP's node-limited routing (DeepSeek-V3 sends a token to at most 4 nodes),
redundant experts (EPLB), two-batch overlap of the all-to-all with computation, and the uneven
token counts of DP ranks within the dispatch itself (their attention imbalance is priced by the
slowest-rank rule in :mod:`servesim.cost.parallel_step`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from servesim.cost.quantise import input_quantisation_s
from servesim.cost.roofline import OpCost, roofline
from servesim.cost.routing import experts_hit
from servesim.dtypes import DType, Precision
from servesim.hardware import HardwareProfile, Link, OperatorEfficiency
from servesim.model_spec import ModelSpec
from servesim.parallelism import Parallelism, Placement

IO_BYTES = 2.0
"""Expert outputs and the combine travel in 16 bits."""
LOGIT_BYTES = 4.0
"""Router logits gathered with the hidden states by ``allgather_reducescatter`` (fp32, as
DeepSeek's gate computes them)."""


# ---------------------------------------------------------------------- bytes of a dispatch
def all_to_all_bytes(routed_tokens: float, hidden: int, bytes_per_element: float, ep: int) -> float:
    """Bytes one GPU sends in a per-expert all-to-all (DeepEP low-latency): ``routed_tokens``
    (token, expert) assignments leave it, ``(ep - 1) / ep`` of them for experts on other GPUs,
    each a ``hidden``-wide row."""
    return routed_tokens * (ep - 1) / ep * hidden * bytes_per_element


def remote_ranks_per_token(num_experts: int, top_k: int, ep: int) -> float:
    """Expected remote expert ranks holding at least one of a token's ``top_k`` experts (uniform
    routing, ``num_experts / ep`` experts per rank): a rank misses all of them with probability
    ``C(E - E/ep, k) / C(E, k)``."""
    if ep <= 1:
        return 0.0
    local = num_experts // ep
    miss = math.comb(num_experts - local, top_k) / math.comb(num_experts, top_k)
    return (ep - 1) * (1.0 - miss)


def zipf_imbalance(num_experts: int, top_k: int, ep: int, exponent: float, samples: int = 256) -> float:
    """Load of the busiest of ``ep`` expert ranks over the mean when expert popularity follows
    Zipf's law (expert of popularity rank ``j`` picked with weight ``j^-exponent``).

    Each token picks ``top_k`` distinct experts, so an expert's share of assignments is capped at
    one per token: the per-expert rates are ``top_k x`` the normalised weights, water-filled under
    that cap. Popularity is not tied to expert ids, so the experts are placed on ranks by a random
    permutation (as contiguous placement of a random popularity order is); the answer is the mean
    over ``samples`` permutations from a fixed seed, so it is the same on every call."""
    if ep <= 1:
        return 1.0
    weights = np.arange(1, num_experts + 1, dtype=np.float64) ** -exponent
    rates = _capped_rates(weights, top_k)
    rng = np.random.default_rng(0)
    per_rank = num_experts // ep
    worst = np.empty(samples)
    for i in range(samples):
        loads = rates[rng.permutation(num_experts)].reshape(ep, per_rank).sum(axis=1)
        worst[i] = loads.max()
    return float(worst.mean() / (top_k / ep))


def _capped_rates(weights: np.ndarray, top_k: int) -> np.ndarray:
    """Per-expert selection rates summing to ``top_k``, proportional to ``weights`` but at most 1."""
    rates = np.zeros_like(weights)
    free = np.ones(weights.size, dtype=bool)
    budget = float(top_k)
    while True:
        share = budget * weights[free] / weights[free].sum()
        over = share > 1.0
        if not over.any():
            rates[free] = share
            return rates
        index = np.flatnonzero(free)[over]
        rates[index] = 1.0
        free[index] = False
        budget -= index.size


# ---------------------------------------------------------------------- one MoE layer
class ExpertLayer:
    """Routed experts of one MoE layer on one rank of an expert-parallel (or DP-shared) layout."""

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, parallelism: Parallelism,
                 where: Placement, precision: Precision, expert_weight_bytes: float) -> None:
        assert model.moe is not None
        self.moe = model.moe
        self.hidden = model.hidden_size
        self.gated = model.gated_mlp
        self.parallelism = parallelism
        self.where = where
        self.hardware = hardware
        self.precision = precision
        self.expert_weight_bytes = expert_weight_bytes
        self.local_experts = self.moe.num_experts // parallelism.ep
        self.local_intermediate = self.moe.expert_intermediate // parallelism.moe_tp
        self.peak = hardware.peak(precision.math)
        self.bandwidth = hardware.memory.bandwidth_Bps

    # ------------------------------------------------------------------ compute
    def assignments(self, tokens: float) -> float:
        """(token, expert) assignments on the busiest rank: ``tokens x k x f / ep``."""
        p = self.parallelism
        return tokens * self.moe.top_k * p.expert_imbalance / p.ep

    def experts_hit(self, tokens: float) -> float:
        """Expected local experts of the busiest rank that at least one token picks (each picked
        by a token with probability ``f k / E``)."""
        pick = min(1.0, self.parallelism.expert_imbalance * self.moe.top_k / self.moe.num_experts)
        return experts_hit(self.local_experts, pick, tokens)

    def gemms(self, tokens: float, layers: int, experts: OperatorEfficiency,
              quantise: OperatorEfficiency | None = None) -> OpCost:
        """The fused expert GEMMs (up and down) of ``layers`` MoE layers on the busiest rank, priced
        by ``experts`` (the profile's fused-MoE class, :meth:`Efficiency.moe_for`); with
        8-bit activations and ``quantise`` given, the dynamic quantisation of the rows they
        receive and of their intermediate (:mod:`servesim.cost.quantise`)."""
        h, local = self.hidden, self.local_intermediate
        up = 2 * local if self.gated else local
        rows = self.assignments(tokens)
        hit = max(self.experts_hit(tokens), 1e-12)
        weights = h * (up + local)
        act = self.precision.act_bytes
        io = rows * ((h + local) * act + (up + h) * IO_BYTES)
        nbytes = hit * weights * self.expert_weight_bytes + io
        op = roofline("moe", 2.0 * rows * weights, nbytes, peak_flops=self.peak,
                      bandwidth=self.bandwidth, eff=experts, compute_axis=rows / hit,
                      repeat=layers, kernels=2)
        if quantise is None or act >= IO_BYTES:
            return op
        side = sum(input_quantisation_s(rows, width, act, quantise, self.bandwidth, per_row=False)
                   for width in (h, local))
        return replace(op, side_s=layers * side)

    def activation(self, tokens: float, layers: int, elementwise: OperatorEfficiency) -> OpCost:
        """The activation of the rank's assignments (read gate and up, write their product)."""
        width = 3 if self.gated else 2
        elements = width * self.assignments(tokens) * self.local_intermediate
        return roofline("elementwise", 0.0, elements * IO_BYTES,
                        peak_flops=self.hardware.peak(DType.BF16), bandwidth=self.bandwidth,
                        eff=elementwise, compute_axis=tokens, repeat=layers, kernels=1)

    # ------------------------------------------------------------------ communication
    def dispatch_bytes(self, tokens: float) -> tuple[float, float]:
        """(dispatch, combine) bytes one GPU of the busiest rank sends or receives per MoE layer,
        for ``tokens`` tokens over all data-parallel ranks (each GPU dispatches ``tokens / (tp
        x dp)`` of them)."""
        p = self.parallelism
        gpus = p.stage_gpus
        per_gpu = tokens / gpus
        h, k = self.hidden, self.moe.top_k
        if p.all2all_backend == "allgather_reducescatter":
            # each GPU receives every other GPU's tokens, then reduce-scatters the outputs back
            gathered = (gpus - 1) * per_gpu
            return (gathered * (h * IO_BYTES + self.moe.num_experts * LOGIT_BYTES),
                    gathered * h * IO_BYTES)
        if p.all2all_backend == "deepep_low_latency":
            copies = per_gpu * k * (gpus - 1) / gpus
        else:  # deepep_high_throughput: once per remote GPU holding one of the token's experts
            copies = per_gpu * remote_ranks_per_token(self.moe.num_experts, k, gpus)
        f = p.expert_imbalance
        return (copies * f * h * self.precision.act_bytes, copies * f * h * IO_BYTES)

    def exchange_s(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` between one GPU and its peers of the stage, split between
        the fast domain and the scale-out network in proportion to where the peers are."""
        if nbytes <= 0:
            return 0.0
        p, where = self.parallelism, self.where
        gpus = p.stage_gpus
        if p.all2all_backend == "allgather_reducescatter":
            link = where.outside() if where.stage_spans_domains(p) else where.fast
            return _ring_time(nbytes, link)
        inside = where.peers_inside(gpus) / (gpus - 1)
        times = [(nbytes * inside, self.hardware.all_to_all or where.fast)]
        if inside < 1.0:
            times.append((nbytes * (1.0 - inside), where.outside()))
        return max(link.latency_s + share / (link.bandwidth_Bps * link.efficiency) for share, link in times)

    def communication_s(self, tokens: float, layers: int) -> float:
        """Dispatch and combine of ``layers`` MoE layers (zero without data-parallel ranks: each GPU
        of a TP group already holds every token, and the MoE output's all-reduce combines)."""
        if not self.parallelism.dispatches_tokens or tokens <= 0:
            return 0.0
        dispatch, combine = self.dispatch_bytes(tokens)
        return layers * (self.exchange_s(dispatch) + self.exchange_s(combine))

    def cost(self, tokens: float, layers: int, experts: OperatorEfficiency,
             elementwise: OperatorEfficiency,
             quantise: OperatorEfficiency | None = None) -> tuple[list[OpCost], float]:
        """(operators, communication seconds) of ``layers`` MoE layers for ``tokens`` tokens."""
        if tokens <= 0 or layers == 0:
            return [], 0.0
        ops = [self.gemms(tokens, layers, experts, quantise), self.activation(tokens, layers, elementwise)]
        return ops, self.communication_s(tokens, layers)


def _ring_time(wire_bytes: float, link: Link) -> float:
    """A ring all-gather or reduce-scatter whose wire bytes per GPU are ``wire_bytes`` (already
    ``(n - 1)/n`` of the gathered total): latency plus bytes over the achieved bandwidth. Across
    domains NCCL's rings pass every NIC, so the scale-out link sets the pace."""
    return link.latency_s + wire_bytes / (link.bandwidth_Bps * link.efficiency)
