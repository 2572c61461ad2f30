"""Fitting the all-reduce implementations a serving engine runs (a profile's ``collectives``).

Each implementation is ``latency + latency_per_peer * (world - 1) + wire_bytes / (link bandwidth
* efficiency)`` (:class:`servesim.hardware.CollectiveFit`), ``wire_bytes`` its own
(:mod:`servesim.cost.communication`: one-shot reads every peer's buffer, two-shot and NCCL's
ring move ``2 (w-1)/w`` of the message). The three parameters are chosen by a grid search on the
mean absolute log error, on every other message size (the rest is held out); then, where it
lowers that error, the single bandwidth fraction becomes a curve over the bytes each GPU moves
(:func:`with_efficiency_curves`, per group size): NCCL switches protocol and algorithm with size (on NVSwitch
nodes its NVLS all-reduce beats the ring bound for large messages), which one fraction cannot
follow.

vLLM's all-reduce measurements are split by the engine's own rule (which kernel vLLM runs at
that size and world on that GPU, :func:`servesim.cost.communication.allreduce_kind` with vLLM's
runtime and the profile's compute capability): the one-shot rows fit ``oneshot``, the two-shot
rows ``twoshot``, the rows vLLM sends to PyTorch's symmetric memory (Hopper and Blackwell) fit
``symm_mem``, and the rows above every limit (NCCL inside vLLM) are kept to check the NCCL fit,
which comes from nccl-tests. The host cost of an eager call is the median, over messages of at
most 64 KiB, of eager minus graphed time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from servesim.calibration.fit import fit_curve
from servesim.calibration.profile_fit import error_stats
from servesim.calibration.schema import holdout_mask
from servesim.cost.communication import allreduce_kind, ring_allreduce_s
from servesim.engines.base import RuntimeCosts
from servesim.engines.vllm import vllm_allreduce
from servesim.hardware import CollectiveFit, Collectives, HardwareProfile, Link

VLLM_RUNTIME = RuntimeCosts(**vllm_allreduce())
"""vLLM's choice of all-reduce kernel by size (its defaults: 8 MiB buffer, one-shot limits, the
symmetric-memory size tables by compute capability)."""
CURVE_MIN_ROWS = {"symm_mem": 1}
"""Bandwidth-bound rows a group size needs for its own efficiency (default 2). vLLM's symmetric
memory runs a different kernel by group size (multimem through the switch at 6-8 GPUs on B200,
4-8 on H100; two-shot at the others), and vLLM gives it two to five message sizes per group,
so half of them, held out, leave one: one is a constant fraction for that group, tested on the
held-out sizes around it."""
MIN_FIT_ROWS = 2
"""An implementation with fewer measured rows (after the hold-out) keeps no fit of its own."""
EAGER_MAX_BYTES = 64 * 2**10

LATENCIES = np.concatenate([[0.0], np.geomspace(0.5e-6, 60e-6, 48)])
PER_PEER = np.concatenate([[0.0], np.geomspace(0.1e-6, 5e-6, 16)])
EFFICIENCIES = np.geomspace(0.02, 1.0, 60)


@dataclass(frozen=True)
class CollectiveReport:
    """Errors of one implementation: median and p90 APE in % over the held-out rows."""

    family: str
    rows_fit: int
    rows_held_out: int
    prior: tuple[float, float]
    fit_in: tuple[float, float]
    fit_out: tuple[float, float]


def wire_bytes(kind: str, message: np.ndarray, world: np.ndarray) -> np.ndarray:
    """Per-row bytes each GPU moves (see :mod:`servesim.cost.communication`), vectorised."""
    if kind == "oneshot":
        return (world - 1) * message
    return 2.0 * (world - 1) / world * message


def predict_fit(fit: CollectiveFit, kind: str, message: np.ndarray, world: np.ndarray,
                link: Link) -> np.ndarray:
    wire = wire_bytes(kind, message, world)
    efficiency = np.array([fit.efficiency_at(float(b), int(w)) for b, w in zip(wire, world, strict=True)])
    return fit.latency_s + fit.latency_per_peer_s * (world - 1) + wire / (link.bandwidth_Bps * efficiency)


BANDWIDTH_SHARE = 0.5
"""Rows whose predicted time is at least this much bandwidth term inform the efficiency curve;
below it the latency dominates and the implied efficiency is noise."""


def with_efficiency_curves(fit: CollectiveFit, kind: str, message: np.ndarray, world: np.ndarray,
                           time_s: np.ndarray, link: Link, min_rows: int = 2) -> CollectiveFit:
    """``fit`` with, per group size, an efficiency curve over the bytes each GPU moves, where one
    lowers that group's mean |log error| on the rows it is fitted to: the latencies stay, and each
    bandwidth-bound row's implied efficiency (``wire / (bandwidth * (time - latency))``) is taken
    per octave of wire bytes, as the operator classes' curves are
    (:func:`servesim.calibration.fit.fit_curve`), where the group has ``min_rows`` such rows."""
    wire = wire_bytes(kind, message, world)
    transfer = time_s - (fit.latency_s + fit.latency_per_peer_s * (world - 1))
    informative = (transfer >= BANDWIDTH_SHARE * time_s) & (wire > 0)
    curves = {}
    for size in np.unique(world):
        mine = world == size
        rows = informative & mine
        if rows.sum() < min_rows:
            continue
        implied = np.clip(wire[rows] / (link.bandwidth_Bps * transfer[rows]), 1e-4, 1.0)
        curve = fit_curve(wire[rows], implied, "bytes")
        candidate = fit.model_copy(update={"efficiency_by_world": {int(size): curve}})
        before = predict_fit(fit, kind, message[mine], world[mine], link)
        after = predict_fit(candidate, kind, message[mine], world[mine], link)
        if np.mean(np.abs(np.log(after / time_s[mine]))) < np.mean(np.abs(np.log(before / time_s[mine]))):
            curves[int(size)] = curve
    return fit.model_copy(update={"efficiency_by_world": curves or None})


def fit_one(kind: str, message: np.ndarray, world: np.ndarray, time_s: np.ndarray,
            link: Link) -> CollectiveFit:
    """The (latency, per-peer latency, efficiency) minimising the mean |log error|."""
    wire = wire_bytes(kind, message, world)[:, None, None, None]
    peers = (world - 1)[:, None, None, None]
    predicted = (LATENCIES[None, :, None, None] + PER_PEER[None, None, :, None] * peers
                 + wire / (link.bandwidth_Bps * EFFICIENCIES[None, None, None, :]))
    score = np.mean(np.abs(np.log(predicted / time_s[:, None, None, None])), axis=0)
    i, j, k = np.unravel_index(np.argmin(score), score.shape)
    return CollectiveFit(latency_s=float(f"{LATENCIES[i]:.3g}"),
                         latency_per_peer_s=float(f"{PER_PEER[j]:.3g}"),
                         efficiency=float(f"{EFFICIENCIES[k]:.3g}"))


def vllm_kinds(table: pd.DataFrame, capability: str | None) -> np.ndarray:
    """The kernel vLLM runs for each row of ``table`` on GPUs of compute ``capability``."""
    return np.array([allreduce_kind(float(b), int(w), VLLM_RUNTIME, capability)
                     for b, w in zip(table["bytes"], table["world"], strict=True)])


def fit_collectives(nccl: pd.DataFrame, custom: pd.DataFrame, profile: HardwareProfile,
                    ) -> tuple[Collectives, list[CollectiveReport]]:
    """The profile's ``collectives`` fitted to nccl-tests (``nccl``) and vLLM's all-reduce
    (``custom``), and the error of each."""
    link = profile.interconnect
    fits: dict[str, CollectiveFit | None] = {}
    reports = []
    parts = {"nccl": nccl.assign(kind="nccl")}
    kinds = vllm_kinds(custom, profile.compute_capability)
    for kind in ("oneshot", "twoshot", "symm_mem"):
        parts[kind] = custom[kinds == kind].assign(kind=kind)
    for kind, table in parts.items():
        held = holdout_mask(table, "allreduce")
        if int((~held).sum()) < MIN_FIT_ROWS:  # vLLM never runs it on this GPU (symm_mem on A100)
            fits[kind] = None
            continue
        message, world, time_s = (table[c].to_numpy(float) for c in ("bytes", "world", "time_s"))
        fit = fit_one(kind, message[~held], world[~held], time_s[~held], link)
        fit = with_efficiency_curves(fit, kind, message[~held], world[~held], time_s[~held], link,
                                     min_rows=CURVE_MIN_ROWS.get(kind, 2))
        fits[kind] = fit
        predicted = predict_fit(fit, kind, message, world, link)
        prior = np.array([ring_allreduce_s(b, int(w), link) for b, w in zip(message, world, strict=True)])
        ape = np.abs(predicted - time_s) / time_s
        prior_ape = np.abs(prior - time_s) / time_s
        reports.append(CollectiveReport(kind, int((~held).sum()), int(held.sum()),
                                        error_stats(prior_ape[held]), error_stats(ape[~held]),
                                        error_stats(ape[held])))
    small = custom[custom["bytes"] <= EAGER_MAX_BYTES]
    eager = float(np.median(small["eager_s"] - small["time_s"])) if len(small) else 0.0
    collectives = Collectives(nccl=fits["nccl"], oneshot=fits["oneshot"], twoshot=fits["twoshot"],
                              symm_mem=fits["symm_mem"], eager_call_s=float(f"{max(eager, 0.0):.3g}"))
    return collectives, reports


def engine_allreduce_times(table: pd.DataFrame, hardware: HardwareProfile,
                           runtime: RuntimeCosts = VLLM_RUNTIME) -> np.ndarray:
    """Seconds of each all-reduce of ``table`` (its ``bytes`` and ``world``) as ``runtime`` runs it
    on ``hardware`` (:func:`servesim.cost.communication.allreduce_s`)."""
    from servesim.cost.communication import allreduce_s

    return np.array([allreduce_s(float(b), int(w), runtime, hardware)
                     for b, w in zip(table["bytes"], table["world"], strict=True)], dtype=np.float64)


def engine_allreduce_errors(custom: pd.DataFrame, hardware: HardwareProfile,
                            runtime: RuntimeCosts = VLLM_RUNTIME) -> tuple[float, float]:
    """Median and p90 APE (%) of the all-reduce as ``runtime`` runs it on ``hardware``, against
    every row of vLLM's measured all-reduce (graph-captured)."""
    predicted = engine_allreduce_times(custom, hardware, runtime)
    measured = custom["time_s"].to_numpy(float)
    return error_stats(np.abs(predicted - measured) / measured)
