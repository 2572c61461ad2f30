"""How fast is one step's cost? Run by hand or with ``make bench`` (never as a timed test).

Prices mixed batches (8 prefill chunks of 512 tokens + 504 decodes with varied contexts, i.e. 512
requests) for a dense, an MoE and an MLA model, on the fast path the engine uses
(``step_time``) and on the full breakdown (``step``), both with the per-(tokens, logits) memo warm
and cold, and ``step_record`` with every memo of the cost model cold (what a step the memos have
never seen costs: the token half, the logits half and the attention kernels priced afresh). Prints
microseconds per call.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np

from servesim import BatchShape, CostModel, load_hardware, load_model

CASES = (("llama-3-8b", "h100-sxm-80gb", 1), ("mixtral-8x7b", "h100-sxm-80gb", 2),
         ("deepseek-v3", "h200-sxm-141gb", 8))


MEMOS = ("_token_cache", "_body_cache", "_head_cache", "_chunk_ops", "_decode_ops", "_prefill_records",
         "_moe_cache", "_gemm_rows_at", "_gemm_depth_at")
"""The cost model's per-step memos (those a version lacks are skipped)."""


def clear_memos(cost: CostModel) -> None:
    for name in MEMOS:
        memo = getattr(cost, name, None)
        if memo is not None:
            memo.clear()


def per_call_us(fn, batches: list[BatchShape], repeat: int, clear=None) -> float:
    start = time.perf_counter()
    for i in range(repeat):
        if clear is not None:
            clear()
        fn(batches[i % len(batches)])
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batches = [BatchShape.build([512] * 8, [0] * 8, rng.integers(50, 8000, 504)) for _ in range(64)]
    print(f"{'model':<14} {'hardware':<16} tp  step_time (warm)  step (warm)  step_time (cold memo)"
          "  step_record (all cold)")
    for model_name, hardware_name, tp in CASES:
        cost = CostModel(load_model(model_name), load_hardware(hardware_name), tp)
        warm_fast = per_call_us(cost.step_time, batches, args.repeat)
        warm_full = per_call_us(cost.step, batches, args.repeat)
        cold = per_call_us(cost.step_time, batches, args.repeat // 10, cost._token_cache.clear)
        all_cold = per_call_us(cost.step_record, batches, args.repeat // 10, partial(clear_memos, cost))
        print(f"{model_name:<14} {hardware_name:<16} {tp:<3} {warm_fast:>10.1f} us"
              f" {warm_full:>10.1f} us {cold:>12.1f} us {all_cold:>18.1f} us")


if __name__ == "__main__":
    main()
