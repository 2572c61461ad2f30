"""The front end's way out: one process sends every streamed chunk, one after another.

An engine's server streams each request's tokens through one front-end process (vLLM's API
server, SGLang's tokenizer manager, ``trtllm-serve``): after every step it detokenises, formats
and sends one chunk per request that emitted a token. That work is serial, so the process sends
at most ``1 / chunk_s`` chunks a second. Below that rate it adds microseconds; above it, the
chunks queue, and a client sees its first and last token late: a closed loop's clients then send
their next request late too, until the engine's batch shrinks to what the front end can send.
This is the mechanism behind closed-loop measurements whose TTFT grows with the engine's speed
(more tensor parallelism, longer outputs) while TPOT falls (README, Calibration).

The model is a single FIFO server fed one batch per step (Lindley's recursion): a step ending at
``end`` with ``chunks`` chunks is sent at ``max(end, previous sent) + chunks * chunk_s``; every
chunk of the step is seen then (the front end hands a step's outputs over together). The engine
never waits for it (its scheduler runs in its own process or thread).

What changes: a request's first-token and finish times become the times its client sees them, so
TTFT, TPOT and end-to-end latency are the client's; inter-token gaps stay the engine's (their
lags nearly cancel). Each replica (one server) has its own :class:`OutputStream`.
"""

from __future__ import annotations

from collections.abc import Iterable


class OutputStream:
    """One replica's front-end sender (see the module docstring)."""

    __slots__ = ("chunk_s", "lag", "sent_until")

    def __init__(self, chunk_s: float) -> None:
        self.chunk_s = chunk_s
        """Serial time per chunk (``CpuCosts.frontend_chunk_s``)."""
        self.sent_until = 0.0
        """When the front end has sent everything handed to it so far."""
        self.lag = 0.0
        """How long after its step's end the latest step's chunks were seen."""

    def emit(self, end: float, chunks: int) -> float:
        """A step ending at ``end`` hands over ``chunks`` chunks; returns their lag (0 for none)."""
        if chunks <= 0:
            self.lag = 0.0
            return 0.0
        sent = max(end, self.sent_until) + chunks * self.chunk_s
        self.sent_until = sent
        self.lag = sent - end
        return self.lag

    def emit_steps(self, ends: Iterable[float], chunks: int) -> float:
        """A run of steps ending at ``ends``, each handing over ``chunks`` chunks (a fast-forwarded
        run: the same recursion, step by step); returns the last step's lag."""
        lag = 0.0
        for end in ends:
            lag = self.emit(end, chunks)
        return lag


def open_stream(streams: dict[int, OutputStream], index: int, chunk_s: float) -> OutputStream | None:
    """A new server's front-end sender for replica ``index``, registered in ``streams``
    (``RequestState.streams``, where closed-loop clients look up the lag); None without a
    streaming cost."""
    if not chunk_s:
        return None
    stream = streams[index] = OutputStream(chunk_s)
    return stream
