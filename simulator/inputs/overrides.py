"""``--set key=value``: one override of a YAML document's dotted key, its value read as YAML."""

from __future__ import annotations

from typing import Any

from servesim.errors import ServesimError
from servesim.inputs.files import load_yaml_text


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"deployment.tp=2"`` -> (["deployment", "tp"], 2); a value that is not valid YAML is
    kept as the string it is (``--set name=a: b``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ServesimError("--set", f"{text!r} is not path.to.key=value", "write e.g. --set deployment.tp=2")
    if not raw.strip():
        return key.split("."), None
    try:
        value = load_yaml_text(raw, f"--set {key}", f"--set {key}")
    except ServesimError:
        value = raw
    return key.split("."), value


def set_dotted(document: dict[str, Any], path: list[str], value: Any, field: str) -> None:
    """``document[a][b][c] = value`` for ``path == [a, b, c]``, creating sections on the way."""
    node = document
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ServesimError(field, f"{part!r} is a value, not a section", f"set {part} itself")
        node = child
    node[path[-1]] = value


def apply_overrides(document: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply every ``--set`` to ``document`` in order (it is changed in place and returned)."""
    for text in overrides:
        path, value = parse_override(text)
        set_dotted(document, path, value, f"--set {'.'.join(path)}")
    return document
