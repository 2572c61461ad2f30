"""End-to-end check: a real transformer, run with torch under continuous batching, against
``servesim step`` on the same batch shapes.

On the CPU the model is :data:`servesim.calibration.shapes.E2E_MODEL_CONFIG` (Llama-style, GQA,
random bf16 weights); on a GPU (``--device cuda``) it is any catalogue model, by default
``llama-3-8b`` at full size (16 GB of random bf16 weights), with :data:`GPU_WORKLOAD`. Both are
laid out the way serving engines run it: every scheduled token of the step is packed into one
``[tokens, hidden]`` activation, so each projection is one GEMM with M = tokens; prefills run
causal SDPA per prompt; decodes run one batched SDPA over their contiguous KV slots (gathered with
``index_select``, padded to the longest and masked: a cost vLLM's paged kernel does not pay, and
the simulator does not model); the LM head runs only for the sequences that sample. The scheduler admits
whole prompts under a token budget while slots are free, and every running request decodes
each step, so steps mix prefills and decodes as in vLLM.

The loop is eager torch, one kernel launch per operator, like an engine with CUDA graphs off:
on a GPU a small decode step's launches (about 20 per layer) can take longer than its kernels,
which the cost model prices without any engine's runtime costs (``RuntimeCosts.none``). The
table says which steps that is: ``measured_s`` against ``predicted_s`` by step size.

The workload runs once to warm allocator and caches, then ``passes`` more times, timed; the
schedule depends only on the (seeded) lengths, so every pass runs the same steps, and a step's
measured time is the median over the passes (one pass on a shared 2-core CI machine ranked steps
with Spearman 0.70; the median of three removes most of that scheduler noise). Each
step's measured time is compared with ``CostModel.step_time`` for the same
``BatchShape.from_requests`` and the given (e.g. ``cpu-local``) profile.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Workload:
    requests: int = 32
    prompt_min: int = 16
    prompt_max: int = 384
    output_min: int = 4
    output_max: int = 48
    max_slots: int = 16
    token_budget: int = 512
    seed: int = 0


GPU_WORKLOAD = Workload(requests=48, prompt_min=64, prompt_max=1536, output_min=8, output_max=128,
                        max_slots=32, token_budget=4096)
"""A GPU run of a full-size 8B model: prompts up to 1.5k tokens, up to 32 running sequences and a
4096-token step budget, so steps range from single decodes to multi-prompt prefills (its KV cache
is 7.0 GB for Llama-3-8B, weights 16 GB: it fits an 80 GB card)."""


class PackedDecoder:
    """A Llama-style model's forward pass over a packed batch, with a slot-based contiguous KV
    cache, on ``device``."""

    def __init__(self, spec: ModelSpec, max_slots: int, max_len: int, seed: int = 0,
                 device: str = "cpu") -> None:
        torch = import_torch()
        self.torch, self.spec, self.device = torch, spec, device
        g = torch.Generator(device=device).manual_seed(seed)
        h, d, heads, kv = spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads
        inter, vocab = spec.intermediate_size, spec.vocab_size
        bf16 = torch.bfloat16

        def weight(*shape: int) -> Any:
            return (torch.randn(*shape, generator=g, device=device) * shape[0] ** -0.5).to(bf16)

        def ones(n: int) -> Any:
            return torch.ones(n, dtype=bf16, device=device)

        self.embed = weight(vocab, h)
        self.layers = [{"ln1": ones(h), "wqkv": weight(h, (heads + 2 * kv) * d),
                        "wo": weight(heads * d, h), "ln2": ones(h),
                        "wgu": weight(h, 2 * inter), "wdown": weight(inter, h)}
                       for _ in range(spec.num_layers)]
        self.norm = ones(h)
        self.lm_head = weight(h, vocab)
        shape = (spec.num_layers, max_slots, kv, max_len, d)
        self.k_cache = torch.zeros(shape, dtype=bf16, device=device)
        self.v_cache = torch.zeros(shape, dtype=bf16, device=device)
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32, device=device), inv)
        self.cos, self.sin = angles.cos().to(bf16), angles.sin().to(bf16)

    @staticmethod
    def _rope(torch: Any, x: Any, cos: Any, sin: Any) -> Any:
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def step(self, prefills: list[tuple[int, list[int]]], decodes: list[tuple[int, int, int]]) -> Any:
        """``prefills``: (slot, prompt ids); ``decodes``: (slot, position, token id).
        Returns the sampled token of every prefill, then of every decode."""
        torch, spec = self.torch, self.spec
        F = torch.nn.functional
        heads, kv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        ids = [t for _, p in prefills for t in p] + [t for _, _, t in decodes]
        positions = [i for _, p in prefills for i in range(len(p))] + [pos for _, pos, _ in decodes]
        dev = self.device
        ids_t, pos_t = torch.tensor(ids, device=dev), torch.tensor(positions, device=dev)
        n_pre = sum(len(p) for _, p in prefills)
        dec_slots = torch.tensor([s for s, _, _ in decodes], dtype=torch.long, device=dev)
        dec_pos = torch.tensor([p for _, p, _ in decodes], dtype=torch.long, device=dev)
        longest = max(p for _, p, _ in decodes) + 1 if decodes else 0
        mask = ((torch.arange(longest, device=dev)[None, :] <= dec_pos[:, None])[:, None, None, :]
                if decodes else None)
        x = self.embed.index_select(0, ids_t)
        cos = self.cos.index_select(0, pos_t)[:, None, :]
        sin = self.sin.index_select(0, pos_t)[:, None, :]
        for layer_index, w in enumerate(self.layers):
            hidden = F.rms_norm(x, (spec.hidden_size,), w["ln1"])
            qkv = hidden @ w["wqkv"]
            q = self._rope(torch, qkv[:, : heads * d].view(-1, heads, d), cos, sin)
            k = self._rope(torch, qkv[:, heads * d : (heads + kv) * d].view(-1, kv, d), cos, sin)
            v = qkv[:, (heads + kv) * d :].view(-1, kv, d)
            kc, vc = self.k_cache[layer_index], self.v_cache[layer_index]
            outs = []
            start = 0
            for slot, prompt in prefills:
                n = len(prompt)
                kc[slot, :, :n] = k[start : start + n].transpose(0, 1)
                vc[slot, :, :n] = v[start : start + n].transpose(0, 1)
                qs = q[start : start + n].transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(qs, kc[slot, :, :n][None], vc[slot, :, :n][None],
                                                   is_causal=True, enable_gqa=True)
                outs.append(o[0].transpose(0, 1).reshape(n, heads * d))
                start += n
            if decodes:
                kc[dec_slots, :, dec_pos] = k[n_pre:]
                vc[dec_slots, :, dec_pos] = v[n_pre:]
                keys = kc[:, :, :longest].index_select(0, dec_slots)
                values = vc[:, :, :longest].index_select(0, dec_slots)
                o = F.scaled_dot_product_attention(q[n_pre:, :, None, :], keys, values, attn_mask=mask,
                                                   enable_gqa=True)
                outs.append(o.reshape(len(decodes), heads * d))
            x = x + torch.cat(outs) @ w["wo"]
            hidden = F.rms_norm(x, (spec.hidden_size,), w["ln2"])
            gate, up = (hidden @ w["wgu"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w["wdown"]
        ends = np.cumsum([len(p) for _, p in prefills]) - 1
        rows = torch.tensor(list(ends) + list(range(n_pre, n_pre + len(decodes))), dtype=torch.long,
                            device=dev)
        last = F.rms_norm(x[rows], (spec.hidden_size,), self.norm)
        return (last @ self.lm_head).float().argmax(dim=-1)


STEP_MARK = "servesim_e2e_step_"


def _serve(model: PackedDecoder, workload: Workload, annotate: Any = None) -> list[dict[str, Any]]:
    """Run the workload to completion; one record per step with its batch and measured time.
    ``annotate`` (torch.profiler.record_function) marks each step for :func:`_kernel_seconds`."""
    rng = np.random.default_rng(workload.seed)
    prompts = rng.integers(workload.prompt_min, workload.prompt_max + 1, workload.requests)
    outputs = rng.integers(workload.output_min, workload.output_max + 1, workload.requests)
    waiting = list(range(workload.requests))
    running: dict[int, dict[str, int]] = {}  # request -> slot, computed, total, last token
    free = list(range(workload.max_slots))
    steps: list[dict[str, Any]] = []
    while waiting or running:
        decodes = [(r, s) for r, s in running.items()]
        budget = workload.token_budget - len(decodes)
        admitted = []
        while waiting and free and prompts[waiting[0]] <= budget:
            r = waiting.pop(0)
            budget -= int(prompts[r])
            admitted.append(r)
            running[r] = {"slot": free.pop(0), "computed": 0, "total": int(prompts[r]), "token": 0}
        prefills = [(running[r]["slot"], list(rng.integers(0, model.spec.vocab_size, prompts[r])))
                    for r in admitted]
        dec_args = [(s["slot"], s["computed"], s["token"]) for _, s in decodes]
        new = [int(prompts[r]) for r in admitted] + [1] * len(decodes)
        computed = [0] * len(admitted) + [s["computed"] for _, s in decodes]
        total = [int(prompts[r]) for r in admitted] + [s["total"] for _, s in decodes]
        start = time.perf_counter()
        if annotate is None:
            sampled = model.step(prefills, dec_args).tolist()
        else:
            with annotate(f"{STEP_MARK}{len(steps)}"):
                sampled = model.step(prefills, dec_args).tolist()
        elapsed = time.perf_counter() - start
        steps.append({"new": new, "computed": computed, "total": total, "measured_s": elapsed})
        for r, token in zip(admitted + [r for r, _ in decodes], sampled, strict=True):
            state = running[r]
            state["computed"] = state["total"]
            state["total"] += 1
            state["token"] = int(token)
            if state["total"] - int(prompts[r]) >= int(outputs[r]):
                free.append(state["slot"])
                del running[r]
    return steps


KERNEL_CLASSES = {"gemm": ("aten::mm", "aten::addmm", "aten::_scaled_mm"),
                  "attention": ("scaled_dot_product", "flash", "efficient_attention", "bmm", "softmax"),
                  "kv_gather_and_copies": ("index", "copy_", "cat", "where")}
"""torch operators (matched by substring of their profiler key) behind each class of GPU time; the
rest (norms, RoPE, activations, residual adds, the mask) is ``elementwise``. The matrix products
of math-backend attention are ``aten::bmm``, so they count as attention, not GEMMs."""
PREDICTED_CLASSES = {"gemm": ("qkv_proj", "o_proj", "mlp", "lm_head", "moe"),
                     "attention": ("attn_prefill", "attn_decode"),
                     "elementwise": ("embedding", "elementwise")}
"""The cost model's breakdown entries summed into each of those classes (the KV gathers have no
counterpart: paged kernels read the cache in place)."""


def kernel_class(key: str) -> str:
    """The class of GPU time of a profiled torch operator (:data:`KERNEL_CLASSES`)."""
    for name, markers in KERNEL_CLASSES.items():
        if any(marker in key for marker in markers):
            return name
    return "elementwise"


def _kernel_seconds(model: PackedDecoder, workload: Workload) -> tuple[list[float], dict[str, float]] | None:
    """GPU time per step, and per class of operator over the whole pass, from one more pass under
    ``torch.profiler``. A step's GPU time sums the device's kernels and copies that start inside
    its range: a step ends with a synchronisation (its sampled tokens are read back), so its
    kernels cannot spill into the next one. What the measured wall time adds on top is the eager
    loop's host work (launches, Python). None when the profiler cannot see the device."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        steps = _serve(model, workload, annotate=record_function)
    events = list(prof.events())
    ranges = {int(e.name[len(STEP_MARK):]): (e.time_range.start, e.time_range.end) for e in events
              if e.name.startswith(STEP_MARK) and e.device_type == DeviceType.CPU}
    device = sorted((e.time_range.start, e.time_range.end - e.time_range.start) for e in events
                    if e.device_type == DeviceType.CUDA and not e.name.startswith(STEP_MARK))
    if len(ranges) != len(steps) or not device:
        return None
    starts = np.array([d[0] for d in device], dtype=float)
    durations = np.array([d[1] for d in device], dtype=float)
    bounds = np.array([ranges[i] for i in range(len(steps))], dtype=float)
    first = np.searchsorted(starts, bounds[:, 0], side="left")
    last = np.searchsorted(starts, bounds[:, 1], side="right")
    cumulative = np.concatenate([[0.0], np.cumsum(durations)])
    classes: dict[str, float] = {}
    for average in prof.key_averages():
        if average.key.startswith(STEP_MARK):
            continue
        name = kernel_class(average.key)
        classes[name] = classes.get(name, 0.0) + average.self_device_time_total * 1e-6
    return list((cumulative[last] - cumulative[first]) * 1e-6), classes


def run_e2e(profile: HardwareProfile, workload: Workload | None = None, threads: int = 1,
            passes: int = 3, device: str = "cpu", model_name: str | None = None) -> pd.DataFrame:
    """Per step: batch summary, measured (median over ``passes``) and predicted seconds, the error.

    ``device`` cpu runs the small model with :class:`Workload`'s defaults; cuda runs
    ``model_name`` (default ``llama-3-8b``) with :data:`GPU_WORKLOAD`."""
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    torch = import_torch()
    torch.set_num_threads(threads)
    if device == "cuda" and not torch.cuda.is_available():
        raise ServesimError("--device", "cuda requested but torch sees no GPU",
                            "use --device cpu, or a CUDA build of torch on a GPU machine")
    if device not in ("cpu", "cuda"):
        raise ServesimError("--device", f"unknown device {device!r}", "use cuda or cpu")
    name = model_name or ("llama-3-8b" if device == "cuda" else None)
    spec = load_model(name) if name else e2e_model()
    workload = workload or (GPU_WORKLOAD if device == "cuda" else Workload())
    model = PackedDecoder(spec, workload.max_slots, workload.prompt_max + workload.output_max + 1,
                          workload.seed, device)
    # The loop times the model's forward passes only: no serving engine's step cost is added.
    cost = CostModel(model.spec, profile, tp=1, runtime=RuntimeCosts.none())
    with torch.inference_mode():
        _serve(model, workload)  # warm-up pass
        runs = [_serve(model, workload) for _ in range(passes)]
        try:
            profiled = _kernel_seconds(model, workload) if device == "cuda" else None
        except Exception as error:  # the profiler is a bonus: the wall times stand alone
            warnings.warn(f"e2e: no kernel times from torch.profiler ({error})", stacklevel=1)
            profiled = None
    steps = runs[0]
    measured = np.median([[step["measured_s"] for step in run] for run in runs], axis=0)
    rows = []
    predicted_classes: dict[str, float] = {}
    for i, step in enumerate(steps):
        batch = BatchShape.from_requests(np.array(step["new"]), np.array(step["computed"]),
                                         np.array(step["total"]))
        priced = cost.step(batch)
        predicted = priced.time_s
        for name, parts in PREDICTED_CLASSES.items():
            predicted_classes[name] = predicted_classes.get(name, 0.0) + sum(
                priced.breakdown.get(part, 0.0) for part in parts)
        rows.append({"step": i, "prefills": batch.num_prefills, "prefill_tokens": batch.num_prefill_tokens,
                     "decodes": batch.num_decodes, "decode_context": int(batch.decode_context.sum()),
                     "measured_s": float(measured[i]), "predicted_s": predicted})
    table = pd.DataFrame(rows)
    table["ape"] = (table["predicted_s"] - table["measured_s"]).abs() / table["measured_s"]
    table["signed_%"] = (table["predicted_s"] / table["measured_s"] - 1) * 100
    if profiled is not None:
        kernels, classes = profiled
        table["kernel_s"] = kernels
        table["kernel_ape"] = (table["predicted_s"] - table["kernel_s"]).abs() / table["kernel_s"]
        table["kernel_signed_%"] = (table["predicted_s"] / table["kernel_s"] - 1) * 100
        table.attrs["kernel_classes"] = pd.DataFrame(
            [{"class": name, "gpu_s": classes.get(name, 0.0), "predicted_s": predicted_classes.get(name, 0.0)}
             for name in (*KERNEL_CLASSES, "elementwise")])
    return table
