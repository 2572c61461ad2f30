"""The Python-int twins of a fast-forwarded run's NumPy counts give the very same integers:
``tile_run_keys`` (the KV-tile key counts the run pricer looks up its memo by) against
``decode_run_keys``, and a short run's KV blocks in use, bisected from a sorted list in
``plan_decode_run``, against ``grown_in``."""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import pytest

from servesim.core.fast_forward import grown_in
from servesim.cost.attention import AttentionShape, decode_run_keys, tile_run_keys

FULL = AttentionShape(decode_flops_per_key=1, prefill_flops_per_pair=1, cache_elements_per_token=1,
                      prefill_kv_elements_per_token=1, heads=1, q_head_dim=1, v_head_dim=1,
                      decode_q_width=1, decode_o_width=1, window=None)


@pytest.mark.parametrize("tile", [2, 16, 64, 256])
def test_tile_run_keys_are_decode_run_keys(tile: int) -> None:
    """Every step's key count, for random batches (contexts on and next to tile boundaries,
    runs of 1 to ``tile`` steps, from step 0 or later), as the NumPy count gives it."""
    rng = np.random.default_rng(tile)
    for _ in range(400):
        n = int(rng.integers(1, 65))
        context = rng.integers(0, 5 * tile, n) * int(rng.choice([1, tile]))  # some on boundaries
        context = np.maximum(context + rng.integers(-1, 2, n), 0)
        steps = int(rng.integers(1, tile + 1))
        first_step = int(rng.choice([0, 0, int(rng.integers(1, 3 * tile))]))
        counted = tile_run_keys(context.tolist(), first_step, steps, tile)
        expected = decode_run_keys(context, first_step, steps, FULL, tile)
        assert all(type(key) is int for key in counted)
        np.testing.assert_array_equal(np.array(counted, dtype=np.float64), expected)


@pytest.mark.parametrize("block_size", [1, 2, 16, 32])
def test_bisected_blocks_are_grown_in(block_size: int) -> None:
    """``plan_decode_run``'s list path (a run of at most ``block_size`` steps, offsets bisected)
    counts the blocks grown by each step as ``grown_in`` does."""
    rng = np.random.default_rng(block_size)
    for _ in range(300):
        n = int(rng.integers(1, 65))
        offsets = sorted(rng.integers(1, block_size + 1, n).tolist())
        steps = int(rng.integers(1, block_size + 1))
        bisected = [bisect_right(offsets, j) for j in range(steps)]
        expected = grown_in(np.array(offsets, dtype=np.int64), block_size, steps)
        np.testing.assert_array_equal(bisected, expected)
