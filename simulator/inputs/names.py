"""Run names that are safe folder names.

An experiment's, sweep's or capacity question's ``name`` becomes a folder (``runs/<name>``,
``sweeps/<name>``, ``runs/capacity-<name>``) when no ``--out`` is given. A name with a path
separator or ``..`` would write outside those folders (``name: ../../etc``), so such names are
refused, with a safe spelling offered as the fix, rather than silently rewritten: the name is also
the run's label in summaries and reports.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

MAX_NAME_CHARS = 128
_UNSAFE = re.compile(r"[/\\\x00-\x1f\x7f]")


def safe_spelling(name: str) -> str:
    """``name`` as one folder name: its path parts (without ``.`` and ``..``) joined by ``-``."""
    parts = [p.strip() for p in _UNSAFE.split(name) if p.strip() not in ("", ".", "..")]
    return "-".join(parts).lstrip(".")[:MAX_NAME_CHARS] or "run"


def check_run_name(name: str) -> str:
    """``name`` if it is one safe folder name; a ValueError saying why and what to write instead."""
    if not name.strip():
        raise ValueError("a name cannot be empty; write e.g. name: my-run")
    if _UNSAFE.search(name) or name in (".", "..") or name.startswith(".."):
        raise ValueError("is not a safe folder name (no /, \\, control characters or leading ..); "
                         f"write e.g. name: {safe_spelling(name)}")
    return name


RunName = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(check_run_name)]
"""A ``name`` field that becomes a default output folder."""
