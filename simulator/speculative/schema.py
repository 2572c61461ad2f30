"""The experiment's ``speculative:`` section, spelt as vLLM's ``--speculative-config``.

::

    speculative:
      method: eagle3              # draft_model | eagle | eagle3 | mtp | ngram
      num_speculative_tokens: 3   # k: proposals verified per step (0 turns speculation off)
      model: null                 # draft_model: catalogue name or config.json (required);
                                  # eagle, eagle3: the head's config.json (default: derived from
                                  # the target); mtp, ngram: not used
      acceptance: {preset: eagle3-llama-3.1-8b-mtbench}   # or rate | rates | per_position |
                                  # distribution | measured (see AcceptanceConfig)
      disable_by_batch_size: null # no speculation in steps with more running requests (vLLM's
                                  # knob; default: the engine's, none for vllm-v0)
      draft_tensor_parallel_size: null   # draft_model: 1 or the deployment's tp (default)

Every key is checked, cross-key rules too (a draft model needs ``model``; ``propose_rate`` is
n-gram lookup's), each as one line naming the key. ``--set speculative.num_speculative_tokens=4``
and sweep axes over any of these keys work as for every other section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from servesim.errors import ServesimError
from servesim.inputs.schema import StrictModel

MAX_SPECULATIVE_TOKENS = 16
"""The largest ``k`` accepted (vLLM's examples go to 7-8; beyond 16 acceptance is ~0 for any
published proposer)."""


class MeasuredAcceptance(StrictModel):
    """Acceptance counters as vLLM reports them (``vllm:spec_decode_num_drafts`` and
    ``vllm:spec_decode_num_accepted_tokens_per_pos``, or the offline example's printout)."""

    num_drafts: int = Field(ge=1, description="(request, step) pairs that proposed")
    accepted_per_position: list[int] = Field(min_length=1, description="times proposal i was accepted")


class AcceptanceConfig(StrictModel):
    """How many proposals the target accepts. Give exactly one form (each is reduced to the
    probability that the first ``i`` proposals are all accepted, :mod:`.acceptance`):

    - ``rate``: every proposal is accepted with probability ``rate`` given the ones before it were
      (i.i.d.; expected tokens per step ``(1 - rate^(k+1)) / (1 - rate)``);
    - ``rates``: that conditional rate per position, as EAGLE reports ``n-alpha``;
    - ``per_position``: the unconditional rate per position (vLLM's "acceptance at token i",
      non-increasing);
    - ``distribution``: how often exactly 0, 1, 2, ... proposals were accepted (counts or
      probabilities, measured from a dataset);
    - ``measured``: vLLM's counters;
    - ``preset``: a published measurement (``servesim.speculative.presets``).
    """

    rate: float | None = Field(None, ge=0, le=1)
    rates: list[float] | None = Field(None, min_length=1)
    per_position: list[float] | None = Field(None, min_length=1)
    distribution: list[float] | None = Field(None, min_length=2)
    measured: MeasuredAcceptance | None = None
    preset: str | None = None
    propose_rate: float | None = Field(
        None, gt=0, le=1, description="n-gram lookup: share of a request's decode steps in which "
        "the lookup finds a match and proposes (default 1, or the preset's)")

    @model_validator(mode="after")
    def _one_form(self) -> AcceptanceConfig:
        given = [name for name in ACCEPTANCE_FORMS if getattr(self, name) is not None]
        if len(given) != 1:
            problem = "gives no acceptance model" if not given else f"gives {' and '.join(given)}"
            raise ServesimError("speculative.acceptance", problem,
                                f"give exactly one of: {', '.join(ACCEPTANCE_FORMS)}")
        return self

    @property
    def form(self) -> str:
        return next(name for name in ACCEPTANCE_FORMS if getattr(self, name) is not None)


ACCEPTANCE_FORMS = ("rate", "rates", "per_position", "distribution", "measured", "preset")


class SpeculativeConfig(StrictModel):
    """Speculative decoding, as vLLM's ``speculative_config`` names it."""

    method: Literal["draft_model", "eagle", "eagle3", "mtp", "ngram"] = Field(
        description="what proposes: a draft model, an EAGLE / EAGLE-3 head, the target's MTP "
        "layers, or n-gram lookup in the prompt (prompt lookup decoding)")
    num_speculative_tokens: int = Field(
        ge=0, le=MAX_SPECULATIVE_TOKENS,
        description="proposals each decoding request verifies per step (k); 0 turns speculation "
        "off, so a sweep can include the baseline")
    model: str | None = Field(
        None, description="draft_model: catalogue name or config.json of the draft; eagle/eagle3: "
        "the head's config.json (default: one layer shaped like the target's)")
    acceptance: AcceptanceConfig
    disable_by_batch_size: int | None = Field(
        None, ge=1, description="no speculation in a step with more running requests than this "
        "(vLLM's disable_by_batch_size, TensorRT-LLM's max_concurrency); default: the engine's")
    draft_tensor_parallel_size: int | None = Field(
        None, ge=1, description="draft_model: tensor parallelism of the draft, 1 or the deployment's "
        "tp (default)")

    @model_validator(mode="after")
    def _method_keys(self) -> SpeculativeConfig:
        method = self.method
        if method == "draft_model" and not self.model:
            raise ServesimError("speculative.model", "is required for method draft_model",
                                "name a catalogue model (e.g. llama-3.2-1b) or a config.json")
        if method in ("mtp", "ngram") and self.model:
            source = "the target's own MTP layers" if method == "mtp" else "the prompt, on the CPU"
            raise ServesimError("speculative.model", f"is not used by method {method} (it proposes "
                                f"from {source})", "remove it")
        if self.draft_tensor_parallel_size is not None and method != "draft_model":
            raise ServesimError("speculative.draft_tensor_parallel_size",
                                "applies to method draft_model only", "remove it")
        propose = self.acceptance.propose_rate
        if propose is not None and propose < 1 and method != "ngram":
            raise ServesimError("speculative.acceptance.propose_rate",
                                f"applies to method ngram (a {method} proposer always proposes)",
                                "remove it or set method: ngram")
        return self

    @property
    def enabled(self) -> bool:
        return self.num_speculative_tokens > 0

