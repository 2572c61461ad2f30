"""Tensor parallelism over several fast domains (SGLang's and vLLM's multi-node TP): the
all-reduces run hierarchically, by hand."""

from __future__ import annotations

import pytest

from servesim import BatchShape, CostModel, load_hardware, load_model
from servesim.cost.communication import (
    allgather_s,
    allreduce_s,
    domains_spanned,
    fitted_collective_s,
    ring_allgather_s,
    ring_allreduce_s,
    ring_wire_bytes,
)
from servesim.engines import RuntimeCosts

H100 = load_hardware("h100-sxm-80gb")
CUSTOM = RuntimeCosts(allreduce="custom")


def test_tp16_over_two_nodes_reduces_inside_by_nccl_and_across_by_infiniband() -> None:
    """16 GPUs = 2 nodes of 8: an intra-node NCCL all-reduce of the whole message (its
    reduce-scatter + all-gather) plus a 2-rank ring all-reduce of each GPU's eighth over its NIC.
    vLLM's custom all-reduce is single-node, so even a 1 MiB message takes NCCL inside."""
    assert domains_spanned(16, H100) == (8, 2) and domains_spanned(8, H100) is None
    assert H100.collectives is not None and H100.scale_out is not None
    message = 1 << 20
    inside = fitted_collective_s(H100.collectives.nccl, ring_wire_bytes(message, 8), 8, H100.interconnect)
    ib = H100.scale_out
    across = ib.latency_s + 2 * (2 - 1) / 2 * (message / 8) / (ib.bandwidth_Bps * ib.efficiency)
    assert allreduce_s(message, 16, CUSTOM, H100) == pytest.approx(inside + across, rel=1e-12)
    assert ring_allreduce_s(message / 8, 2, ib) == pytest.approx(across, rel=1e-12)
    # and it costs more than the same all-reduce inside one node (custom two-shot there)
    assert allreduce_s(message, 16, CUSTOM, H100) > allreduce_s(message, 8, CUSTOM, H100)


def test_logits_gather_across_nodes_then_inside() -> None:
    total = 32 * 128_256 * 2
    ib = H100.scale_out
    assert ib is not None
    expected = ring_allgather_s(total / 8, 4, ib) + allgather_s(total, 8, CUSTOM, H100)
    assert allgather_s(total, 32, CUSTOM, H100) == pytest.approx(expected, rel=1e-12)


def test_a_tp16_step_pays_its_all_reduces_over_infiniband() -> None:
    """Llama-3.1-405B, decode batch 32: 2 x 126 + 1 all-reduces of 32 x 16,384 bf16 values and
    one logits all-gather, each priced as above."""
    model = load_model("llama-3.1-405b")
    cost = CostModel(model, H100, tp=16, runtime=CUSTOM)
    step = cost.step(BatchShape.decode(32, 1000))
    residual = 32 * model.hidden_size * 2
    expected = (2 * 126 + 1) * allreduce_s(residual, 16, CUSTOM, H100) \
        + allgather_s(32 * model.vocab_size * 2, 16, CUSTOM, H100)
    assert step.breakdown["communication"] == pytest.approx(expected, rel=1e-12)
    ring = CostModel(model, H100, tp=16, runtime=RuntimeCosts(allreduce="ring"))
    link, ib = H100.interconnect, H100.scale_out
    assert ib is not None
    logits = 32 * model.vocab_size * 2
    by_ring = (2 * 126 + 1) * (ring_allreduce_s(residual, 8, link) + ring_allreduce_s(residual / 8, 2, ib)) \
        + ring_allgather_s(logits / 8, 2, ib) + ring_allgather_s(logits, 8, link)
    step_by_ring = ring.step(BatchShape.decode(32, 1000))
    assert step_by_ring.breakdown["communication"] == pytest.approx(by_ring, rel=1e-12)
