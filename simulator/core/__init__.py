"""The simulation core: per-request state, each replica's queues and KV pool, the replica
iteration loop, KV links and the step log, on one SimPy clock (:mod:`servesim.core.sim`).

It carries out decisions (a policy's admissions and preemptions, a topology's hand-offs) the same
way for everyone, and knows no policy, engine or topology by name.
"""
