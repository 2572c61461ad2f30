"""Per-session metrics: what a user of a multi-turn chat or an agent workflow sees.

A session (the workload's ``links.session``: a conversation, or one run of an agent workflow) is
judged as a whole: how long it took from its first request being sent to its last answer
(``duration_s``), how its time to first token changes from turn to turn (later turns carry longer
prompts but find more of them in the prefix cache), and, with SLOs, the fraction of sessions in
which every request met them. Requests of no session (-1) are left out.

The ``sessions`` summary section appears only when the workload has sessions, so the summaries
of other runs keep their keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.metrics.columns import Table, as_frame
from servesim.metrics.stats import describe
from servesim.metrics.summary import slo_met
from servesim.workloads.requests import RequestTable

if TYPE_CHECKING:
    import pandas as pd

TURNS_SHOWN = 10
"""Turns listed one by one in ``ttft_by_turn``; later turns are pooled into one row."""


def session_columns(table: RequestTable) -> dict[str, np.ndarray]:
    """The ``session`` and ``turn`` columns of the request table (none without sessions)."""
    if table.links is None:
        return {}
    return {"session": table.links.session, "turn": table.links.turn}


def session_section(requests: Table, table: RequestTable,
                    slo_limits: dict[str, float]) -> dict[str, Any]:
    """``{"sessions": ...}`` for a workload with sessions, else ``{}`` (pandas is imported for
    the groupby only when there are sessions)."""
    links = table.links
    if links is None or not np.any(links.session >= 0):
        return {}
    import pandas as pd

    frame = as_frame(requests).assign(session=links.session, turn=links.turn)
    frame = frame[frame["session"] >= 0]
    completed = (frame["status"] == "completed").to_numpy()
    grouped = frame.assign(completed=completed).groupby("session", sort=True)
    start = grouped["arrival_s"].min()
    end = grouped["finish_s"].max()
    all_done = grouped["completed"].all()
    turns = grouped.size()
    durations = (end - start)[all_done].to_numpy(dtype=float)
    out: dict[str, Any] = {
        "sessions": int(turns.size),
        "completed": int(all_done.sum()),
        "requests": len(frame),
        "turns": {"mean": float(turns.mean()), "max": int(turns.max())},
        "duration_s": describe(durations),
        "ttft_by_turn": _by_turn(frame, completed),
    }
    if slo_limits:
        met = pd.Series(slo_met(frame, slo_limits), index=frame.index)
        out["slo_attainment"] = float(met.groupby(frame["session"]).all().mean())
    return {"sessions": out}


def _by_turn(frame: pd.DataFrame, completed: np.ndarray) -> list[dict[str, Any]]:
    """TTFT statistics and prefix-cache hit rate per turn index (turns >= TURNS_SHOWN pooled)."""
    turn = frame["turn"].to_numpy()
    rows = []
    for index in range(min(int(turn.max()) + 1, TURNS_SHOWN + 1)):
        mask = (turn == index) if index < TURNS_SHOWN else (turn >= TURNS_SHOWN)
        done = mask & completed
        ttft = describe(frame["ttft_s"].to_numpy()[done])
        prompt = float(frame["prompt_tokens"].to_numpy()[mask].sum())
        cached = float(frame["cached_tokens"].to_numpy()[mask].sum())
        rows.append({"turn": index if index < TURNS_SHOWN else f"{TURNS_SHOWN}+",
                     "requests": int(mask.sum()), "mean_prompt_tokens": prompt / max(int(mask.sum()), 1),
                     "hit_rate": cached / prompt if prompt else 0.0,
                     "ttft_mean": ttft["mean"], "ttft_p50": ttft["p50"], "ttft_p99": ttft["p99"]})
    return rows
