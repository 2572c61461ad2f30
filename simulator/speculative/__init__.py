"""Speculative decoding as a what-if: the ``speculative:`` section (:mod:`.schema`), the acceptance
model (:mod:`.acceptance`, published presets in :mod:`.presets`), the proposers (:mod:`.proposer`),
and a replica group's resolved speculation (:mod:`.plan`). The core's side (how many proposals a
decode verifies, how many are accepted, several tokens per step) is
:mod:`servesim.core.speculation`; the price of a speculative step is
:mod:`servesim.cost.speculative`."""

from servesim.speculative.acceptance import AcceptanceModel, acceptance_model, iid_length
from servesim.speculative.schema import AcceptanceConfig, SpeculativeConfig

__all__ = ["AcceptanceConfig", "AcceptanceModel", "SpeculativeConfig", "acceptance_model", "iid_length"]
