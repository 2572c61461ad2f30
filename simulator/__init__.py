"""servesim: a discrete-event simulator of LLM inference serving with a roofline cost model.

The public API, for notebooks and scripts (the CLI is a thin shell over it)::

    from simulator import load_model, load_hardware, CostModel, BatchShape, Precision
    cost = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb"), tp=1)
    cost.step(BatchShape.decode(batch_size=64, context=1024)).time_s
"""

from simulator.cost import BatchShape, CostModel, StepCost
from simulator.dtypes import DType, Precision
from simulator.errors import ServesimError
from simulator.hardware import HardwareProfile
from simulator.hardware_io import load_hardware
from simulator.memory import MemoryPlan, plan_memory
from simulator.model_config import load_model
from simulator.model_spec import ModelSpec
from simulator.step_report import StepReport, analyse_step

__version__ = "0.1.0"

__all__ = ["BatchShape", "CostModel", "DType", "HardwareProfile", "MemoryPlan", "ModelSpec",
           "Precision", "ServesimError", "StepCost", "StepReport", "analyse_step",
           "load_hardware", "load_model", "plan_memory"]
