"""What every serving engine declares: its scheduler defaults and its runtime costs per step.

The cost model prices the GPU kernels of a step; the engine says what its software adds around
them (:class:`RuntimeCosts`). Today that is a fixed per-step CPU time, serial with the GPU (the
scheduler, input preparation, sampling and output processing of an engine without overlap).
The serving-engine models add CPU work that grows with the batch, its overlap with the GPU,
CUDA-graph capture sizes and the collective implementation, as fields of the same object, so the
cost model has one place to read them from.
"""

from __future__ import annotations

import math
from abc import ABC
from bisect import bisect_left
from dataclasses import asdict, dataclass, replace
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from servesim.errors import ServesimError
from servesim.inputs.files import read_yaml
from servesim.inputs.schema import FrozenModel, StrictModel, parse_model
from servesim.resources import configs_dir

if TYPE_CHECKING:
    from servesim.model_spec import ModelSpec

DEFAULT_ENGINE = "vllm"
"""The engine an experiment runs when it names none: vLLM's current (V1) engine, what users run.
``vllm-v0`` keeps servesim 0.1's behaviour bit for bit."""


AllReduceKind = Literal["ring", "nccl", "custom"]
"""Which all-reduce an engine runs: ``ring`` prices every call with the interconnect's ring
model (servesim 0.1); ``nccl`` uses the profile's measured NCCL fit; ``custom`` is vLLM's (and
SGLang's) custom all-reduce over NVLink peer memory: one-shot for small messages, two-shot up to
``custom_allreduce_max_bytes``, then (where ``allreduce_limits`` names the GPU and group) PyTorch's
symmetric-memory all-reduce, NCCL above (see :mod:`servesim.cost.communication`)."""

AllReduceLimit = tuple[str, int, float, float]
"""(compute capability, group size, bytes the custom all-reduce's messages stay below, bytes
the symmetric-memory all-reduce's messages reach at most): one row of an engine's size tables."""


@dataclass(frozen=True)
class DpBalance:
    """TensorRT-LLM's context balancing across attention-DP ranks (``AttentionDpConfig``,
    ``PyExecutor._balance_adp_requests``): each iteration, new prompts start only when every rank
    has one to start and a free seat; otherwise they wait, counting iterations, until
    ``timeout_iters`` have passed or some rank has nothing to decode. When every rank has one and
    every rank is decoding, they wait ``batching_wait_iters`` iterations more, to batch prompts."""

    timeout_iters: int
    batching_wait_iters: int


@dataclass(frozen=True)
class RuntimeCosts:
    """An engine's software around the GPU kernels of one step, as the cost model folds it in.

    **CPU work per step** (scheduling, input preparation, sampling, detokenisation, output
    processing): ``step_overhead_s + cpu_per_seq_s * sequences + cpu_per_token_s * new tokens +
    cpu_per_sample_s * sampled tokens``. ``overlap`` says whether it runs under the GPU's step
    (vLLM v1's async scheduling, SGLang's overlap scheduler, TensorRT-LLM's overlap scheduler:
    the step takes ``max(GPU, CPU)``) or before it (vLLM V0: ``GPU + CPU``).

    **Serial CPU work per step** (``serial_*``): the part of the host's work that no overlap can
    hide because the next step needs its result before it can be launched (with async scheduling
    the sampled tokens must reach the next step's input; SGLang's and TensorRT-LLM's overlap
    schedulers likewise wait for the previous step's outputs): ``serial_fixed_s + serial_per_seq_s
    * sequences + serial_per_token_s * new tokens + serial_per_sample_s * sampled tokens``, added
    after the overlap: ``max(GPU, CPU) + serial``. Zero unless an engine's fitted profile sets it.

    **CUDA graphs**: a step that replays a captured graph is padded up to the next
    ``cuda_graph_sizes`` entry (its GEMMs and elementwise kernels run that many rows; sizes in
    requests where ``graph_counts_requests``) and pays no
    per-kernel launch; ``graph_mixed`` lets steps with prefill chunks replay piecewise graphs
    (vLLM v1: everything but attention), else only pure decode steps are captured;
    ``graph_decode_full`` false replays decodes piecewise too; ``graph_padding`` false means a
    batch size that is not captured runs eagerly (TensorRT-LLM's default). A step that runs
    eagerly launches every kernel from the host: with ``launch_s`` per launch the GPU waits when
    the launches take longer than the kernels.

    **All-reduce**: ``allreduce`` and the size limits pick the implementation per message size;
    the hardware profile's ``collectives`` section says how fast each is.
    """

    step_overhead_s: float = 0.0
    """Fixed CPU time of one iteration."""
    provenance: str = ""
    cpu_per_seq_s: float = 0.0
    cpu_per_token_s: float = 0.0
    cpu_per_sample_s: float = 0.0
    overlap: bool = False
    cuda_graph_sizes: tuple[int, ...] = ()
    graph_mixed: bool = False
    graph_decode_full: bool = True
    """Pure decode steps replay one full graph (else piecewise graphs, like mixed steps)."""
    graph_padding: bool = True
    graph_counts_requests: bool = False
    """The capture sizes count requests, not tokens (TensorRT-LLM's ``cuda_graph_batch_sizes``,
    SGLang's ``cuda_graph_bs``): a speculative decode step of ``b`` requests, each verifying its
    proposals, replays the graph captured for ``b`` (both capture their decode graphs with the
    draft tokens), padded by whole requests. vLLM's sizes count tokens, so its verify step of
    ``b x (1 + k)`` tokens replays the graph of that many tokens. Without speculation every
    decode request computes one token and the two agree."""
    launch_s: float = 0.0
    allreduce: AllReduceKind = "ring"
    custom_allreduce_max_bytes: float = 8 * 2**20
    oneshot_max_bytes: tuple[tuple[int, float], ...] = ((2, math.inf), (4, 512 * 2**10), (8, 256 * 2**10))
    """(largest world size, largest message in bytes) pairs for the one-shot kernel; larger
    custom all-reduces run two-shot."""
    custom_allreduce_worlds: tuple[int, ...] = ()
    """Group sizes the custom all-reduce runs at (vLLM's and SGLang's ``CustomAllreduce`` take 2,
    4, 6 or 8 GPUs and disable themselves otherwise, leaving every message to NCCL); empty: any."""
    allreduce_limits: tuple[AllReduceLimit, ...] = ()
    """Per (compute capability, group size), where the custom all-reduce stops (messages below it)
    and the symmetric-memory all-reduce takes over (messages up to its limit), as vLLM's tables
    say; a GPU or group not listed keeps ``custom_allreduce_max_bytes`` and no symmetric memory."""
    serial_fixed_s: float = 0.0
    serial_per_seq_s: float = 0.0
    serial_per_token_s: float = 0.0
    serial_per_sample_s: float = 0.0
    frontend_s: float = 0.0
    """The front end's latency on every request's path (see :attr:`CpuCosts.frontend_s`): not a
    step cost, so the cost model never reads it; the simulation delays each request's entry by it."""
    handoff_s: float = 0.0
    """A disaggregated deployment's hand-off latency per request (see :attr:`CpuCosts.handoff_s`):
    not a step cost; the disaggregated topology adds it to each KV transfer."""
    frontend_chunk_s: float = 0.0
    """The front end's serial time per streamed chunk (see :attr:`CpuCosts.frontend_chunk_s`):
    not a step cost; each replica's :class:`~servesim.core.stream_out.OutputStream` reads it."""
    schedule_ahead: bool = False
    """The engine forms step ``n + 1`` as it launches step ``n`` (knob ``schedule_ahead``, only
    with ``overlap``): a request that arrives while a step runs first runs two steps later
    (:mod:`servesim.core.replica`). Not a step cost; the replicas read it."""
    recv_interval: int = 1
    """The engine reads its input queue only every this many decode steps, and at once after a
    prefill step or when idle (SGLang's ``--scheduler-recv-interval``): an arrival waits for that
    read. 1: every step. Not a step cost; a replica of one scheduling unit reads it
    (:mod:`servesim.core.replica`), and runs step by step when it is above 1."""
    dp_balance: DpBalance | None = None
    """Data-parallel attention ranks hold new prompts back until every rank has one (TensorRT-LLM's
    ``attention_dp_config.enable_balance``); None: each rank starts its prompts when it can. Not
    a step cost; a replica with DP ranks reads it (:mod:`servesim.core.parallel_replica`)."""

    @classmethod
    def none(cls) -> RuntimeCosts:
        """No software cost: the GPU kernels alone (``servesim step --ideal``, kernel checks)."""
        return cls(0.0, "none: kernels only")

    @property
    def is_flat(self) -> bool:
        """A fixed CPU cost serial with the kernels and nothing else: servesim 0.1's runtime,
        priced with exactly its arithmetic (``vllm-v0`` stays bit-identical)."""
        return (not self.overlap and not self.cuda_graph_sizes and self.launch_s == 0.0
                and self.cpu_per_seq_s == 0.0 and self.cpu_per_token_s == 0.0
                and self.cpu_per_sample_s == 0.0 and not self.has_serial)

    @property
    def has_serial(self) -> bool:
        """Some host work per step is serial with the GPU beyond what overlaps it."""
        return (self.serial_fixed_s, self.serial_per_seq_s, self.serial_per_token_s,
                self.serial_per_sample_s) != (0.0, 0.0, 0.0, 0.0)

    def cpu_s(self, seqs: float, new_tokens: float, samples: float) -> float:
        """Host time of one step with ``seqs`` sequences computing ``new_tokens`` tokens and
        sampling ``samples`` of them."""
        return (self.step_overhead_s + self.cpu_per_seq_s * seqs + self.cpu_per_token_s * new_tokens
                + self.cpu_per_sample_s * samples)

    def serial_s(self, seqs: float, new_tokens: float, samples: float) -> float:
        """Host time of one step that the GPU waits for even when the rest overlaps it."""
        return (self.serial_fixed_s + self.serial_per_seq_s * seqs + self.serial_per_token_s * new_tokens
                + self.serial_per_sample_s * samples)

    def graph_size(self, tokens: int, decode_only: bool) -> int | None:
        """The captured size a step of ``tokens`` new tokens replays (its padded size), or None
        when it runs eagerly."""
        sizes = self.cuda_graph_sizes
        if not sizes or tokens > sizes[-1] or not (decode_only or self.graph_mixed):
            return None
        padded = sizes[bisect_left(sizes, tokens)]
        if padded != tokens and not self.graph_padding:
            return None
        return padded

    def oneshot_limit(self, world: int) -> float:
        """Largest message (bytes) the custom all-reduce sends one-shot at ``world`` GPUs."""
        for largest_world, limit in self.oneshot_max_bytes:
            if world <= largest_world:
                return limit
        return 0.0

    @cached_property
    def _limits_by_group(self) -> dict[tuple[str | None, int], tuple[float, float]]:
        """:attr:`allreduce_limits` keyed once: every priced all-reduce looks its group up."""
        return {(cc, world): (below, up_to) for cc, world, below, up_to in self.allreduce_limits}

    def allreduce_limits_at(self, capability: str | None, world: int) -> tuple[float, float]:
        """(custom all-reduce below, symmetric memory up to) in bytes for ``world`` GPUs of this
        compute capability; (``custom_allreduce_max_bytes``, 0) where the tables are silent, and
        no custom all-reduce at a group size it does not run at."""
        custom_below, symm_max = self._limits_by_group.get((capability, world),
                                                           (self.custom_allreduce_max_bytes, 0.0))
        if self.custom_allreduce_worlds and world not in self.custom_allreduce_worlds:
            custom_below = 0.0
        return custom_below, symm_max

    def describe(self) -> dict[str, Any]:
        """The coefficients as plain values (for summaries and sweep identities)."""
        out = asdict(self)
        if not self.has_serial:  # descriptions of runtimes without it read as before
            for key in ("serial_fixed_s", "serial_per_seq_s", "serial_per_token_s", "serial_per_sample_s"):
                out.pop(key)
        if not self.frontend_chunk_s:  # likewise for runtimes without a streaming cost
            out.pop("frontend_chunk_s")
        out["cuda_graph_sizes"] = list(self.cuda_graph_sizes)
        out["oneshot_max_bytes"] = [list(pair) for pair in self.oneshot_max_bytes]
        if self.allreduce_limits:
            out["allreduce_limits"] = [list(row) for row in self.allreduce_limits]
        else:  # descriptions of engines without size tables read as before
            out.pop("allreduce_limits")
        if self.custom_allreduce_worlds:
            out["custom_allreduce_worlds"] = list(self.custom_allreduce_worlds)
        else:
            out.pop("custom_allreduce_worlds")
        return out


def capture_sizes(*parts: range | list[int]) -> tuple[int, ...]:
    """Sorted distinct capture sizes from ranges and lists (as the engines spell them)."""
    return tuple(sorted({int(v) for part in parts for v in part}))


@dataclass(frozen=True)
class SchedulerDefaults:
    """The engine arguments a deployment inherits when it does not set them (vLLM's names)."""

    policy: str = "continuous"
    max_num_seqs: int = 256
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    watermark: float = 0.01
    enable_prefix_caching: bool = False
    chunked_max_num_batched_tokens: int = 2048
    """Token budget of a step when the policy chunks prompts."""
    min_max_num_batched_tokens: int = 2048
    """Without chunking the budget is ``max(max_model_len, this)``, so any admissible prompt fits
    one step."""

    def max_num_batched_tokens(self, max_model_len: int, chunks_prefills: bool) -> int:
        if chunks_prefills:
            return self.chunked_max_num_batched_tokens
        return max(max_model_len, self.min_max_num_batched_tokens)


@dataclass(frozen=True)
class SpeculationDefaults:
    """What an engine does with speculative decoding unless the experiment says otherwise."""

    disable_by_batch_size: int | None = None
    """No speculation in steps with more running requests than this (None: always speculate)."""
    max_num_seqs: int | None = None
    """``max_num_seqs`` while speculating, when the deployment does not set it (None: the usual
    default). SGLang lowers ``max_running_requests`` to 48 when speculating."""
    step_overhead_s: float = 0.0
    """Software time of a step that verifies proposals, beyond the kernels (rejection sampling,
    proposal bookkeeping), serial with the GPU."""
    pass_overhead_s: float = 0.0
    """Software time of each proposer pass beyond its kernels (input preparation, launch,
    sampling the proposal)."""
    provenance: str = ""
    overhead_provenance: str = ""


VLLM_V1_SPECULATION_FIT = (0.93e-3, 0.40e-3)
"""Software time per verifying step and per proposer pass (seconds), fitted by
``servesim.calibration.speculation`` (least squares over 12 rows) to vLLM V1 step times of
Llama-3.1-8B with EAGLE-1 and EAGLE-3 heads, k = 2..7, batch 1, H100 (vLLM issue #20780); RMS
residual 1.6 ms per step."""


def vllm_fitted_speculation(provenance: str, *, max_num_seqs: int | None = None,
                            estimate_for: str | None = None) -> SpeculationDefaults:
    """Speculation defaults with :data:`VLLM_V1_SPECULATION_FIT`'s overheads: measured for vLLM
    V1; for another engine (``estimate_for``) they are an estimate and say so."""
    step_s, pass_s = VLLM_V1_SPECULATION_FIT
    source = ("fitted (servesim.calibration.speculation) to vLLM V1's published step times (vLLM issue "
              "#20780)")
    if estimate_for is not None:
        source = f"estimate: {source}, not measured for {estimate_for}"
    return SpeculationDefaults(disable_by_batch_size=None, max_num_seqs=max_num_seqs, step_overhead_s=step_s,
                               pass_overhead_s=pass_s, provenance=provenance, overhead_provenance=source)


class EngineKnobs(FrozenModel):
    """Knobs every engine takes under ``engine:`` (an engine adds its own by subclassing)."""

    version: str | None = Field(None, description="engine version to model (default: the latest modelled)")
    step_overhead_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="fixed CPU time per iteration, on every GPU (default: the engine's value for the "
        "hardware)")
    speculative_step_overhead_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="speculative decoding: software time of a step that verifies proposals (default: "
        "the engine's)")
    proposal_pass_overhead_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="speculative decoding: software time of each proposer pass (default: the "
        "engine's)")
    cpu_per_seq_s: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="CPU time per iteration per scheduled sequence")
    cpu_per_token_s: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="CPU time per iteration per new token")
    cpu_per_sample_s: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="CPU time per iteration per sampled token")
    serial_overhead_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="fixed CPU time per iteration that the GPU waits for even with overlap")
    serial_per_seq_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="CPU time per iteration per scheduled sequence that the GPU waits for even with overlap")
    frontend_latency_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="the front end's latency per request (HTTP server, tokenisation, hand-off to the "
        "scheduler, the first token's way back), added to every TTFT and end-to-end latency")
    frontend_chunk_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="the front end's serial CPU time per streamed chunk (one per request per step: "
        "detokenise, format, send); when the engine emits chunks faster than one front-end process "
        "sends them, clients see their tokens late (docs/architecture.md, Front end)")
    handoff_latency_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="disaggregated serving: the hand-off's latency per request beyond the KV bytes' "
        "time on the link (the transfer's set-up and completion notice, the decode worker taking the "
        "request in), added to every TTFT of a disaggregated deployment")
    schedule_ahead: bool = Field(
        False, description="an overlapping engine (vLLM async scheduling, SGLang's and TensorRT-LLM's "
        "overlap schedulers) forms each step while the one before runs, so a request that arrives "
        "during a step first runs two steps later; off by default: on AIConfigurator's serving file "
        "it makes the replayed TTFT worse (README, Calibration: Scheduling one step ahead)")
    profile: Path | None = Field(
        None, description="an engine runtime profile YAML (written by `servesim calibrate "
        "from-benchmark` or `fit-serving`) whose CPU coefficients replace the engine's")

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_text(cls, value: Any) -> Any:
        """YAML reads ``0.12`` as a number (and ``0.10`` as 0.1): ask for quotes, never guess."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"quote it: version: \"{value}\" (YAML reads an unquoted version as a "
                             "number, and 0.10 as 0.1)")
        return value


@dataclass(frozen=True)
class CpuCosts:
    """An engine's host time per iteration on one kind of server: ``fixed_s + per_seq_s *
    sequences + per_token_s * new tokens + per_sample_s * sampled tokens``, with where the
    numbers come from."""

    fixed_s: float
    per_seq_s: float = 0.0
    per_token_s: float = 0.0
    per_sample_s: float = 0.0
    provenance: str = ""
    serial_fixed_s: float = 0.0
    """Host time per iteration the GPU waits for even when the rest overlaps it (see
    :class:`RuntimeCosts`)."""
    serial_per_seq_s: float = 0.0
    frontend_s: float = 0.0
    """The front end's latency per request, outside the step loop: from the client's send until
    the scheduler holds the request (HTTP server, tokenisation, hand-off to the engine process)
    plus the first token's way back (detokenisation, streaming). Every request pays it once, in
    TTFT and end-to-end latency; it is not in any step's time, so TPOT and throughput do not see
    it. A fixed delay is the same to a client wherever on the round trip it falls, so the
    simulation adds it on the way in (:func:`servesim.core.sim.arrivals`)."""
    handoff_s: float = 0.0
    """A disaggregated deployment's hand-off latency per request, beyond the KV bytes' time on the
    link: the KV transfer's set-up and its completion notice (NIXL, Mooncake's transfer engine) and
    the decode worker taking the request in. Each request's prompt KV lands on its decode replica
    this much after its last byte; aggregated deployments never read it."""
    frontend_chunk_s: float = 0.0
    """The front end's serial time per streamed chunk (one per request per step that emits a
    token): detokenising, formatting and sending it, in one process for the whole server (vLLM's
    API server, SGLang's tokenizer manager, ``trtllm-serve``). Each replica's front end takes a
    step's chunks once the step ends and the step before's are sent, ``chunks x frontend_chunk_s``
    for all of them, so the client sees a step's tokens at ``max(end, previous sent) + chunks x
    frontend_chunk_s``. Below its capacity (1 / frontend_chunk_s chunks per second) that adds a few
    microseconds; above it the lag grows until the closed loop's clients, who send their next
    request only when they see the last token, slow down to it (:mod:`servesim.core.stream_out`).
    0 (every shipped engine): the front end keeps up with any rate."""

    def runtime(self, **engine: Any) -> RuntimeCosts:
        """These host costs with the rest of an engine's runtime (overlap, graphs, all-reduce)."""
        return RuntimeCosts(step_overhead_s=self.fixed_s, provenance=self.provenance,
                            cpu_per_seq_s=self.per_seq_s, cpu_per_token_s=self.per_token_s,
                            cpu_per_sample_s=self.per_sample_s, serial_fixed_s=self.serial_fixed_s,
                            serial_per_seq_s=self.serial_per_seq_s, frontend_s=self.frontend_s,
                            handoff_s=self.handoff_s, frontend_chunk_s=self.frontend_chunk_s, **engine)

    def replace_from(self, knobs: EngineKnobs) -> CpuCosts:
        """These costs with every coefficient the experiment sets replaced."""
        values = {"fixed_s": knobs.step_overhead_s, "per_seq_s": knobs.cpu_per_seq_s,
                  "per_token_s": knobs.cpu_per_token_s, "per_sample_s": knobs.cpu_per_sample_s,
                  "serial_fixed_s": knobs.serial_overhead_s, "serial_per_seq_s": knobs.serial_per_seq_s,
                  "frontend_s": knobs.frontend_latency_s, "handoff_s": knobs.handoff_latency_s,
                  "frontend_chunk_s": knobs.frontend_chunk_s}
        given: dict[str, float] = {k: v for k, v in values.items() if v is not None}
        if not given:
            return self
        note = ", ".join(f"engine.{_KNOB_OF[k]}" for k in given) + " in the experiment"
        return replace(self, **given, provenance=f"{note}; others: {self.provenance}")


UNFITTED_CPU = CpuCosts(3e-4, 5e-6, 0.0, 0.0, "estimate before fitting: 0.3 ms per step plus 5 us per "
                        "sequence (scheduler, input preparation, sampler, output processing), overlapped, "
                        "and 0.1 ms per step serial (the sampled tokens' return to the host before the next "
                        "step launches); not measured", serial_fixed_s=1e-4)
"""The host costs an overlapping engine starts from until ``configs/engines/<name>.yaml`` fits them."""


_KNOB_OF = {"fixed_s": "step_overhead_s", "per_seq_s": "cpu_per_seq_s", "per_token_s": "cpu_per_token_s",
            "per_sample_s": "cpu_per_sample_s", "serial_fixed_s": "serial_overhead_s",
            "serial_per_seq_s": "serial_per_seq_s", "frontend_s": "frontend_latency_s",
            "handoff_s": "handoff_latency_s", "frontend_chunk_s": "frontend_chunk_s"}


def by_prefix(table: dict[str, Any], hardware_name: str) -> Any:
    """The entry of ``table`` whose key is the longest prefix of ``hardware_name`` ("" matches all)."""
    key = max((prefix for prefix in table if hardware_name.startswith(prefix)), key=len)
    return table[key]


class Engine(ABC):
    """A serving engine as the simulator models it; subclasses fill in the class attributes."""

    name: ClassVar[str]
    title: ClassVar[str]
    """What it is, for people (``vLLM 0.6 (V0 engine)``)."""
    versions: ClassVar[tuple[str, ...]]
    """Versions whose behaviour this model follows; the first is the default."""
    Knobs: ClassVar[type[EngineKnobs]] = EngineKnobs
    defaults: ClassVar[SchedulerDefaults] = SchedulerDefaults()
    step_overhead_s: ClassVar[dict[str, float]] = {"": 0.0}
    """Per-step CPU time by hardware-profile name prefix (longest match; "" is the default), for
    an engine whose CPU work is one constant (see :attr:`cpu_costs` for the full model)."""
    cpu_costs: ClassVar[dict[str, CpuCosts]] = {}
    """Host time per iteration by hardware-profile name prefix; when empty, :attr:`step_overhead_s`
    gives a constant. A fitted file ``configs/engines/<name>.yaml`` (``servesim calibrate
    fit-serving``) replaces these entries."""
    provenance: ClassVar[dict[str, str]] = {}
    fast_forward: ClassVar[bool] = False
    """Its steps are priced by the cost model alone (no per-step state outside it), so a run of
    pure-decode steps may be fast-forwarded (``servesim.core.fast_forward``). Off by default: an
    engine that says nothing runs step by step."""
    speculation: ClassVar[SpeculationDefaults] = SpeculationDefaults()
    """Its defaults for speculative decoding (``speculative:`` in the experiment)."""
    hybrid_experts: ClassVar[bool] = False
    """With data-parallel attention, whether its MoE layers may split the stage's GPUs into ``ep``
    expert-parallel groups of ``moe_tp`` GPUs each (TensorRT-LLM's ``moe_expert_parallel_size`` x
    ``moe_tensor_parallel_size``; SGLang's ``--ep-size`` below ``--tp-size``, dispatching by
    all-gather). vLLM's ``--enable-expert-parallel`` makes every GPU of the stage an expert rank,
    so off by default: ep is 1 or all of them."""
    memory_budget: ClassVar[str] = "whole_gpu"
    """How it reads its memory fraction (``deployment.gpu_memory_utilization``): one of
    :data:`servesim.memory.BUDGET_RULES` (vLLM's: of the whole GPU, activations included)."""

    def __init__(self, knobs: EngineKnobs) -> None:
        self.knobs = knobs
        self.version = knobs.version or self.versions[0]
        self._profile = (read_runtime_profile(knobs.profile, "engine.profile", self.name)
                         if knobs.profile is not None else None)

    # ------------------------------------------------------------------ CPU work
    def cpu_table(self) -> dict[str, CpuCosts]:
        """Host-time coefficients by hardware prefix: the engine's profile file if given, else
        its fitted file if shipped, else the module's values."""
        if self._profile is not None:
            return self._profile
        fitted = fitted_runtime(self.name)
        if fitted:
            return {**self.builtin_cpu_table(), **fitted}
        return self.builtin_cpu_table()

    def speculation_overheads(self) -> tuple[float, float, str]:
        """(per verifying step, per proposer pass, where they come from) for speculative decoding:
        the engine's defaults unless the experiment's ``engine`` section overrides them."""
        defaults, knobs = self.speculation, self.knobs
        step = defaults.step_overhead_s if knobs.speculative_step_overhead_s is None \
            else knobs.speculative_step_overhead_s
        per_pass = defaults.pass_overhead_s if knobs.proposal_pass_overhead_s is None \
            else knobs.proposal_pass_overhead_s
        overridden = (knobs.speculative_step_overhead_s, knobs.proposal_pass_overhead_s) != (None, None)
        source = "engine section of the experiment" if overridden else defaults.overhead_provenance
        return step, per_pass, source

    def builtin_cpu_table(self) -> dict[str, CpuCosts]:
        if self.cpu_costs:
            return dict(self.cpu_costs)
        note = self.provenance.get("step_overhead_s", "")
        return {prefix: CpuCosts(value, provenance=note) for prefix, value in self.step_overhead_s.items()}

    def cpu(self, hardware_name: str) -> CpuCosts:
        """Host time per iteration on ``hardware_name``, with the experiment's knobs applied."""
        return by_prefix(self.cpu_table(), hardware_name).replace_from(self.knobs)

    # ------------------------------------------------------------------ what a deployment inherits
    def scheduler_defaults(self, hardware_name: str, hbm_bytes: float, tp: int) -> SchedulerDefaults:
        """The engine arguments a deployment inherits on this GPU at this TP degree (engines
        whose defaults depend on the GPU override this)."""
        return self.defaults

    def hybrid_block_size(self, model: ModelSpec, tp: int, kv_bytes: float) -> int | None:
        """The smallest KV block (tokens) the engine uses for ``model`` when its recurrent state
        shares the KV pool's pages, or None: the deployment's block size stands (a dense model;
        every engine but vLLM V1 keeps the state in a pool of its own)."""
        return None

    def memory_fraction(self, hbm_bytes: float, *, tp: int, pp: int, dp: int, chunk: int | None,
                        speculative: str | None) -> float | None:
        """The memory fraction the engine picks itself for this deployment when the experiment
        sets none (``deployment.gpu_memory_utilization``), or None: its scheduler defaults'.
        ``chunk``: the step budget of a policy that chunks prompts (None: it does not);
        ``speculative``: the speculative method, if any. (SGLang derives ``mem_fraction_static``
        from all of these.)"""
        return None

    def runtime(self, hardware_name: str, *, tp: int = 1, max_num_seqs: int | None = None,
                hbm_bytes: float | None = None) -> RuntimeCosts:
        """The software cost per step of this engine on ``hardware_name`` at TP ``tp`` with
        ``max_num_seqs`` seats (CUDA-graph capture sizes may depend on both)."""
        cpu = self.cpu(hardware_name)
        if self._is_constant_only(cpu) and self.knobs.step_overhead_s is not None:
            return replace(cpu.runtime(), provenance="engine.step_overhead_s in the experiment")
        return cpu.runtime()

    @staticmethod
    def _is_constant_only(cpu: CpuCosts) -> bool:
        return (cpu.per_seq_s == 0.0 and cpu.per_token_s == 0.0 and cpu.per_sample_s == 0.0
                and cpu.serial_fixed_s == 0.0 and cpu.serial_per_seq_s == 0.0)

    # ------------------------------------------------------------------ descriptions
    def knob_values(self) -> dict[str, Any]:
        """The knobs as given (unset ones omitted), with the resolved version."""
        return {"name": self.name, **self.knobs.model_dump(mode="json", exclude_none=True),
                "version": self.version}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "title": self.title}

    def identity(self) -> dict[str, Any]:
        """Everything of this engine that decides results (for sweep run names): its knobs, its
        defaults and its coefficients."""
        identity: dict[str, Any] = {"knobs": self.knob_values(), "defaults": asdict(self.defaults),
                                    "step_overhead_s": dict(self.step_overhead_s)}
        table = self.cpu_table()
        if self.cpu_costs or self._profile is not None or fitted_runtime(self.name):
            identity["cpu_costs"] = {k: _cpu_identity(v) for k, v in sorted(table.items())}
        return identity


def _cpu_identity(costs: CpuCosts) -> dict[str, Any]:
    """``costs`` as plain values, without a zero streaming cost (so that the sweep identities of
    engines without one read as before it existed)."""
    values = asdict(costs)
    if not costs.frontend_chunk_s:
        values.pop("frontend_chunk_s")
    return values


# ---------------------------------------------------------------------- runtime profile files
class _CpuEntry(StrictModel):
    fixed_s: float = Field(ge=0, allow_inf_nan=False)
    per_seq_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    per_token_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    per_sample_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    serial_fixed_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    serial_per_seq_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    frontend_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    handoff_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    frontend_chunk_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    provenance: str = ""


class RuntimeProfile(StrictModel):
    """An engine runtime profile file: host-time coefficients by hardware-name prefix
    (``default`` matches every GPU)."""

    engine: str
    version: str | None = None
    cpu_costs: dict[str, _CpuEntry]
    notes: str = ""

    def table(self) -> dict[str, CpuCosts]:
        return {("" if prefix == "default" else prefix):
                CpuCosts(e.fixed_s, e.per_seq_s, e.per_token_s, e.per_sample_s, e.provenance,
                         e.serial_fixed_s, e.serial_per_seq_s, e.frontend_s, e.handoff_s,
                         e.frontend_chunk_s)
                for prefix, e in self.cpu_costs.items()}


def read_runtime_profile(path: Path, where: str, engine: str) -> dict[str, CpuCosts]:
    """The CPU table of a runtime profile YAML; one-line errors name the file and the key."""
    data = read_yaml(Path(path), str(path))
    profile = parse_model(RuntimeProfile, data, file=str(path))
    if profile.engine != engine:
        raise ServesimError(f"{where}", f"{path} is a profile of engine {profile.engine!r}, not {engine!r}",
                            f"use engine: {{name: {profile.engine}, profile: {path}}} or another file")
    if not profile.cpu_costs:
        raise ServesimError(f"{path}: cpu_costs", "is empty",
                            "give at least one entry (default matches every GPU)")
    return profile.table()


@cache
def fitted_runtime(engine: str) -> dict[str, CpuCosts]:
    """The shipped fit of ``engine``'s host-time coefficients (``configs/engines/<name>.yaml``),
    or nothing when none is shipped."""
    path = configs_dir() / "engines" / f"{engine}.yaml"
    if not path.is_file():
        return {}
    return read_runtime_profile(path, "engine", engine)


ENGINES: dict[str, type[Engine]] = {}


def register_engine(cls: type[Engine]) -> type[Engine]:
    ENGINES[cls.name] = cls
    return cls


def make_engine(name: str, knobs: dict[str, Any], where: str = "engine") -> Engine:
    """The engine ``name`` with its validated knobs; a one-line error for an unknown name, knob
    or version."""
    cls = ENGINES.get(name)
    if cls is None:
        raise ServesimError(f"{where}.name", f"unknown engine {name!r}",
                            f"use one of: {', '.join(sorted(ENGINES))}")
    parsed = parse_model(cls.Knobs, knobs, at=where)
    if parsed.version is not None and parsed.version not in cls.versions:
        raise ServesimError(f"{where}.version", f"{name} is modelled for versions "
                            f"{', '.join(cls.versions)}, not {parsed.version!r}",
                            f"use one of them or leave version out (default {cls.versions[0]})")
    return cls(parsed)


BARE_COST_MODEL_ENGINE = "vllm-v0"
"""The engine whose runtime a bare ``CostModel`` (built without one) adds: servesim 0.1's flat
per-step constant and ring all-reduce, so the cost model alone stays the textbook its tests check
by hand. Runs always pass their deployment's engine."""


def default_runtime(hardware_name: str) -> RuntimeCosts:
    """The runtime costs a ``CostModel`` built without an engine adds on ``hardware_name``."""
    return make_engine(BARE_COST_MODEL_ENGINE, {}).runtime(hardware_name)
