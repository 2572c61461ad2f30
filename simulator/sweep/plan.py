"""Checking every point of a sweep before anything runs, and naming its runs.

Each point is the base experiment with the point's values set, validated exactly as ``servesim
run`` would validate it. Two kinds of failure are told apart:

* a malformed point (an unknown key, a value of the wrong type or range, an unknown model,
  hardware, policy, policy knob or data type name) is the sweep file's mistake: the whole sweep
  stops before the first run with one line naming the sweep key at fault and the point;
* a well-formed point whose deployment cannot run (the weights do not fit in HBM, no room for a
  KV block, a token budget below the context length, a data-type combination no kernel
  implements, a data type the GPU has no tensor cores for) is a result, not a mistake: a TP
  sweep asks exactly which degrees fit, a precision grid which combinations exist. Such a point
  is recorded as ``infeasible`` with the config's own one-line reason and the sweep goes on; one
  that fails only once running (in the cost model) is recorded the same way by its worker.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

from servesim.config import ExperimentConfig, validate_document
from servesim.dtypes import DType
from servesim.engines import Engine, make_engine
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.hardware_io import load_hardware
from servesim.model_config import load_model
from servesim.model_spec import ModelSpec
from servesim.policies.base import check_policy
from servesim.policies.routers import check_router
from servesim.sweep.axes import Point, expand, point_label, varied_keys
from servesim.sweep.hashing import identity, point_hash, run_hash
from servesim.sweep.spec import Sweep, set_dotted
from servesim.topology.resolve import resolve_topology

Status = Literal["ok", "infeasible"]


@dataclass(frozen=True)
class RunTask:
    """One (point, seed) run: everything a worker needs, as plain picklable data."""

    run_id: str
    point_id: str
    replication: int
    seed: int
    document: dict[str, Any]
    """The resolved experiment (JSON-ready), seed included."""
    base_dir: str
    """Where the experiment's relative paths (traces) resolve."""


@dataclass
class PlannedPoint:
    index: int
    values: Point
    point_id: str
    config: ExperimentConfig
    hardware: HardwareProfile
    status: Status = "ok"
    reason: str = ""
    runs: list[RunTask] = field(default_factory=list)
    num_gpus: int | None = None
    """From the resolved topology (every group of it); None when infeasible."""

    @property
    def gpus(self) -> int:
        if self.num_gpus is not None:
            return self.num_gpus
        d = self.config.deployment
        return d.tp * d.pp * d.dp * d.replicas


@dataclass
class SweepPlan:
    sweep: Sweep
    keys: list[str]
    points: list[PlannedPoint]

    @property
    def runs(self) -> list[RunTask]:
        return [run for point in self.points for run in point.runs]


def plan_sweep(sweep: Sweep) -> SweepPlan:
    """Every point validated and named; raises :class:`ServesimError` for the first malformed one."""
    loaded: dict[tuple[str, str], Any] = {}  # each model and profile file is parsed once per plan
    points = [plan_point(sweep, i, values, loaded) for i, values in enumerate(expand(sweep.spec))]
    return SweepPlan(sweep, varied_keys(sweep.spec), points)


def plan_point(sweep: Sweep, index: int, values: Point,
               loaded: dict[tuple[str, str], Any] | None = None) -> PlannedPoint:
    places = sweep.describe_axes()
    document = copy.deepcopy(sweep.base_document)
    for key, value in values.items():
        set_dotted(document, key, value, places[key][-1])

    def blame(exc: ServesimError, config_field: str | None = None) -> ServesimError:
        known = exc.field if config_field is None or exc.field.startswith(config_field) else config_field
        where = _place(known, places)
        return ServesimError(where, f"point {index} ({point_label(values)}): {exc}",
                             f"fix {where} in {sweep.source}")

    try:
        config = validate_document(document, sweep.source)
    except ServesimError as exc:
        raise blame(exc) from None
    model, hardware, engine = _check_names(config, blame, {} if loaded is None else loaded)
    ident = identity(config, model, hardware, engine)
    point = PlannedPoint(index, values, point_hash(ident), config, hardware)
    try:
        point.num_gpus = resolve_topology(config).num_gpus
    except ServesimError as exc:
        point.status, point.reason = "infeasible", str(exc)
        return point
    resolved = config.model_dump(mode="json")
    for replication in range(sweep.spec.replications):
        seed = config.seed + replication
        ident["experiment"]["seed"] = seed
        point.runs.append(RunTask(run_hash(ident), point.point_id, replication, seed,
                                  {**resolved, "seed": seed}, str(sweep.base_dir)))
    return point


def _check_names(config: ExperimentConfig, blame: Any, loaded: dict[tuple[str, str], Any]
                 ) -> tuple[ModelSpec, HardwareProfile, Engine]:
    """The names a point uses exist and its knobs are well formed (a typo here is the file's
    mistake, not an infeasible point)."""
    found = []
    for section, name, load in (("model", config.model, load_model),
                                ("hardware", config.hardware, load_hardware)):
        if (section, name) not in loaded:
            try:
                loaded[section, name] = load(name, section)
            except ServesimError as exc:
                raise blame(exc, section) from None
        found.append(loaded[section, name])
    model, hardware = found
    p = config.precision

    def check(section: str, call: Any) -> Any:
        try:
            return call()
        except ServesimError as exc:
            raise blame(exc, section) from None

    engine: Engine = check("engine", lambda: make_engine(config.engine.name, config.engine.knobs()))
    check("policy", lambda: check_policy(config.policy.name or engine.defaults.policy, config.policy.knobs()))
    check("router", lambda: check_router(config.router.name, config.router.knobs()))
    check("precision.weights", lambda: DType.parse(p.weights, "precision.weights"))
    check("precision.activations", lambda: DType.parse(p.activations, "precision.activations"))
    check("precision.kv_cache", lambda: DType.parse(p.kv_cache, "precision.kv_cache"))
    if p.expert_weights is not None:
        check("precision.expert_weights",
              lambda: DType.parse(str(p.expert_weights), "precision.expert_weights"))
    return model, hardware, engine


def _place(config_field: str, places: dict[str, list[str]]) -> str:
    """The sweep key behind a config field: the varied key (or ``set`` key) equal to it, inside
    it or containing it; else ``base``."""
    for key, where in places.items():
        if key == config_field:
            return where[-1]
    for key, where in places.items():
        if key.startswith(config_field + ".") or config_field.startswith(key + "."):
            return where[-1]
    return "base"
