"""Names of sweep runs: a hash of what was simulated, the same on every run and every machine.

A run's folder is named by the SHA-256 of a canonical JSON document (sorted keys, no spaces,
ASCII, shortest round-trip floats, which Python prints identically on every IEEE-754 platform)
holding the fully resolved experiment (every default filled in, the seed included) and the
contents of the model, hardware and engine it names. Including the contents means that editing a model
config or recalibrating a hardware profile gives new names, so a resumed sweep reruns those points
instead of trusting results computed from the old numbers. Fields that cannot change a result are
left out: the experiment's ``name``, the profile's price and provenance notes, the model file's
path. Sixteen hex digits (64 bits) keep collisions out of reach for any sweep that fits on disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from servesim.config import ExperimentConfig
from servesim.engines import Engine
from servesim.hardware import HardwareProfile
from servesim.model_spec import ModelSpec

HASH_DIGITS = 16


def canonical_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def digest(document: Any) -> str:
    return hashlib.sha256(canonical_json(document).encode("ascii")).hexdigest()[:HASH_DIGITS]


def identity(config: ExperimentConfig, model: ModelSpec, hardware: HardwareProfile,
             engine: Engine) -> dict[str, Any]:
    """Everything that decides a run's results, as plain JSON (the seed included): the
    experiment, the model's shape, the hardware profile and the engine's coefficients."""
    experiment = config.model_dump(mode="json")
    experiment.pop("name", None)
    if experiment.get("metric_percentiles") == [99.0]:  # the default: runs named before it existed
        experiment.pop("metric_percentiles")
    spec = dataclasses.asdict(model)
    spec.pop("source", None)
    profile = hardware.model_dump(mode="json", exclude={"cost_per_gpu_hour", "provenance"})
    return {"experiment": experiment, "model": spec, "hardware": profile, "engine": engine.identity()}


def run_hash(identity_document: dict[str, Any]) -> str:
    """The name of one (point, seed) run."""
    return digest(identity_document)


def point_hash(identity_document: dict[str, Any]) -> str:
    """The name of a point: the same identity without the seed, shared by its replications."""
    experiment = {k: v for k, v in identity_document["experiment"].items() if k != "seed"}
    return digest({**identity_document, "experiment": experiment})
