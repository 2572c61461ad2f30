"""The summary's ``speculation`` section: what was configured, and what speculation did.

Definitions follow vLLM's speculative-decoding metrics:

- ``drafts``: (request, step) pairs that verified at least one proposal (``num_drafts``);
- ``acceptance_rate`` = accepted proposals / proposed ones (``spec_decode_draft_acceptance_rate``);
- ``mean_acceptance_length`` = 1 + accepted / drafts: tokens a verifying request emits per step
  (vLLM's and EAGLE's "mean acceptance length", ``tau``);
- ``acceptance_per_position[i]`` = drafts that accepted proposal ``i`` / drafts (vLLM's
  "acceptance at token i"), to compare with the configured model's ``per_position``.

Time: ``proposal_s`` sums the steps' ``op_proposal_s`` (proposer passes and speculative software
time), ``verify_extra_s`` what verifying cost the target's passes beyond plain decoding; both also
as shares of the replicas' busy time. TPOT keeps vLLM's definition (per output token); ITL counts
one gap per chunk of tokens a step delivers (vLLM's benchmark appends one ITL per streamed chunk),
so with speculation mean ITL exceeds mean TPOT by about the mean acceptance length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servesim.core.replica_state import ReplicaState
from servesim.metrics.columns import Table, column
from servesim.speculative.plan import SpeculationPlan


def speculative_section(plan: SpeculationPlan, states: list[ReplicaState],
                        steps: Table) -> dict[str, Any]:
    """The section for one speculating group: ``states`` its replicas, ``steps`` their steps."""
    k = plan.num_tokens
    drafts = proposed = accepted = 0
    per_position = np.zeros(k, dtype=np.int64)
    for state in states:
        assert state.speculation is not None
        counts = state.speculation.counts
        drafts += counts.drafts
        proposed += counts.proposed
        accepted += counts.accepted
        assert counts.accepted_per_position is not None
        per_position += counts.accepted_per_position
    decoding = column(steps, "num_decodes") > 0
    speculating = column(steps, "proposed_tokens") > 0
    busy = float(column(steps, "duration_s").sum())
    proposal_s = float(column(steps, "op_proposal_s").sum())
    verify_s = float(column(steps, "verify_extra_s").sum())
    return {
        **plan.describe(),
        "drafts": drafts,
        "proposed_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
        "acceptance_per_position": (per_position / drafts).tolist() if drafts else None,
        "decode_steps": int(decoding.sum()),
        "speculating_steps": int(speculating.sum()),
        "proposal_s": proposal_s,
        "verify_extra_s": verify_s,
        "proposal_share": proposal_s / busy if busy else 0.0,
        "verify_extra_share": verify_s / busy if busy else 0.0,
    }


def speculation_lines(sections: dict[str, Any]) -> list[str]:
    """One line for people about the ``speculation`` section, if there is one."""
    spec = sections.get("speculation")
    if not spec:
        return []
    head = f"speculation: {spec['method']}, k = {spec['num_speculative_tokens']}"
    if not spec["drafts"]:
        return [f"{head}: no step verified proposals ({spec['decode_steps']:,} decode steps)"]
    expected = spec["acceptance_model"]["expected_acceptance_length"]
    return [f"{head}: {spec['acceptance_rate']:.1%} of {spec['proposed_tokens']:,} proposals accepted, "
            f"mean acceptance length {spec['mean_acceptance_length']:.2f} tokens/step (model "
            f"{expected:.2f}); {spec['speculating_steps']:,} of {spec['decode_steps']:,} decode steps "
            f"speculated; proposals {spec['proposal_share']:.1%} and verification "
            f"{spec['verify_extra_share']:.1%} of busy time"]


def speculation_plan_line(plan: SpeculationPlan) -> str:
    """The configured speculation, for ``servesim run`` and ``validate``."""
    proposer, k = plan.proposer, plan.num_tokens
    spec = proposer.spec
    network = "prompt lookup on the CPU" if spec is None else \
        f"{spec.name} ({spec.num_layers} layer{'s' if spec.num_layers > 1 else ''}, tp {proposer.tp})"
    cap = plan.disable_by_batch_size
    return (f"speculative: {plan.config.method}, k = {k}, proposer {network}: weights "
            f"{proposer.weight_bytes / 2**30:.2f} GiB, KV {proposer.kv_bytes_per_token / 1024:.1f} KiB per "
            f"token per GPU; expected acceptance length {plan.acceptance.expected_length(k):.2f}; "
            + ("speculates at every batch size" if cap is None else f"off above {cap} running requests"))
