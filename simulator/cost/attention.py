"""The cost of the attention kernels: the one place to read or change it.

Attention is split the way serving engines run it: one kernel for the prefill chunks of the step
(FlashAttention over variable-length sequences) and one for the decoding requests (paged
attention: one query per sequence over its cached KV). Both are costed per layer on one GPU of
the tensor-parallel group, which holds ``heads`` query heads, and both run in 16-bit math: the KV
cache may be stored narrower (fp8, int8, int4) and is dequantised as it is read. Q and O are
16-bit activations.

Prefill chunk of ``q`` new tokens over ``c`` earlier ones (causal):
  attended (query, key) pairs ``P = q*c + q(q+1)/2`` (each new token sees the context and the new
  tokens up to itself; with a sliding window ``W`` each sees at most ``W``);
  FLOPs ``= P * flops_per_pair`` where ``flops_per_pair = 2 * heads * (d_qk + d_v)``
  (score product plus weighted sum of values);
  bytes ``=`` read Q and write O for the ``q`` tokens, read the K and V of every key any of them
  sees once (``min(c + q, W - 1 + q)`` tokens: FlashAttention's IO, so the earlier chunks' KV is
  re-read by every later chunk, which is what makes chunked prefill cost more than one pass), and
  write the new tokens' KV into the cache.
  The compute efficiency is read at the chunk's equivalent causal length ``sqrt(2P)``, so a short
  chunk over a long context counts as the larger kernel it is.

Decode of a request with ``c`` cached tokens: its one query sees ``min(c + 1, W)`` keys, which the
kernel processes in tiles of ``key_tile`` keys (the profile's, fitted: a sequence of 10 tokens
costs a whole tile); FLOPs per key as above; bytes = that many tokens of cached KV (the dominant
term), plus Q, O and the new
KV write. The memory efficiency is read at the kernel's total bytes per layer.

Speculative verification of ``k`` proposals is a decode with ``q = 1 + k`` queries over the same
cache (FlashMLA's ``s_q > 1``, FlashInfer's and FlashAttention's multi-query decode): the KV of
its ``min(c + q, W - 1 + q)`` keys is read once for all ``q`` queries, the attended pairs are
``q*c + q(q+1)/2`` (causal among the new tokens, as a prefill chunk), and Q, O and the KV writes
grow ``q``-fold. The compute curve is read at the kernel's query rows (decodes, or their queries).
So verifying a few proposals over a long context costs little more than decoding one token: the
cache read dominates and does not grow.

MLA (DeepSeek) caches one latent of ``kv_lora_rank + rope_dim`` per token shared by all heads.
Decode runs in the absorbed form: each head's query is ``kv_lora_rank + rope_dim`` wide and scores
against the latent directly, its output is ``kv_lora_rank`` wide
(``flops_per_key = 2 * heads * (2 * kv_lora_rank + rope_dim)``), and only the latent is read.
Prefill runs in the expanded form (``d_qk = nope + rope``, ``d_v = v_head_dim``) over K and V
up-projected from the latents, so it reads ``heads * (d_qk + d_v)`` elements per key; the
up-projection itself is a GEMM priced with the projections.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import cast

import numpy as np

from servesim.cost.batch import BatchShape
from servesim.cost.roofline import OpCost, memory_efficiency
from servesim.hardware import HardwareProfile

ATTENTION_IO_BYTES = 2.0
"""Q and O are 16-bit activations whatever the GEMM precision."""


@dataclass(frozen=True)
class AttentionShape:
    """Per-GPU attention dimensions of one layer.

    ``cache_elements_per_token`` is what the KV cache stores (and decode reads) per token;
    ``prefill_kv_elements_per_token`` is what the prefill kernel reads per key (the same, except
    for MLA's expanded K/V). ``decode_q_width`` and ``decode_o_width`` are the per-request query
    and output widths of the decode kernel, all heads together.
    """

    heads: int
    q_head_dim: int
    v_head_dim: int
    cache_elements_per_token: int
    prefill_kv_elements_per_token: int
    prefill_flops_per_pair: int
    decode_flops_per_key: int
    decode_q_width: int
    decode_o_width: int
    window: int | None
    chunk: int | None = None
    """Chunked local attention (Llama 4): a token sees only the tokens of its own block of
    ``chunk`` positions."""
    mla: bool = False
    """MLA's expanded prefill (DeepSeek-style): its own kernel, whose time the profile may scale
    (``Efficiency.mla_prefill_time_scale``)."""


def chunk_prefix_pairs(tokens: np.ndarray, chunk: int) -> np.ndarray:
    """Attended pairs of the first ``tokens`` positions under chunked attention: position ``p``
    (0-based) sees ``p mod chunk + 1`` keys, so full blocks give ``chunk(chunk+1)/2`` each and the
    last partial block of ``r`` positions ``r(r+1)/2``."""
    full, rest = np.divmod(tokens, chunk)
    return full * (chunk * (chunk + 1) / 2) + rest * (rest + 1) / 2


def attended_pairs(new: np.ndarray, context: np.ndarray, shape: AttentionShape) -> np.ndarray:
    """Attended (query, key) pairs of prefill chunks under ``shape``'s attention kind."""
    if shape.chunk is None:
        return causal_pairs(new, context, shape.window)
    new = new.astype(np.float64)
    context = context.astype(np.float64)
    return chunk_prefix_pairs(context + new, shape.chunk) - chunk_prefix_pairs(context, shape.chunk)


def keys_read(new: np.ndarray, context: np.ndarray, shape: AttentionShape) -> np.ndarray:
    """Distinct keys a prefill chunk reads under ``shape``'s attention kind (chunked: from the
    start of the block holding the chunk's first token)."""
    if shape.chunk is None:
        return prefill_keys_read(new, context, shape.window)
    return context + new - (context // shape.chunk) * shape.chunk


def causal_pairs(new: np.ndarray, context: np.ndarray, window: int | None) -> np.ndarray:
    """Attended (query, key) pairs of chunks of ``new`` tokens over ``context`` earlier ones.

    New token ``j`` (1-based) sees ``context + j`` keys, or ``window`` if fewer. With
    ``k = clip(window - context, 0, new)`` tokens below the window the sum is
    ``k*context + k(k+1)/2 + (new - k)*window``.
    """
    new = new.astype(np.float64)
    context = context.astype(np.float64)
    if window is None:
        return new * context + new * (new + 1) / 2
    below = np.clip(window - context, 0, new)
    return below * context + below * (below + 1) / 2 + (new - below) * window


def prefill_keys_read(new: np.ndarray, context: np.ndarray, window: int | None) -> np.ndarray:
    """Distinct keys a chunk's queries see: all ``context + new``, or with a window the last
    ``window - 1`` context tokens before the chunk plus the chunk itself."""
    if window is None:
        return context + new
    return np.minimum(context + new, window - 1 + new)


def prefill_attention(batch: BatchShape, shape: AttentionShape, hardware: HardwareProfile,
                      peak_flops: float, kv_bytes: float, layers: int) -> OpCost:
    if batch.num_prefills == 0:
        return OpCost("attn_prefill", 0.0, 0.0, 0.0, 0.0, 0.0)
    if batch.num_prefills == 1 and shape.chunk is None:
        return one_chunk_attention(int(batch.prefill_tokens[0]), int(batch.prefill_context[0]), shape,
                                   hardware, peak_flops, kv_bytes, layers)
    return chunks_attention(batch.prefill_tokens, batch.prefill_context, shape, hardware, peak_flops,
                            kv_bytes, layers)


def chunks_attention(new: np.ndarray, context: np.ndarray, shape: AttentionShape,
                     hardware: HardwareProfile, peak_flops: float, kv_bytes: float,
                     layers: int) -> OpCost:
    """The prefill kernel over chunks of ``new`` tokens (int64, each >= 1) over ``context``
    earlier ones, in NumPy (the general path of :func:`prefill_attention`)."""
    eff = hardware.efficiency.attention_prefill
    pairs = attended_pairs(new, context, shape)
    flops = pairs * shape.prefill_flops_per_pair
    total_new = float(new.sum())
    keys = float(keys_read(new, context, shape).sum())
    efficiency = eff.compute(np.sqrt(2.0 * pairs))
    # One varlen kernel runs every chunk: its grid is the query rows of all of them times the
    # heads, and a short chunk over a long context splits its keys across more blocks (split-KV)
    # until the GPU is full, so the grid is read at the keys each chunk sees (its query rows when
    # it has no context, as in the fitted timings); each score is a dot product over the
    # query-key head dimension.
    factor = eff.shape_factor(keys * shape.heads, shape.q_head_dim)
    if factor != 1.0:
        efficiency = efficiency * factor
    scale = hardware.efficiency.mla_prefill_time_scale if shape.mla else None
    if scale is not None:
        efficiency = efficiency / scale
    compute_s = float(np.sum(flops / (peak_flops * efficiency)))
    nbytes = (total_new * shape.heads * (shape.q_head_dim + shape.v_head_dim) * ATTENTION_IO_BYTES
              + keys * shape.prefill_kv_elements_per_token * kv_bytes
              + total_new * shape.cache_elements_per_token * kv_bytes)
    memory_s = nbytes / (hardware.memory.bandwidth_Bps * memory_efficiency(eff, nbytes, total_new))
    return OpCost("attn_prefill", float(flops.sum()) * layers, nbytes * layers, compute_s * layers,
                  memory_s * layers, eff.fixed_s * layers)


def one_chunk_attention(new: int, context: int, shape: AttentionShape, hardware: HardwareProfile,
                        peak_flops: float, kv_bytes: float, layers: int) -> OpCost:
    """:func:`prefill_attention` of one chunk of ``new`` tokens over ``context`` (full or sliding
    attention), in Python floats: a mixed step mostly holds one chunk, and NumPy's calls on
    one-element arrays cost more than the arithmetic. The same IEEE operations on the same values
    in the same order (``sqrt`` is correctly rounded on both sides; a one-element sum is its
    element), except the compute curve, which is read through NumPy's ``log`` and ``interp`` on a
    one-element array exactly as the array path reads it (``math.log`` may differ in the last
    bit)."""
    eff = hardware.efficiency.attention_prefill
    q, c = float(new), float(context)
    window = shape.window
    if window is None:
        pairs = q * c + q * (q + 1) / 2
        keys = float(context + new)
    else:  # causal_pairs' clip and prefill_keys_read's minimum
        below = min(max(window - c, 0.0), q)
        pairs = below * c + below * (below + 1) / 2 + (q - below) * window
        keys = float(min(context + new, window - 1 + new))
    flops = pairs * shape.prefill_flops_per_pair
    efficiency = float(cast(np.ndarray, eff.compute(np.array([math.sqrt(2.0 * pairs)])))[0])
    factor = eff.shape_factor(keys * shape.heads, shape.q_head_dim)
    if factor != 1.0:
        efficiency = efficiency * factor
    scale = hardware.efficiency.mla_prefill_time_scale if shape.mla else None
    if scale is not None:
        efficiency = efficiency / scale
    compute_s = flops / (peak_flops * efficiency)
    nbytes = (q * shape.heads * (shape.q_head_dim + shape.v_head_dim) * ATTENTION_IO_BYTES
              + keys * shape.prefill_kv_elements_per_token * kv_bytes
              + q * shape.cache_elements_per_token * kv_bytes)
    memory_s = nbytes / (hardware.memory.bandwidth_Bps * memory_efficiency(eff, nbytes, q))
    return OpCost("attn_prefill", flops * layers, nbytes * layers, compute_s * layers,
                  memory_s * layers, eff.fixed_s * layers)


def decode_attention(batch: BatchShape, shape: AttentionShape, hardware: HardwareProfile,
                     peak_flops: float, kv_bytes: float, layers: int) -> OpCost:
    if batch.num_decodes == 0:
        return OpCost("attn_decode", 0.0, 0.0, 0.0, 0.0, 0.0)
    keys = decode_keys(batch, shape, hardware.efficiency.decode_for(kv_bytes).key_tile)
    if keys is None:
        return _verify_attention(batch, shape, hardware, peak_flops, kv_bytes, layers)
    return decode_attention_of(float(batch.num_decodes), keys, shape, hardware, peak_flops, kv_bytes, layers)


def decode_keys(batch: BatchShape, shape: AttentionShape, tile: int) -> float | None:
    """The keys :func:`decode_attention` reads for the decodes of ``batch`` (at least one), KV
    tiles of ``tile`` keys counted whole; None when they verify speculative proposals (priced by
    pairs, not keys alone). With the decode count, all the kernel's price depends on
    (``CostModel`` memoises it by the two)."""
    if batch.decode_tokens is not None:
        return None
    n = float(batch.num_decodes)
    if shape.chunk is not None and tile == 1:
        keys = float((batch.decode_context % shape.chunk).sum()) + n
    elif shape.window is None and shape.chunk is None and tile == 1:
        keys = batch.decode_context_sum + n
    elif shape.window is None and shape.chunk is None:
        # each request reads ceil((c + 1) / tile) = c // tile + 1 whole tiles (c >= 0): the
        # general branch's integer sum, in two NumPy calls
        keys = float(tile * (int((batch.decode_context // tile).sum()) + batch.num_decodes))
    else:
        context = batch.decode_context if shape.chunk is None else batch.decode_context % shape.chunk
        seen = context + 1
        if shape.window is not None:
            seen = np.minimum(seen, shape.window)
        if tile > 1:
            seen = -(-seen // tile) * tile
        keys = float(seen.sum())
    return keys


def decode_attention_of(n: float, keys: float, shape: AttentionShape, hardware: HardwareProfile,
                        peak_flops: float, kv_bytes: float, layers: int,
                        pairs: float | None = None) -> OpCost:
    """The decode kernel of ``n`` query rows whose requests read ``keys`` keys in all: the one
    formula :func:`decode_attention`, speculative verification (``pairs``: the query-key pairs
    scored, when a request's several queries share one read) and a fast-forwarded run of decode
    steps (:class:`~servesim.cost.decode_run.DecodeRunPricer`, element by element) all price with;
    an 8-bit cache reads its own class where the profile has one (:meth:`Efficiency.decode_for`)."""
    eff = hardware.efficiency.decode_for(kv_bytes)
    flops = (keys if pairs is None else pairs) * shape.decode_flops_per_key
    nbytes = ((keys + n) * shape.cache_elements_per_token * kv_bytes
              + n * (shape.decode_q_width + shape.decode_o_width) * ATTENTION_IO_BYTES)
    compute_s = flops / (peak_flops * eff.compute.at(n))
    memory_s = nbytes / (hardware.memory.bandwidth_Bps * memory_efficiency(eff, nbytes, n))
    return OpCost("attn_decode", flops * layers, nbytes * layers, compute_s * layers,
                  memory_s * layers, eff.fixed_s * layers)


RUN_BLOCK_ELEMENTS = 1 << 20
"""Requests x steps per block when a run's key counts need every context (windows, chunks)."""
SMALL_GRID = 4096
"""Up to this many (request, step) pairs, whole KV tiles are counted pair by pair (fewer NumPy
calls than the per-residue count)."""


def decode_run_keys(context: np.ndarray, first_step: int, steps: int, shape: AttentionShape,
                    tile: int) -> np.ndarray:
    """The ``keys`` :func:`decode_attention` reads in each decode step ``j`` (from ``first_step``,
    ``steps`` of them) of a run in which the same requests decode over ``context + j`` cached
    tokens: the same integers, summed exactly, so each is the very float the step's own call gets.
    Full attention counts in O(requests + steps) (whole KV tiles: a request's tile count grows by
    one in the steps where its context passes a multiple of ``tile``); windows and chunks count
    every (request, step) pair, a block of steps at a time."""
    n = int(context.size)
    if shape.window is None and shape.chunk is None:
        if n * steps <= SMALL_GRID and tile > 1:  # a few NumPy calls over every (request, step) pair
            # ceil((c + j + 1) / tile) as a floor, summed, then times tile: integers, so exact
            rounded_up = (context + (first_step + tile))[:, None] + np.arange(steps, dtype=np.int64)
            return ((rounded_up // tile).sum(axis=0) * tile).astype(np.float64)
        js = np.arange(first_step, first_step + steps, dtype=np.int64)
        if tile == 1:
            return (int(context.sum()) + n * js).astype(np.float64) + float(n)
        first = context + first_step + 1
        keys0 = int((-(-first // tile) * tile).sum())
        # seen_i(j) = tile * ceil((c_i + j + 1) / tile) grows by tile from step j - 1 to j exactly
        # when (c_i + j) is a multiple of tile.
        residues = np.bincount(context % tile, minlength=tile)
        grows = tile * residues[(-js[1:]) % tile]
        return np.concatenate(([keys0], keys0 + np.cumsum(grows))).astype(np.float64)
    js = np.arange(first_step, first_step + steps, dtype=np.int64)
    keys = np.empty(steps, dtype=np.float64)
    block = max(1, RUN_BLOCK_ELEMENTS // max(n, 1))
    for start in range(0, steps, block):
        part = js[start:start + block]
        grid = context[:, None] + part[None, :]
        if shape.chunk is not None:
            grid = grid % shape.chunk
            if tile == 1:
                keys[start:start + part.size] = grid.sum(axis=0).astype(np.float64) + float(n)
                continue
        seen = grid + 1
        if shape.window is not None:
            seen = np.minimum(seen, shape.window)
        if tile > 1:
            seen = -(-seen // tile) * tile
        keys[start:start + part.size] = seen.sum(axis=0).astype(np.float64)
    return keys


TILE_KEYS_REQUESTS = 64
"""Up to this many requests, :func:`tile_run_keys` counts in Python ints (fewer calls than NumPy's)."""


def tile_run_keys(context: list[int], first_step: int, steps: int, tile: int) -> list[int]:
    """:func:`decode_run_keys` of full attention read in whole KV tiles (``tile > 1``) over a run
    of at most ``tile`` steps, as Python ints (the same integers: ``float`` of each is the key
    count the step's own call gets). Request ``i`` reads ``ceil((c_i + j + 1) / tile)`` tiles in
    step ``j``: ``q_i`` (the quotient of ``c_i + first_step + tile``, remainder ``r_i``) until
    ``r_i + j`` reaches ``tile``, one more from step ``tile - r_i`` on; within ``tile`` steps it
    passes at most one. So step 0 reads ``tile * sum(q_i)`` keys and each later step adds
    ``tile`` per request whose crossing falls there: one modulo per request, a running sum."""
    base = first_step + tile
    residues = [(c + base) % tile for c in context]
    keys = [0] * steps  # step 0's keys, then each step's increase
    keys[0] = (sum(context) + len(context) * base - sum(residues)) // tile * tile  # sum(q_i), exact
    crossing_before = tile - steps  # r_i above it crosses at step tile - r_i < steps
    for residue in residues:
        if residue > crossing_before:
            keys[tile - residue] += tile
    return list(accumulate(keys))


def _verify_attention(batch: BatchShape, shape: AttentionShape, hardware: HardwareProfile,
                      peak_flops: float, kv_bytes: float, layers: int) -> OpCost:
    """The decode kernel when decodes carry several queries (speculative verification): each
    request's cached KV is read once for its ``q`` queries (see the module docstring). With every
    ``q == 1`` this is the plain decode formula."""
    assert batch.decode_tokens is not None
    eff = hardware.efficiency.decode_for(kv_bytes)
    queries = batch.decode_tokens
    rows = float(batch.num_decode_tokens)
    context = batch.decode_context
    pairs_each = causal_pairs(queries, context, shape.window)
    read = prefill_keys_read(queries, context, shape.window)
    tile = eff.key_tile
    if tile > 1:  # the kernel reads whole KV tiles; every query scores the padding too
        tiled = -(-read // tile) * tile
        pairs_each = pairs_each + (tiled - read) * queries
        read = tiled
    return decode_attention_of(rows, float(read.sum()), shape, hardware, peak_flops, kv_bytes, layers,
                               pairs=float(pairs_each.sum()))
