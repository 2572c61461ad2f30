"""The disaggregated run: prefill replicas, decode replicas and the KV link on one SimPy clock.

Both pools are ordinary :class:`~servesim.engine.replica.Replica` loops over
:class:`~servesim.engine.replica_state.ReplicaState`, each with its pool's policy, hardware and
cost model; replica indices run over the prefill pool first, then the decode pool, so the steps
table keeps one replica column (plus a ``pool`` label). What differs:

- a prefill replica is built with a ``handoff``: a request whose prompt is computed emits nothing
  there; it leaves ``running`` with its KV blocks still held (:meth:`Handoff.prefilled`);
- the decode router (:mod:`servesim.policies.disaggregated`) picks a decode replica, whose
  :class:`~servesim.policies.disaggregated.KvReceiver` reserves the blocks for the prompt's KV when it has
  room and then starts the copy;
- the copy is a SimPy process on the :class:`~servesim.engine.kv_link.KvLink` (queueing for a
  channel, then ``latency + bytes / bandwidth``). When it lands, the prefill replica frees the
  blocks, and the request emits its first token on the decode replica and joins its running set.

TTFT therefore ends when the KV has arrived on the decode side: it includes the prefill, the wait
for decode-side room, the link queue and the copy. (vLLM's NIXL path samples the first token
again in the decode instance's first step, one decode step later; Splitwise and DistServe count
it from the prefill machine, which streams it while the copy runs: this choice is the pessimistic
one of the three, as the issue asked.) Layer-by-layer overlap of the copy with the prefill
(Splitwise) is not modelled: the copy starts after the whole prompt.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from functools import partial
from pathlib import Path

import numpy as np
import simpy
from servesim.config import ExperimentConfig
from servesim.engine.deployment import policy_knobs
from servesim.engine.kv_link import KvLink
from servesim.engine.pools import DisaggregatedDeployment
from servesim.engine.replica import Replica
from servesim.engine.replica_state import EngineLimits, ReplicaState
from servesim.engine.simulation import Progress, SimulationResult, _arrivals, _run
from servesim.engine.state import DECODE_KV_NEVER_FITS, KV_NEVER_FITS, TOO_LONG, RequestState
from servesim.engine.step_log import StepLog
from servesim.policies.base import make_policy
from servesim.policies.disaggregated import KvReceiver, LeastKvLoad
from servesim.policies.routers import make_router
from servesim.workloads.requests import RequestTable


class PrefillReplicaState(ReplicaState):
    """A prefill replica holds only a prompt's KV; a request is refused at arrival when it could
    never fit here (its prompt) or on a decode replica (prompt and outputs but the last)."""

    def __init__(self, index: int, requests: RequestState, limits: EngineLimits,
                 decode_limits: EngineLimits, seed: int = 0) -> None:
        super().__init__(index, requests, limits, seed=seed)
        self.decode_limits = decode_limits

    def rejection(self, request: int) -> int:
        r, lim, dec = self.requests, self.limits, self.decode_limits
        prompt, output = int(r.prompt[request]), int(r.output[request])
        if prompt + output > min(lim.max_model_len, dec.max_model_len):
            return TOO_LONG
        if self.pool.blocks_for(prompt) > lim.num_blocks:
            return KV_NEVER_FITS
        if -(-(prompt + output - 1) // dec.block_size) > dec.num_blocks:
            return DECODE_KV_NEVER_FITS
        return 0


class Handoff:
    """Moves prefilled requests to the decode pool and over the link (the engine's mechanism;
    the decisions are the decode router's and the :class:`KvReceiver`'s)."""

    def __init__(self, env: simpy.Environment, requests: RequestState, link: KvLink,
                 kv_bytes_per_token: float) -> None:
        self.env = env
        self.requests = requests
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.prefill: list[Replica] = []
        self.decode: list[Replica] = []
        self.receivers: list[KvReceiver] = []
        self.route = LeastKvLoad(self.receivers).route

    def prefilled(self, replica: Replica, ids: np.ndarray, now: float) -> None:
        """``ids`` finished their prompt on prefill ``replica``: each goes to a decode replica."""
        replica.state.hand_off(ids)
        r = self.requests
        r.prefill_end[ids] = now
        first_decode = len(self.prefill)
        for request in ids.tolist():
            d = self.route(request, now)
            r.decode_replica[request] = first_decode + d
            self.receivers[d].offer(request)
            self.decode[d].wake()

    def start_transfer(self, request: int, now: float) -> None:
        """Blocks are reserved on the decode side: queue the copy on the link."""
        self.requests.transfer_queued[request] = now
        self.env.process(self._transfer(request))

    def _transfer(self, request: int) -> Generator[simpy.Event, object, None]:
        r = self.requests
        nbytes = float(r.prompt[request]) * self.kv_bytes_per_token
        start, end = yield from self.link.transfer(nbytes)
        r.transfer_start[request] = start
        source = self.prefill[int(r.replica[request])]
        source.state.pool.release(request)
        source.wake()  # freed blocks may admit waiting prompts
        d = int(r.decode_replica[request]) - len(self.prefill)
        target, receiver = self.decode[d], self.receivers[d]
        receiver.landed()
        ids = np.array([request], dtype=np.int64)
        if r.land(ids, end).size:  # a one-token output is complete on arrival
            target.state.pool.release(request)
        else:
            target.state.join_running(ids)
        target.wake()


def simulate_disaggregated(config: ExperimentConfig, deployment: DisaggregatedDeployment,
                           workload: RequestTable, base_dir: Path | None,
                           progress: Progress | None) -> SimulationResult:
    started = time.perf_counter()
    env = simpy.Environment()
    requests = RequestState(workload)
    steps = StepLog()
    prefill, decode = deployment.prefill, deployment.decode
    link = KvLink(env, deployment.link)
    handoff = Handoff(env, requests, link, deployment.kv_bytes_per_token)

    name, knobs = deployment.pool_policy("prefill")
    prefill_states = [PrefillReplicaState(i, requests, prefill.limits, decode.limits, config.seed)
                      for i in range(prefill.replicas)]
    cost = prefill.cost_model()
    for state in prefill_states:
        replica = Replica(env, state, make_policy(name, knobs, state), cost, steps)
        replica.handoff = partial(handoff.prefilled, replica)
        handoff.prefill.append(replica)

    name, knobs = deployment.pool_policy("decode")
    held = np.zeros(len(requests), dtype=np.int64)  # the decode pool's own block column
    decode_states = [ReplicaState(prefill.replicas + j, requests, decode.limits, held, config.seed)
                     for j in range(decode.replicas)]
    cost = decode.cost_model()
    for state in decode_states:
        receiver = KvReceiver(state, make_policy(name, knobs, state), handoff.start_transfer)
        handoff.receivers.append(receiver)
        handoff.decode.append(Replica(env, state, receiver, cost, steps))
    if deployment.options.decode.router != "least_kv":
        handoff.route = make_router(deployment.options.decode.router, {}, decode_states).route

    router = make_router(config.router.name, policy_knobs(config.router), prefill_states)
    env.process(_arrivals(env, workload, router.route, handoff.prefill))
    _run(env, requests, progress, every_s=max(1.0, workload.duration_s / 200))
    records = steps.records()
    end = float((records["start_s"] + records["duration_s"]).max()) if records.size else 0.0
    end = max(end, float(np.nanmax(requests.transfer_end, initial=0.0)))
    pools = ["prefill"] * prefill.replicas + ["decode"] * decode.replicas
    return SimulationResult(config, deployment, workload, requests, steps,  # type: ignore[arg-type]
                            [*prefill_states, *decode_states], end, time.perf_counter() - started,
                            base_dir, pools=pools, link=link)
