"""One sweep per folder at a time, and one sweep per folder.

Two sweeps started into the same folder would both run every point (twice the work, racing on
the same run folders), so a running sweep holds an exclusive ``flock`` on ``DIR/.sweep.lock``; a
second one is refused with the holder's pid, host and start time. The lock belongs to the
process: the kernel drops it when the process ends, however it ends (kill -9 included), so a
resumed sweep never finds a stale lock.

A folder also holds one sweep: starting a *different* sweep there (another file, or the same file
edited) would replace its ``results.parquet`` and orphan its runs. Such a start is refused,
naming what differs; ``--force`` replaces the folder's sweep, keeping the runs both share (a
run's name is the hash of everything that decides its result) and deleting the others.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Any

from servesim.errors import ServesimError

LOCK_FILE = ".sweep.lock"


class SweepLock:
    """An exclusive lock on a sweep folder, held until :meth:`release` or the process ends."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def acquire(cls, out_dir: Path) -> SweepLock:
        path = out_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ServesimError("--out", f"cannot create {path}: {exc.strerror}",
                                "choose a writable folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise ServesimError("--out", f"{out_dir} is in use by another sweep ({holder})",
                                "wait for it to finish, or run into another --out folder") from None
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def sweep_difference(held: Any, new: dict[str, Any]) -> str:
    """What differs between the sweep a folder holds (its ``sweep.resolved.yaml`` without the
    points) and a new one; empty when they are the same sweep."""
    if not isinstance(held, dict):
        return "its sweep.resolved.yaml is not a sweep"
    old = {k: v for k, v in held.items() if k != "points"}
    if old == new:
        return ""
    if old.get("name") != new.get("name"):
        return f"it holds sweep {old.get('name')!r}, not {new.get('name')!r}"
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return f"it holds sweep {old.get('name')!r} with other {', '.join(keys)}"
