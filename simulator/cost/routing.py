"""How many distinct experts a MoE layer reads when its tokens pick experts at random.

Each of ``tokens`` tokens picks a given expert with probability ``pick`` (``top_k / E`` under
uniform routing, more on the busiest expert-parallel rank), so that expert is hit with probability
``1 - (1 - pick)^tokens`` and ``experts`` of them hit ``experts (1 - (1 - pick)^tokens)``: one
decoding token reads its top-k experts, a large batch reads them all. The cost model prices the
experts' weights by this count (``step_cost``, ``expert_parallel``), and the calibration prices a
measured row that routed uniformly by the same function (``calibration/moe_routing.py``).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

Number = TypeVar("Number", float, np.ndarray)


def experts_hit(experts: Number, pick: Number, tokens: Number) -> Number:
    """Expected experts, of ``experts``, that at least one of ``tokens`` tokens picks, each token
    picking each of them with probability ``pick``."""
    return experts * (1.0 - (1.0 - pick) ** tokens)
