"""Writing files whole or not at all.

Every output (run tables, summaries, reports, sweep points) is written to a temporary file in the
target's folder and renamed into place, so an interrupted run or sweep never leaves a truncated
file that a later reader (or a resumed sweep) would trust.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from servesim.errors import ServesimError


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_current_umask()


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it to ``path``
    (whatever ``write`` returns, such as a count of bytes written, is ignored)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise write_error(path, exc) from None
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; give the file the usual mode
        os.replace(tmp, path)
    except OSError as exc:  # disk full, quota, read-only: the old file (if any) is untouched
        raise write_error(path, exc) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_error(path: Path, exc: OSError) -> ServesimError:
    """A failed write as one line: which file, why (no space left, permission), and the fix."""
    reason = exc.strerror or str(exc)
    fix = ("free some space and run again" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
           else "choose a writable folder (--out) and run again")
    return ServesimError(str(path), f"could not be written: {reason}", fix)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def make_output_dir(folder: Path, named: Path | None = None) -> None:
    """Create an output folder (and its parents) before any long work starts, or fail with the
    one-line ``--out`` error; ``named`` is the folder the user gave, when ``folder`` is inside it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServesimError("--out", f"cannot create {named or folder}: {exc.strerror}",
                            "choose a writable folder") from None
