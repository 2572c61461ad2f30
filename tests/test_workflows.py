"""Agentic workflows: a DAG template of LLM calls with tool latencies, fan-out and join, their
prompts accumulating context, and their release times checked by hand."""

from __future__ import annotations

import pytest
from engine_helpers import experiment, run, tabulate

from servesim.errors import ServesimError
from servesim.workloads import build_workload, parse_workload_config


def fixed(value: float) -> dict:
    return {"dist": "fixed", "value": value}


AGENT = {
    "plan": {"input_tokens": fixed(1000), "output": fixed(100)},
    "search": {"after": ["plan"], "fan_out": 3, "tool_s": fixed(2.0), "input_tokens": fixed(300),
               "output": fixed(50)},
    "answer": {"after": ["search"], "tool_s": fixed(0.5), "input_tokens": fixed(40), "output": fixed(200)},
}


def workload(count: int = 1, steps: dict | None = None, rate: float = 1.0):
    return parse_workload_config({"arrival": {"process": "constant", "rate": rate},
                                  "workflow": {"count": count, "steps": steps or AGENT}})


def test_workflow_prompts_accumulate_context() -> None:
    """plan: 1000. Each search: the plan's context (1000 + 100) + its 300 = 1400. answer: search 0's
    context (1400 + 50) + the other two searches' answers (2 x 50) + 40 = 1590."""
    table = build_workload(workload(), 0)
    assert table.prompt_tokens.tolist() == [1000, 1400, 1400, 1400, 1590]
    links = table.links
    assert links is not None
    assert links.prefix_parent.tolist() == [-1, 0, 0, 0, 1]
    assert links.prefix_shared.tolist() == [0, 1100, 1100, 1100, 1450]
    assert links.after_ids.tolist() == [0, 0, 0, 1, 2, 3]
    assert links.turn.tolist() == [0, 1, 1, 1, 2] and links.session.tolist() == [0] * 5


def test_fan_out_and_join_release_times() -> None:
    """The three searches are sent 2 s after the plan ends, together; the answer 0.5 s after the
    last of them ends. The searches find the plan's computed context in the cache:
    (1000 + 100 - 1) // 16 blocks."""
    result = run(experiment({"enable_prefix_caching": True}, engine="vllm-v0"), build_workload(workload(), 0))
    requests = tabulate(result).requests
    plan_end = requests["finish_s"][0]
    assert requests["arrival_s"][1:4].tolist() == pytest.approx([plan_end + 2.0] * 3)
    assert requests["arrival_s"][4] == pytest.approx(requests["finish_s"][1:4].max() + 0.5)
    assert requests["cached_tokens"][1:4].min() == 1099 // 16 * 16
    sessions = tabulate(result).summary["sessions"]
    assert sessions["duration_s"]["max"] == pytest.approx(requests["finish_s"][4] - requests["arrival_s"][0])
    assert [row["requests"] for row in sessions["ttft_by_turn"]] == [1, 3, 1]


def test_many_runs_are_independent_blocks() -> None:
    table = build_workload(workload(count=4, rate=0.5), 1)
    links = table.links
    assert links is not None and len(table) == 20
    assert links.session.tolist() == [s for s in range(4) for _ in range(5)]
    assert links.prefix_parent.tolist()[5:10] == [-1, 5, 5, 5, 6]
    assert table.arrival_s.tolist()[::5] == [2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize(("steps", "message"), [
    ({"a": {"after": ["b"], "input_tokens": fixed(1), "output": fixed(1)}}, "not an earlier step"),
    ({"a": {"tool_s": fixed(1), "input_tokens": fixed(1), "output": fixed(1)}}, "remove tool_s"),
    ({"a": {"input_tokens": fixed(1), "output": fixed(1), "fan_out": 0}}, "greater than or equal to 1"),
])
def test_workflow_errors_are_one_line(steps: dict, message: str) -> None:
    with pytest.raises(ServesimError) as info:
        workload(steps=steps)
    assert message in str(info.value) and "\n" not in str(info.value)
