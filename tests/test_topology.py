"""Deployments as topologies of replica groups: the ``deployment.kind`` key, the 0.1 spelling
that still loads (with a note, and errors named as it was written), and what every topology
answers (its groups, GPUs, rejections, step-table labels)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from engine_helpers import experiment, run, table, tabulate

from servesim.config import MigrationNote
from servesim.core.state import DECODE_KV_NEVER_FITS, KV_NEVER_FITS, TOO_LONG
from servesim.errors import ServesimError
from servesim.pipeline import prepare
from servesim.topology.base import TOPOLOGIES
from servesim.topology.resolve import resolve_topology

NEW = {"kind": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 2, "tp": 2},
       "link": {"kind": "nvlink"}}
OLD = {"name": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 2, "tp": 2},
       "link": {"kind": "nvlink"}}


def test_built_in_topologies() -> None:
    assert {"colocated", "disaggregated"} <= set(TOPOLOGIES)
    colocated = resolve_topology(experiment({"replicas": 3, "tp": 2}))
    assert colocated.kind == "colocated" and len(colocated.groups) == 1
    assert colocated.num_gpus == 6 and colocated.group_of_replica() == ["replicas"] * 3
    split = resolve_topology(experiment(NEW))
    assert [g.name for g in split.groups] == ["prefill", "decode"] and split.kv_group.name == "decode"
    assert split.num_gpus == 1 + 2 * 2 and split.group_of_replica() == ["prefill", "decode", "decode"]


def test_the_01_spelling_runs_the_same_deployment_with_one_note() -> None:
    with pytest.warns(MigrationNote, match="now deployment: {kind: disaggregated"):
        old = experiment(policy=OLD)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MigrationNote)  # the new spelling raises no note
        new = experiment(NEW)
    assert old.deployment == new.deployment and old.legacy_disaggregated and not new.legacy_disaggregated
    workload = table(np.linspace(0, 2, 40), 700, 20)
    a, b = tabulate(run(old, workload)), tabulate(run(new, workload))
    assert a.summary == b.summary
    assert a.steps.equals(b.steps)


def test_errors_name_the_keys_as_written() -> None:
    with pytest.raises(ServesimError, match=r"^deployment\.decode\.tp: 3 does not divide"):
        resolve_topology(experiment({**NEW, "decode": {"tp": 3}}))
    with pytest.warns(MigrationNote), pytest.raises(ServesimError, match=r"^policy\.decode\.tp: 3 does not"):
        resolve_topology(experiment(policy={**OLD, "decode": {"tp": 3}}))
    with pytest.raises(ServesimError, match=r"^deployment\.prefill: applies to deployment.kind disagg"):
        resolve_topology(experiment({"prefill": {"replicas": 2}}))
    with pytest.raises(ServesimError, match=r"^deployment\.kind: Input should be 'colocated', "):
        experiment({"kind": "pipelined"})
    with pytest.raises(ServesimError, match=r"^deployment\.decode\.policy: disaggregated is a deployment "
                       r"topology, not a per-replica policy"):
        resolve_topology(experiment({**NEW, "decode": {"policy": "disaggregated"}}))


def test_rejections_are_known_before_the_run_and_are_what_the_run_rejects() -> None:
    """Colocated: too long for max_model_len, or more KV than the pool. Disaggregated: a prompt
    that does not fit a prefill replica, or prompt and outputs that do not fit a decode one."""
    prompts = np.array([100, 3000, 100, 2000])
    outputs = np.array([50, 50, 4000, 10])
    workload = table(np.arange(4.0), prompts, outputs)
    config = experiment({"max_model_len": 4096, "num_gpu_blocks": 150})  # 2,400 tokens of KV
    plan = prepare(config, workload=workload)
    assert plan.reject_codes.tolist() == [0, KV_NEVER_FITS, TOO_LONG, 0]
    ran = tabulate(run(config, workload)).requests
    assert (ran["status"] == "rejected").tolist() == [False, True, True, False]
    assert plan.rejections() == {
        "prompt + output tokens exceed max_model_len": 1,
        "prompt + output tokens need more KV blocks than the replica's pool holds": 1}
    # prompts up to 2,400 tokens on a prefill replica; prompt + outputs up to 2,080 on a decode one
    pools = {"prefill": {"num_gpu_blocks": 150}, "decode": {"num_gpu_blocks": 130}}
    split = prepare(experiment({**NEW, **pools}), workload=workload)
    assert split.reject_codes.tolist() == [0, KV_NEVER_FITS, DECODE_KV_NEVER_FITS, 0]
