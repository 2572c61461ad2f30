"""Raw ShareGPT JSON, read as ``vllm bench serve --dataset-name sharegpt`` reads it.

The file (e.g. ``ShareGPT_V3_unfiltered_cleaned_split.json``) is a JSON list of conversations,
``{"id": ..., "conversations": [{"from": "human", "value": TEXT}, {"from": "gpt", "value":
TEXT}, ...]}``. vLLM's benchmark (``vllm/benchmarks/datasets.py``, ``ShareGPTDataset``) keeps
conversations with at least two messages, takes message 0 as the prompt and message 1 as the
completion (roles are not checked), counts tokens with the model's tokenizer, and prunes pairs
with ``is_valid_sequence``: prompt or completion under 4 tokens, prompt over 1024, or both over
2048 (``dataset_utils.is_valid_sequence``'s defaults). :func:`first_turns` does exactly that; the
engine then resamples the pairs with replacement (vLLM shuffles once and takes the first N).

:func:`read_conversations` keeps every turn instead, messages ``(2k, 2k + 1)`` as turn ``k``'s user
message and answer, for multi-turn sessions (``workload.sessions.conversations``).

Token counts come from :mod:`servesim.workloads.tokens`: the ``ceil(chars / 4)`` estimate, or a
local Hugging Face tokenizer; the source line says which.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servesim.errors import ServesimError
from servesim.inputs.files import read_text
from servesim.workloads.tokens import token_counter

MIN_TOKENS, MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS = 4, 1024, 2048
"""vLLM's ``is_valid_sequence`` defaults, which its ShareGPT sampler uses."""

STATS_HEADER = "num_prefill_tokens"


@dataclass(frozen=True)
class Conversations:
    """Turns of each conversation: turn ``j`` of conversation ``c`` is row
    ``offsets[c] + j`` of ``user_tokens`` (the user's message) and ``output_tokens`` (the answer)."""

    offsets: np.ndarray
    user_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def turns(self) -> np.ndarray:
        return np.diff(self.offsets)


def read_conversations(path: Path, tokenizer: str | None = None) -> Conversations:
    """Every conversation with at least one (user, answer) pair, in file order."""
    entries = _entries(path)
    texts: list[str] = []
    per_conversation: list[int] = []
    skipped = 0
    for index, entry in enumerate(entries):
        messages = _messages(entry, index, path)
        if messages is None or len(messages) < 2:
            skipped += 1
            continue
        pairs = len(messages) // 2
        for k in range(2 * pairs):
            texts.append(_text(messages[k], index, k, path))
        per_conversation.append(pairs)
    if not per_conversation:
        raise ServesimError("path", f"{path} holds no conversation with a user message and an answer",
                            "give a ShareGPT JSON file: a list of {conversations: [{from, value}, ...]}")
    count, label = token_counter(tokenizer)
    tokens = count(texts)
    offsets = np.zeros(len(per_conversation) + 1, dtype=np.int64)
    np.cumsum(per_conversation, out=offsets[1:])
    note = f"; skipped {skipped} entries with fewer than 2 messages" if skipped else ""
    return Conversations(offsets, tokens[0::2].copy(), tokens[1::2].copy(),
                         f"{path.name} (sharegpt): {len(per_conversation)} conversations, "
                         f"{int(offsets[-1])} turns; {label}{note}")


def first_turns(path: Path, tokenizer: str | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(prompt, output, source) of each conversation's first turn that vLLM's filter keeps."""
    conversations = read_conversations(path, tokenizer)
    first = conversations.offsets[:-1]
    prompt, output = conversations.user_tokens[first], conversations.output_tokens[first]
    keep = ((prompt >= MIN_TOKENS) & (output >= MIN_TOKENS) & (prompt <= MAX_PROMPT_TOKENS)
            & (prompt + output <= MAX_TOTAL_TOKENS))
    if not keep.any():
        raise ServesimError("path", f"no first turn of {path} passes vLLM's length filter (4 <= prompt "
                            f"<= {MAX_PROMPT_TOKENS}, output >= 4, prompt + output <= {MAX_TOTAL_TOKENS})",
                            "check the file's token counts or the tokenizer")
    source = (f"{conversations.source.split(';')[0]}; first turns, {int(keep.sum())} kept by vLLM's "
              f"filter; {conversations.source.split('; ', 1)[1]}")
    return prompt[keep], output[keep], source


# ---------------------------------------------------------------------------------------- parsing
def _entries(path: Path) -> list[object]:
    if not path.is_file():
        raise ServesimError("path", f"no such file {path}", "check the path (in a YAML, relative paths "
                            "resolve against the YAML's folder)")
    text = read_text(path, "path")
    head = text.lstrip()[:200]
    if head.startswith(STATS_HEADER) or STATS_HEADER in head.split("\n", 1)[0]:
        raise ServesimError("format", f"{path} holds Vidur/Sarathi length statistics "
                            f"({STATS_HEADER},...), not ShareGPT conversations",
                            "use format: vidur-stats (format sharegpt now reads raw ShareGPT JSON, "
                            "as vllm bench serve --dataset-name sharegpt does)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ServesimError("path", f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column "
                            f"{exc.colno})", "give a ShareGPT JSON file (a list of conversations)") from None
    if not isinstance(data, list):
        raise ServesimError("path", f"{path} holds a JSON {type(data).__name__}, not a list of conversations",
                            "give a ShareGPT JSON file (a list of conversations)")
    return data


def _messages(entry: object, index: int, path: Path) -> list[object] | None:
    if not isinstance(entry, dict) or "conversations" not in entry:
        return None  # vLLM skips entries without conversations
    messages = entry["conversations"]
    if not isinstance(messages, list):
        raise ServesimError("conversations", f"entry {index} of {path} has conversations that are not "
                            "a list", "give a list of {from, value} messages")
    return messages


def _text(message: object, index: int, k: int, path: Path) -> str:
    value = message.get("value") if isinstance(message, dict) else None
    if not isinstance(value, str):
        raise ServesimError("conversations", f"message {k} of entry {index} of {path} has no text value",
                            "every message needs a string value")
    return value
