"""Reading the public Vidur per-operator profiles (and FlashAttention figures) as measurements.

``vidur_profiling/compute/<gpu>/<org>/<model>/mlp.csv`` times one layer's GEMMs on one GPU for
``num_tokens`` rows at TP 1..8; ``network/<gpu>_dgx/all_reduce.csv`` times NCCL all-reduce on an
8-GPU box (``size`` in bytes: 64 MB at 8 GPUs gives the NVLink bus bandwidth NCCL reports);
``compute/a100/attention_n8192_q64_kv8_tp2/attention.csv`` is the one public A100 attention
profile (paged FlashAttention, Llama-2-70B heads at TP2). No public H100 attention kernel times
exist, so H100 prefill rests on the FlashAttention-3 forward throughput read off the
flash-attention README figures, and H100 decode keeps the A100 decode fit (the same kernel
family, as a fraction of each GPU's HBM bandwidth). The tables are built in memory in the
:mod:`servesim.calibration.schema` format; nothing from the shared data is copied into the repository.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servesim.errors import ServesimError

GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
PROFILE_OF = {"a100": "a100-sxm-80gb", "h100": "h100-sxm-80gb"}
FA_IMPL = "FlashAttention-3"
FA_HEAD_DIM = 128


def _gemm_rows(mlp: pd.DataFrame, model: str) -> pd.DataFrame:
    """The four GEMMs of each row as (m, n, k) on one GPU, with Vidur's median time."""
    h, inter = mlp["n_embd"], mlp["n_expanded_embd"]
    heads, kv_heads = mlp["n_head"], mlp["n_kv_head"]
    tp = mlp["num_tensor_parallel_workers"]
    gated = mlp["use_gated_mlp"].astype(str) == "True"
    up = inter * (1 + gated.astype(int))
    kn = {"attn_pre_proj": (h, (heads + 2 * kv_heads) * (h // heads) // tp),
          "attn_post_proj": (h // tp, h), "mlp_up_proj": (h, up // tp),
          "mlp_down_proj": (inter // tp, h)}
    frames = []
    for op, (k, n) in kn.items():
        frames.append(pd.DataFrame({
            "m": mlp["num_tokens"], "n": n, "k": k, "dtype": "bf16",
            "time_s": mlp[f"time_stats.{op}.median"] * 1e-3, "model": model, "tp": tp, "op": op}))
    return pd.concat(frames, ignore_index=True)


def gemm_table(root: Path, gpu: str) -> pd.DataFrame:
    paths = sorted((root / "compute" / gpu).glob("*/*/mlp.csv"))
    if not paths:
        raise ServesimError("vidur", f"no {gpu} mlp.csv under {root / 'compute' / gpu}",
                            "give the vidur_profiling folder (it holds compute/ and network/)")
    frames = [_gemm_rows(pd.read_csv(p), f"{p.parent.parent.name}/{p.parent.name}") for p in paths]
    table = pd.concat(frames, ignore_index=True)
    table["source"] = f"vidur_profiling/compute/{gpu}"
    return table


def allreduce_table(root: Path, gpu: str) -> pd.DataFrame | None:
    path = root / "network" / f"{gpu}_dgx" / "all_reduce.csv"
    if not path.exists():
        return None
    raw = pd.read_csv(path)
    raw = raw[raw["num_workers"] <= raw["devices_per_node"]]  # one node: NVLink, not the network
    return pd.DataFrame({"bytes": raw["size"], "world": raw["num_workers"],
                         "time_s": raw["time_stats.all_reduce.median"] * 1e-3,
                         "source": f"vidur_profiling/network/{gpu}_dgx/all_reduce.csv"})


def attention_tables(root: Path) -> dict[str, pd.DataFrame]:
    """Prefill and decode rows of the A100 attention profile, per GPU (32 q / 4 KV heads)."""
    paths = sorted((root / "compute" / "a100").glob("attention_*/attention.csv"))
    if not paths:
        return {}
    raw = pd.read_csv(paths[0])
    tp = raw["num_tensor_parallel_workers"]
    common = {"heads": raw["n_q_head"] // tp, "kv_heads": raw["n_kv_head"] // tp,
              "head_dim": raw["n_embd"] // raw["n_q_head"], "source": f"vidur {paths[0].parent.name}"}
    full = pd.DataFrame({**common, "batch": raw["batch_size"], "seq": raw["prefill_chunk_size"],
                         "context": raw["kv_cache_size"], "prefill": raw["is_prefill"].astype(bool),
                         "prefill_s": raw["time_stats.attn_prefill.median"] * 1e-3,
                         "decode_s": raw["time_stats.attn_decode.median"] * 1e-3})
    prefill = full[full["prefill"]].rename(columns={"prefill_s": "time_s"})
    decode = full[~full["prefill"]].rename(columns={"decode_s": "time_s"})
    keep = ["batch", "seq", "context", "heads", "kv_heads", "head_dim", "time_s", "source"]
    return {"attention_prefill": prefill[keep].reset_index(drop=True),
            "attention_decode": decode[[c for c in keep if c != "seq"]].reset_index(drop=True)}


def flashattention_prefill(path: Path) -> pd.DataFrame | None:
    """H100 causal forward rows of the FlashAttention README figures as kernel times.

    Those figures use ``batch = 16k / seqlen`` and 2,048 hidden (``heads = 2048 / head_dim``)
    and count ``4 * batch * seqlen^2 * heads * head_dim / 2`` FLOPs for a causal pass."""
    if not path.exists():
        return None
    raw = pd.read_csv(path)
    rows = raw[raw["gpu"].str.contains("H100") & (raw["impl"] == FA_IMPL) & (raw["pass"] == "fwd")
               & (raw["causal"].astype(str) == "True") & (raw["head_dim"] == FA_HEAD_DIM)]
    seq = rows["seqlen"].astype(int)
    batch = 16384 // seq
    heads = 2048 // rows["head_dim"].astype(int)
    flops = 4.0 * batch * seq**2 * heads * rows["head_dim"] / 2
    return pd.DataFrame({"batch": batch, "seq": seq, "context": 0, "heads": heads,
                         "kv_heads": heads, "head_dim": rows["head_dim"].astype(int),
                         "time_s": flops / (rows["tflops"] * 1e12),
                         "source": f"{path.name} ({FA_IMPL} fwd causal hdim {FA_HEAD_DIM})"}
                        ).reset_index(drop=True)


def vidur_tables(root: Path, gpu: str) -> dict[str, pd.DataFrame]:
    """Every public measurement for ``gpu`` (``a100`` or ``h100``) in the schema's tables."""
    root = Path(root)
    if not (root / "compute").is_dir():
        raise ServesimError("vidur", f"{root} has no compute/ folder",
                            "give ../shared/data/kernels/vidur_profiling")
    tables: dict[str, pd.DataFrame] = {"gemm": gemm_table(root, gpu)}
    allreduce = allreduce_table(root, gpu)
    if allreduce is not None:
        tables["allreduce"] = allreduce
    if gpu == "a100":
        tables.update(attention_tables(root))
    else:
        fa = flashattention_prefill(root.parent / "flashattention_tflops_from_readme_figures.csv")
        if fa is not None:
            tables["attention_prefill"] = fa
    return tables


def gpu_of(profile_name: str) -> str:
    for gpu in PROFILE_OF:
        if profile_name.startswith(gpu):
            return gpu
    raise ServesimError("--profile", f"no public Vidur data for {profile_name}",
                        "use an a100-* or h100-* profile")
