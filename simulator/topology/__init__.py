"""Deployments as topologies of replica groups.

A topology (``deployment.kind``) resolves an experiment into groups of identical replicas
(:class:`~servesim.topology.group.ReplicaGroup`: model, GPU, parallelism, engine, memory plan,
limits, policy) and, at run time, builds their replicas, routers and links on the simulation's
clock. ``colocated``: N replicas behind a router. ``disaggregated``: a prefill group and a decode
group joined by a KV link. See :mod:`servesim.topology.base` for the interface a new topology
implements; this package's ``__init__`` imports nothing, so the experiment schema can use
:mod:`servesim.topology.keys` without a cycle.
"""
