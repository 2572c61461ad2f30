"""Serving engines as first-class: named and versioned, owning the scheduler defaults and the
per-step runtime cost that hardware profiles no longer hold; a new engine needs only its module."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from engine_helpers import experiment, run, table, tabulate

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.engines import ENGINES, Engine, RuntimeCosts, SchedulerDefaults, make_engine, register_engine
from servesim.errors import ServesimError
from servesim.topology.resolve import resolve_topology

LLAMA = load_model("llama-3-8b")


def test_an_experiment_without_an_engine_runs_vllm_v1() -> None:
    """The default engine is vLLM V1 (its scheduler: chunked prefill with prefix caching, an
    8,192-token budget on an H100); the test helper pins V0, so the document is written out."""
    from servesim.config import validate_document

    document = {"model": "llama-3-8b", "hardware": "h100-sxm-80gb",
                "workload": {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 1,
                             "lengths": {"preset": "azure-conversation"}}}
    group = resolve_topology(validate_document(document)).kv_group
    assert (group.engine.name, group.engine.version) == ("vllm", "0.19")
    assert group.policy.name == "chunked_prefill" and group.limits.max_num_batched_tokens == 8192
    assert group.limits.enable_prefix_caching and group.runtime.overlap


def test_vllm_v0_owns_the_step_cost_per_gpu() -> None:
    """The 0.1 hardware profiles held 0.6 ms per step (0.8 ms on A100 and MI300X servers); the
    vllm-v0 engine carries exactly those values, so every earlier result is unchanged."""
    engine = make_engine("vllm-v0", {})
    assert engine.version == "0.6" and engine.defaults.policy == "continuous"
    for hardware, step_s in (("h100-sxm-80gb", 6e-4), ("h200-sxm-141gb", 6e-4), ("l40s", 6e-4),
                             ("a100-sxm-80gb", 8e-4), ("a100-pcie-80gb", 8e-4), ("mi300x", 8e-4)):
        assert engine.runtime(hardware).step_overhead_s == step_s, hardware
    assert engine.runtime("a100-sxm-80gb").provenance.startswith("estimate")
    assert resolve_topology(experiment()).engine.name == "vllm-v0"


def test_the_engine_step_cost_adds_to_every_step_exactly() -> None:
    """A knob of 1.0 ms instead of 0.6 ms adds 0.4 ms to each step's price, and to a lone
    request's end-to-end latency 0.4 ms per step it took (one prefill, 9 decodes)."""
    h100 = load_hardware("h100-sxm-80gb")
    base = CostModel(LLAMA, h100)
    busier = make_engine("vllm-v0", {"step_overhead_s": 1e-3})
    slower = CostModel(LLAMA, h100, runtime=busier.runtime(h100.name))
    kernels = CostModel(LLAMA, h100, runtime=RuntimeCosts.none())
    for batch in (BatchShape.prefill(512), BatchShape.decode(64, 1000)):
        assert slower.step_time(batch) - base.step_time(batch) == pytest.approx(4e-4, rel=1e-9)
        assert base.step_time(batch) - kernels.step_time(batch) == pytest.approx(6e-4, rel=1e-9)
    one = table([0.0], 512, 10)
    default = tabulate(run(experiment(), one))
    tuned = tabulate(run(experiment(engine={"name": "vllm-v0", "step_overhead_s": 1e-3}), one))
    assert len(default.steps) == len(tuned.steps) == 10
    assert np.allclose(tuned.steps["duration_s"] - default.steps["duration_s"], 4e-4, rtol=1e-9)
    assert tuned.summary["e2e_s"]["max"] - default.summary["e2e_s"]["max"] == pytest.approx(10 * 4e-4)
    assert np.allclose(tuned.steps["op_overhead_s"], 1e-3)


def test_the_engine_fills_in_what_the_deployment_leaves_unset() -> None:
    group = resolve_topology(experiment()).kv_group
    assert (group.limits.max_num_seqs, group.limits.block_size, group.memory.gpu_memory_utilization) == \
        (256, 16, 0.9)
    assert group.settings.watermark == 0.01 and group.settings.enable_prefix_caching is False
    assert group.policy.name == "continuous"  # the engine's default policy
    set_here = resolve_topology(experiment({"max_num_seqs": 64, "block_size": 32})).kv_group
    assert (set_here.limits.max_num_seqs, set_here.limits.block_size) == (64, 32)


@pytest.mark.parametrize(("engine", "message"), [
    ("tensorrt", r"^engine.name: unknown engine 'tensorrt'; use one of: .*vllm-v0"),
    ({"name": "vllm-v0", "version": "0.2"}, r"^engine.version: vllm-v0 is modelled for versions 0.6"),
    ({"name": "vllm-v0", "overhead": 1}, r"^engine.overhead: unknown key; remove it or use one of: version"),
    ({"name": "vllm-v0", "step_overhead_s": -1}, r"^engine.step_overhead_s: .*greater than or equal to 0"),
])
def test_bad_engines_are_one_line_errors(engine: object, message: str) -> None:
    with pytest.raises(ServesimError, match=message):
        resolve_topology(experiment(engine=engine))


@pytest.fixture
def toy_engine():
    """An engine that exists only in this test: adding one is a subclass and a registration."""

    @register_engine
    class Toy(Engine):
        name = "toy"
        title = "a test engine"
        versions = ("1",)
        defaults = SchedulerDefaults(policy="chunked_prefill", max_num_seqs=8, block_size=32,
                                     chunked_max_num_batched_tokens=512)
        step_overhead_s: ClassVar[dict[str, float]] = {"": 2e-3}

    yield Toy
    del ENGINES["toy"]


def test_a_new_engine_needs_only_its_own_class(toy_engine: type[Engine]) -> None:
    """Its defaults and step cost reach the run with nothing else changed."""
    config = experiment(engine="toy")
    group = resolve_topology(config).kv_group
    assert group.policy.name == "chunked_prefill" and group.limits.max_num_seqs == 8
    assert group.limits.block_size == 32 and group.limits.max_num_batched_tokens == 512
    tables = tabulate(run(config, table([0.0] * 12, 300, 4)))
    assert tables.summary["completed"] == 12
    assert (tables.steps["running"] <= 8).all() and (tables.steps["op_overhead_s"] == 2e-3).all()
    assert (tables.steps["prefill_tokens"] + tables.steps["decode_tokens"] <= 512).all()
