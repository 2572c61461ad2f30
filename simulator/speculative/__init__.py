"""Speculative decoding as a what-if: the ``speculative:`` section (:mod:`.schema`), the acceptance
model (:mod:`.acceptance`, published presets in :mod:`.presets`), the proposers (:mod:`.proposer`),
and a replica group's resolved speculation (:mod:`.plan`). The core's side (how many proposals a
decode verifies, how many are accepted, several tokens per step) is
:mod:`servesim.core.speculation`; the price of a speculative step is
:mod:`servesim.cost.speculative`.

The names below are loaded on first use (PEP 562), so that the experiment schema reads a
``speculative:`` section without the acceptance model's NumPy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servesim.speculative.acceptance import AcceptanceModel, acceptance_model, iid_length
    from servesim.speculative.schema import AcceptanceConfig, SpeculativeConfig

__all__ = ["AcceptanceConfig", "AcceptanceModel", "SpeculativeConfig", "acceptance_model", "iid_length"]


def __getattr__(name: str) -> Any:
    if name in ("AcceptanceModel", "acceptance_model", "iid_length"):
        from servesim.speculative import acceptance

        return getattr(acceptance, name)
    if name in ("AcceptanceConfig", "SpeculativeConfig"):
        from servesim.speculative import schema

        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
