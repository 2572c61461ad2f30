"""Which KV blocks of each request hold content that another request can share.

vLLM's automatic prefix caching keys every *full* KV block by a hash of its tokens chained with the
hash of the block before it, so a block's key names its whole prefix and two requests share a
block only when everything before it is identical too. A simulator has no tokens; it has the
trace's prefix block ids instead (Mooncake's ``hash_ids``: id ``i`` names the ``P``-token block
``[i P, (i + 1) P)`` of the prompt, ``P = RequestTable.prefix_block_size`` = 512 in Mooncake).

This module maps those ids onto the engine's KV blocks of ``block_size`` tokens, exactly:

- The prompt's hash blocks are interned as nodes of a prefix tree, keyed by (parent node, id,
  tokens in the block): the same node means the same tokens from the start of the prompt to the
  end of that block. The length is part of the key so that a truncated last block (a prompt that
  ends inside it) is never confused with the whole block.
- KV block ``b`` (tokens ``[b bs, (b + 1) bs)``) is keyed by the node of the hash block holding its
  *last* token, so a KV block straddling two hash blocks depends on both. Only full KV blocks
  inside the prompt's hashed tokens are keyed (vLLM caches full blocks only); the rest of a
  request's blocks (the partial last block, tokens past the ids, generated tokens) are private.
- Every keyed KV block gets a dense integer *slot*: ``base[node] + b - first_block(node)``. A
  request's slots are its keyed blocks in prompt order, so the pools can keep their cache state in
  NumPy arrays indexed by slot instead of one Python object per block.

Built once per simulation (a Python loop over the ids only, about 0.3 s for the 12k-request
Mooncake conversation trace with 288k ids) and shared by every replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from servesim.workloads.requests import RequestTable


_EMPTY = np.empty(0, dtype=np.int64)


class PrefixIndex:
    """Slots of every request's shareable KV blocks (see the module docstring)."""

    def __init__(self, table: RequestTable, block_size: int) -> None:
        n = len(table)
        self.block_size = bs = int(block_size)
        self.keyed_blocks = np.zeros(n, dtype=np.int64)
        """Full KV blocks of request ``r``'s hashed prompt tokens (its first ``keyed_blocks[r]``
        blocks are shareable)."""
        chain_offsets = np.zeros(n + 1, dtype=np.int64)
        chains: list[int] = []
        bases: list[int] = []
        firsts: list[int] = []
        counts: list[int] = []
        offsets, ids = table.prefix_block_offsets, table.prefix_block_ids
        if offsets is not None and ids is not None:
            size = int(table.prefix_block_size)
            nodes: dict[tuple[int, int, int], int] = {}
            prompts = table.prompt_tokens.tolist()
            id_list = ids.tolist()
            bounds = offsets.tolist()
            slots = 0
            for r in range(n):
                parent, prompt, keyed = -1, prompts[r], 0
                for i, block_id in enumerate(id_list[bounds[r]:bounds[r + 1]]):
                    begin = i * size
                    if begin >= prompt:  # ids past the prompt name no tokens of it
                        break
                    end = min(begin + size, prompt)
                    key = (parent, block_id, end - begin)
                    node = nodes.get(key)
                    if node is None:
                        node = nodes[key] = len(bases)
                        first, count = begin // bs, end // bs - begin // bs
                        bases.append(slots)
                        firsts.append(first)
                        counts.append(count)
                        slots += count
                    chains.append(node)
                    keyed = end // bs
                    parent = node
                chain_offsets[r + 1] = len(chains)
                self.keyed_blocks[r] = keyed
        self.chain_offsets = chain_offsets
        self.chain_nodes = np.asarray(chains, dtype=np.int64)
        self.node_base = np.asarray(bases, dtype=np.int64)
        self.node_first = np.asarray(firsts, dtype=np.int64)
        self.node_count = np.asarray(counts, dtype=np.int64)
        self.num_slots = int(self.node_count.sum()) if self.node_count.size else 0

    @property
    def shares_anything(self) -> bool:
        """Whether any request has a shareable block at all."""
        return bool(self.keyed_blocks.any())

    def slots(self, request: int) -> np.ndarray:
        """Slots of ``request``'s keyed KV blocks, block 0 first (empty when it has none)."""
        if self.keyed_blocks[request] == 0:
            return _EMPTY
        chain = self.chain_nodes[self.chain_offsets[request]:self.chain_offsets[request + 1]]
        counts = self.node_count[chain]
        # Block b of node k sits at slot base[k] + (b - first[k]); a chain's blocks are consecutive.
        starts = self.node_base[chain] - self.node_first[chain]
        return np.repeat(starts, counts) + np.arange(self.node_first[chain[0]],
                                                     self.node_first[chain[0]] + int(counts.sum()))
