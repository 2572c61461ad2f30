"""Scheduling policies and routers over one shared token-budget core (see :mod:`servesim.policies.base`).

Importing this package registers the built-in policies and routers by name. Adding a policy is one
module here that subclasses :class:`~servesim.policies.base.Policy`, registers it, and is imported
below.
"""

from servesim.policies import (  # noqa: F401  (registers the built-in policies and routers)
    chunked_prefill,
    continuous,
    fleet_routers,
    priority,
    routers,
    sjf,
    static,
)
from servesim.policies.base import POLICIES, Batch, Policy, make_policy
from servesim.policies.routers import ROUTERS, Router, make_router

__all__ = ["POLICIES", "ROUTERS", "Batch", "Policy", "Router", "make_policy", "make_router"]
