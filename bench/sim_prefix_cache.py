"""The prefix cache of the GPU-timed server's scheduler (bench/sim_scheduler.py): vLLM V1's automatic prefix
caching in miniature (vllm/v1/core/kv_cache_manager.py, block_pool.py; on by default in vLLM's server).

- A prompt's KV lives in 16-token blocks; each full block is named by a hash chained over every token up to its
  end (`block_hashes`), so equal hashes mean equal prefixes.
- A request admitted to a slot reuses the longest run of its leading blocks the cache holds, capped one token
  short of its length (vLLM always computes at least the last token to sample from it): those tokens are not
  computed again and count as `prefix_cache_hits` (tokens), the request's length as `prefix_cache_queries`.
- Blocks a running request holds are never evicted; when it finishes (or is aborted or preempted) its blocks
  become free but stay cached, last block first in eviction order (vLLM frees a request's blocks in reverse,
  so a prefix outlives its tails), and are evicted least-recently-used first when the KV cache needs room.

Simplification: two running requests sharing a block each count it in the scheduler's KV usage (vLLM counts
it once), which makes preemption come a little early when many running requests share a prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16  # vLLM's default KV block on a GPU


def block_hashes(token_ids: Sequence[int], block: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """Chained hashes of a prompt's full blocks: block i's hash covers tokens 0 .. (i + 1) * block."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block + 1, block):
        parent = hash((parent, tuple(token_ids[start : start + block])))
        hashes.append(parent)
    return tuple(hashes)


class PrefixCache:
    """Cached blocks by hash: those running requests hold (with how many hold each) and free ones (LRU order)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._held: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.queries = 0  # tokens looked up (vLLM's prefix_cache_queries)
        self.hits = 0  # of those, tokens found cached (prefix_cache_hits)

    def lookup(self, hashes: Sequence[int], tokens: int) -> int:
        """How many leading blocks of a `tokens`-long request are cached (at most `(tokens - 1) // BLOCK_TOKENS`)."""
        found = 0
        for block_hash in hashes[: max(0, tokens - 1) // BLOCK_TOKENS]:
            if block_hash not in self._held and block_hash not in self._free:
                break
            found += 1
        self.queries += tokens
        self.hits += found * BLOCK_TOKENS
        return found

    def hold(self, hashes: Sequence[int]) -> None:
        """A running request holds these blocks (found cached, or just computed): none of them can be evicted."""
        for block_hash in hashes:
            self._free.pop(block_hash, None)
            self._held[block_hash] = self._held.get(block_hash, 0) + 1

    def release(self, hashes: Sequence[int]) -> None:
        """A request let go of its blocks: the last ones become the first to evict."""
        for block_hash in reversed(hashes):
            left = self._held.get(block_hash, 0) - 1
            if left > 0:
                self._held[block_hash] = left
                continue
            self._held.pop(block_hash, None)
            self._free[block_hash] = None
            self._free.move_to_end(block_hash)

    def evict(self, used_blocks: int) -> None:
        """Drop the least recently freed blocks until free cached ones fit beside `used_blocks` in the cache."""
        while self._free and len(self._free) > self.capacity_blocks - used_blocks:
            self._free.popitem(last=False)

    def reset(self) -> None:
        """Forget every free cached block (vLLM's `POST /reset_prefix_cache`); held blocks stay with their requests."""
        self._free.clear()

    @property
    def cached_blocks(self) -> int:
        """Blocks the cache can serve now (held by a running request or free)."""
        return len(self._held) + len(self._free)
