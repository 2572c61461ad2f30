"""The sweep file: one base experiment, the keys to vary, and how to combine them.

A sweep runs many variants of one experiment and tabulates them side by side. The file::

    name: tp-70b                      # optional; default: the file's stem
    base: quickstart                  # a built-in experiment name, a path relative to this file,
                                      # or the experiment itself as an inline mapping
    set:                              # optional overrides of the base (dotted key: value)
      model: llama-2-70b
      workload.num_requests: 200
    grid:                             # cartesian product of these lists
      hardware: [a100-sxm-80gb, h100-sxm-80gb]
      deployment.tp: [1, 2, 4, 8]
    zip:                              # keys varied together: equal-length lists, one entry each
      - deployment.tp: [1, 2, 4]      # (a list of groups, or one mapping for a single group)
        deployment.replicas: [4, 2, 1]
    random:                           # n points drawn from lists or ranges, seeded
      n: 8
      seed: 0
      axes:
        workload.arrival.rate: {uniform: [4, 16]}     # also loguniform: [lo, hi]
        deployment.max_num_seqs: {randint: [64, 256]} # integers, both ends included
        policy.name: [continuous, chunked_prefill]    # a list: uniform choice
    replications: 3                   # seeds: the base seed + 0, 1, ..., K-1
    output: summary                   # summary (summary.json per run) or full (+ parquet tables)

Any dotted experiment key can be varied (``model``, ``hardware``, ``deployment.tp``,
``policy.name`` and its knobs, ``workload.arrival.rate``, ``precision.weights``, ...), except
``seed`` (use ``replications``) and ``output`` (a sweep-level choice).

How the parts combine: every grid key is one axis, every zip group is one axis (its i-th point
takes the i-th value of each of its lists), and the random block is one axis of ``n`` samples
(each sample draws every random key independently). The sweep's points are the cartesian product of
all these axes, in file order (the last axis varies fastest). So ``grid`` with 2 x 4 values, one
zip group of 3 and ``random.n: 5`` give 2 x 4 x 3 x 5 = 120 points, each run ``replications``
times. A key may appear in only one axis. Without any axis the sweep is the base alone (useful for
replications). The random draws come from ``numpy.random.default_rng(random.seed)`` in a fixed
order (sample by sample, key by key in file order), so the same file gives the same points on any
machine.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from servesim.config import absolute_trace_paths, read_yaml_document
from servesim.errors import ServesimError
from servesim.inputs.names import RunName
from servesim.inputs.overrides import parse_override
from servesim.inputs.overrides import set_dotted as set_path
from servesim.inputs.schema import StrictModel, user_error
from servesim.resources import configs_dir, find_builtin

FORBIDDEN_AXES = {"seed": "vary seeds with replications: K", "output": "set output at the top of the sweep"}


class RandomBlock(StrictModel):
    n: int = Field(ge=1, description="samples to draw")
    seed: int = Field(0, ge=0, description="seed of the sampler (not of the workload)")
    axes: dict[str, Any] = Field(min_length=1, description="key: list of values, or {uniform|loguniform|"
                                 "randint: [lo, hi]}")


class SweepSpec(StrictModel):
    name: RunName | None = None
    base: str | dict[str, Any]
    set: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    zip: list[dict[str, list[Any]]] = Field(default_factory=list)
    random: RandomBlock | None = None
    replications: int = Field(1, ge=1)
    output: Literal["summary", "full"] = "summary"

    @field_validator("zip", mode="before")
    @classmethod
    def _one_group(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value


class Sweep:
    """A loaded sweep: the spec, its base experiment document, and where relative paths resolve."""

    def __init__(self, spec: SweepSpec, name: str, base_document: dict[str, Any], base_dir: Path,
                 source: str) -> None:
        self.spec = spec
        self.name = name
        self.base_document = base_document
        """The base experiment after the sweep's ``set`` overrides (not yet validated)."""
        self.base_dir = base_dir
        """The base experiment's folder: its relative trace paths resolve against it."""
        self.source = source

    def describe_axes(self) -> dict[str, list[str]]:
        """Each sweep key -> its place in the file (``grid.x``, ``zip[0].y``, ``random.z``, ``set.w``)."""
        places: dict[str, list[str]] = {}
        for key in self.spec.set:
            places.setdefault(key, []).append(f"set.{key}")
        for key in self.spec.grid:
            places.setdefault(key, []).append(f"grid.{key}")
        for i, group in enumerate(self.spec.zip):
            for key in group:
                places.setdefault(key, []).append(f"zip[{i}].{key}")
        if self.spec.random is not None:
            for key in self.spec.random.axes:
                places.setdefault(key, []).append(f"random.axes.{key}")
        return places


def find_sweep(text: str) -> Path:
    """A sweep path, or the name of a built-in sweep: ``configs/sweeps/<name>.yaml``, or a sweep at
    the top of ``configs/`` (``compare-policies``, which the issue placed beside the experiments)."""
    return find_builtin(text, [configs_dir() / "sweeps", configs_dir()], "SWEEP", "sweep", is_sweep_file)


def is_sweep_file(path: Path) -> bool:
    """A sweep names a ``base`` experiment; an experiment never has that key."""
    try:
        return "base" in read_yaml_document(path)
    except ServesimError:
        return False


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> Sweep:
    """Read and check a sweep file (its structure and its base; the points are checked by
    :func:`servesim.sweep.plan.plan_sweep`). ``overrides`` (``key=value``, as ``--set``) join the
    file's ``set:`` section."""
    path = Path(path)
    document = read_yaml_document(path)
    for text in overrides or []:
        parts, value = parse_override(text)
        if not isinstance(document.setdefault("set", {}), dict):
            raise ServesimError("set", "is not a mapping", "write set: {key: value, ...}")
        document["set"][".".join(parts)] = value
    return parse_sweep(document, path.parent, str(path), default_name=path.stem)


def parse_sweep(document: dict[str, Any], folder: Path, source: str = "sweep",
                default_name: str = "sweep") -> Sweep:
    try:
        spec = SweepSpec.model_validate(document)
    except ValidationError as exc:
        error = user_error(exc, SweepSpec, missing_fix=lambda _, key: f"add {key}: ... to {source}",
                           value_fix=f"fix it in {source}")
        raise error from None
    _check_axes(spec, source)
    base_document, base_dir = _base_document(spec.base, folder, source)
    for key, value in spec.set.items():
        set_dotted(base_document, key, value, f"set.{key}")
    base_document.pop("output", None)
    base_document["output"] = spec.output
    name = spec.name or default_name
    return Sweep(spec, name, base_document, base_dir, source)


MAX_SWEEP_RUNS = 50_000
"""Runs one sweep may hold. Points are planned (each validated) before anything runs and every run
is a folder, so a grid of 200,000 points or a billion random samples would exhaust time and
memory before the first result; such a sweep is refused up front, counted from the axes' lengths
without expanding them."""


def count_runs(spec: SweepSpec) -> tuple[int, int]:
    """(points, runs) of ``spec``, from the axes' lengths alone."""
    points = math.prod(len(values) for values in spec.grid.values())
    for group in spec.zip:
        points *= len(next(iter(group.values()), []))
    if spec.random is not None:
        points *= spec.random.n
    return points, points * spec.replications


def _check_size(spec: SweepSpec, source: str) -> None:
    points, runs = count_runs(spec)
    if runs > MAX_SWEEP_RUNS:
        raise ServesimError(source, f"has {points:,} points x {spec.replications:,} replications = "
                            f"{runs:,} runs, more than the {MAX_SWEEP_RUNS:,} one sweep may hold",
                            "split it into smaller sweeps, or sample the space with random: {n: ...}")


def _check_axes(spec: SweepSpec, source: str) -> None:
    seen: dict[str, str] = {}
    axes: list[tuple[str, str, list[Any] | Any]] = [(f"grid.{k}", k, v) for k, v in spec.grid.items()]
    for i, group in enumerate(spec.zip):
        if not group:
            raise ServesimError(f"zip[{i}]", "is empty", "give it key: [values] pairs or remove it")
        lengths = {key: len(values) for key, values in group.items()}
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{k} has {n}" for k, n in lengths.items())
            raise ServesimError(f"zip[{i}]", f"lists differ in length ({shown})",
                                "give every key of a zip group the same number of values")
        axes += [(f"zip[{i}].{k}", k, v) for k, v in group.items()]
    if spec.random is not None:
        axes += [(f"random.axes.{k}", k, v) for k, v in spec.random.axes.items()]
    for place, key, values in axes:
        if key in FORBIDDEN_AXES:
            raise ServesimError(place, f"{key} cannot be varied", FORBIDDEN_AXES[key])
        if key in seen:
            raise ServesimError(place, f"{key} is already varied by {seen[key]}", "vary each key in one axis")
        seen[key] = place
        if isinstance(values, list) and not values:
            raise ServesimError(place, "has no values", "list at least one value")
    _check_size(spec, source)
    for key in spec.set:
        if key in FORBIDDEN_AXES and key != "seed":
            raise ServesimError(f"set.{key}", f"{key} cannot be set here", FORBIDDEN_AXES[key])
        if key in seen:
            raise ServesimError(f"set.{key}", f"{key} is also varied by {seen[key]}",
                                "set it or vary it, not both")


def _base_document(base: str | dict[str, Any], folder: Path, source: str) -> tuple[dict[str, Any], Path]:
    if isinstance(base, dict):
        return copy.deepcopy(base), folder
    relative = folder / base
    if relative.is_file():
        return read_yaml_document(relative), relative.parent
    builtin = configs_dir() / f"{base.removesuffix('.yaml')}.yaml"
    if builtin.is_file() and Path(base).parent == Path("."):
        return read_yaml_document(builtin), builtin.parent
    known = ", ".join(sorted(p.stem for p in configs_dir().glob("*.yaml")))
    raise ServesimError("base", f"{base} not found (looked beside {source} and among the built-in "
                        "experiments)", f"give a path relative to the sweep file or one of: {known}")


def set_dotted(document: dict[str, Any], key: str, value: Any, field: str) -> None:
    """``document[a][b][c] = value`` for ``key == "a.b.c"``, creating sections on the way."""
    parts = key.split(".")
    if not all(parts):
        raise ServesimError(field, f"{key!r} is not a dotted key", "write e.g. deployment.tp")
    set_path(document, parts, copy.deepcopy(value), field)


def sweep_document(sweep: Sweep) -> dict[str, Any]:
    """The sweep with its base expanded inline (``set`` applied, trace paths made absolute), so
    the written ``sweep.resolved.yaml`` runs as is from any folder."""
    document = sweep.spec.model_dump(mode="json", exclude_none=True)
    document["name"] = sweep.name
    base = copy.deepcopy(sweep.base_document)
    if isinstance(base.get("workload"), dict):
        absolute_trace_paths(base["workload"], sweep.base_dir)
    document["base"] = base
    document.pop("set", None)  # already applied to the base
    return document
