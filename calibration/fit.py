"""Fitting efficiency curves and fixed costs to measured kernel times.

For one operator class the model is ``t = fixed + max(flops / (peak * ec(x_c)), bytes / (bw *
em(x_m)))``. Given ``fixed``, every row implies an efficiency for the resource that binds it:
``flops / (peak * (t - fixed))`` if compute-bound, ``bytes / (bw * (t - fixed))`` if memory-bound.
The fit alternates: classify each row by the larger predicted term (starting from the textbook
ridge point), set each curve's knot (one per octave of its axis) to the median implied efficiency
of the rows bound by it near that knot, and repeat until the classification is stable. ``fixed``
is chosen from a grid below the fastest measurement by the mean absolute log error.

The curves are held to :class:`servesim.hardware.Curve`'s rule (time may not fall as work grows,
``d ln eff / d ln x <= 1``): the knots are made isotonic in ``ln x - ln eff`` (pool-adjacent-
violators, weighted by the rows behind each knot), then any remaining step steeper than the
validator allows is clipped. A curve with no row bound by it keeps the profile's previous curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from servesim.calibration.work import Work, fast_predict
from servesim.hardware import Axis, Curve, Link, OperatorEfficiency

MIN_EFF = 1e-4
RIDGE_LOCK = 2.0
"""Rows whose textbook compute and memory times differ by more than this factor keep the
textbook's verdict through the fit (see :func:`_fit_given_fixed`); ``ridge_lock=None`` turns it
off for a family whose kernels are slower than their textbook bound on the other side
(a fused MoE's grouped GEMMs, :data:`servesim.calibration.profile_fit.UNLOCKED_FAMILIES`)."""


@dataclass(frozen=True)
class FitResult:
    """A fitted operator class and what the fit saw."""

    efficiency: OperatorEfficiency
    rows: int
    compute_rows: int
    memory_rows: int
    compute_kept: bool
    memory_kept: bool


def isotonic_increasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.concatenate([np.full(int(c), v) for v, _, c in blocks])


def _sig(value: float, digits: int = 4, down: bool = False) -> float:
    """``value`` to ``digits`` significant digits (rounded down if ``down``), as written to YAML."""
    scale = 10 ** (digits - 1 - math.floor(math.log10(value)))
    return (math.floor(value * scale) if down else round(value * scale)) / scale


def monotone_knots(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Knot efficiencies closest to ``y`` that satisfy the Curve validator's rule, to four
    significant digits."""
    y = np.clip(y, MIN_EFF, 1.0)
    g = isotonic_increasing(np.log(x) - np.log(y), weights)
    y = np.array([_sig(v) for v in np.clip(x / np.exp(g), MIN_EFF, 1.0)])
    for i in range(len(y) - 1):
        ceiling = _sig(y[i] * (1.0 + math.log(x[i + 1] / x[i])) * (1 - 1e-9), down=True)
        y[i + 1] = min(y[i + 1], ceiling)
    return y


def fit_curve(x: np.ndarray, implied: np.ndarray, axis: Axis) -> Curve:
    """A log-linear curve through the median implied efficiency per octave of ``x``."""
    log2 = np.log2(x)
    knot_index = np.rint(log2).astype(int)
    knots, inverse, counts = np.unique(knot_index, return_inverse=True, return_counts=True)
    medians = np.array([np.exp(np.median(np.log(implied[inverse == i]))) for i in range(len(knots))])
    xs = np.exp2(knots.astype(float))
    ys = monotone_knots(xs, medians, counts.astype(float))
    if len(xs) == 1:
        return Curve(axis=axis, x=(float(xs[0]),), y=(float(ys[0]),))
    return Curve(axis=axis, x=tuple(float(v) for v in xs), y=tuple(float(v) for v in ys))


SHAPE_ROUNDS = 8
"""Alternations of the tokens curve and the outputs and depth factors (:func:`fit_shaped`); the
medians settle within a few."""


def fit_factor(x: np.ndarray, log_residual: np.ndarray, axis: Axis) -> Curve:
    """A shape factor (<= 1, largest knot 1): per octave of ``x``, the median of what the other
    curves leave of each row's log efficiency, shifted so its best octave reads 1, then held to
    the Curve rule like every fitted curve."""
    knot_index = np.rint(np.log2(x)).astype(int)
    knots, inverse, counts = np.unique(knot_index, return_inverse=True, return_counts=True)
    medians = np.array([np.median(log_residual[inverse == i]) for i in range(len(knots))])
    xs = np.exp2(knots.astype(float))
    ys = monotone_knots(xs, np.exp(medians - medians.max()), counts.astype(float))
    if len(xs) == 1:
        return Curve(axis=axis, x=(float(xs[0]),), y=(1.0,))
    return Curve(axis=axis, x=tuple(float(v) for v in xs), y=tuple(float(v) for v in ys))


def fit_shaped(tokens: np.ndarray, outputs: np.ndarray, depth: np.ndarray,
               implied: np.ndarray) -> tuple[Curve, Curve, Curve]:
    """A GEMM class's compute efficiency as a product ``ec(m) * fo(m n) * fd(k)``, fitted by
    alternating medians in log space (each curve on what the other two leave).

    One curve over the rows alone is the median shape's efficiency at each row count, over a grid
    whose n and k run from 32 to 65,536: at 1,024 rows vLLM's FP8 GEMM reaches 0.5 PFLOP/s at
    n = k = 1,024 and 1.45 at n = 16,384, k = 4,096 (H200). Few output elements are few output
    tiles, which leave SMs idle; a short K loop pays each tile's prologue and epilogue over less
    work. The factors' best octave reads 1."""
    log_eff = np.log(np.clip(implied, MIN_EFF, 1.0))
    fo = np.zeros_like(log_eff)
    fd = np.zeros_like(log_eff)
    outputs_curve = Curve.constant(1.0, "outputs")
    depth_curve = Curve.constant(1.0, "depth")
    for _ in range(SHAPE_ROUNDS):
        rows_curve = fit_curve(tokens, np.exp(log_eff - fo - fd), "tokens")
        fr = np.log(np.asarray(rows_curve(tokens), dtype=float))
        previous = (outputs_curve.y, depth_curve.y)
        outputs_curve = fit_factor(outputs, log_eff - fr - fd, "outputs")
        fo = np.log(np.asarray(outputs_curve(outputs), dtype=float))
        depth_curve = fit_factor(depth, log_eff - fr - fo, "depth")
        fd = np.log(np.asarray(depth_curve(depth), dtype=float))
        if (outputs_curve.y, depth_curve.y) == previous:  # a fixed point: later rounds repeat it
            break
    rows_curve = fit_curve(tokens, np.exp(log_eff - fo - fd), "tokens")
    return rows_curve, outputs_curve, depth_curve


def rejoin_prior(curve: Curve, prior: Curve, octaves: int = 12) -> Curve:
    """``curve`` extended past its last knot toward ``prior``, rising at the steepest rate the
    Curve rule allows (one octave multiplies efficiency by at most ``1 + ln 2``).

    A memory curve fitted on small kernels only (the public A100 prefill profile times single
    sequences, all under 4 MB) would otherwise hold its small-kernel efficiency flat for a batch
    of prefills reading hundreds of MB; beyond the measured range the prior (hand-set from
    larger kernels of the same GPU) is the better guess."""
    xs, ys = list(curve.x), list(curve.y)
    for _ in range(octaves):
        x_next = xs[-1] * 2.0
        target = float(prior(x_next))
        if target <= ys[-1]:
            break
        ys.append(min(target, _sig(ys[-1] * (1.0 + math.log(2.0)) * (1 - 1e-9), down=True)))
        xs.append(x_next)
    return Curve(axis=curve.axis, x=tuple(xs), y=tuple(ys))


def prior_below(curve: Curve, prior: Curve) -> Curve:
    """``curve`` preceded by the prior's knots below its first one (capped by its first value).

    A few large-kernel measurements (FlashAttention's throughput figures start at 512 tokens)
    say nothing about short prefills; held flat, the fitted curve would credit a 128-token chunk
    with a 4k-token kernel's efficiency. Below the measured range the prior's shape is the better
    guess. Falls back to ``curve`` if the join would break the Curve rule."""
    below = [(x, min(y, curve.y[0])) for x, y in zip(prior.x, prior.y, strict=True) if x < curve.x[0]]
    if not below:
        return curve
    try:
        return Curve(axis=curve.axis, x=(*(x for x, _ in below), *curve.x),
                     y=(*(y for _, y in below), *curve.y))
    except ValueError:
        return curve


def _fit_given_fixed(w: Work, fixed: float, bandwidth: float, prior: OperatorEfficiency,
                     memory_tail: bool, iterations: int = 12, fit_memory: bool = True,
                     ridge_lock: float | None = RIDGE_LOCK) -> FitResult:
    remaining = np.maximum(w.time_s - w.side - fixed * w.kernels, 0.02 * w.time_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        implied_c = np.minimum(w.flops / (w.peak * remaining), 1.0)
        implied_m = np.minimum(w.bytes / (bandwidth * remaining), 1.0)
    # Rows more than RIDGE_LOCK from the textbook ridge keep its verdict, so that one curve
    # cannot explain the other resource's inefficiency (e.g. a short prefill chunk over a long
    # context charged to a collapsing memory curve); rows near the ridge follow the fitted curves.
    ideal_c, ideal_m = w.flops / w.peak, w.bytes / bandwidth
    lock = math.inf if ridge_lock is None else ridge_lock
    locked_c = ideal_c > lock * ideal_m
    locked_m = ideal_m > lock * ideal_c
    compute_bound = ideal_c >= ideal_m
    compute, memory = prior.compute, prior.memory
    shaped = w.outputs is not None and w.depth is not None
    # a fit by rows alone drops the prior's factors: its rows curve is fitted without them
    outputs, depth = (prior.outputs, prior.depth) if shaped else (None, None)
    for _ in range(iterations):
        use_c = compute_bound & (w.flops > 0)
        use_m = ~compute_bound & (w.bytes > 0)
        if not use_c.any():
            compute = prior.compute
        elif shaped:
            assert w.outputs is not None and w.depth is not None
            compute, outputs, depth = fit_shaped(w.x_compute[use_c], w.outputs[use_c], w.depth[use_c],
                                                 implied_c[use_c])
        else:
            compute = fit_curve(w.x_compute[use_c], implied_c[use_c], "tokens")
        if not fit_memory:
            use_m = np.zeros_like(use_m)
        memory = fit_curve(w.x_memory[use_m], implied_m[use_m], "bytes") if use_m.any() else prior.memory
        if memory_tail and use_m.any():
            memory = rejoin_prior(memory, prior.memory)
        with np.errstate(divide="ignore", invalid="ignore"):
            # fitted curves are valid already: no need to validate them again each iteration
            shape_eff = OperatorEfficiency.model_construct(compute=compute, memory=memory, fixed_s=0.0,
                                                           outputs=outputs, depth=depth)
            tc = np.where(w.flops > 0, w.flops / (w.peak * w.compute_eff(shape_eff)), 0.0)
            x_m = w.x_memory if memory.axis == "bytes" else w.tokens
            tm = np.where(w.bytes > 0, w.bytes / (bandwidth * memory(x_m)), 0.0)
        new = ((tc >= tm) | locked_c) & ~locked_m
        if np.array_equal(new, compute_bound):
            break
        compute_bound = new
    eff = OperatorEfficiency(compute=compute, memory=memory, fixed_s=float(fixed), outputs=outputs,
                             depth=depth)
    n_c = int((compute_bound & (w.flops > 0)).sum())
    n_m = int((~compute_bound & (w.bytes > 0)).sum())
    return FitResult(eff, len(w), n_c, n_m, compute_kept=n_c == 0, memory_kept=n_m == 0)


MIN_ROWS_FULL_FIT = 12
"""Fewer fitted rows than this fit only the compute curve (see :func:`fit_operator`)."""


def log_error(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(np.log(predicted / measured))))


def fit_operator(w: Work, bandwidth: float, prior: OperatorEfficiency,
                 memory_tail: bool = True, ridge_lock: float | None = RIDGE_LOCK) -> FitResult:
    """Curves and fixed cost minimising the mean absolute log error over ``w``; with
    ``memory_tail`` the memory curve rejoins the prior's beyond the measured sizes;
    ``ridge_lock``: see :data:`RIDGE_LOCK` (None: every row may change sides)."""
    if len(w) == 0:
        raise ValueError("no rows to fit")
    if len(w) < MIN_ROWS_FULL_FIT:
        # Too few rows to tell a launch cost and a memory curve from a compute curve (e.g. six
        # FlashAttention throughput figures, all large kernels): fit the compute curve only and
        # keep the prior's fixed cost and memory curve, rather than a fixed cost of 0 and a
        # memory curve at 100% of HBM that no small kernel reaches.
        result = _fit_given_fixed(w, prior.fixed_s, bandwidth, prior, memory_tail, fit_memory=False,
                                  ridge_lock=ridge_lock)
        compute = prior_below(result.efficiency.compute, prior.compute)
        return replace(result, efficiency=result.efficiency.model_copy(update={"compute": compute}),
                       memory_kept=True)
    floor = float(np.min(np.maximum(w.time_s - w.side, 0.02 * w.time_s))) / w.kernels
    candidates = [0.0, *(floor * f for f in np.linspace(0.05, 0.95, 19))]
    best: tuple[float, FitResult] | None = None
    for fixed in candidates:
        result = _fit_given_fixed(w, fixed, bandwidth, prior, memory_tail, ridge_lock=ridge_lock)
        score = log_error(fast_predict(w, result.efficiency, bandwidth), w.time_s)
        if best is None or score < best[0]:
            best = (score, result)
    assert best is not None
    result = best[1]
    rounded = result.efficiency.model_copy(update={"fixed_s": float(f"{result.efficiency.fixed_s:.3g}")})
    return replace(result, efficiency=rounded)


def fit_link(message_bytes: np.ndarray, world: np.ndarray, time_s: np.ndarray, link: Link) -> Link:
    """Latency and achieved fraction of the ring all-reduce model minimising the mean absolute
    log error, by grid search (latency 0.5-200 us, efficiency 0.02-1, both log-spaced)."""
    wire = (2.0 * (world - 1) / world * message_bytes)[:, None, None]
    latencies = np.concatenate([[0.0], np.geomspace(0.5e-6, 200e-6, 60)])[None, :, None]
    efficiencies = np.geomspace(0.02, 1.0, 80)[None, None, :]
    predicted = latencies + wire / (link.bandwidth_Bps * efficiencies)
    score = np.mean(np.abs(np.log(predicted / time_s[:, None, None])), axis=0)
    i, j = np.unravel_index(np.argmin(score), score.shape)
    return link.model_copy(update={"latency_s": float(f"{latencies[0, i, 0]:.3g}"),
                                   "efficiency": float(f"{efficiencies[0, 0, j]:.3g}")})
