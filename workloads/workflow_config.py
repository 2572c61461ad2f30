"""The ``workload.workflow:`` section: agentic workflows as a small DAG template, as a pydantic model.

Each workflow run is a copy of one template of named LLM calls (``steps``), in order; the
workload's ``arrival`` process (and ``duration_s`` or ``count``) says when runs start::

    workload:
      arrival: {process: poisson, rate: 0.2}       # workflow runs per second
      duration_s: 3600
      workflow:
        count: 500                                 # optional cap on runs
        steps:
          plan:   {input_tokens: {dist: fixed, value: 1500}, output: {dist: fixed, value: 200}}
          search: {after: [plan], fan_out: 3, tool_s: {dist: lognormal, median: 1.5, sigma: 0.5},
                   input_tokens: {dist: uniform, low: 300, high: 800}, output: {dist: fixed, value: 150}}
          answer: {after: [search], tool_s: {dist: fixed, value: 0.2},
                   input_tokens: {dist: fixed, value: 100}, output: {dist: fixed, value: 400}}

The rules (:mod:`servesim.workloads.workflows`), and nothing more: a step runs ``fan_out``
parallel calls; a step with ``after`` is sent ``tool_s`` (a tool's latency, drawn per call) after
*every* call of the steps it follows has ended (a join); its prompt is the whole context of the
first step it follows (that call's prompt and answer: the prefix cache can hold them), then the
answers of the other calls it follows, then its own ``input_tokens`` (a tool's result, an
instruction). A step without ``after`` starts the run, its prompt the system prompt
(``shared_prefix``) and its ``input_tokens``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PositiveInt, model_validator

from servesim.inputs.schema import StrictModel
from servesim.workloads.length_dists import LengthDist
from servesim.workloads.session_config import SecondsDist

MAX_STEPS = 64
MAX_FAN_OUT = 256


class WorkflowStep(StrictModel):
    """One LLM call of the template (``fan_out`` parallel copies)."""

    after: list[str] = Field(default_factory=list, description="steps that must end before this one")
    fan_out: Annotated[int, Field(ge=1, le=MAX_FAN_OUT)] = 1
    tool_s: SecondsDist | None = Field(None, description="delay after the steps it follows end "
                                       "(a tool call); none: sent at once")
    input_tokens: LengthDist
    output: LengthDist


class WorkflowConfig(StrictModel):
    """A DAG template of LLM calls (see the module docstring)."""

    count: PositiveInt | None = Field(None, description="workflow runs (with duration_s: at most)")
    steps: Annotated[dict[str, WorkflowStep], Field(min_length=1, max_length=MAX_STEPS)]

    @model_validator(mode="after")
    def _check(self) -> WorkflowConfig:
        seen: list[str] = []
        for name, step in self.steps.items():
            for dependency in step.after:
                if dependency not in seen:
                    known = f"one of the steps before it: {', '.join(seen)}" if seen else "none (it is first)"
                    raise ValueError(f"step {name} follows {dependency!r}, which is not an earlier step; "
                                     f"use {known}")
            if len(set(step.after)) != len(step.after):
                raise ValueError(f"step {name} lists a step twice in after")
            if not step.after and step.tool_s is not None:
                raise ValueError(f"step {name} starts the workflow, so it has no tool call before it; "
                                 "remove tool_s")
            seen.append(name)
        return self
