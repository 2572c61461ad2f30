"""Which kernel shapes to benchmark: those the catalogue's models produce at TP 1..8.

GEMMs take the (K, N) of each layer's QKV, O, gate/up and down projections (and the LM head)
on one GPU of a TP group, for M (tokens in the step) from 1 to 16k. Attention takes each
model's per-GPU head layout. A per-kernel FLOP cap keeps a CPU run to minutes: a 16k-row GEMM of
a 70B layer would take seconds on a laptop, and the fit does not need it there. ``--quick`` keeps
one catalogue model plus the end-to-end check's small model, and a sparser grid.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.model_config import load_model, model_from_hf_config
from servesim.model_spec import ModelSpec

E2E_MODEL_CONFIG = {
    "model_type": "llama", "hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 1408, "vocab_size": 8192,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "_servesim": {"source": "servesim calibration end-to-end check (random weights)"},
}
"""The small decoder-only transformer run for real by the end-to-end check (GQA 8/2 heads)."""

FULL_MODELS = ("llama-3-8b", "llama-2-7b", "mistral-7b", "llama-2-13b", "yi-34b", "llama-3-70b",
               "qwen2.5-72b")
QUICK_MODELS = ("llama-3-8b",)
TPS = (1, 2, 4, 8)
FULL_M = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
          3072, 4096, 6144, 8192, 12288, 16384)
QUICK_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
FLOP_CAP = {("cpu", True): 3e9, ("cpu", False): 3e10, ("cuda", True): 2e13, ("cuda", False): 1e15}
WEIGHT_CAP = {("cpu", True): 64e6, ("cpu", False): 512e6, ("cuda", True): 2e9, ("cuda", False): 4e9}
"""Largest bf16 weight matrix benchmarked (bytes): a 128k-vocabulary LM head is 1 GB."""


def e2e_model() -> ModelSpec:
    return model_from_hf_config(E2E_MODEL_CONFIG, "e2e-small")


@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int
    model: str
    tp: int
    op: str


def layer_gemms(model: ModelSpec, tp: int) -> list[tuple[str, int, int]]:
    """(op, K, N) of one layer's dense GEMMs on one GPU, and the LM head."""
    h = model.hidden_size
    heads = model.num_heads // tp
    kv = max(1, model.num_kv_heads // tp)
    inter = -(-model.intermediate_size // tp)
    up = 2 * inter if model.gated_mlp else inter
    return [("qkv_proj", h, (heads + 2 * kv) * model.head_dim), ("o_proj", heads * model.head_dim, h),
            ("mlp_up", h, up), ("mlp_down", inter, h), ("lm_head", h, -(-model.vocab_size // tp))]


def gemm_shapes(device: str, quick: bool, rows: tuple[int, ...] | None = None) -> list[GemmShape]:
    """Every catalogue layer GEMM (model, TP degree, operator) at each row count of the grid, or
    of ``rows`` when given (the token counts a user's steps have: the grid's are powers of two and
    their halves, multiples of 16 from 16 on, which some FP8 kernels run faster than others)."""
    names = QUICK_MODELS if quick else FULL_MODELS
    models = [(n, load_model(n)) for n in names] + [("e2e-small", e2e_model())]
    cap = FLOP_CAP[(device, quick)]
    weight_cap = WEIGHT_CAP[(device, quick)]
    seen: set[tuple[int, int, int]] = set()
    shapes = []
    for name, model in models:
        for tp in (1,) if name == "e2e-small" else TPS:
            if model.num_heads % tp or model.mla is not None:
                continue
            for op, k, n in layer_gemms(model, tp):
                if 2.0 * k * n > weight_cap:
                    continue
                for m in rows or (QUICK_M if quick else FULL_M):
                    if 2.0 * m * k * n > cap or (m, n, k) in seen:
                        continue
                    seen.add((m, n, k))
                    shapes.append(GemmShape(m, n, k, name, tp, op))
    return sorted(shapes, key=lambda s: (s.k, s.n, s.m))


@dataclass(frozen=True)
class AttentionLayout:
    heads: int
    kv_heads: int
    head_dim: int
    label: str


def attention_layouts(quick: bool) -> list[AttentionLayout]:
    """Per-GPU head layouts: the small model's, and Llama-3-8B's at TP 1 and 4 (GQA 4:1)."""
    small = e2e_model()
    layouts = [AttentionLayout(small.num_heads, small.num_kv_heads, small.head_dim, "e2e-small")]
    layouts.append(AttentionLayout(8, 2, 128, "llama-3-8b tp4"))
    if not quick:
        layouts += [AttentionLayout(32, 8, 128, "llama-3-8b tp1"),
                    AttentionLayout(32, 32, 128, "llama-2-7b tp1"),
                    AttentionLayout(8, 1, 128, "llama-3-70b tp8")]
    return layouts


PREFILL_SEQ = {True: (16, 32, 64, 128, 256, 512, 1024, 2048),
               False: (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192, 16384)}
PREFILL_BATCH = (1, 4)
DECODE_BATCH = {True: (1, 4, 16, 32), False: (1, 2, 4, 8, 16, 32, 64, 128, 256)}
DECODE_CONTEXT = {True: (32, 64, 128, 256, 512, 1024, 2048),
                  False: (32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192)}
COPY_BYTES = {True: tuple(2**p for p in range(12, 27)), False: tuple(2**p for p in range(10, 31))}
