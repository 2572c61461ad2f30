"""servesim: a discrete-event simulator of LLM inference serving with a roofline cost model.

The public API, for notebooks and scripts (the CLI is a thin shell over it)::

    from servesim import load_model, load_hardware, CostModel, BatchShape, Precision
    cost = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm-80gb"), tp=1)
    cost.step(BatchShape.decode(batch_size=64, context=1024)).time_s
"""

from servesim.cost import BatchShape, CostModel, StepCost
from servesim.dtypes import DType, Precision
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.hardware_io import load_hardware
from servesim.memory import MemoryPlan, plan_memory
from servesim.model_config import load_model
from servesim.model_spec import ModelSpec
from servesim.step_report import StepReport, analyse_step

__version__ = "0.1.0"

__all__ = ["BatchShape", "CostModel", "DType", "HardwareProfile", "MemoryPlan", "ModelSpec",
           "Precision", "ServesimError", "StepCost", "StepReport", "analyse_step",
           "load_hardware", "load_model", "plan_memory"]
