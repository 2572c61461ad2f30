"""servesim: a discrete-event simulator of LLM inference serving with a roofline cost model.

The public API, for notebooks and scripts (the CLI is a thin shell over it)::

    import servesim
    result = servesim.run("quickstart", workload__arrival__rate=16)     # see servesim.api
    result.summary.ttft_s.p99, result.requests, result.report()
    servesim.sweep("rates-h100", workload__num_requests=200).results
    servesim.capacity("llama3-8b-chat", target_rate=40).winner

    from servesim import load_model, load_hardware, CostModel, BatchShape, Precision
    cost = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb"), tp=1)
    cost.step(BatchShape.decode(batch_size=64, context=1024)).time_s

Names are imported on first use (PEP 562), so ``import servesim`` and ``servesim --help`` do not
pay for NumPy, pandas, pydantic or plotly until a command needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "BatchShape": "servesim.cost", "CostModel": "servesim.cost", "StepCost": "servesim.cost",
    "DType": "servesim.dtypes", "Precision": "servesim.dtypes", "ServesimError": "servesim.errors",
    "HardwareProfile": "servesim.hardware", "load_hardware": "servesim.hardware_io",
    "MemoryPlan": "servesim.memory", "plan_memory": "servesim.memory", "load_model": "servesim.model_config",
    "ModelSpec": "servesim.model_spec", "StepReport": "servesim.step_report",
    "analyse_step": "servesim.step_report",
    "run": "servesim.api", "Result": "servesim.api", "SweepResult": "servesim.api",
    "CapacityResult": "servesim.api",
}
_CALLABLE_PACKAGES = ("sweep", "capacity")
"""Subpackages that are also functions: ``servesim.sweep(...)``, ``servesim.capacity(...)``."""


def __getattr__(name: str) -> Any:
    if name in _CALLABLE_PACKAGES:
        return importlib.import_module(f"servesim.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, *_CALLABLE_PACKAGES])


if TYPE_CHECKING:
    from servesim.api import CapacityResult, Result, SweepResult, run
    from servesim.cost import BatchShape, CostModel, StepCost
    from servesim.dtypes import DType, Precision
    from servesim.errors import ServesimError
    from servesim.hardware import HardwareProfile
    from servesim.hardware_io import load_hardware
    from servesim.memory import MemoryPlan, plan_memory
    from servesim.model_config import load_model
    from servesim.model_spec import ModelSpec
    from servesim.step_report import StepReport, analyse_step

__all__ = ["BatchShape", "CapacityResult", "CostModel", "DType", "HardwareProfile", "MemoryPlan", "ModelSpec",
           "Precision", "Result", "ServesimError", "StepCost", "StepReport", "SweepResult", "analyse_step",
           "capacity", "load_hardware", "load_model", "plan_memory", "run", "sweep"]
