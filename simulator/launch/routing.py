"""The simulated router in words, and as the SGLang router's policy name."""

from __future__ import annotations

ROUTER_WORDS = {
    "round_robin": "round robin",
    "least_outstanding": "least outstanding requests",
    "least_kv": "lowest KV-cache use (vLLM's kv_cache_usage metric)",
    "prefix_affinity": "prefix-cache-aware routing (SGLang router's cache_aware policy)",
}

SGLANG_ROUTER_POLICY = {"round_robin": "round_robin", "prefix_affinity": "cache_aware"}
"""servesim routers the SGLang router ships (others need a load balancer that implements them)."""


def routing_text(router: str, servers: int) -> str:
    if servers == 1:
        return "one server, no load balancer needed"
    return f"{servers} servers behind a load balancer routing by {ROUTER_WORDS.get(router, router)}"
