"""A KV block pool with automatic prefix caching (vLLM's ``enable_prefix_caching``).

It keeps :class:`~servesim.core.kv_cache.BlockPool`'s interface (``free``, ``held``,
``blocks_to_grow``, ``grow``, ``grow_many``, ``release``, ``release_many``) so that every policy
runs on it unchanged, and adds what vLLM v1's KV-cache manager and block pool do on top:

- **Keys.** A request's first ``PrefixIndex.keyed_blocks[r]`` blocks have content keys (slots, see
  :mod:`servesim.core.prefix_index`); its other blocks are private.
- **Hits.** On admission a request with nothing computed takes the longest run of its keyed blocks
  that this replica has cached, from block 0, capped so that at least its last token is computed
  (vLLM: ``max_cache_hit_length = num_tokens - 1``, in whole blocks). It references those blocks
  (reference count + 1) and starts with ``computed`` = the hit tokens.
- **Registration.** A keyed block becomes cached when it is allocated (vLLM v1 caches a block's
  hash in ``allocate_slots``, for the tokens the step computes). If the key is already cached (a
  request admitted in the same step as the one that allocated it, or the one block past a capped
  hit) the new block stays a private duplicate, freed when its request finishes.
- **Release.** A finished or preempted request drops its references; a block whose count reaches
  zero stays cached and becomes *evictable*. Evictable blocks count as free (vLLM's free block
  queue holds them; its KV-cache usage metric excludes them).
- **Eviction.** Allocation uses never-used/private-freed (*empty*) blocks first and evicts cached
  ones only when none is left, least recently released first, and within one release the last
  block of the request first (vLLM frees a request's blocks in reverse order so that the tail of a
  prefix goes before its head). This is SGLang's radix cache rule (evict only under pressure);
  vLLM's single free queue would instead recycle an old cached block before a younger empty one,
  which differs only while the pool still has empty blocks.

Accounting is exact at every point: ``in_use + evictable + empty == total``, where ``in_use`` is
the distinct blocks referenced by running requests plus their private blocks, and ``free =
evictable + empty`` is what policies see. Cache state lives in two NumPy arrays over slots
(``refs``: -1 when not cached here, else the reference count; ``stamp``: the release that last made
it evictable), so a lookup or a release is a few vectorised operations, never a loop over blocks.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from servesim.core.kv_cache import BlockPool
from servesim.core.prefix_index import PrefixIndex

_EMPTY = np.empty(0, dtype=np.int64)
_NOT_CACHED = -1


class PrefixBlockPool(BlockPool):
    """``total`` blocks of ``block_size`` tokens, shared by prefix across requests."""

    __slots__ = (
        "_looked_up",
        "_lru",
        "_referenced",
        "_releases",
        "empty",
        "evictable",
        "evicted_blocks",
        "index",
        "refs",
        "stamp",
    )

    def __init__(self, total_blocks: int, block_size: int, index: PrefixIndex,
                 held: np.ndarray | None = None) -> None:
        super().__init__(total_blocks, block_size, index.keyed_blocks.size, held)
        if index.block_size != self.block_size:
            raise ValueError(f"prefix index built for block_size {index.block_size}, pool has {block_size}")
        self.index = index
        self.empty = self.total
        self.evictable = 0
        self.evicted_blocks = 0
        self.refs = np.full(index.num_slots, _NOT_CACHED, dtype=np.int32)
        self.stamp = np.zeros(index.num_slots, dtype=np.int64)
        self._referenced: dict[int, np.ndarray] = {}  # request -> slots it references, in order
        self._lru: deque[list] = deque()  # [release number, slots to evict first-to-last, cursor]
        self._releases = 0
        self._looked_up: dict[tuple[int, int], tuple[int, int]] = {}
        """:meth:`lookup`'s answers since the cache last changed (every change ends in
        :meth:`_sync`, which empties it): admission looks each request up twice, when the policy
        prices it (``ReplicaState.prefill_need``) and when it is admitted (:meth:`admit`)."""

    # ------------------------------------------------------------------ what the cache holds
    @property
    def cached_blocks(self) -> int:
        """Blocks with a cached key, referenced or not."""
        return int(np.count_nonzero(self.refs >= 0))

    def lookup(self, request: int, tokens: int) -> tuple[int, int]:
        """(hit blocks, how many of them are evictable) if ``request``, holding nothing, were
        admitted now to compute ``tokens`` tokens. Pure: changes nothing (answers are remembered
        until the cache changes)."""
        key = (request, tokens)
        known = self._looked_up.get(key)
        if known is not None:
            return known
        keyed = int(self.index.keyed_blocks[request])
        if keyed == 0 or tokens <= self.block_size:
            return 0, 0
        usable = min(keyed, (int(tokens) - 1) // self.block_size)
        refs = self.refs[self.index.slots(request)[:usable]]
        missing = refs < 0
        hit = int(np.argmax(missing)) if np.count_nonzero(missing) else usable
        answer = self._looked_up[key] = (hit, int(np.count_nonzero(refs[:hit] == 0)))
        return answer

    def cached_prefix_tokens(self, request: int) -> int:
        """Tokens of ``request``'s prompt whose KV this replica holds, from the start (what a
        prefix-aware router compares; not capped by the recompute of the last token)."""
        slots = self.index.slots(request)
        if slots.size == 0:
            return 0
        missing = self.refs[slots] < 0
        return (int(np.argmax(missing)) if missing.any() else int(slots.size)) * self.block_size

    # ------------------------------------------------------------------ admission
    def admit(self, requests: np.ndarray, tokens: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Admit ``requests`` (holding no blocks), the i-th to compute up to ``tokens[i]`` tokens
        with ``blocks[i]`` fewer free blocks, as :meth:`lookup` priced it; returns the tokens each
        found cached.

        In three phases, so that the batch sees the cache as the policy priced it: all lookups
        first, then every hit is referenced (so that no allocation of the batch evicts a block
        another member hits), then the misses are allocated and registered."""
        ids = requests.tolist()
        plans = [self.lookup(r, int(t)) for r, t in zip(ids, tokens.tolist(), strict=True)]
        index = self.index
        for r, (hit, _) in zip(ids, plans, strict=True):
            if hit:
                slots = index.slots(r)[:hit]
                refs = self.refs[slots]
                self.evictable -= int(np.count_nonzero(refs == 0))
                self.refs[slots] = refs + 1
                self._referenced[r] = slots
        held = self.held
        for r, (hit, evictable_hits), cost in zip(ids, plans, blocks.tolist(), strict=True):
            private = int(cost) - evictable_hits
            self._take(private)
            held[r] = hit + private
            self._register(r, hit, hit + private)
        self._sync()
        return np.fromiter((hit * self.block_size for hit, _ in plans), dtype=np.int64, count=len(ids))

    def admit_one(self, request: int, tokens: int, blocks: int) -> int:
        """:meth:`admit` of one request (most admissions start one prompt), with Python ints
        instead of the arrays of one element: the same lookup, references, allocation and
        registration in the same order; returns the tokens it found cached
        (``tests/test_core_fast_paths.py`` compares whole runs both ways)."""
        hit, evictable_hits = self.lookup(request, tokens)
        if hit:
            slots = self.index.slots(request)[:hit]
            refs = self.refs[slots]
            self.evictable -= int(np.count_nonzero(refs == 0))
            self.refs[slots] = refs + 1
            self._referenced[request] = slots
        private = blocks - evictable_hits
        self._take(private)
        self.held[request] = hit + private
        self._register(request, hit, hit + private)
        self._sync()
        return hit * self.block_size

    # ------------------------------------------------------------------ BlockPool's interface
    def grow(self, request: int, blocks: int) -> None:
        if blocks:
            self._take(blocks)
            before = int(self.held[request])
            self.held[request] = before + blocks
            if before < self.index.keyed_blocks[request]:
                self._register(request, before, before + blocks)
            self._sync()

    def grow_many(self, requests: np.ndarray, blocks: np.ndarray, total: int) -> None:
        if not total:
            return
        if 0 < total <= self.empty:  # _take's common case, inline (twice per fast-forwarded run)
            self.empty -= total
        else:
            self._take(total)
        before = self.held[requests]
        self.held[requests] = before + blocks
        below = before < self.index.keyed_blocks[requests]
        if not np.count_nonzero(below):  # decodes: every request is past its hashed prompt
            # (count_nonzero: a fraction of ``.any()``'s cost on a few elements)
            self._sync()
            return
        growing_keyed = below & (blocks > 0)
        if np.count_nonzero(growing_keyed):  # only prompt chunks; a decode grows past the hashed prompt
            for r, b, n in zip(requests[growing_keyed].tolist(), before[growing_keyed].tolist(),
                               blocks[growing_keyed].tolist(), strict=True):
                self._register(r, b, b + n)
        self._sync()

    def shrink_many(self, requests: np.ndarray, keep: np.ndarray) -> None:
        """Give back private blocks beyond the first ``keep[i]`` of ``requests[i]`` (rejected
        speculative proposals: decode blocks, past the keyed prompt blocks, which stay)."""
        keep = np.maximum(keep, self.index.keyed_blocks[requests])
        excess = self.held[requests] - keep
        freed = int(excess[excess > 0].sum())
        if freed:
            self.held[requests] = np.minimum(self.held[requests], keep)
            self.empty += freed
            self._sync()

    def release(self, request: int) -> int:
        blocks = int(self.held[request])
        self.held[request] = 0
        slots = self._referenced.pop(request, _EMPTY)
        if slots.size:
            refs = self.refs[slots] - 1
            self.refs[slots] = refs
            unreferenced = slots[refs == 0]
            if unreferenced.size:
                self._releases += 1
                self.stamp[unreferenced] = self._releases
                self.evictable += int(unreferenced.size)
                self._lru.append([self._releases, unreferenced[::-1], 0])
        self.empty += blocks - int(slots.size)
        self._sync()
        return blocks

    def release_many(self, requests: np.ndarray) -> None:
        for request in requests.tolist():
            self.release(request)

    # ------------------------------------------------------------------ internals
    def _sync(self) -> None:
        if self._looked_up:
            self._looked_up.clear()
        self.free = self.empty + self.evictable
        used = self.total - self.free
        if used > self.peak_used:
            self.peak_used = used

    def _take(self, blocks: int) -> None:
        """Hand out ``blocks`` blocks: empty ones first, then evict the least recently released."""
        if blocks > self.empty + self.evictable:
            raise RuntimeError(f"policy allocated {blocks} KV blocks with {self.empty + self.evictable} free")
        if blocks <= self.empty:
            self.empty -= blocks
            return
        self._evict(blocks - self.empty)
        self.empty = 0

    def _evict(self, count: int) -> None:
        self.evictable -= count
        self.evicted_blocks += count
        refs, stamp, lru = self.refs, self.stamp, self._lru
        while count:
            entry = lru[0]
            release, slots, cursor = entry
            pending = slots[cursor:]
            # Still evictable from this release: unreferenced and not released again since.
            valid = np.flatnonzero((refs[pending] == 0) & (stamp[pending] == release))
            taken = valid[:count]
            refs[pending[taken]] = _NOT_CACHED
            count -= int(taken.size)
            if taken.size < valid.size:
                entry[2] = cursor + int(taken[-1]) + 1
            else:
                lru.popleft()

    def _register(self, request: int, start: int, stop: int) -> None:
        """Blocks ``[start, stop)`` of ``request`` were just allocated: those with a key not yet
        cached here become cached, referenced by it; the others stay private."""
        stop = min(stop, int(self.index.keyed_blocks[request]))
        if stop <= start:
            return
        slots = self.index.slots(request)[start:stop]
        new = slots[self.refs[slots] < 0]
        if new.size:
            self.refs[new] = 1
            held = self._referenced.get(request)
            self._referenced[request] = new if held is None else np.concatenate((held, new))

    # ------------------------------------------------------------------ checks (tests, debugging)
    def audit(self, holders: np.ndarray) -> dict[str, int]:
        """Recount the pool from its arrays, given the requests on this replica (``held`` is
        shared by all replicas): blocks in use (distinct referenced + private), cached-unreferenced
        and empty; raises if a count disagrees with the running totals."""
        referenced = int(np.count_nonzero(self.refs > 0))
        evictable = int(np.count_nonzero(self.refs == 0))
        references = sum(int(s.size) for s in self._referenced.values())
        if int(self.refs[self.refs > 0].sum()) != references:
            raise AssertionError("reference counts disagree with the requests' references")
        if not set(self._referenced) <= set(np.asarray(holders).tolist()):
            raise AssertionError("a request references blocks of a replica it is not on")
        private = int(self.held[holders].sum()) - references
        if evictable != self.evictable:
            raise AssertionError(f"{evictable} cached-unreferenced blocks, counter says {self.evictable}")
        in_use = referenced + private
        if in_use + evictable + self.empty != self.total or self.free != evictable + self.empty:
            raise AssertionError(f"in use {in_use} + cached {evictable} + empty {self.empty} "
                                 f"!= {self.total} blocks (free {self.free})")
        return {"in_use": in_use, "referenced": referenced, "references": references,
                "evictable": evictable, "empty": self.empty, "total": self.total}
