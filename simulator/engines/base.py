"""What every serving engine declares: its scheduler defaults and its runtime costs per step.

The cost model prices the GPU kernels of a step; the engine says what its software adds around
them (:class:`RuntimeCosts`). Today that is a fixed per-step CPU time, serial with the GPU (the
scheduler, input preparation, sampling and output processing of an engine without overlap).
The serving-engine models add CPU work that grows with the batch, its overlap with the GPU,
CUDA-graph capture sizes and the collective implementation, as fields of the same object, so the
cost model has one place to read them from.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from pydantic import Field

from servesim.errors import ServesimError
from servesim.inputs.schema import FrozenModel, parse_model

DEFAULT_ENGINE = "vllm-v0"
"""The engine an experiment runs when it names none: today's behaviour, unchanged."""


@dataclass(frozen=True)
class RuntimeCosts:
    """An engine's software cost per step on one kind of GPU, as the cost model adds it."""

    step_overhead_s: float = 0.0
    """CPU time of one iteration that the GPU waits for (no overlap): scheduling, input
    preparation, sampling, output processing."""
    provenance: str = ""

    @classmethod
    def none(cls) -> RuntimeCosts:
        """No software cost: the GPU kernels alone (``servesim step --ideal``, kernel checks)."""
        return cls(0.0, "none: kernels only")


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


class EngineKnobs(FrozenModel):
    """Knobs every engine takes under ``engine:`` (an engine adds its own by subclassing)."""

    version: str | None = Field(None, description="engine version to model (default: the latest modelled)")
    step_overhead_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="CPU time per iteration the GPU waits for, on every GPU (default: the engine's "
        "estimate for the hardware)")
    speculative_step_overhead_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="speculative decoding: software time of a step that verifies proposals (default: "
        "the engine's)")
    proposal_pass_overhead_s: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="speculative decoding: software time of each proposer pass (default: the "
        "engine's)")


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
    """Per-step CPU time by hardware-profile name prefix (longest match; "" is the default)."""
    provenance: ClassVar[dict[str, str]] = {}
    fast_forward: ClassVar[bool] = False
    """Its steps are priced by the cost model alone (no per-step state outside it), so a run of
    pure-decode steps may be fast-forwarded (``servesim.core.fast_forward``). Off by default: an
    engine that says nothing runs step by step."""
    speculation: ClassVar[SpeculationDefaults] = SpeculationDefaults()
    """Its defaults for speculative decoding (``speculative:`` in the experiment)."""

    def __init__(self, knobs: EngineKnobs) -> None:
        self.knobs = knobs
        self.version = knobs.version or self.versions[0]

    def runtime(self, hardware_name: str) -> RuntimeCosts:
        """The software cost per step of this engine on the GPU named ``hardware_name``."""
        if self.knobs.step_overhead_s is not None:
            return RuntimeCosts(self.knobs.step_overhead_s, "engine.step_overhead_s in the experiment")
        table = self.step_overhead_s
        key = max((prefix for prefix in table if hardware_name.startswith(prefix)), key=len)
        return RuntimeCosts(table[key], self.provenance.get("step_overhead_s", ""))

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

    def knob_values(self) -> dict[str, Any]:
        """The knobs as given (unset ones omitted), with the resolved version."""
        return {"name": self.name, **self.knobs.model_dump(exclude_none=True), "version": self.version}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "title": self.title}

    def identity(self) -> dict[str, Any]:
        """Everything of this engine that decides results (for sweep run names): its knobs, its
        defaults and its coefficients."""
        return {"knobs": self.knob_values(), "defaults": asdict(self.defaults),
                "step_overhead_s": dict(self.step_overhead_s)}


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


def default_runtime(hardware_name: str) -> RuntimeCosts:
    """The default engine's runtime costs on ``hardware_name`` (the cost model's default)."""
    return make_engine(DEFAULT_ENGINE, {}).runtime(hardware_name)
