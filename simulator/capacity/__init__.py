"""Capacity planning: the highest rate each candidate deployment sustains within the SLOs, the
fewest GPUs for a target rate, and what each costs (``servesim capacity``)."""

from servesim.capacity.config import CapacityConfig, load_capacity_document, validate_capacity
from servesim.capacity.limits import decode_batch_limits
from servesim.capacity.plan import plan_capacity

__all__ = ["CapacityConfig", "decode_batch_limits", "load_capacity_document", "plan_capacity",
           "validate_capacity"]

import sys as _sys

from servesim.api import CallablePackage as _CallablePackage

_sys.modules[__name__].__class__ = _CallablePackage  # servesim.capacity(...) plans (servesim.api)
