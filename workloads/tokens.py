"""Token counts of text, for datasets that ship text rather than lengths (raw ShareGPT JSON).

Two counters, and every workload says which one it used:

- ``estimate`` (the default, no dependency): ``ceil(characters / 4)``, OpenAI's published rule of
  thumb for English text ("one token generally corresponds to ~4 characters of text", OpenAI
  help centre, *What are tokens and how to count them?*). It is an estimate: code, numbers and
  non-Latin scripts take more tokens per character, and a real tokenizer also adds special
  tokens (vLLM's ``len(tokenizer(text).input_ids)`` counts Llama's BOS).
- a Hugging Face tokenizer, named by ``tokenizer:`` (a hub name or a local folder), loaded with
  ``local_files_only=True`` so nothing is downloaded: real token counts exactly as vLLM's
  benchmark counts them (``len(tokenizer(text).input_ids)``). It needs ``transformers`` installed
  and the tokenizer in the local cache; otherwise loading fails with one line saying so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from servesim.errors import ServesimError

CHARS_PER_TOKEN = 4.0
"""OpenAI's rule of thumb for English text (see the module docstring); an estimate."""

Counter = Callable[[Sequence[str]], np.ndarray]


def estimate_tokens(texts: Sequence[str]) -> np.ndarray:
    """``ceil(len(text) / 4)`` per text (0 for empty text)."""
    return np.fromiter((math.ceil(len(t) / CHARS_PER_TOKEN) for t in texts), dtype=np.int64,
                       count=len(texts))


def token_counter(tokenizer: str | None, field: str = "tokenizer") -> tuple[Counter, str]:
    """The counter for ``tokenizer`` (None: the estimate) and a label saying which it is."""
    if tokenizer is None:
        return estimate_tokens, "token counts estimated as ceil(characters / 4)"
    try:
        from transformers import AutoTokenizer  # optional: only for real token counts
    except ImportError:
        raise ServesimError(field, f"counting tokens with {tokenizer!r} needs the transformers package",
                            "pip install transformers, or remove tokenizer to use the ceil(chars / 4) "
                            "estimate") from None
    try:
        loaded = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ServesimError(field, f"tokenizer {tokenizer!r} is not available offline "
                            f"({' '.join(str(exc).split())[:120]})",
                            "download it once (huggingface-cli download NAME) or give a local "
                            "folder") from None

    def count(texts: Sequence[str]) -> np.ndarray:
        return np.fromiter((len(ids) for ids in loaded(list(texts)).input_ids), dtype=np.int64,
                           count=len(texts))

    return count, f"token counts from the {tokenizer} tokenizer"
