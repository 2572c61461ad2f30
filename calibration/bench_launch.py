"""What a decode step's kernel launches and CUDA graphs cost on this GPU, measured.

The engines' runtime model (:mod:`servesim.cost.engine_runtime`) charges a step that runs eagerly
``launch_s`` of host time per kernel (the GPU waits when the launches take longer than the
kernels) and a step replayed from a CUDA graph one launch. Both were estimates; this benchmark
measures them on a Llama-shaped decoder laid out as an engine with CUDA graphs lays out a decode
step: static input buffers, a static KV cache every sequence of the batch attends over in full
(``context`` tokens), each projection one GEMM, fused RMSNorm. Per batch size:

- ``eager_s``: wall time per forward, ``reps`` forwards back to back with one synchronisation at
  the end (the steady state of a loop that launches eagerly: the host runs ahead when it can);
- ``graph_s``: the same forward captured once in a CUDA graph and replayed back to back;
- ``kernels`` and ``kernel_s``: the GPU kernels of one forward and the sum of their durations
  (``torch.profiler``).

From those, :func:`launch_figures` derives the host time per kernel launch (``eager_s / kernels``
in the steps whose launches outlast their kernels by half again) and what a graph adds per kernel
(``(graph_s - kernel_s) / kernels``: the gaps between a graph's kernels). A micro-benchmark beside
them times ``LAUNCH_MICRO_KERNELS`` one-element adds eagerly and captured, the floor of both.

On the CPU there is no graph and no device kernel to count: the table holds the eager times alone
(the CI smoke test of the code path). ``servesim calibrate launch --device cuda`` runs it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pandas as pd

from servesim.calibration.shapes import e2e_model
from servesim.calibration.timing import import_torch
from servesim.cost import BatchShape, CostModel
from servesim.engines import RuntimeCosts
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.model_config import load_model
from servesim.model_spec import ModelSpec

GPU_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CPU_BATCHES = (1, 4)
LAUNCH_MICRO_KERNELS = 2000
LAUNCH_BOUND = 1.5
"""A step counts as launch-bound when its eager wall time is at least this multiple of its
kernels' time: the GPU then idles between kernels and the wall time is the host's."""


class StaticDecoder:
    """A Llama-style decode step over static buffers (capturable in a CUDA graph)."""

    def __init__(self, spec: ModelSpec, batch: int, context: int, device: str, seed: int = 0) -> None:
        torch = import_torch()
        self.torch, self.spec = torch, spec
        g = torch.Generator(device=device).manual_seed(seed)
        h, d, heads, kv = spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads
        bf16 = torch.bfloat16

        def weight(*shape: int) -> Any:
            return (torch.randn(*shape, generator=g, device=device) * shape[0] ** -0.5).to(bf16)

        self.embed = weight(spec.vocab_size, h)
        self.layers = [{"ln1": torch.ones(h, dtype=bf16, device=device),
                        "wqkv": weight(h, (heads + 2 * kv) * d), "wo": weight(heads * d, h),
                        "ln2": torch.ones(h, dtype=bf16, device=device),
                        "wgu": weight(h, 2 * spec.intermediate_size),
                        "wdown": weight(spec.intermediate_size, h)} for _ in range(spec.num_layers)]
        self.norm = torch.ones(h, dtype=bf16, device=device)
        self.lm_head = weight(h, spec.vocab_size)
        self.k_cache = [torch.zeros(batch, kv, context, d, dtype=bf16, device=device)
                        for _ in range(spec.num_layers)]
        self.v_cache = [torch.zeros_like(k) for k in self.k_cache]
        self.ids = torch.zeros(batch, dtype=torch.long, device=device)
        angle = (context - 1) / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        self.cos, self.sin = angle.cos().to(bf16), angle.sin().to(bf16)
        self.position = context - 1
        self.batch = batch

    def resize(self, batch: int) -> None:
        """Serve ``batch`` sequences from the first rows of the buffers."""
        self.batch = batch

    def forward(self) -> Any:
        torch, spec = self.torch, self.spec
        F = torch.nn.functional
        b, heads, kv, d = self.batch, spec.num_heads, spec.num_kv_heads, spec.head_dim
        x = self.embed[self.ids[:b]]
        for i, w in enumerate(self.layers):
            hidden = F.rms_norm(x, (spec.hidden_size,), w["ln1"])
            qkv = hidden @ w["wqkv"]
            q = qkv[:, : heads * d].view(b, heads, d)
            k = qkv[:, heads * d : (heads + kv) * d].view(b, kv, d)
            q1, q2 = q[..., ::2], q[..., 1::2]
            q = torch.cat([q1 * self.cos - q2 * self.sin, q1 * self.sin + q2 * self.cos], dim=-1)
            k1, k2 = k[..., ::2], k[..., 1::2]
            k = torch.cat([k1 * self.cos - k2 * self.sin, k1 * self.sin + k2 * self.cos], dim=-1)
            keys, values = self.k_cache[i][:b], self.v_cache[i][:b]
            keys[:, :, self.position] = k
            values[:, :, self.position] = qkv[:, (heads + kv) * d :].view(b, kv, d)
            o = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, enable_gqa=True)
            x = x + o.reshape(b, heads * d) @ w["wo"]
            hidden = F.rms_norm(x, (spec.hidden_size,), w["ln2"])
            gate, up = (hidden @ w["wgu"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w["wdown"]
        return (F.rms_norm(x, (spec.hidden_size,), self.norm) @ self.lm_head).argmax(dim=-1)


def _wall_per_call(torch: Any, fn: Any, reps: int, device: str) -> float:
    """Seconds per call of ``fn`` called ``reps`` times back to back, synchronised once."""
    for _ in range(max(2, reps // 5)):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def _graph(torch: Any, fn: Any) -> Any:
    """``fn`` captured in a CUDA graph (after a warm-up on a side stream, as capture requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _device_kernels(torch: Any, fn: Any) -> tuple[int, float]:
    """(GPU kernels, their summed seconds) of one call of ``fn`` (``torch.profiler``)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return len(kernels), sum(e.time_range.end - e.time_range.start for e in kernels) * 1e-6


def _micro(torch: Any, device: str, reps: int) -> dict[str, float]:
    """Seconds per one-element add, launched eagerly and replayed from a graph."""
    x = torch.zeros(1, device=device)

    def adds() -> None:
        for _ in range(LAUNCH_MICRO_KERNELS):
            x.add_(1.0)

    eager = _wall_per_call(torch, adds, max(3, reps // 5), device) / LAUNCH_MICRO_KERNELS
    graph = math.nan
    if device == "cuda":
        captured = _graph(torch, adds)
        graph = _wall_per_call(torch, captured.replay, max(3, reps // 5), device) / LAUNCH_MICRO_KERNELS
    return {"micro_eager_s": eager, "micro_graph_s": graph}


def run_launch(profile: HardwareProfile, device: str = "cuda", model_name: str | None = None,
               batches: tuple[int, ...] | None = None, context: int = 1024, reps: int = 50,
               threads: int = 1) -> pd.DataFrame:
    """One row per batch size: eager and graph wall times, kernels, and the cost model's price of
    the same decode step's kernels (``predicted_kernel_s``: ``RuntimeCosts.none``), and the
    micro-benchmark's two figures (``micro_eager_s``, ``micro_graph_s``; the same in every row)."""
    torch = import_torch()
    torch.set_num_threads(threads)
    if device not in ("cpu", "cuda"):
        raise ServesimError("--device", f"unknown device {device!r}", "use cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ServesimError("--device", "cuda requested but torch sees no GPU",
                            "use --device cpu, or a CUDA build of torch on a GPU machine")
    if context < 2:
        raise ServesimError("--context", f"must be at least 2 tokens, got {context}", "e.g. --context 1024")
    name = model_name or ("llama-3-8b" if device == "cuda" else None)
    spec = load_model(name) if name else e2e_model()
    batches = batches or (GPU_BATCHES if device == "cuda" else CPU_BATCHES)
    model = StaticDecoder(spec, max(batches), context, device)
    cost = CostModel(spec, profile, tp=1, runtime=RuntimeCosts.none())
    rows = []
    with torch.inference_mode():
        micro = _micro(torch, device, reps)
        for batch in batches:
            model.resize(batch)
            row: dict[str, Any] = {"batch": batch, "context": context,
                                   "eager_s": _wall_per_call(torch, model.forward, reps, device)}
            if device == "cuda":
                graph = _graph(torch, model.forward)
                row["graph_s"] = _wall_per_call(torch, graph.replay, reps, device)
                row["kernels"], row["kernel_s"] = _device_kernels(torch, model.forward)
                del graph
            else:
                row["graph_s"], row["kernels"], row["kernel_s"] = math.nan, math.nan, math.nan
            row["predicted_kernel_s"] = predicted_kernel_s(cost, batch, context)
            rows.append(row)
    table = pd.DataFrame(rows).assign(**micro)
    table.attrs["model"] = spec.name
    return table


def predicted_kernel_s(cost: CostModel, batch: int, context: int) -> float:
    """The cost model's kernels of the benchmark's step: ``batch`` decodes, each computing its
    token ``context`` (``context - 1`` already cached) and sampling the next."""
    computed = np.full(batch, context - 1, dtype=np.int64)
    return cost.step(BatchShape.from_requests(np.ones(batch, dtype=np.int64), computed, computed + 1)).time_s


def launch_figures(table: pd.DataFrame) -> dict[str, float]:
    """The host time per kernel launch and a graph's time per kernel beyond its kernels.

    ``launch_s``: median of ``eager_s / kernels`` over the launch-bound rows (``eager_s >=
    LAUNCH_BOUND * kernel_s``), NaN when none is; ``graph_gap_s``: median of ``(graph_s -
    kernel_s) / kernels`` over all rows; ``launch_bound_rows``: how many rows the first uses."""
    bound = table[table["eager_s"] >= LAUNCH_BOUND * table["kernel_s"]]
    launch = float((bound["eager_s"] / bound["kernels"]).median()) if len(bound) else math.nan
    gap = ((table["graph_s"] - table["kernel_s"]) / table["kernels"]).dropna()
    return {"launch_s": launch, "graph_gap_s": float(gap.median()) if len(gap) else math.nan,
            "launch_bound_rows": float(len(bound))}
