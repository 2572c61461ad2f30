"""Shared fixtures: built-in specs, the textbook roofline profile, and the shared data folder."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from servesim import HardwareProfile, ModelSpec, load_hardware, load_model
from servesim.hardware import Memory

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# The parse cache (servesim.inputs.parse_cache) of a test run lives and dies with it: tests never
# read a developer's cache nor leave entries in ~/.cache (subprocesses inherit the variable).
_CACHE = tempfile.mkdtemp(prefix="servesim-test-cache-")
os.environ["SERVESIM_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)


@pytest.fixture(scope="session")
def llama2_7b() -> ModelSpec:
    return load_model("llama-2-7b")


@pytest.fixture(scope="session")
def llama3_8b() -> ModelSpec:
    return load_model("llama-3-8b")


@pytest.fixture(scope="session")
def a100() -> HardwareProfile:
    return load_hardware("a100-sxm-80gb")


@pytest.fixture(scope="session")
def textbook_a100(a100: HardwareProfile) -> HardwareProfile:
    """An A100 as textbooks draw it: 312 TFLOP/s, exactly 2.0 TB/s, efficiency 1, no overheads."""
    memory = Memory(capacity_bytes=a100.memory.capacity_bytes, bandwidth_Bps=2.0e12)
    return a100.ideal().model_copy(update={"memory": memory})


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not present at {SHARED_DATA} (optional: only for real-data checks)")
    return SHARED_DATA


PROPERTY_TEST_S = 300
"""Per-test deadline of every hypothesis test (pytest-timeout): a bug that stops the engine's
progress fails that test instead of hanging the suite (the engine's own guard,
``servesim.core.progress``, normally stops such a run within the test's first example)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "obj", None)
        is_property = getattr(function, "is_hypothesis_test", False)
        if is_property and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(PROPERTY_TEST_S))
