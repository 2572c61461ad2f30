"""The judge and the record of the input fuzzing (``test_fuzz_inputs.py``).

Each generated input is handed to the reader or pipeline stage that owns it under a per-case
CPU-time limit, and judged GOOD when it either works (and whatever it produced is finite: a
summary is valid JSON) or fails with one :class:`ServesimError` line that names a field and a fix.
Anything else (another exception: a traceback; the time limit: a hang; a result with NaN or
infinity) is BAD. Every case is written to a corpus folder (``SERVESIM_FUZZ_CORPUS``, else a
temporary one) with its verdict, so a failure can be replayed and the corpus counted.
"""

from __future__ import annotations

import json
import math
import os
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from servesim.errors import ServesimError

CASE_CPU_S = float(os.environ.get("SERVESIM_FUZZ_CASE_S", "20"))
"""CPU seconds one case may take (a hang burns CPU; the slowest GOOD case takes well under 1 s)."""


class CaseTimeout(BaseException):
    """The per-case limit (BaseException: no ``except Exception`` in servesim can swallow it)."""


def _expired(signum: int, frame: FrameType | None) -> None:
    raise CaseTimeout


@dataclass
class Corpus:
    folder: Path
    verdicts: list[dict[str, Any]] = field(default_factory=list)

    def __repr__(self) -> str:  # hypothesis prints the fixture with a failing case: keep it short
        return f"Corpus({self.folder}, {len(self.verdicts)} cases)"

    def judge(self, kind: str, payload: bytes | str, suffix: str, call: Callable[[Path], Any]) -> str:
        """Write ``payload`` as a file, run ``call(file)`` under the limit, record and return the
        verdict line (``GOOD ...`` or ``BAD ...``)."""
        number = len(self.verdicts)
        case_dir = self.folder / kind
        case_dir.mkdir(parents=True, exist_ok=True)
        path = case_dir / f"{number:05d}{suffix}"
        path.write_bytes(payload.encode() if isinstance(payload, str) else payload)
        verdict = judge(lambda: call(path))
        record = {"case": number, "kind": kind, "file": str(path.relative_to(self.folder)),
                  "verdict": verdict}
        self.verdicts.append(record)
        with (self.folder / "index.jsonl").open("a", encoding="utf-8") as index:
            index.write(json.dumps(record) + "\n")
        return verdict


def judge(call: Callable[[], Any]) -> str:
    previous = signal.signal(signal.SIGVTALRM, _expired)
    signal.setitimer(signal.ITIMER_VIRTUAL, CASE_CPU_S)
    try:
        produced = call()
    except ServesimError as exc:
        text = str(exc)
        if "\n" in text or "Traceback" in text or not exc.field or not exc.fix:
            return f"BAD error not one line with a field and a fix: {text!r}"
        return f"GOOD error: {text}"
    except CaseTimeout:
        return f"BAD no answer within {CASE_CPU_S:g} CPU seconds (a hang)"
    except Exception as exc:
        return "BAD traceback: " + " | ".join(traceback.format_exception_only(exc)).strip()
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
    bad = non_finite(produced)
    return f"BAD result holds {bad}" if bad else "GOOD ran"


def non_finite(value: Any, where: str = "result") -> str:
    """The first NaN or infinity in a result (a dict or list of numbers), else ''."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} at {where}"
    if isinstance(value, dict):
        for key, item in value.items():
            if found := non_finite(item, f"{where}.{key}"):
                return found
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if found := non_finite(item, f"{where}[{i}]"):
                return found
    return ""
