"""A per-user cache of parsed YAML documents, so start-up does not re-parse unchanged files.

PyYAML's pure-Python parser reads a hardware profile (about 10 KB of curves) in some 20 ms, and
``servesim hardware`` reads all fifteen: most of its start-up. libyaml's parser would be faster
but says different things about bad input depending on the PyYAML build installed, so the one
parser stays and its *result* is kept instead: keyed by the SHA-256 of the file's text and this
module's :data:`FORMAT`, stored with :mod:`marshal` (the document is plain data: dicts, lists,
strings, numbers, booleans, None; marshal keeps int keys and shared aliases, which JSON would not,
and it never runs code, unlike pickle), written atomically. A document marshal cannot hold (a
YAML timestamp) is simply not cached. Any problem with the cache (unwritable folder, a damaged or
foreign file) falls back to parsing, so the cache can change how fast servesim starts, never
what it reads: a bad file is parsed (and refused) every time, since only successful parses are
stored.

Where: ``$SERVESIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/servesim``, else ``~/.cache/servesim``;
``SERVESIM_CACHE_DIR=off`` turns it off. Entries are a few KB each and never go stale (the key is
the content); deleting the folder is always safe.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = b"servesim-yaml-1"
"""Part of every key: change it when the loader's output for the same text changes."""
MIN_BYTES = 1024
"""Smaller files parse faster than a cache lookup is worth."""
OFF = "off"


def cache_dir() -> Path | None:
    """The cache folder, or None when turned off."""
    explicit = os.environ.get("SERVESIM_CACHE_DIR")
    if explicit is not None:
        return None if explicit.strip().lower() in (OFF, "") else Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servesim"


def _entry(text: str) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    digest = hashlib.sha256(FORMAT + b"\0" + text.encode("utf-8", "surrogatepass")).hexdigest()
    return folder / "yaml" / f"{digest}.marshal"


def cached_parse(text: str, parse: Callable[[], Any]) -> Any:
    """``parse()``'s document for ``text``, from the cache when it holds it."""
    if len(text) < MIN_BYTES:
        return parse()
    try:
        entry = _entry(text)
    except (OSError, RuntimeError, UnicodeError):  # no home folder, an unencodable character
        entry = None
    if entry is None:
        return parse()
    try:
        with entry.open("rb") as handle:
            return marshal.load(handle)
    except (OSError, EOFError, ValueError, TypeError):
        pass  # not cached yet, or unreadable: parse
    document = parse()
    _store(entry, document)
    return document


def _store(entry: Path, document: Any) -> None:
    """Write ``document`` to ``entry`` atomically, or nothing if it cannot be."""
    try:
        data = marshal.dumps(document)
    except ValueError:  # a timestamp or another object marshal does not hold
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=".marshal")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, entry)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return
