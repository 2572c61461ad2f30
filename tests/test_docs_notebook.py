"""docs/notebook.md is executed: every ``python`` block runs in one namespace, in order, and what
it prints must equal the ``text`` block right after it (blocks marked ``python notrun`` are
shown, not run). So the notebook example's numbers are real and stay so."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "notebook.md"
FENCE = re.compile(r"```([^\n]*)\n(.*?)```", re.DOTALL)


def blocks() -> list[tuple[str, str | None]]:
    """(code, expected output or None) of every block the page runs."""
    found = [(info.strip(), body) for info, body in FENCE.findall(PAGE.read_text(encoding="utf-8"))]
    out: list[tuple[str, str | None]] = []
    for i, (info, body) in enumerate(found):
        if info != "python":
            continue
        after = found[i + 1] if i + 1 < len(found) else None
        out.append((body, after[1] if after is not None and after[0] == "text" else None))
    return out


def test_the_notebook_page_prints_what_it_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # anything a block writes lands here
    namespace: dict[str, object] = {}
    runnable = blocks()
    assert len(runnable) >= 4
    for number, (code, expected) in enumerate(runnable, start=1):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{PAGE.name} block {number}", "exec"), namespace)
        if expected is not None:
            assert printed.getvalue() == expected, f"block {number} printed:\n{printed.getvalue()}"
