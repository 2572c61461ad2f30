"""Reading a user's file: bytes to text to a parsed document, every failure one line.

Each reader names the file and the place in it (line and column for YAML and JSON), and turns
every way reading can fail into a :class:`~servesim.errors.ServesimError`: a missing or
unreadable file, bytes that are not UTF-8 (a Latin-1 byte, a binary file), malformed syntax,
nesting deeper than Python's parser can follow. ``field`` is what the caller calls the file (the
experiment's ``hardware`` key, ``--model``, ``workload.trace.path``) and leads the message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from servesim.errors import ServesimError


def read_text(path: Path, field: str) -> str:
    """The file as UTF-8 text (a byte-order mark is dropped)."""
    try:
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


def load_yaml_text(text: str, source: str, field: str) -> Any:
    """Parse YAML ``text`` read from ``source`` (a path, or ``--set``)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        detail = getattr(exc, "problem", None) or "cannot parse"
        column = f" at column {mark.column + 1}" if mark else ""
        raise ServesimError(field, f"{source}: malformed YAML{where}",
                            f"fix the syntax{column} ({detail})") from None
    except RecursionError:
        raise ServesimError(field, f"{source}: YAML nested too deeply to read",
                            "flatten the document") from None


def read_yaml(path: Path, field: str) -> Any:
    """The YAML document in ``path`` (None for an empty file)."""
    return load_yaml_text(read_text(path, field), str(path), field)


def yaml_mapping(path: Path, field: str, what: str = "key: value pairs") -> dict[str, Any]:
    """The YAML document in ``path``, which must be a mapping (an empty file is an empty one)."""
    document = read_yaml(path, field)
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ServesimError(field, f"{path} holds a {type(document).__name__}, not a mapping",
                            f"write {what} at the top level")
    return document


def read_json(path: Path, field: str) -> Any:
    """The JSON document in ``path``."""
    text = read_text(path, field)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ServesimError(field, f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                            f"{exc.msg})", "fix the file") from None
    except RecursionError:
        raise ServesimError(field, f"{path}: JSON nested too deeply to read",
                            "flatten the document") from None
