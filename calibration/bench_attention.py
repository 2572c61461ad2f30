"""Attention microbenchmarks with torch ``scaled_dot_product_attention``.

Prefill: ``batch`` sequences of ``seq`` tokens, causal, no earlier context (torch's causal mask
aligns to the top-left corner when queries and keys differ in length, so chunked prefill over a
cache would need an explicit mask; the public A100 profile covers that case). Decode: one query
per sequence over a **contiguous** KV cache of ``context`` tokens plus its own (not paged: torch
has no paged kernel; vLLM's paged kernels read the same bytes in 16-token blocks), rotating over
copies of the cache so that small caches are not timed from the CPU's or GPU's last-level cache. GQA runs
natively (``enable_gqa``), with ``heads / kv_heads`` query heads per KV head.
"""

from __future__ import annotations

import pandas as pd

from servesim.calibration.shapes import (
    DECODE_BATCH,
    DECODE_CONTEXT,
    FLOP_CAP,
    PREFILL_BATCH,
    PREFILL_SEQ,
    attention_layouts,
)
from servesim.calibration.timing import Rotating, Timing, copies_for, import_torch, median_seconds


def bench_prefill(device: str, quick: bool, timing: Timing | None = None) -> pd.DataFrame:
    torch = import_torch()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    timing = timing or Timing.for_run(device, quick)
    cap = FLOP_CAP[(device, quick)]
    rows = []
    for layout in attention_layouts(quick):
        for batch in PREFILL_BATCH:
            for seq in PREFILL_SEQ[quick]:
                flops = batch * seq * (seq + 1) / 2 * 4 * layout.heads * layout.head_dim
                if flops > cap:
                    continue
                q = torch.randn(batch, layout.heads, seq, layout.head_dim, dtype=torch.bfloat16,
                                device=device)
                k = torch.randn(batch, layout.kv_heads, seq, layout.head_dim, dtype=torch.bfloat16,
                                device=device)
                v = torch.randn_like(k)
                fn = lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
                rows.append({"batch": batch, "seq": seq, "context": 0, "heads": layout.heads,
                             "kv_heads": layout.kv_heads, "head_dim": layout.head_dim,
                             "layout": layout.label, "time_s": median_seconds(fn, device, timing)})
    table = pd.DataFrame(rows)
    table["source"] = f"servesim bench ({device}, torch SDPA causal)"
    return table


def bench_decode(device: str, quick: bool, timing: Timing | None = None) -> pd.DataFrame:
    torch = import_torch()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    timing = timing or Timing.for_run(device, quick)
    rows = []
    for layout in attention_layouts(quick):
        for batch in DECODE_BATCH[quick]:
            for context in DECODE_CONTEXT[quick]:
                if device == "cpu" and batch * context * layout.kv_heads * layout.head_dim > 2**24:
                    continue
                q = torch.randn(batch, layout.heads, 1, layout.head_dim, dtype=torch.bfloat16,
                                device=device)
                k = torch.randn(batch, layout.kv_heads, context + 1, layout.head_dim,
                                dtype=torch.bfloat16, device=device)
                v = torch.randn_like(k)
                # Each repetition reads another copy of the KV cache, as each layer of a step does.
                copies = copies_for(2 * (q.nbytes + k.nbytes + v.nbytes))
                inputs = Rotating([(q, k, v)] + [(q.clone(), k.clone(), v.clone())
                                                 for _ in range(copies - 1)])
                fn = lambda r=inputs: sdpa(*r.next(), enable_gqa=True)  # noqa: E731
                rows.append({"batch": batch, "context": context, "heads": layout.heads,
                             "kv_heads": layout.kv_heads, "head_dim": layout.head_dim,
                             "layout": layout.label, "kv_layout": "contiguous",
                             "time_s": median_seconds(fn, device, timing)})
    table = pd.DataFrame(rows)
    table["source"] = f"servesim bench ({device}, torch SDPA decode, contiguous KV)"
    return table
