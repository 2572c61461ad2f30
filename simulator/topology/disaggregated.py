"""``disaggregated``: a prefill group and a decode group of replicas, KV caches sent between them.

Keys (``deployment.kind: disaggregated``)::

    deployment:
      kind: disaggregated
      prefill: {replicas: 1, tp: 1, hardware: ..., policy: ..., max_num_seqs: ...}
      decode:  {replicas: 1, ..., router: least_kv}
      link:    {kind: infiniband | ethernet | nvlink | pcie, bandwidth_Bps, latency_s, efficiency,
                channels}

Each group is resolved exactly as a colocated deployment is (:func:`resolve_group` on the
deployment's keys with the group's own laid over them), so its memory plan, KV pool and engine
limits come from its own hardware and TP and every check applies to it; an error is reported
under the group's key (``deployment.decode.tp``) when the group set that key.

On the clock both groups are ordinary replica loops; replica indices run over the prefill group
first, then the decode group (the step table's ``pool`` column says which). What differs:

- a prefill replica's finished prompts leave ``running`` with their KV blocks still held and go
  to :class:`Handoff` instead of emitting (the replica's ``prompts_done`` exit);
- the decode router (:mod:`servesim.policies.handoff`) picks a decode replica, whose
  :class:`~servesim.policies.handoff.KvReceiver` reserves the blocks for the prompt's KV when it
  has room and then starts the copy;
- the copy is a SimPy process on the :class:`~servesim.core.kv_link.KvLink` (queueing for a
  channel, then ``latency + bytes / bandwidth``). When its last byte is sent, the prefill replica
  frees the blocks; the engine's hand-off latency later (``CpuCosts.handoff_s``: the transfer's
  set-up and completion notice, the decode worker taking the request in) it lands, and the request
  emits its first token on the decode replica and joins its running set.

TTFT therefore ends when the KV has arrived on the decode side: it includes the prefill, the wait
for decode-side room, the link queue and the copy. (vLLM's NIXL path samples the first token
again in the decode instance's first step, one decode step later; Splitwise and DistServe count
it from the prefill machine, which streams it while the copy runs: this choice is the pessimistic
one of the three.) Layer-by-layer overlap of the copy with the prefill (Splitwise) is not
modelled: the copy starts after the whole prompt.
"""

from __future__ import annotations

from collections.abc import Generator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.core.kv_cache import blocks_for
from servesim.core.replica_state import ReplicaState
from servesim.core.state import DECODE_KV_NEVER_FITS, KV_NEVER_FITS, TOO_LONG, RequestState
from servesim.engines import Engine
from servesim.errors import ServesimError
from servesim.hardware_io import load_hardware
from servesim.metrics.columns import as_frame
from servesim.metrics.stats import describe as describe_values
from servesim.metrics.stats import fmt_seconds
from servesim.metrics.usage import kv_usage
from servesim.model_config import load_model
from servesim.policies.base import Policy, choose_policy
from servesim.policies.handoff import KvReceiver, LeastKvLoad
from servesim.policies.routers import ROUTERS, RouterChoice, choose_router
from servesim.topology.base import Built, Topology, build_group, register_topology
from servesim.topology.colocated import deployment_keys, experiment_policy, precision_of
from servesim.topology.group import ReplicaGroup, resolve_group
from servesim.topology.keys import GROUP_ENGINE_KEYS, DecodeGroupKeys, GroupKeys, LinkKeys

if TYPE_CHECKING:
    import pandas as pd
    import simpy

    from servesim.config import ExperimentConfig
    from servesim.core.kv_link import KvLink, KvLinkSpec
    from servesim.core.replica import ServingUnit
    from servesim.core.sim import Sim

GROUPS = ("prefill", "decode")
LEAST_KV = "least_kv"
REQUEST_COLUMNS = ("decode_replica", "prefill_end_s", "transfer_queued_s", "transfer_start_s",
                   "transfer_end_s")
"""Per request: the decode replica; when the prompt KV was complete on the prefill replica; when
the decode replica reserved its blocks and asked the link for a channel; the copy itself."""


@register_topology
class Disaggregated(Topology):
    kind = "disaggregated"
    supports_prefix_caching = False
    prefix_caching_note = "its prefill and decode groups do not share a prefix cache yet"

    def __init__(self, prefill: ReplicaGroup, decode: ReplicaGroup, link: KvLinkSpec,
                 router: RouterChoice, decode_router: str) -> None:
        super().__init__((prefill, decode))
        self.prefill = prefill
        self.decode = decode
        self.link = link
        self.router = router
        self.decode_router = decode_router

    # ------------------------------------------------------------------ resolution
    @classmethod
    def resolve(cls, config: ExperimentConfig, engine: Engine) -> Disaggregated:
        d = config.deployment
        if config.speculative is not None and config.speculative.enabled:
            raise ServesimError("speculative", f"is not modelled for deployment kind {cls.kind!r} yet "
                                "(the prefill group would also run the proposer's prefill)",
                                "remove it or use deployment.kind: colocated")
        if d.enable_prefix_caching:
            raise ServesimError("deployment.enable_prefix_caching", f"is not modelled for deployment kind "
                                f"{cls.kind!r} ({cls.prefix_caching_note})",
                                "remove it or use deployment.kind: colocated")
        prefill_keys, decode_keys = d.prefill or GroupKeys(), d.decode or DecodeGroupKeys()
        default_policy = experiment_policy(config, engine)
        policies = {name: choose_policy(*keys.policy_section(default_policy),
                                        where=f"deployment.{name}.policy")
                    for name, keys in (("prefill", prefill_keys), ("decode", decode_keys))}
        if decode_keys.router != LEAST_KV and decode_keys.router not in ROUTERS:
            raise ServesimError("deployment.decode.router", f"unknown router {decode_keys.router!r}",
                                f"use one of: {', '.join(sorted({LEAST_KV, *ROUTERS}))}")
        if d.replicas != 1:
            raise ServesimError("deployment.replicas", "a disaggregated deployment sizes its groups itself",
                                "set deployment.prefill.replicas and deployment.decode.replicas instead")
        router = choose_router(config.router.name, config.router.knobs())
        if router.cls.needs_prefix_cache:
            raise ServesimError("router.name", f"{router.name} routes by what the replicas' prefix "
                                "caches hold, and prefix caching is off",
                                "set deployment.enable_prefix_caching: true or pick another router")
        model = load_model(config.model, "model")
        prefill = _resolve_group(config, engine, model, "prefill", prefill_keys, policies["prefill"])
        decode = _resolve_group(config, engine, model, "decode", decode_keys, policies["decode"])
        from servesim.core.kv_link import resolve_link  # here: a colocated plan loads no link (SimPy)

        link_keys = d.link or LinkKeys()
        link = resolve_link(link_keys.kind, link_keys.bandwidth_Bps, link_keys.latency_s,
                            link_keys.efficiency, link_keys.channels, min(prefill.tp, decode.tp),
                            [prefill.hardware, decode.hardware])
        return cls(prefill, decode, link, router, decode_keys.router)

    # ------------------------------------------------------------------ what it is
    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes of one token over all TP shards (what crosses the link), at the KV dtype."""
        p = self.precision
        return float(self.model.kv_bytes_per_token(p.kv_cache, 1, p.group_size))

    def group(self, name: str) -> ReplicaGroup:
        return self.prefill if name == "prefill" else self.decode

    def describe(self) -> dict[str, Any]:
        p, d = self.prefill, self.decode
        same_hw = p.hardware.name == d.hardware.name
        out = p.describe()
        out.update({
            "hardware": p.hardware.name if same_hw else f"{p.hardware.name} (prefill) / "
                                                        f"{d.hardware.name} (decode)",
            "tp": p.tp if p.tp == d.tp else f"{p.tp} (prefill) / {d.tp} (decode)",
            "replicas": self.replicas, "gpus": self.num_gpus,
            "kv_blocks_per_replica": d.limits.num_blocks,
            "max_num_seqs": d.limits.max_num_seqs,
            "max_num_batched_tokens": d.limits.max_num_batched_tokens,
            "pools": {name: self._describe_group(name) for name in GROUPS},
            "link": self.link.describe(),
        })
        return out

    def describe_links(self) -> list[str]:
        link, spec = self.link.link, self.link
        return [f"KV link: {link.kind}, {link.bandwidth_Bps * link.efficiency / 1e9:.1f} GB/s x "
                f"{spec.lanes} lane(s), {link.latency_s * 1e6:.0f} us, {spec.channels} channel(s); "
                f"{self.kv_bytes_per_token / 1024:.0f} KiB of KV per prompt token"]

    def _describe_group(self, name: str) -> dict[str, object]:
        group = self.group(name)
        described = group.describe()
        keep = ("hardware", "tp", "replicas", "gpus", "kv_blocks_per_replica", "max_num_seqs",
                "max_num_batched_tokens")
        out = {key: described[key] for key in keep}
        out["policy"] = group.policy.name
        if group.policy.knobs:
            out["policy_options"] = group.policy.knobs
        if name == "decode":
            out["router"] = self.decode_router
        return out

    # ------------------------------------------------------------------ before and during a run
    def rejection_codes(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """A request is refused at arrival when it could never fit on a prefill replica (its
        prompt) or on a decode replica (prompt and outputs but the last)."""
        pre, dec = self.prefill.limits, self.decode.limits
        codes = np.zeros(prompt.size, dtype=np.int8)
        codes[blocks_for(prompt + output - 1, dec.block_size) > dec.num_blocks] = DECODE_KV_NEVER_FITS
        codes[blocks_for(prompt, pre.block_size) > pre.num_blocks] = KV_NEVER_FITS
        codes[prompt + output > min(pre.max_model_len, dec.max_model_len)] = TOO_LONG
        return codes

    def build(self, sim: Sim, reject_codes: np.ndarray) -> Built:
        from servesim.core.kv_link import KvLink

        if self.prefill.runtime.frontend_chunk_s or self.decode.runtime.frontend_chunk_s:
            raise ServesimError("engine.frontend_chunk_s", "the front end's streaming cost is modelled for "
                                "aggregated deployments, not disaggregated ones",
                                "leave it 0 (unset) for this deployment")
        link = KvLink(sim.env, self.link)
        handoff = Handoff(sim.env, sim.requests, link, self.kv_bytes_per_token, self.decode.runtime.handoff_s,
                          state_bytes=self.model.linear_state_bytes(1))
        prefill = build_group(sim, self.prefill, 0, partial(
            _prefill_state, sim, self.prefill, reject_codes))
        for replica in prefill.replicas:
            replica.prompts_done = partial(handoff.prefilled, replica)
            handoff.prefill.append(replica)
        held = np.zeros(len(sim.requests), dtype=np.int64)  # the decode group's own block column
        no_rejections = np.zeros(len(sim.requests), dtype=np.int8)  # arrivals never reach it
        decode = build_group(sim, self.decode, self.prefill.units, partial(
            _decode_state, sim, self.decode, held, no_rejections), wrap_policy=handoff.receiver)
        handoff.decode.extend(decode.replicas)
        if self.decode_router != LEAST_KV:
            handoff.route = choose_router(self.decode_router, {}).make(decode.states).route
        router = self.router.make(prefill.states)
        replicas = prefill.replicas

        def entry(request: int, now: float) -> None:
            replicas[router.route(request, now)].accept(request)

        return Built(entry, [prefill, decode], [link])

    # ------------------------------------------------------------------ after a run
    def request_columns(self, sim: Sim) -> dict[str, np.ndarray]:
        r = sim.requests
        return dict(zip(REQUEST_COLUMNS, (r.decode_replica.astype(np.int64), r.prefill_end, r.transfer_queued,
                                          r.transfer_start, r.transfer_end), strict=True))

    def summary_sections(self, sim: Sim, built: Built, requests: pd.DataFrame, steps: pd.DataFrame,
                         span: float) -> dict[str, Any]:
        """``disaggregation``: per group (``pools``) its steps, busy time and KV figures; the link's
        transfers and utilisation (busy channel-seconds over ``channels x`` the run's span); and
        the waits of a request between its prefill and its first token: ``decode_wait_s`` (for
        decode-side room), ``link_wait_s`` (for a channel), ``transfer_s`` (the copy)."""
        described = self.describe()["pools"]
        pools: dict[str, Any] = {}
        for run in built.groups:
            name = run.group.name
            mine = steps[steps["pool"] == name]
            busy = float(mine["duration_s"].sum())
            pools[name] = {**described[name], "steps": len(mine), "busy_s": busy,
                           "busy_fraction": busy / (len(run.replicas) * span) if span > 0 else 0.0,
                           "kv": kv_usage(run.states, mine)}
        link = built.links[0]
        frame = as_frame(requests)
        moved = frame[np.isfinite(frame["transfer_end_s"].to_numpy())]

        def waits(end: str, start: str) -> dict[str, float | None]:
            return describe_values((moved[end] - moved[start]).to_numpy())

        return {"disaggregation": {
            "pools": pools,
            "link": {**link.spec.describe(), "transfers": link.transfers, "bytes": link.bytes,
                     "busy_s": link.busy_s,
                     "utilization": link.busy_s / (link.spec.channels * span) if span > 0 else 0.0},
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "decode_wait_s": waits("transfer_queued_s", "prefill_end_s"),
            "link_wait_s": waits("transfer_start_s", "transfer_queued_s"),
            "transfer_s": waits("transfer_end_s", "transfer_start_s"),
        }}

    def summary_lines(self, sections: dict[str, Any]) -> list[str]:
        dis = sections["disaggregation"]
        link, pools = dis["link"], dis["pools"]
        copy, link_wait, room_wait = dis["transfer_s"], dis["link_wait_s"], dis["decode_wait_s"]
        return [f"KV transfers: {link['transfers']:,}, copy p50 {fmt_seconds(copy['p50'])} p99 "
                f"{fmt_seconds(copy['p99'])}; link wait p99 {fmt_seconds(link_wait['p99'])}, decode-room "
                f"wait p99 {fmt_seconds(room_wait['p99'])}; link busy {link['utilization']:.0%}; prefill "
                f"pool busy {pools['prefill']['busy_fraction']:.0%}, decode pool busy "
                f"{pools['decode']['busy_fraction']:.0%}"]

    def resolved_deployment(self, deployment: dict[str, Any]) -> str:
        """Each group's derived limits written into its section."""
        header = []
        for name in GROUPS:
            group = self.group(name)
            limits, memory = group.limits, group.memory
            section = deployment.get(name) or {}
            section.update({"max_num_batched_tokens": limits.max_num_batched_tokens,
                            "max_num_seqs": limits.max_num_seqs, "tp": group.tp,
                            "replicas": group.replicas, "policy": {"name": group.policy.name,
                                                                   **group.policy.knobs}})
            deployment[name] = section
            header.append(f"{name}: {limits.num_blocks:,} KV blocks of {limits.block_size} tokens per "
                          f"replica ({memory.kv_cache_bytes / 2**30:.1f} GiB per GPU)")
        deployment["max_model_len"] = self.prefill.limits.max_model_len
        deployment["block_size"] = self.prefill.limits.block_size
        if deployment.get("link") is None:
            deployment["link"] = LinkKeys().model_dump(mode="json")
        return "; ".join(header)


def _resolve_group(config: ExperimentConfig, engine: Engine, model: Any, name: str, keys: GroupKeys,
                   policy: Any) -> ReplicaGroup:
    overrides = {key: getattr(keys, key) for key in GROUP_ENGINE_KEYS if getattr(keys, key) is not None}
    group_keys = deployment_keys(config, **overrides, replicas=keys.replicas, enable_prefix_caching=False)
    try:
        hardware = load_hardware(keys.hardware or config.hardware, "hardware")
        return resolve_group(name, group_keys, model, hardware, precision_of(config), engine, policy)
    except ServesimError as exc:
        raise ServesimError(_group_field(exc.field, name, keys, overrides), exc.problem, exc.fix) from None


def _group_field(field: str, name: str, keys: GroupKeys, overrides: dict[str, Any]) -> str:
    """The key a user set that an error is about: the group's own, or the shared one."""
    head, _, rest = field.partition(".")
    key = rest if head == "deployment" else head
    if key in overrides or (key == "hardware" and keys.hardware):
        return f"deployment.{name}.{key}"
    if head == "policy":
        return f"deployment.{name}.policy" + (f".{rest}" if rest else "")
    if head == "deployment" and key == "":
        return f"deployment.{name}"
    return f"{field} (group {name})"


def _prefill_state(sim: Sim, group: ReplicaGroup, reject_codes: np.ndarray, index: int) -> ReplicaState:
    return ReplicaState(index, sim.requests, group.limits, seed=sim.seed, reject_codes=reject_codes)


def _decode_state(sim: Sim, group: ReplicaGroup, held: np.ndarray, reject_codes: np.ndarray,
                  index: int) -> ReplicaState:
    return ReplicaState(index, sim.requests, group.limits, held, sim.seed, reject_codes=reject_codes)


class Handoff:
    """Moves prefilled requests to the decode group and over the link (the mechanism; the
    decisions are the decode router's and the :class:`KvReceiver`'s)."""

    def __init__(self, env: simpy.Environment, requests: RequestState, link: KvLink,
                 kv_bytes_per_token: float, handoff_s: float = 0.0, state_bytes: float = 0.0) -> None:
        """``handoff_s``: the engine's hand-off latency per request
        (:attr:`~servesim.engines.base.CpuCosts.handoff_s`): a transfer's KV lands on its decode
        replica this long after its last byte left the link. ``state_bytes``: a hybrid model's
        recurrent state of one request (all shards), which crosses with its KV."""
        self.env = env
        self.requests = requests
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.handoff_s = handoff_s
        self.state_bytes = state_bytes
        self.prefill: list[ServingUnit] = []
        self.decode: list[ServingUnit] = []
        self.receivers: list[KvReceiver] = []
        self.route = LeastKvLoad(self.receivers).route

    def receiver(self, state: ReplicaState, policy: Policy) -> KvReceiver:
        """Wrap a decode replica's policy so that it takes in transfers."""
        receiver = KvReceiver(state, policy, self.start_transfer)
        self.receivers.append(receiver)
        return receiver

    def prefilled(self, replica: ServingUnit, ids: np.ndarray, now: float) -> None:
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

    def _transfer(self, request: int) -> Generator[simpy.Event, Any, None]:
        r = self.requests
        nbytes = float(r.prompt[request]) * self.kv_bytes_per_token + self.state_bytes
        start, end = yield from self.link.transfer(nbytes)
        r.transfer_start[request] = start
        source = self.prefill[int(r.replica[request])]
        source.state.pool.release(request)
        source.wake()  # freed blocks may admit waiting prompts
        landed = end
        if self.handoff_s > 0.0:  # set-up and completion notice: the decode side learns of it later
            yield self.env.timeout(self.handoff_s)
            landed = self.env.now
        d = int(r.decode_replica[request]) - len(self.prefill)
        target, receiver = self.decode[d], self.receivers[d]
        receiver.landed()
        ids = np.array([request], dtype=np.int64)
        if r.land(ids, landed, sent=end).size:  # a one-token output is complete on arrival
            target.state.pool.release(request)
        else:
            target.state.join_running(ids)
        target.wake()
