"""Every request's progress, one NumPy array per field (never a Python object per request).

In the unified token-budget view (docs/architecture.md) a request is two numbers: ``computed[r]`` tokens
whose KV is in the cache and ``num_tokens(r) = prompt[r] + generated[r]`` tokens it has. A step
gives it some new tokens to compute; when ``computed`` reaches ``num_tokens`` the step samples one
more output token. A prefill, a chunk of one, a decode and a recompute after preemption are all
this one rule, applied by :meth:`RequestState.complete_step` for every policy.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from servesim.errors import ServesimError

if TYPE_CHECKING:
    from servesim.core.stream_out import OutputStream
    from servesim.workloads.requests import RequestTable


# Life cycle of a request (``status``).
PENDING, WAITING, RUNNING, DONE, REJECTED = 0, 1, 2, 3, 4
TRANSFERRING = 5
"""Disaggregated serving: prefilled, waiting for decode-side blocks or on the KV link."""
STATUS_NAMES = ("pending", "waiting", "running", "completed", "rejected", "transferring")
UNFINISHED_NAME = "unfinished"

REJECT_REASONS = ("", "prompt + output tokens exceed max_model_len",
                  "prompt + output tokens need more KV blocks than the replica's pool holds",
                  "prompt + output tokens need more KV blocks than a decode replica's pool holds")
"""Why a request was refused at arrival; ``reject_reason[r]`` indexes this tuple."""
TOO_LONG, KV_NEVER_FITS, DECODE_KV_NEVER_FITS = 1, 2, 3


INT32_MAX = int(np.iinfo(np.int32).max)
TOKEN_HEADROOM = 1 << 20
"""Tokens a request's counters may pass its prompt + output by (speculative proposals beyond
its last token are counted, then dropped), kept clear of int32's end."""


def token_dtype(prompt: np.ndarray, output: np.ndarray) -> type[np.integer]:
    """The narrowest dtype that holds a request's token count (cached prompt tokens; none exceeds
    prompt + output and a few proposals): int32 unless the workload has a request of some two
    billion tokens (such a request is refused as too long, but its counters still must not
    wrap), then int64."""
    if prompt.size and int(prompt.max()) + int(output.max()) >= INT32_MAX - TOKEN_HEADROOM:
        return np.int64
    return np.int32


SMALL_GAPS = 64
"""Up to this many gaps, :meth:`ItlLog.add` groups them in Python (cheaper than NumPy calls)."""


class ItlLog:
    """Every inter-token latency of the run, stored as (value, count) pairs.

    In a decode step every request that also ran the previous step sees the same gap, so one pair
    covers them all; only requests stalled by a prefill or a preemption add their own values. The
    full distribution over all tokens is kept exactly, without an entry per token. Each pair also
    keeps when it was emitted: a fast-forwarded run (``servesim.core.fast_forward``) writes its
    pairs when it ends, after other replicas' pairs from inside it, and :meth:`arrays` puts them
    back in the order the step-by-step loop writes them (by time).
    """

    __slots__ = ("_settled", "at", "counts", "out_of_order", "values")

    def __init__(self) -> None:
        self.values = array("d")
        self.counts = array("i")
        """How many requests saw each gap (int32: a batch's requests)."""
        self.at = array("d")
        self.out_of_order = False
        self._settled: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        """The pairs written before the last :meth:`arrays` call, in time order (values, counts,
        times): the buffers they came from are dropped, so the log is held once."""

    def add(self, gaps: np.ndarray, now: float) -> None:
        size = int(gaps.size)
        if size == 0:
            return
        if size <= SMALL_GAPS:  # Python's sort of a few floats: np.unique's pairs, without its overhead
            listed = sorted(gaps.tolist())
            if listed[0] == listed[-1]:
                self.values.append(listed[0])
                self.counts.append(size)
                self.at.append(now)
                return
            # Each distinct value and its count, in sorted order (Counter's pairs over the sorted
            # list), by bisecting the few runs of equal values: a step's gaps take one or two
            # values (those that ran the step before, and a stalled or new request)
            i = 0
            while i < size:
                value = listed[i]
                j = bisect_right(listed, value, i)
                self.values.append(value)
                self.counts.append(j - i)
                self.at.append(now)
                i = j
            return
        low, high = gaps.min(), gaps.max()
        if low == high:
            self.values.append(float(low))
            self.counts.append(size)
            self.at.append(now)
            return
        lows, highs = int(np.count_nonzero(gaps == low)), int(np.count_nonzero(gaps == high))
        if lows + highs == size:  # two values (the batch's gap and its new or stalled requests'):
            self.values.extend((float(low), float(high)))  # np.unique's pairs, a sort cheaper
            self.counts.extend((lows, highs))
            self.at.extend((now, now))
            return
        values, counts = np.unique(gaps, return_counts=True)
        self.values.extend(values.tolist())
        self.counts.extend(counts.tolist())
        self.at.extend([now] * int(values.size))

    def add_runs(self, gaps: list[float], count: int, at: list[float]) -> None:
        """``count`` requests each saw every gap of ``gaps``, the one ending at ``at[i]`` (a
        fast-forwarded run of decode steps: one pair per step, as :meth:`add` stores each of
        those steps)."""
        self.values.extend(gaps)
        self.counts.extend([count] * len(gaps))
        self.at.extend(at)
        self.out_of_order = True

    def nbytes(self) -> int:
        """Bytes the pairs hold now (append buffers and settled arrays), without settling them."""
        held = sum(len(buffer) * buffer.itemsize for buffer in (self.values, self.counts, self.at))
        return held + (sum(column.nbytes for column in self._settled) if self._settled is not None else 0)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every pair's value and count (read-only; counts in int32), in the order the
        step-by-step loop writes them (by time: a stable sort when runs wrote theirs late). The
        pairs move out of the append buffers into these arrays one column at a time, each buffer
        dropped once its column is moved (a million-request run's pairs are 3.8 million: the
        buffers and the sorted arrays are never all held at once); pairs written later are merged
        in at the next call, after those at the same time."""
        if self._settled is not None and not len(self.values):
            return self._settled[0], self._settled[1]
        at = self._joined("at")
        # step by step the pairs are in time order
        order = np.argsort(at, kind="stable") if self.out_of_order or self._settled is not None else None
        sorted_at = at.copy() if order is None else at[order]
        del at
        self.at = array("d")
        settled = self._moved("values", order), self._moved("counts", order), sorted_at
        self.out_of_order = False
        for column in settled:
            column.flags.writeable = False
        self._settled = settled
        return settled[0], settled[1]

    def _joined(self, name: str) -> np.ndarray:
        """One column of every pair written (``values``, ``counts`` or ``at``): the settled pairs'
        then the append buffer's (read in place when nothing is settled)."""
        buffer = getattr(self, name)
        column = np.frombuffer(buffer, dtype=np.dtype(buffer.typecode))
        if self._settled is None:
            return column
        index = ("values", "counts", "at").index(name)
        return np.concatenate((self._settled[index], column))

    def _moved(self, name: str, order: np.ndarray | None) -> np.ndarray:
        """:meth:`_joined`'s column in time order (``order``: None when it is already), its
        append buffer emptied."""
        column = self._joined(name)
        moved = column.copy() if order is None else column[order]
        del column
        setattr(self, name, array(getattr(self, name).typecode))
        return moved


class RequestState:
    """Columns of per-request progress and timestamps (seconds, NaN until reached)."""

    def __init__(self, table: RequestTable) -> None:
        n = len(table)
        self.table = table
        # Requests released by others (sessions, agent chains) record when they were sent.
        self.arrival = table.arrival_s if table.links is None else table.arrival_s.copy()
        self.prompt = table.prompt_tokens
        self.output = table.output_tokens
        # The counters every step updates stay int64, the dtype of the batches' arrays they meet:
        # int32 there cost about 6% of a run's CPU in NumPy's mixed-dtype casts, for 12 MB per
        # million requests (measured on the core benchmark). The cold ones are narrow.
        self.computed = np.zeros(n, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)
        self.first_scheduled = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.last_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.max_itl = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int32)  # counters: checked for wrapping (check_counters)
        self.swaps_out = np.zeros(n, dtype=np.int32)  # preemptions that kept the KV in host memory
        self.swaps_in = np.zeros(n, dtype=np.int32)
        self.status = np.zeros(n, dtype=np.int8)
        self.reject_reason = np.zeros(n, dtype=np.int8)
        self.streams: dict[int, OutputStream] = {}
        """Each replica's front-end sender, by replica index, when its engine has a streaming cost
        (:mod:`servesim.core.stream_out`): closed-loop clients read the lag of the step that
        finished their request there."""
        self.replica = np.full(n, -1, dtype=np.int32)
        self.blocks_held = np.zeros(n, dtype=np.int64)  # KV blocks, on the request's replica (hot, as above)
        # prompt tokens found in the prefix cache (written at admission)
        self.cached_tokens = np.zeros(n, dtype=token_dtype(self.prompt, self.output))
        self.itl = ItlLog()
        self.done_listeners: list[Callable[[np.ndarray, float], None]] = []
        """Called with the requests that just completed and the time (requests released by
        completions, :mod:`servesim.core.release`, and autoscalers listen here)."""
        self._transit: dict[str, np.ndarray] = {}
        """Disaggregated serving's columns (:data:`TRANSIT_COLUMNS`), made on first use: a
        colocated run never holds them."""

    # Disaggregated serving only (NaN / -1 otherwise): ``replica`` is then the prefill replica.
    def _transit_column(self, name: str) -> np.ndarray:
        column = self._transit.get(name)
        if column is None:
            column = self._transit[name] = (np.full(len(self), -1, dtype=np.int32) if name == "decode_replica"
                                            else np.full(len(self), np.nan))
        return column

    @property
    def decode_replica(self) -> np.ndarray:
        return self._transit_column("decode_replica")

    @property
    def prefill_end(self) -> np.ndarray:
        """The prompt's KV is complete on the prefill replica."""
        return self._transit_column("prefill_end")

    @property
    def transfer_queued(self) -> np.ndarray:
        """The decode replica reserved its blocks and asked the link for a channel."""
        return self._transit_column("transfer_queued")

    @property
    def transfer_start(self) -> np.ndarray:
        return self._transit_column("transfer_start")

    @property
    def transfer_end(self) -> np.ndarray:
        """The KV has arrived on the decode replica: the first token is emitted then."""
        return self._transit_column("transfer_end")

    def check_counters(self) -> None:
        """Refuse a run whose int32 event counters wrapped (each grows by one per event, so a
        wrap shows as a negative count): never a silently wrong table."""
        for name in ("preemptions", "swaps_out", "swaps_in"):
            column = getattr(self, name)
            if column.size and int(column.min()) < 0:
                raise ServesimError(name, f"a request was counted more than {INT32_MAX:,} times",
                                    "simulate fewer requests or a shorter window")

    def __len__(self) -> int:
        return int(self.arrival.size)

    def num_tokens(self, request: int) -> int:
        return int(self.prompt[request] + self.generated[request])

    def complete_step(self, ids: np.ndarray, new_tokens: np.ndarray, now: float,
                      decode_only: bool = False, accepted: np.ndarray | None = None) -> np.ndarray:
        """Credit a finished step: ``ids[i]`` computed ``new_tokens[i]`` more tokens at ``now``.

        Requests whose computed count reaches their token count sample one token; their first
        sets ``first_token``, later ones add an inter-token gap. Returns the ids that emitted
        their last output token (the caller frees their blocks). ``decode_only`` says every
        request decoded one token after an earlier one (so all emit, none for the first time),
        which skips those checks on the engine's most frequent path.

        Speculative decoding: ``accepted[i]`` proposals of ``ids[i]`` were accepted, and its
        ``new_tokens[i]`` counts only the tokens whose KV is kept (its last token and the accepted
        proposals). Such a request's computed count then passes its token count by ``accepted[i]``
        and it emits ``1 + accepted[i]`` tokens at once: one chunk, so one inter-token gap.
        """
        if decode_only:
            self.computed[ids] += 1
            return self._emit(ids, now, may_be_first=False)
        if accepted is None and ids.size == 1:
            return self._complete_one(ids, int(new_tokens[0]), now)
        return self._complete_many(ids, new_tokens, now, accepted)

    def emitting(self, ids: np.ndarray, new_tokens: np.ndarray) -> np.ndarray:
        """Which of ``ids`` will emit a token when a step computing ``new_tokens`` more is
        credited (read before it is): their computed tokens reach their prompt plus the tokens
        they have generated, :meth:`_complete_many`'s rule (``>=``: a speculative step's accepted
        proposals, drawn as it is credited, pass it)."""
        return self.computed[ids] + new_tokens >= self.prompt[ids] + self.generated[ids]

    def _complete_one(self, ids: np.ndarray, new_tokens: int, now: float) -> np.ndarray:
        """:meth:`complete_step` of one request (most prefill steps start one prompt), with scalar
        reads and writes instead of some twenty NumPy calls on arrays of one element: the same
        values written (``fmax`` keeps the larger gap, or the one that is not NaN) and the same
        ITL pair (``tests/test_core_fast_paths.py`` compares whole runs both ways)."""
        request = int(ids[0])
        computed = int(self.computed[request]) + new_tokens
        self.computed[request] = computed
        generated = int(self.generated[request])
        if computed != int(self.prompt[request]) + generated:
            return ids[:0]
        generated += 1
        self.generated[request] = generated
        last = float(self.last_token[request])
        if math.isnan(last):
            self.first_token[request] = now
        else:
            gap = now - last
            itl = self.itl
            itl.values.append(gap)
            itl.counts.append(1)
            itl.at.append(now)
            previous = float(self.max_itl[request])
            if math.isnan(previous) or gap > previous:
                self.max_itl[request] = gap
        self.last_token[request] = now
        if generated < int(self.output[request]):
            return ids[:0]
        finished = ids.copy()
        self.finish[request] = now
        self.status[request] = DONE
        for listen in self.done_listeners:
            listen(finished, now)
        return finished

    def _complete_many(self, ids: np.ndarray, new_tokens: np.ndarray, now: float,
                       accepted: np.ndarray | None) -> np.ndarray:
        """:meth:`complete_step` of any batch that is not all decodes."""
        computed = self.computed[ids] + new_tokens
        self.computed[ids] = computed
        if accepted is not None:
            emits = computed == self.prompt[ids] + self.generated[ids] + accepted
            return self._emit(ids[emits], now, may_be_first=True, counts=1 + accepted[emits])
        emits = computed == self.prompt[ids] + self.generated[ids]
        every = np.count_nonzero(emits) == emits.size
        return self._emit(ids if every else ids[emits], now, may_be_first=True)

    def complete_prefill(self, ids: np.ndarray, new_tokens: np.ndarray) -> np.ndarray:
        """Credit a step on a prefill-only replica: ``ids[i]`` computed ``new_tokens[i]`` more
        prompt tokens. Nothing is emitted there; returns the ids whose whole prompt is now in the
        cache, ready to hand their KV to a decode replica."""
        computed = self.computed[ids] + new_tokens
        self.computed[ids] = computed
        ready = computed >= self.prompt[ids] + self.generated[ids]
        return ids if ready.all() else ids[ready]

    def land(self, ids: np.ndarray, now: float, sent: float | None = None) -> np.ndarray:
        """The prompt KV of ``ids`` arrived on their decode replica at ``now`` (its last byte left
        the link at ``sent``, default ``now``: the rest is the engine's hand-off): they emit their
        first token there (disaggregated TTFT includes the transfer). Returns those now done
        (one-token outputs)."""
        self.transfer_end[ids] = now if sent is None else sent
        return self._emit(ids, now, may_be_first=True)

    def _emit(self, emitted: np.ndarray, now: float, may_be_first: bool,
              counts: np.ndarray | int = 1) -> np.ndarray:
        """``emitted`` each sample one token (``counts`` tokens: speculative decoding) at ``now``,
        delivered together (one inter-token gap each); returns those that are now done."""
        if emitted.size == 0:
            return emitted
        generated = self.generated[emitted] + counts
        self.generated[emitted] = generated
        last = self.last_token[emitted]
        first = np.isnan(last) if may_be_first else None
        if first is not None and np.count_nonzero(first):
            self.first_token[emitted[first]] = now
            later = ~first
            self._note_gaps(emitted[later], now - last[later], now)
        else:
            self._note_gaps(emitted, now - last, now)
        self.last_token[emitted] = now
        done = generated >= self.output[emitted]
        if not np.count_nonzero(done):
            return emitted[:0]
        finished = emitted[done]
        self.finish[finished] = now
        self.status[finished] = DONE
        for listen in self.done_listeners:
            listen(finished, now)
        return finished

    def _note_gaps(self, ids: np.ndarray, gaps: np.ndarray, now: float) -> None:
        if gaps.size == 0:
            return
        self.itl.add(gaps, now)
        previous = self.max_itl[ids]
        self.max_itl[ids] = np.fmax(previous, gaps)
