"""A model's ``config.json`` by its Hugging Face id (``meta-llama/Meta-Llama-3-8B``).

Looked for, in order:

1. the local Hugging Face cache, as ``huggingface_hub`` lays it out: ``$HF_HUB_CACHE``, else
   ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``; in it
   ``models--<org>--<name>/snapshots/<revision>/config.json``, the revision ``refs/main`` names
   (else the newest snapshot). Nothing leaves the machine;
2. a download with ``huggingface_hub`` (an optional dependency: ``pip install huggingface_hub``),
   which honours ``HF_TOKEN`` for gated models and ``HF_HUB_OFFLINE``, and fills the same cache.

Offline and not cached, the error is one line saying where to put the file (or to pass a
``config.json`` path instead). Only the architecture is read: no weights are fetched.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from servesim.errors import ServesimError

HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hf_id(text: str) -> bool:
    """``org/name`` (one slash, no file suffix, not an existing path)."""
    return bool(HF_ID.match(text)) and not text.endswith(".json") and not Path(text).expanduser().exists()


def hub_cache_dir() -> Path:
    """Where ``huggingface_hub`` keeps downloaded repositories."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    base = Path(home).expanduser() if home else Path("~/.cache/huggingface").expanduser()
    return base / "hub"


def cached_config(repo_id: str) -> Path | None:
    """``config.json`` of ``repo_id`` in the local cache (``refs/main``'s snapshot, else the newest)."""
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = repo / "snapshots" / ref.read_text(encoding="utf-8").strip() / "config.json"
        if candidate.is_file():
            return candidate
    snapshots = sorted((p for p in (repo / "snapshots").glob("*/config.json") if p.is_file()),
                       key=lambda p: (p.stat().st_mtime, p.parent.name))
    return snapshots[-1] if snapshots else None


def find_config(repo_id: str, where: str = "model") -> Path:
    """The ``config.json`` of ``repo_id``: from the cache, else downloaded (see the module docstring)."""
    cached = cached_config(repo_id)
    if cached is not None:
        return cached
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    target = repo / "snapshots" / "<revision>" / "config.json"
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ServesimError(where, f"{repo_id} is not in the Hugging Face cache ({hub_cache_dir()}) and "
                            "huggingface_hub is not installed to download it",
                            f"pip install huggingface_hub, or put the model's config.json at {target}, "
                            "or give the path of a config.json") from None
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename="config.json"))
    except Exception as exc:  # offline, gated, missing repo: huggingface_hub raises many types
        reason = " ".join(str(exc).split())[:200]
        raise ServesimError(where,
                            f"cannot download {repo_id}'s config.json ({type(exc).__name__}: {reason})",
                            f"check the id and your network or HF_TOKEN, or put the file at {target}, or "
                            "give the path of a config.json") from None
