"""How one replica spreads over GPUs and nodes, and every check of a combination up front.

The degrees read like the engines' flags:

- ``tp``: tensor parallelism inside each attention rank (vLLM ``--tensor-parallel-size``);
- ``pp``: pipeline stages, each holding a contiguous range of layers (``--pipeline-parallel-size``;
  the split is vLLM's ``get_pp_indices`` unless ``pp_layers`` gives it, as
  ``VLLM_PP_LAYER_PARTITION`` does);
- ``dp``: data-parallel attention ranks inside one replica (vLLM ``--data-parallel-size`` with an
  MoE model, SGLang ``--enable-dp-attention``): each rank holds its own batch and KV cache, the
  MoE layers are shared by all of them;
- ``ep``: the expert-parallel degree of the MoE layers (vLLM ``--enable-expert-parallel`` makes it
  ``tp x dp``; SGLang ``--ep-size``): experts are split over ``ep`` GPUs and the remaining factor
  ``moe_tp = tp x dp / ep`` shards each expert as tensor parallelism does.

A replica occupies ``tp x dp x pp`` GPUs, numbered as vLLM numbers its ranks (TP innermost, then
DP, then PP): stage ``s`` is GPUs ``[s * tp * dp, (s + 1) * tp * dp)``. A TP group must sit inside
one fast (NVLink) domain; a stage may span domains (its MoE dispatch then partly crosses the
scale-out network), and a pipeline send crosses the network exactly when two consecutive stages
sit in different domains.

Which layouts are allowed follows vLLM's rules: with ``dp = 1`` every GPU of a TP group holds all
of a step's tokens, so ``ep`` must divide ``tp`` and needs no dispatch (the MoE output's
all-reduce combines it); with ``dp > 1`` the MoE layers run either tensor-parallel over all
``tp x dp`` GPUs (``ep = 1``) or expert-parallel over all of them (``ep = tp x dp``), with the
tokens of every rank dispatched by ``all2all_backend``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile, Link
from servesim.model_spec import ModelSpec

ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency")
"""How the tokens of the data-parallel ranks reach the experts (vLLM's ``--all2all-backend``
names; ``allgather_reducescatter`` is its default): every GPU gathers every token and the outputs
are reduce-scattered back; or DeepEP's all-to-all, which sends a token once to each remote GPU
holding one of its experts (high-throughput kernels) or once per remote expert (low-latency
kernels)."""


@dataclass(frozen=True)
class StageLayers:
    """One pipeline stage's share of the model: layers ``[start, stop)``; the first stage also runs
    the embedding, the last the final norm, the LM head and the sampler."""

    index: int
    start: int
    stop: int
    first: bool
    last: bool

    @property
    def layers(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Parallelism:
    """How one replica spreads over GPUs (see the module docstring)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    pp_layers: tuple[int, ...] = ()
    """Layers per stage; empty: vLLM's default split."""
    all2all_backend: str = "allgather_reducescatter"
    expert_imbalance: float = 1.0
    """Load of the busiest expert-parallel rank over the mean (1: uniform routing)."""

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def stage_gpus(self) -> int:
        """GPUs of one pipeline stage: its ``dp`` attention ranks of ``tp`` GPUs each."""
        return self.tp * self.dp

    @property
    def moe_tp(self) -> int:
        """Tensor-parallel degree of each expert: the stage's GPUs over the expert-parallel degree."""
        return self.stage_gpus // self.ep

    @property
    def is_single_group(self) -> bool:
        """One TP group per replica: no stages, no DP ranks, no expert parallelism (the engine path
        servesim always had, kept bit for bit)."""
        return self.pp == 1 and self.dp == 1 and self.ep == 1

    @property
    def dispatches_tokens(self) -> bool:
        """Whether MoE layers move tokens between ranks (only data-parallel ranks hold different
        tokens)."""
        return self.dp > 1

    def describe(self) -> dict[str, int]:
        if self.is_single_group:
            return {"tp": self.tp}
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep}

    def label(self) -> str:
        parts = [f"tp{self.tp}"] + [f"{k}{v}" for k, v in (("pp", self.pp), ("dp", self.dp),
                                                            ("ep", self.ep)) if v > 1]
        return " ".join(parts)


# ---------------------------------------------------------------------- pipeline stages
def default_partition(layers: int, pp: int) -> tuple[int, ...]:
    """vLLM's split (``get_pp_indices``): equal shares, the remainder one layer each on the stages
    before the last, from the second-to-last backwards (the last stage runs the LM head)."""
    share, extra = divmod(layers, pp)
    parts = [share] * pp
    for i in range(2, extra + 2):
        parts[-i] += 1
    return tuple(parts)


def stages_of(model: ModelSpec, parallelism: Parallelism) -> tuple[StageLayers, ...]:
    """The pipeline stages of ``model`` under ``parallelism`` (one stage without PP)."""
    parts = parallelism.pp_layers or default_partition(model.num_layers, parallelism.pp)
    out, start = [], 0
    for index, count in enumerate(parts):
        out.append(StageLayers(index, start, start + count, index == 0, index == len(parts) - 1))
        start += count
    return tuple(out)


# ---------------------------------------------------------------------- where GPUs sit
@dataclass(frozen=True)
class Placement:
    """Which links a replica's traffic crosses, from its layout and its GPU's domains."""

    domain_gpus: int
    """GPUs per fast domain (the whole replica when the profile names no domain and it fits one)."""
    fast: Link
    scale_out: Link | None

    def stage_send_link(self, parallelism: Parallelism, boundary: int) -> Link:
        """The link a send from stage ``boundary`` to the next crosses. Stages are packed whole
        into domains (``domain // (tp x dp)`` per domain, none split while it fits one), so the
        send stays inside a domain unless the next stage starts a new one; a stage wider than a
        domain always sends to GPUs of other domains."""
        width = parallelism.stage_gpus
        if width > self.domain_gpus:
            return self._outside()
        per_domain = self.domain_gpus // width
        crosses = boundary // per_domain != (boundary + 1) // per_domain
        return self._outside() if crosses else self.fast

    def stage_spans_domains(self, parallelism: Parallelism) -> bool:
        return parallelism.stage_gpus > self.domain_gpus

    def peers_inside(self, group: int) -> int:
        """Other GPUs of a ``group``-GPU collective (aligned to domains) in one GPU's own domain."""
        return min(group, self.domain_gpus) - 1

    def outside(self) -> Link:
        return self._outside()

    def _outside(self) -> Link:
        assert self.scale_out is not None  # checked by check_parallelism
        return self.scale_out


def placement(hardware: HardwareProfile, parallelism: Parallelism) -> Placement:
    domain = hardware.fast_domain_gpus or parallelism.gpus_per_replica
    return Placement(domain, hardware.interconnect, hardware.scale_out)


# ---------------------------------------------------------------------- checks
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _valid_tp(model: ModelSpec, limit: int) -> list[int]:
    good = []
    for tp in _divisors(model.num_heads):
        if tp > limit:
            break
        kv = model.num_kv_heads
        if model.mla is not None or kv % tp == 0 or tp % kv == 0:
            good.append(tp)
    return good


def _listing(values: list[int]) -> str:
    """``1`` for one value, ``one of 1, 2, 4`` for several."""
    if len(values) == 1:
        return str(values[0])
    return "one of " + ", ".join(str(v) for v in values)


def check_parallelism(model: ModelSpec, hardware: HardwareProfile, p: Parallelism,
                      where: str = "deployment", hybrid_experts: bool = False) -> None:
    """Every combination checked before anything runs; each mistake is one line naming the key and
    suggesting values that work. ``hybrid_experts``: the engine lets data-parallel attention's MoE
    layers split the stage into ``ep`` groups of ``moe_tp`` GPUs (``Engine.hybrid_experts``)."""
    for key in ("tp", "pp", "dp", "ep"):
        if getattr(p, key) < 1:
            raise ServesimError(f"{where}.{key}", f"must be at least 1, got {getattr(p, key)}",
                                "use 1 or more")
    model.check_tensor_parallel(p.tp)
    _check_fast_domain(model, hardware, p, where)
    _check_stages(model, p, where)
    _check_experts(model, p, where, hybrid_experts)


def _check_fast_domain(model: ModelSpec, hardware: HardwareProfile, p: Parallelism, where: str) -> None:
    domain = hardware.fast_domain_gpus
    gpus = p.gpus_per_replica
    if domain is None:
        if gpus > 1 and not p.is_single_group:
            raise ServesimError(f"{where}.pp" if p.pp > 1 else f"{where}.dp",
                                f"hardware {hardware.name} does not say how many GPUs share its "
                                f"{hardware.interconnect.kind}, so a {gpus}-GPU replica cannot be placed",
                                "add fast_domain_gpus (and scale_out) to the profile")
        return
    if p.tp > domain:
        # A TP group over several domains (SGLang's and vLLM's multi-node TP) runs its all-reduces
        # hierarchically (servesim.cost.communication): it must hold whole domains.
        if hardware.scale_out is None or p.tp % domain:
            fits = [t for t in _valid_tp(model, domain)]
            why = (f"{hardware.name} names no scale_out network" if hardware.scale_out is None
                   else f"{p.tp} is not a whole number of domains")
            raise ServesimError(
                f"{where}.tp", f"tp {p.tp} spans {math.ceil(p.tp / domain)} {hardware.interconnect.kind} "
                f"domains of {domain} GPUs on {hardware.name} and {why}",
                f"use tp {max(fits) if fits else 1} (or less) and pp or dp to span domains, or a multiple "
                f"of {domain}")
    elif p.stage_gpus > domain and domain % p.tp:
        fitting = [t for t in _valid_tp(model, domain) if domain % t == 0]
        raise ServesimError(f"{where}.tp", f"tp {p.tp} does not divide the {domain} GPUs of a "
                            f"{hardware.interconnect.kind} domain on {hardware.name}, so a stage of "
                            f"{p.stage_gpus} GPUs would split a TP group over two domains",
                            f"use {_listing(fitting)}")
    if gpus > domain and hardware.scale_out is None:
        raise ServesimError(f"{where}.pp" if p.pp > 1 else f"{where}.dp",
                            f"a replica of {gpus} GPUs spans {math.ceil(gpus / domain)} domains of "
                            f"{domain} GPUs, and hardware {hardware.name} names no scale_out network",
                            f"use at most {domain} GPUs per replica or add scale_out to the profile")


def _check_stages(model: ModelSpec, p: Parallelism, where: str) -> None:
    layers = model.num_layers
    if p.pp > layers:
        raise ServesimError(f"{where}.pp", f"{p.pp} stages exceed {model.name}'s {layers} layers",
                            f"use at most {layers}")
    if not p.pp_layers:
        return
    parts = p.pp_layers
    example = ", ".join(str(v) for v in default_partition(layers, p.pp))
    if len(parts) != p.pp:
        raise ServesimError(f"{where}.pp_layers", f"lists {len(parts)} stages but pp is {p.pp}",
                            f"give one layer count per stage, e.g. [{example}]")
    if min(parts) < 1 or sum(parts) != layers:
        raise ServesimError(f"{where}.pp_layers", f"{list(parts)} must be positive and sum to "
                            f"{model.name}'s {layers} layers", f"e.g. [{example}]")


def _check_experts(model: ModelSpec, p: Parallelism, where: str, hybrid: bool = False) -> None:
    moe = model.moe
    if moe is None:
        if p.dp > 1:
            raise ServesimError(f"{where}.dp", f"{model.name} is dense: data-parallel attention ranks "
                                "share only MoE layers, so they would be independent replicas",
                                "use deployment.replicas for data parallelism of a dense model")
        if p.ep > 1:
            raise ServesimError(f"{where}.ep", f"{model.name} has no experts to split",
                                "remove ep (expert parallelism applies to MoE models)")
        return
    gpus = p.stage_gpus
    if p.dp == 1:
        if p.tp % p.ep:
            good = [e for e in _divisors(p.tp) if moe.num_experts % e == 0]
            raise ServesimError(
                f"{where}.ep", f"{p.ep} does not divide tp {p.tp}: without data-parallel ranks the "
                "experts are split over the GPUs of the TP group", f"use {_listing(good)}, or "
                "set dp so that ep = tp x dp (DeepSeek's layout)")
    elif hybrid and gpus % p.ep:
        good = [e for e in _divisors(gpus) if moe.num_experts % e == 0]
        raise ServesimError(
            f"{where}.ep", f"{p.ep} does not divide the stage's {gpus} GPUs (tp {p.tp} x dp {p.dp}): "
            "its MoE layers run ep expert-parallel groups of tp x dp / ep GPUs", f"use {_listing(good)}")
    elif not hybrid and p.ep not in (1, gpus):
        raise ServesimError(
            f"{where}.ep", f"{p.ep} with tp {p.tp} x dp {p.dp}: with data-parallel attention the MoE "
            f"layers span all {gpus} GPUs of the stage, tensor-parallel (ep 1) or expert-parallel "
            f"(ep {gpus}), as vLLM's --enable-expert-parallel does", f"use ep 1 or {gpus} (TensorRT-LLM "
            "and SGLang also take an ep that divides them)")
    if moe.num_experts % p.ep:
        good = [e for e in _divisors(gpus) if moe.num_experts % e == 0]
        raise ServesimError(f"{where}.ep", f"{p.ep} does not divide {model.name}'s {moe.num_experts} "
                            "experts", f"use {_listing(good)}")
    if p.moe_tp > 1 and moe.expert_intermediate % p.moe_tp:
        raise ServesimError(f"{where}.ep", f"each expert would be split {p.moe_tp} ways but its "
                            f"intermediate size {moe.expert_intermediate} does not divide by that",
                            "raise ep so that fewer GPUs share one expert")
    if p.all2all_backend not in ALL2ALL_BACKENDS:
        raise ServesimError(f"{where}.all2all_backend", f"unknown backend {p.all2all_backend!r}",
                            f"use one of {', '.join(ALL2ALL_BACKENDS)}")
    if p.all2all_backend.startswith("deepep") and p.dp > 1 and p.ep > 1 and p.moe_tp > 1:
        raise ServesimError(f"{where}.all2all_backend", f"{p.all2all_backend} sends each token to the "
                            f"GPU holding its expert, and ep {p.ep} over {gpus} GPUs slices every "
                            f"expert {p.moe_tp} ways",
                            f"set ep = tp x dp = {gpus}, or use allgather_reducescatter")
    if p.all2all_backend.startswith("deepep") and not (p.dp > 1 and p.ep > 1):
        raise ServesimError(f"{where}.all2all_backend", f"{p.all2all_backend} dispatches tokens "
                            "between data-parallel ranks to expert-parallel GPUs, and this layout has "
                            f"{'no data-parallel ranks' if p.dp == 1 else 'no expert parallelism'}",
                            "set dp > 1 and ep = tp x dp, or use allgather_reducescatter")
    if p.expert_imbalance != 1.0 and p.ep == 1:
        raise ServesimError(f"{where}.expert_routing", "load imbalance between expert ranks needs "
                            "expert parallelism (every GPU holds a slice of every expert at ep 1)",
                            "set ep > 1 or remove expert_routing")
    if not 1.0 <= p.expert_imbalance <= p.ep:
        raise ServesimError(f"{where}.expert_routing", f"imbalance {p.expert_imbalance} must lie "
                            f"between 1 (uniform) and ep = {p.ep} (every token on one rank)",
                            "give the busiest rank's load over the mean")
