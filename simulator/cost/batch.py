"""The shape of one iteration's batch, as the cost model needs it.

In the unified token-budget view every scheduled request processes some *new* tokens over some
*context* it has already computed. A request still working through its prompt is a prefill
(a whole prompt, or one chunk of it); a request past its prompt is a decode and processes one new
token, or ``1 + k`` when it verifies ``k`` speculative proposals (its last token and the proposals,
a small chunk that reads the same weights and KV as one decode). Recompute after preemption is a
prefill again. The cost model needs only these arrays (and a few sums of them), never the requests
themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from servesim.errors import ServesimError

_INT = np.int64
_NO_TOKENS = np.empty(0, dtype=_INT)
_NO_EMITS = np.empty(0, dtype=bool)
_DECODES_ONLY = {"prefill_tokens": _NO_TOKENS, "prefill_context": _NO_TOKENS, "prefill_emits": _NO_EMITS,
                 "decode_tokens": None, "num_prefills": 0, "num_prefill_tokens": 0}
"""What every :meth:`BatchShape.decodes_only` shares."""


SMALL_BATCH = 16
"""Up to this many requests, :meth:`BatchShape.from_requests` classifies them in Python (cheaper
than NumPy calls on arrays this small)."""
SMALL_SUM = 64
"""Up to this many decodes, ``decodes_only`` sums the contexts in Python (exact, as NumPy's int64
sum is; fewer calls)."""


def _as_tokens(values: Sequence[int] | np.ndarray, field: str) -> np.ndarray:
    array = np.asarray(values, dtype=_INT).reshape(-1)
    if array.size and array.min() < 0:
        raise ServesimError(field, "token counts cannot be negative", "give counts >= 0")
    return array


def _no_new_tokens() -> ServesimError:
    return ServesimError("new_tokens", "a scheduled request computes at least one token",
                         "do not schedule requests with no new tokens")


def _past_the_total() -> ServesimError:
    return ServesimError("new_tokens", "computed + new exceeds the request's tokens",
                         "schedule at most total - computed new tokens (plus proposals)")

@dataclass(frozen=True)
class BatchShape:
    """One iteration: prefill chunks and decoding requests.

    ``prefill_tokens[i]`` new prompt tokens are computed for prefill ``i`` on top of
    ``prefill_context[i]`` tokens it computed in earlier steps (0 unless chunked or recomputed);
    ``prefill_emits[i]`` says whether this chunk finishes the prompt, so the step also samples
    that request's first output token (and runs the LM head for it).
    ``decode_context[j]`` is the number of tokens already in decoding request ``j``'s KV cache;
    its new tokens attend to those and to each other (causally). ``decode_tokens[j]`` is how many
    new tokens it computes: ``None`` means one each (plain decoding); ``1 + k`` is a request that
    verifies ``k`` speculative proposals, which needs logits at every one of them.
    """

    prefill_tokens: np.ndarray
    prefill_context: np.ndarray
    prefill_emits: np.ndarray
    decode_context: np.ndarray
    decode_tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        prefills, decodes = int(self.prefill_tokens.size), int(self.decode_context.size)
        prefill_tokens = int(self.prefill_tokens.sum()) if prefills else 0
        decode_tokens = decodes if self.decode_tokens is None else int(self.decode_tokens.sum())
        set_ = object.__setattr__
        set_(self, "num_prefills", prefills)
        set_(self, "num_decodes", decodes)
        set_(self, "num_prefill_tokens", prefill_tokens)
        set_(self, "num_decode_tokens", decode_tokens)
        set_(self, "num_new_tokens", prefill_tokens + decode_tokens)
        set_(self, "decode_context_sum", float(self.decode_context.sum()) if decodes else 0.0)
        set_(self, "num_logits", decode_tokens + (int(self.prefill_emits.sum()) if prefills else 0))
        if not (len(self.prefill_tokens) == len(self.prefill_context) == len(self.prefill_emits)):
            raise ServesimError("batch", "prefill arrays differ in length",
                                "give one context and one emits flag per prefill chunk")
        if self.prefill_tokens.size and self.prefill_tokens.min() < 1:
            raise ServesimError("prefill_tokens", "a prefill chunk needs at least one token",
                                "drop empty chunks")
        if self.decode_tokens is not None and (self.decode_tokens.size != decodes
                                               or (decodes and self.decode_tokens.min() < 1)):
            raise ServesimError("decode_tokens", "needs one count of at least 1 per decode",
                                "give 1 + proposals for each decoding request")

    @classmethod
    def build(cls, prefill_tokens: Sequence[int] | np.ndarray = (),
              prefill_context: Sequence[int] | np.ndarray | None = None,
              decode_context: Sequence[int] | np.ndarray = (),
              prefill_emits: Sequence[bool] | np.ndarray | None = None,
              decode_tokens: Sequence[int] | np.ndarray | None = None) -> BatchShape:
        """Full prompts by default: no earlier context, and every prefill emits a token; one new
        token per decode unless ``decode_tokens`` says otherwise (speculative verification)."""
        tokens = _as_tokens(prefill_tokens, "prefill_tokens")
        context = (np.zeros_like(tokens) if prefill_context is None
                   else _as_tokens(prefill_context, "prefill_context"))
        emits = (np.ones(tokens.shape, dtype=bool) if prefill_emits is None
                 else np.asarray(prefill_emits, dtype=bool).reshape(-1))
        verified = None if decode_tokens is None else _as_tokens(decode_tokens, "decode_tokens")
        return cls(tokens, context, emits, _as_tokens(decode_context, "decode_context"), verified)

    @classmethod
    def decodes_only(cls, decode_context: np.ndarray) -> BatchShape:
        """Only decodes, over these contexts (int64, >= 0): the engine's most frequent step,
        built without re-validating what the engine guarantees (one update of the frozen
        instance's attributes)."""
        shape = object.__new__(cls)
        decodes = int(decode_context.size)
        # Python's sum of a few ints is NumPy's int64 sum (exact either way), without its overhead
        total = sum(decode_context.tolist()) if decodes <= SMALL_SUM else decode_context.sum()
        shape.__dict__.update(_DECODES_ONLY, decode_context=decode_context, num_decodes=decodes,
                              num_decode_tokens=decodes, num_new_tokens=decodes, num_logits=decodes,
                              decode_context_sum=float(total))
        return shape

    @classmethod
    def decode(cls, batch_size: int, context: int) -> BatchShape:
        """``batch_size`` requests decoding, each with ``context`` tokens already cached."""
        return cls.build(decode_context=np.full(batch_size, context, dtype=_INT))

    @classmethod
    def prefill(cls, *prompt_lengths: int) -> BatchShape:
        return cls.build(prefill_tokens=list(prompt_lengths))

    @classmethod
    def from_requests(cls, new_tokens: np.ndarray, computed_tokens: np.ndarray,
                      total_tokens: np.ndarray, proposed: np.ndarray | None = None) -> BatchShape:
        """The engine's view, in the unified token-budget terms (docs/architecture.md).

        Each scheduled request computes ``new_tokens`` more of its ``total_tokens`` (prompt plus
        output generated so far), ``computed_tokens`` of which are already in its KV cache. A
        request with exactly one uncomputed token that it now computes is a decode; any other is
        a prefill chunk (a prompt, part of one, or a recompute after preemption), and it samples
        a token when it reaches ``total_tokens``. ``proposed[i]`` (speculative decoding) counts
        the proposal tokens a decode verifies on top of its one token: they are part of its
        ``new_tokens`` but not yet of its ``total_tokens``.
        """
        new = np.asarray(new_tokens, dtype=_INT)
        computed = np.asarray(computed_tokens, dtype=_INT)
        total = np.asarray(total_tokens, dtype=_INT)
        if proposed is None and new.ndim == computed.ndim == total.ndim == 1:
            if new.size <= SMALL_BATCH:
                return cls._from_few_requests(new.tolist(), computed.tolist(), total.tolist())
            return cls._from_many_requests(new, computed, total)
        if new.size and new.min() < 1:
            raise _no_new_tokens()
        own = new if proposed is None else new - proposed
        if np.any(computed + own > total) or (proposed is not None and own.size and own.min() < 1):
            raise _past_the_total()
        is_decode = (own == 1) & (computed + 1 == total) & (computed > 0)
        prefill = ~is_decode
        if proposed is not None and np.any(proposed[prefill]):
            raise ServesimError("proposed", "only a decoding request verifies proposals",
                                "give proposals to requests past their first token")
        return cls(new[prefill], computed[prefill], computed[prefill] + new[prefill] == total[prefill],
                   computed[is_decode], None if proposed is None else new[is_decode])

    @classmethod
    def _from_many_requests(cls, new: np.ndarray, computed: np.ndarray, total: np.ndarray) -> BatchShape:
        """:meth:`from_requests` without proposals, in fewer NumPy calls (a mixed step of chunked
        prefill classifies every running request): each request's uncomputed tokens
        ``total - computed`` once, the same checks and classification in those terms (exact int64
        identities), and the sums taken here instead of validating again in ``__post_init__`` (a
        chunk has at least one token, checked above). The same arrays and sums, so the same shape."""
        if new.size and new.min() < 1:
            raise _no_new_tokens()
        left = total - computed
        if (new > left).any():
            raise _past_the_total()
        is_decode = (new == 1) & (left == 1) & (computed > 0)
        prefill = ~is_decode
        prefill_tokens = new[prefill]
        emits = left[prefill] == prefill_tokens
        decode_context = computed[is_decode]
        prefills, decodes = int(prefill_tokens.size), int(decode_context.size)
        return cls._assembled(prefill_tokens, computed[prefill], emits, decode_context,
                              int(prefill_tokens.sum()) if prefills else 0,
                              float(decode_context.sum()) if decodes else 0.0,
                              int(np.count_nonzero(emits)) if prefills else 0)

    @classmethod
    def _from_few_requests(cls, new: list[int], computed: list[int], total: list[int]) -> BatchShape:
        """:meth:`from_requests` of a few requests (most admissions start one or two prompts),
        with Python's ints instead of a dozen NumPy calls on arrays of one or two elements: the
        same checks, the same arrays (int64, bool) and the same sums (Python's int sums are
        exact, as NumPy's int64 ones are here), so the same shape."""
        if new and min(new) < 1:
            raise _no_new_tokens()
        prefill_tokens: list[int] = []
        prefill_context: list[int] = []
        prefill_emits: list[bool] = []
        decode_context: list[int] = []
        for n, c, t in zip(new, computed, total, strict=True):
            if c + n > t:
                raise _past_the_total()
            if n == 1 and c + 1 == t and c > 0:
                decode_context.append(c)
            else:
                prefill_tokens.append(n)
                prefill_context.append(c)
                prefill_emits.append(c + n == t)
        return cls._assembled(np.array(prefill_tokens, dtype=_INT), np.array(prefill_context, dtype=_INT),
                              np.array(prefill_emits, dtype=bool), np.array(decode_context, dtype=_INT),
                              sum(prefill_tokens), float(sum(decode_context)) if decode_context else 0.0,
                              sum(prefill_emits))

    @classmethod
    def _assembled(cls, prefill_tokens: np.ndarray, prefill_context: np.ndarray, prefill_emits: np.ndarray,
                   decode_context: np.ndarray, prefill_sum: int, decode_context_sum: float,
                   emitting: int) -> BatchShape:
        """A shape without proposals from arrays already checked and their sums already taken (the
        few- and many-request paths of :meth:`from_requests`): ``__post_init__``'s validation and
        sums skipped, the same fields set."""
        decodes = int(decode_context.size)
        shape = object.__new__(cls)
        shape.__dict__.update(
            prefill_tokens=prefill_tokens, prefill_context=prefill_context, prefill_emits=prefill_emits,
            decode_context=decode_context, decode_tokens=None, num_prefills=int(prefill_tokens.size),
            num_decodes=decodes, num_prefill_tokens=prefill_sum, num_decode_tokens=decodes,
            num_new_tokens=prefill_sum + decodes, decode_context_sum=decode_context_sum,
            num_logits=decodes + emitting)
        return shape

    # ------------------------------------------------------------------ sums the cost model uses
    # The sums below are computed once, in __post_init__: the engine reads them several times
    # per step, and (before Python 3.12) functools.cached_property takes a lock on every read.
    num_prefills: int = field(init=False)
    num_decodes: int = field(init=False)
    num_prefill_tokens: int = field(init=False)
    """Prompt tokens computed this step, over all prefill chunks."""
    num_decode_tokens: int = field(init=False)
    """Tokens the decodes compute: one each, plus the proposals they verify."""
    num_new_tokens: int = field(init=False)
    """Rows of every GEMM in this step (the M dimension)."""
    decode_context_sum: float = field(init=False)
    """Tokens cached by all decoding requests together (what decode attention reads)."""
    num_logits: int = field(init=False)
    """Rows of the LM head: every decode token (a verified proposal needs its logits too) and each
    prefill chunk that finishes its prompt."""

    @property
    def verifies(self) -> bool:
        """Whether some decode verifies speculative proposals this step."""
        return self.decode_tokens is not None and self.num_decode_tokens > self.num_decodes

    def without_proposals(self) -> BatchShape:
        """The same step had no request speculated: every decode computes one token."""
        if self.decode_tokens is None:
            return self
        return BatchShape(self.prefill_tokens, self.prefill_context, self.prefill_emits,
                          self.decode_context)

    @property
    def is_empty(self) -> bool:
        return self.num_new_tokens == 0
