"""PyYAML's safe loader with servesim's limits, and its failures as one line each.

Loaded by :func:`servesim.inputs.files.load_yaml_text` when a text is parsed, not when the readers
are imported: a document the per-user cache holds (:mod:`servesim.inputs.parse_cache`) is read back
without PyYAML, so ``servesim models``, ``hardware``, ``step`` and ``validate`` start without it.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from servesim.errors import ServesimError
from servesim.inputs.limits import DocumentTooLarge, check_shape


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


def parse_yaml_text(text: str, source: str, field: str) -> Any:
    """Parse YAML ``text`` read from ``source`` (a path, or ``--set``): what
    :func:`servesim.inputs.files.load_yaml_text` does."""
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
