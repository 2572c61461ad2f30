"""Reading a user's file: bytes to text to a parsed document, every failure one line.

Each reader names the file and the place in it (line and column for YAML and JSON), and turns
every way reading can fail into a :class:`~servesim.errors.ServesimError`: a missing or
unreadable file, a file too large to be a config (:mod:`servesim.inputs.limits`), bytes that are
not UTF-8 (a Latin-1 byte, a binary file), malformed syntax, a value YAML cannot build (a date
such as ``2023-13-45``, an integer of thousands of digits), a key given twice, aliases that
expand beyond the budget ("billion laughs"), nesting deeper than any config needs. ``field`` is
what the caller calls the file (the experiment's ``hardware`` key, ``--model``,
``workload.trace.path``) and leads the message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servesim.errors import ServesimError
from servesim.inputs.limits import MAX_DOCUMENT_BYTES, DocumentTooLarge, check_shape, plain_children
from servesim.inputs.parse_cache import cached_parse


def read_text(path: Path, field: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """The file as UTF-8 text (a byte-order mark is dropped); a file over ``max_bytes`` is
    refused before it is read."""
    try:
        size = path.stat().st_size
        if size > max_bytes and path.is_file():
            raise ServesimError(field, f"{path} is {size / 2**20:,.1f} MiB, more than the "
                                f"{max_bytes / 2**20:,.0f} MiB servesim reads from such a file",
                                "check that this is the right file, or split it") from None
        data = path.read_bytes()
    except FileNotFoundError:
        raise ServesimError(field, f"{path} not found", "check the path") from None
    except IsADirectoryError:
        raise ServesimError(field, f"{path} is a folder, not a file", "give the file's path") from None
    except OSError as exc:
        raise ServesimError(field, f"cannot read {path}: {exc.strerror}", "check the path") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        byte = data[exc.start:exc.start + 1].hex()
        raise ServesimError(field, f"{path} is not UTF-8 text (byte 0x{byte} at line {line})",
                            "save it as UTF-8") from None


def file_version(path: Path) -> tuple[str, int, int] | None:
    """(resolved path, modification time, size) of an existing file, None otherwise: a cache key
    that changes when the file does, so a parsed profile or model is reused only while its file is
    unchanged (a sweep of 2,000 points reads each once, not 2,000 times)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return str(path.resolve()), stat.st_mtime_ns, stat.st_size


def load_yaml_text(text: str, source: str, field: str) -> Any:
    """Parse YAML ``text`` read from ``source`` (a path, or ``--set``)."""
    from servesim.inputs.yaml_text import parse_yaml_text  # here: a cached document needs no PyYAML

    return parse_yaml_text(text, source, field)


def read_yaml(path: Path, field: str) -> Any:
    """The YAML document in ``path`` (None for an empty file); an unchanged text's parse is reused
    from the per-user cache (:mod:`servesim.inputs.parse_cache`)."""
    text = read_text(path, field)
    return cached_parse(text, lambda: load_yaml_text(text, str(path), field))


def yaml_mapping(path: Path, field: str, what: str = "key: value pairs") -> dict[str, Any]:
    """The YAML document in ``path``, which must be a mapping (an empty file is an empty one)."""
    document = read_yaml(path, field)
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ServesimError(field, f"{path} holds a {type(document).__name__}, not a mapping",
                            f"write {what} at the top level")
    return document


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: Path, field: str) -> Any:
    """The JSON document in ``path`` (standard JSON: ``NaN`` and ``Infinity`` are refused)."""
    text = read_text(path, field)
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ServesimError(field, f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                            f"{exc.msg})", "fix the file") from None
    except ValueError as exc:  # NaN / Infinity, or an integer of thousands of digits
        raise ServesimError(field, f"{path} is not valid JSON ({exc})", "write a finite number") from None
    except RecursionError:
        raise ServesimError(field, f"{path}: JSON nested too deeply to read",
                            "flatten the document") from None
    try:
        check_shape(document, plain_children, shared=False)
    except DocumentTooLarge as exc:
        raise ServesimError(field, f"{path}: {exc.problem}", exc.fix) from None
    return document
