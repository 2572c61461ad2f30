"""One strict base for every YAML schema, and one converter from pydantic errors to one line.

Every section a user writes (experiment, sweep, capacity, hardware profile, engine, policy and
router knobs, topology keys) is a pydantic model on :class:`StrictModel`, so a misspelt key is
an error, never silently ignored. :func:`user_error` turns the first problem of a
``ValidationError`` into ``<field>: <problem>; <fix>``:

- an unknown key: ``deployment.tpp: unknown key; remove it or use one of: tp, replicas, ...``
  (the keys allowed at that place, read from the schema);
- a missing key: ``workload.arrival.rate: is required; add rate: ...`` (or the schema's own fix);
- a bad value: ``deployment.tp: Input should be greater than or equal to 1 (got 0); fix the value``.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from servesim.errors import ServesimError

M = TypeVar("M", bound=BaseModel)


def _number_kind(annotation: Any) -> str:
    """``"number"`` when ``annotation`` admits numbers and no bool (``int``, ``float | None``,
    ``Annotated[float, ...]``), ``"items"`` when it is a list, tuple or mapping of such numbers,
    ``""`` otherwise (``bool``, ``str``, ``Any``, models)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _number_kind(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        kinds = {_number_kind(arg) for arg in typing.get_args(annotation) if arg is not type(None)}
        return kinds.pop() if len(kinds) == 1 else ""
    if origin in (list, tuple, dict):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return "items" if args and _number_kind(args[-1]) == "number" else ""
    if annotation in (int, float):
        return "number"
    return ""


def _refuse_bools(value: Any, kind: str) -> None:
    """YAML reads ``yes``, ``on`` and ``true`` as booleans, and pydantic would take them as 1:
    a number field given one is an error instead."""
    if kind == "number" and isinstance(value, bool):
        raise ValueError(f"Input should be a number, not {str(value).lower()}")
    if kind == "items" and isinstance(value, dict | list | tuple):
        items = value.values() if isinstance(value, dict) else value
        for item in items:
            if isinstance(item, bool):
                raise ValueError(f"Input should hold numbers, not {str(item).lower()}")


class _InputModel(BaseModel):
    """What every user-facing schema shares: unknown keys are errors, a float must be finite
    (``.inf`` and ``.nan`` are refused wherever a number is read, so no infinity reaches a
    summary, a hash or the clock), and a boolean is not a number.

    Validators are built on a model's first use (``defer_build``), not when its module is
    imported: a command imports dozens of schemas and validates a few. Importing the config,
    cost model, engines and pipeline took 0.42 s of CPU instead of 0.46 (min of 10); the light
    commands, which build most of what they import anyway, did not move measurably."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)
    _number_kinds: ClassVar[dict[str, str]]

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, data: Any) -> Any:
        if isinstance(data, dict):
            kinds = cls.__dict__.get("_number_kinds")
            if kinds is None:
                kinds = {name: kind for name, f in cls.model_fields.items()
                         if (kind := _number_kind(f.annotation))}
                type.__setattr__(cls, "_number_kinds", kinds)
            for name, kind in kinds.items():
                if name in data:
                    try:
                        _refuse_bools(data[name], kind)
                    except ValueError as exc:
                        raise PydanticCustomError("bool_number", str(exc), {"field": name}) from None
        return data


class StrictModel(_InputModel):
    """A YAML section: unknown keys are errors, numbers finite and not booleans."""


class OmitsUnsetExtensions(StrictModel):
    """A section that leaves optional keys added after its first release (``EXTENSIONS``) out of
    its dump while they hold their default, so the resolved configs and sweep run names of
    configs that do not use them stay as they were."""

    EXTENSIONS: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in self.EXTENSIONS:
            if key in data and data[key] == type(self).model_fields[key].default:
                del data[key]
        return data


class FrozenModel(_InputModel):
    """A YAML section whose parsed value is immutable (hashable knobs, shared profiles)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


class NamedSection(BaseModel):
    """A section that picks a component by ``name`` and passes the other keys to it as knobs
    (``policy``, ``router``, ``engine``): the component's own schema checks them once it is known."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    name: str | None = None

    def knobs(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if k != "name"}


def _default_missing_fix(field: str, key: str) -> str:
    return f"add {key}: ..."


def user_error(exc: ValidationError, root: type[BaseModel], *, at: str = "", file: str = "",
               missing_fix: Callable[[str, str], str] = _default_missing_fix,
               value_fix: str = "fix the value", unknown_first: bool = True,
               drop: Callable[[list[str]], list[str]] | None = None) -> ServesimError:
    """The first problem of ``exc`` (raised validating ``root``) as one line.

    ``at`` is the dotted key the model sits under (``workload``, ``policy``); ``file`` the file
    it came from, which then leads the field (``h100.yaml: memory.bandwidth_Bps``).
    ``missing_fix(field, key)`` words the fix for a missing key. ``unknown_first`` reports a
    misspelt key before any other problem (the key it should have been is then "missing" too).
    ``drop`` removes parts of a location that are not keys (a union's tag)."""
    errors = exc.errors()
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0]) if unknown_first \
        else errors[0]
    loc = [str(part) for part in error["loc"] if not str(part).startswith("function-")]
    if error["type"] == "bool_number":  # raised for the whole model, about one of its keys
        loc.append(str(error.get("ctx", {}).get("field", "")))
    shown = _without_tags(root, loc)
    if drop is not None:
        shown = drop(shown)
    field = ".".join([part for part in (at, *shown) if part])
    if file:
        field = f"{file}: {field}" if field else file
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = allowed_keys(root, loc[:-1])
        fix = f"remove it or use one of: {', '.join(allowed)}" if allowed else "remove it"
        return ServesimError(field, "unknown key", fix)
    if kind == "missing":
        return ServesimError(field, "is required", missing_fix(field, loc[-1] if loc else field))
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        key = str(error.get("ctx", {}).get("discriminator", "")).strip("'")
        tags = _tags_at(root, loc)
        return ServesimError(field, f"needs {key}" if kind == "union_tag_not_found"
                             else f"unknown {key} {error.get('ctx', {}).get('tag')!r}",
                             f"use {key}: one of {', '.join(tags)}" if tags else f"fix {key}")
    got = error.get("input")
    shown_value = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    message = error["msg"].removeprefix("Value error, ").rstrip(".")
    return ServesimError(field, f"{message}{shown_value}", value_fix)


def parse_model(model: type[M], data: Any, *, at: str = "", file: str = "",
                missing_fix: Callable[[str, str], str] = _default_missing_fix,
                value_fix: str = "fix the value") -> M:
    """``model`` validated from ``data``; the first problem raised as one line (see
    :func:`user_error`)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise user_error(exc, model, at=at, file=file, missing_fix=missing_fix,
                         value_fix=value_fix) from None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation admits (``X | None``, ``Annotated[X | Y, ...]``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def allowed_keys(root: type[BaseModel], loc: list[str]) -> list[str]:
    """The keys allowed at ``loc`` inside ``root`` (for "unknown key" hints); a union's tag in
    ``loc`` (``prompt.fixed``) picks that member."""
    model: type[BaseModel] = root
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        fields = model.model_fields
        if part not in fields:
            return []
        candidates = _models_in(fields[part].annotation)
        if not candidates:
            return []
        model = candidates[0]
        if len(candidates) > 1 and parts:
            tagged = [m for m in candidates if _tag(m) == parts[0]]
            if tagged:
                model = tagged[0]
                parts.pop(0)
    return list(model.model_fields)


def _without_tags(root: type[BaseModel], loc: list[str]) -> list[str]:
    """``loc`` without the union tags pydantic puts in it (``prompt.fixed.value`` is the key
    ``prompt.value`` of the ``fixed`` member)."""
    shown: list[str] = []
    model: type[BaseModel] | None = root
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        shown.append(part)
        if model is None or part not in model.model_fields:
            shown += parts
            break
        candidates = _models_in(model.model_fields[part].annotation)
        model = candidates[0] if candidates else None
        if len(candidates) > 1 and parts:
            tagged = [m for m in candidates if _tag(m) == parts[0]]
            if tagged:
                model = tagged[0]
                parts.pop(0)
    return shown


def _tags_at(root: type[BaseModel], loc: list[str]) -> list[str]:
    """The tags of the union at ``loc`` (the values its discriminator may take)."""
    model: type[BaseModel] = root
    for part in loc[:-1]:
        candidates = _models_in(model.model_fields[part].annotation) if part in model.model_fields else []
        if not candidates:
            return []
        model = candidates[0]
    last = loc[-1] if loc else ""
    if last not in model.model_fields:
        return []
    return [tag for m in _models_in(model.model_fields[last].annotation) if (tag := _tag(m)) is not None]


def _tag(model: type[BaseModel]) -> str | None:
    """The literal value a discriminated union member is tagged with (its first Literal field)."""
    for info in model.model_fields.values():
        if typing.get_origin(info.annotation) is typing.Literal:
            args = typing.get_args(info.annotation)
            if len(args) == 1:
                return str(args[0])
    return None
