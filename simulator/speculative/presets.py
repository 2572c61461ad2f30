"""Published acceptance measurements, usable as ``acceptance: {preset: NAME}``.

Each preset is the unconditional acceptance rate per proposal position (the probability that the
first ``i`` proposals are all accepted, vLLM's "acceptance at token i"), with where it comes from.
Acceptance depends on the target, the proposer, the data and the sampling temperature: use a
preset only for a deployment like the one measured, and measure your own otherwise (vLLM prints
the counters ``acceptance: {measured: ...}`` takes).
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.errors import ServesimError


@dataclass(frozen=True)
class AcceptancePreset:
    per_position: tuple[float, ...]
    """Unconditional acceptance rate of proposal positions 1, 2, ... (non-increasing)."""
    method: str
    """The proposer it was measured with."""
    source: str
    propose_rate: float = 1.0
    """Share of decode steps that proposed (n-gram lookup finds no match in the others)."""


PRESETS: dict[str, AcceptancePreset] = {
    "eagle3-llama-3.1-8b-mtbench": AcceptancePreset(
        (0.781, 0.579, 0.43, 0.29, 0.24, 0.14, 0.08), "eagle3",
        "vLLM issue #20780 (github.com/vllm-project/vllm/issues/20780, 2025-07-10): mean acceptance "
        "lengths of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B on Llama-3.1-8B-Instruct, MT-bench, vLLM V1, "
        "batch 1, k = 2..7: 2.36, 2.79, 3.08, 3.32, 3.46, 3.54. Chain proposals do not depend on k, "
        "so positions 3..7 are the differences of consecutive lengths; positions 1 and 2 (together "
        "1.36) are split assuming position 2's conditional rate equals position 3's (0.742): an "
        "estimate. Consistent with vLLM issue #26191 (k = 7: 12,208 of 33,712 proposals accepted "
        "over 4,816 drafts, length 3.53)."),
    "eagle-llama-3.1-8b-mtbench": AcceptancePreset(
        (0.728, 0.372, 0.19, 0.10, 0.04, 0.02, 0.02), "eagle",
        "vLLM issue #20780 (as eagle3-llama-3.1-8b-mtbench): yuhuili/EAGLE-LLaMA3.1-Instruct-8B "
        "(EAGLE-1 head), mean acceptance lengths 2.10, 2.29, 2.39, 2.43, 2.45, 2.47 at k = 2..7; "
        "positions 1 and 2 (together 1.10) split the same way (an estimate)."),
    "mtp-deepseek-v3": AcceptancePreset(
        (0.875,), "mtp",
        "DeepSeek-V3 Technical Report (arXiv:2412.19437), section 5.4.3: with one MTP module 'the "
        "acceptance rate of the second token prediction ranges between 85% and 90%' (the midpoint; "
        "one position only: nothing is published for reusing the module for k > 1)."),
    "ngram-blazedit-k5": AcceptancePreset(
        (0.81, 0.74, 0.70, 0.68, 0.66), "ngram",
        "vLLM PR #24344 (github.com/vllm-project/vllm/pull/24344): method ngram, k = 5, "
        "prompt_lookup_min 2, prompt_lookup_max 5, 90 prompts of the blazedit code-edit set "
        "(vdaita/edit_5k_char): 993 drafts, 3,562 of 4,960 proposals accepted, acceptance at tokens "
        "0..4 of 0.81, 0.74, 0.70, 0.68, 0.66; 821 tokens were generated in steps where the lookup "
        "found no match, so it proposed in 993 of 1,814 decode steps (propose_rate 0.547). Code "
        "edits repeat their prompt; chat traffic matches far less often.",
        propose_rate=993 / 1814),
}


def preset(name: str) -> AcceptancePreset:
    found = PRESETS.get(name)
    if found is None:
        raise ServesimError("speculative.acceptance.preset", f"unknown preset {name!r}",
                            f"use one of: {', '.join(sorted(PRESETS))}, or give rate: ...")
    return found
