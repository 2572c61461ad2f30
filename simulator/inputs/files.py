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

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from servesim.errors import ServesimError
from servesim.inputs.limits import (
    MAX_DOCUMENT_BYTES,
    DocumentTooLarge,
    check_shape,
    plain_children,
)
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


def _node_children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


class _Mark(Exception):
    """A problem at a place in a YAML text (becomes one line naming the line and column)."""

    def __init__(self, mark: Any, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.mark, self.problem, self.fix = mark, problem, fix


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what would exhaust the program later (see
    :mod:`servesim.inputs.limits`) and a mapping key given twice (PyYAML keeps the last one
    silently, so a duplicated ``rate:`` would run the value the reader did not look at)."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        try:
            check_shape(node, _node_children, shared=True)
        except DocumentTooLarge as exc:
            raise _Mark(None, exc.problem, exc.fix) from None
        return self.construct_document(node)

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # a date out of range, an int of 5,000 digits
            if isinstance(exc, yaml.YAMLError):
                raise
            shown = node.value if isinstance(node, ScalarNode) else node.tag
            text = str(shown) if len(str(shown)) <= 40 else str(shown)[:37] + "..."
            detail = str(exc).split(";")[0]
            raise _Mark(node.start_mark, f"cannot read the value {text!r} ({detail})",
                        "quote it to keep it as text, or fix it") from None

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise _Mark(key_node.start_mark, f"the key {key_node.value!r} is given twice",
                                "keep one of them")
                seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml_text(text: str, source: str, field: str) -> Any:
    """Parse YAML ``text`` read from ``source`` (a path, or ``--set``)."""
    loader: BoundedLoader | None = None
    try:
        loader = BoundedLoader(text)  # the reader refuses control characters here
        return loader.get_single_data()
    except _Mark as exc:
        where = f" at line {exc.mark.line + 1}, column {exc.mark.column + 1}" if exc.mark else ""
        raise ServesimError(field, f"{source}{where}: {exc.problem}", exc.fix) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        detail = getattr(exc, "problem", None) or "cannot parse"
        if isinstance(exc, yaml.reader.ReaderError):  # a control character (YAML forbids them)
            where = f" at line {text.count(chr(10), 0, exc.position) + 1}"
            detail = f"character {exc.character!r} is not allowed in YAML"
        column = f" at column {mark.column + 1}" if mark else ""
        raise ServesimError(field, f"{source}: malformed YAML{where}",
                            f"fix the syntax{column} ({detail})") from None
    except RecursionError:
        raise ServesimError(field, f"{source}: YAML nested too deeply to read",
                            "flatten the document") from None
    finally:
        if loader is not None:
            loader.dispose()


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
