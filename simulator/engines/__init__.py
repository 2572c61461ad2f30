"""Serving engines: the software that runs on each replica (vLLM, SGLang, TensorRT-LLM, ...).

An engine is named and versioned (``engine: vllm-v0`` or ``engine: {name: vllm-v0, ...knobs}``
in an experiment). It owns what belongs to the software rather than the GPU: the scheduler
defaults a deployment inherits (``max_num_seqs``, token budget, block size, policy, prefix
caching), and the per-step runtime cost the cost model adds to the GPU kernels
(:class:`~servesim.engines.base.RuntimeCosts`). Hardware profiles describe hardware only.

Importing this package registers the built-in engines. Adding an engine is one module here that
subclasses :class:`~servesim.engines.base.Engine` and calls :func:`register_engine`.
"""

from servesim.engines import vllm_v0  # noqa: F401  (registers the built-in engines)
from servesim.engines.base import (
    DEFAULT_ENGINE,
    ENGINES,
    Engine,
    EngineKnobs,
    RuntimeCosts,
    SchedulerDefaults,
    SpeculationDefaults,
    default_runtime,
    make_engine,
    register_engine,
)

__all__ = ["DEFAULT_ENGINE", "ENGINES", "Engine", "EngineKnobs", "RuntimeCosts", "SchedulerDefaults",
           "SpeculationDefaults", "default_runtime", "make_engine", "register_engine"]
