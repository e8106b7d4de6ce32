"""The GPU-timed server's prefix cache: a prompt's cached leading blocks are not computed again, a staged prompt
(its prefixes sent one after another) computes each piece once, and free blocks go least recently used first."""

from __future__ import annotations

from bench.sim_prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes
from bench.sim_scheduler import SimRequest, SimScheduler
from storage.planning.node import HARDWARE_PRESETS, LLAMA_70B_FP8

H100 = HARDWARE_PRESETS["8xH100-SXM"]


def scheduler(*, kv_tokens: int = 1_000_000, threshold: int = 0) -> SimScheduler:
    return SimScheduler(
        shape=LLAMA_70B_FP8,
        hardware=H100,
        max_num_seqs=8,
        max_num_batched_tokens=8192,
        kv_cache_tokens=kv_tokens,
        long_prefill_token_threshold=threshold,
    )


def run(sched: SimScheduler, request: SimRequest) -> list[int]:
    """Run one request to its end; the prompt tokens each step computed."""
    sched.add(request)
    prefilled, now = [], 0.0
    while not request.finished:
        plan = sched.schedule()
        prefilled.append(int(plan.load.prefill_tokens))
        now += plan.seconds
        sched.complete(plan, now)
    return prefilled


def prompt(ids: list[int], max_tokens: int = 1) -> SimRequest:
    return SimRequest(prompt_tokens=len(ids), max_tokens=max_tokens, block_hashes=block_hashes(ids))


def test_block_hashes_name_whole_blocks_and_chain_over_the_prefix() -> None:
    ids = list(range(40))
    hashes = block_hashes(ids)
    assert len(hashes) == 40 // BLOCK_TOKENS
    assert block_hashes(ids[:32]) == hashes  # a shorter prompt with the same full blocks
    changed = [99, *ids[1:]]
    assert not set(block_hashes(changed)) & set(hashes)  # a different first token changes every later block's name


def test_a_repeated_prompt_computes_only_what_is_not_cached_and_the_counters_say_so() -> None:
    sched = scheduler()
    ids = list(range(100))
    assert run(sched, prompt(ids)) == [100]
    # 6 whole blocks (96 tokens) are cached; the last 4 tokens are computed again.
    assert run(sched, prompt(ids))[0] == 4
    assert (sched.prefix_cache.queries, sched.prefix_cache.hits) == (200, 96)


def test_a_prompt_that_is_all_whole_blocks_still_computes_its_last_block() -> None:
    sched = scheduler()
    ids = list(range(64))
    run(sched, prompt(ids))
    assert run(sched, prompt(ids))[0] == BLOCK_TOKENS  # vLLM caps a hit one token short of the prompt


def test_a_staged_prompt_computes_each_piece_once_and_the_real_request_only_its_tail() -> None:
    sched = scheduler(threshold=256)
    ids = list(range(502))
    pieces = [run(sched, prompt(ids[:end]))[0] for end in range(64, 502, 64)]
    assert pieces == [64] * 7
    real = prompt(ids, max_tokens=3)
    assert run(sched, real)[0] == 502 - 448
    assert real.output_tokens == 3
    assert sched.prefix_cache.hits == sum(range(64, 449, 64))


def test_without_hashes_nothing_is_cached() -> None:
    sched = scheduler()
    for _ in range(2):
        assert run(sched, SimRequest(prompt_tokens=100, max_tokens=1)) == [100]
    assert sched.prefix_cache.hits == 0


def test_free_blocks_are_evicted_least_recently_used_when_the_kv_cache_needs_the_room() -> None:
    sched = scheduler(kv_tokens=8 * BLOCK_TOKENS)
    old, new = list(range(64)), list(range(1000, 1064))
    run(sched, prompt(old))
    run(sched, prompt(new))  # 4 + 4 blocks: the cache is full of free blocks
    run(sched, prompt(list(range(2000, 2048))))  # 3 blocks of room: taken from the least recently freed prompt
    assert sched.prefix_cache.lookup(block_hashes(new), tokens=65) == 4  # the newer prompt is whole
    assert run(sched, prompt(old))[0] == 48  # the older lost its last 3 blocks; its first, freed last, stayed


def test_a_running_requests_blocks_are_never_evicted_and_a_second_request_shares_them() -> None:
    cache = PrefixCache(capacity_blocks=4)
    cache.hold([1, 2, 3])
    cache.evict(used_blocks=4)  # no room for free blocks, but these are held
    assert cache.lookup([1, 2, 3], tokens=64) == 3
    cache.hold([1, 2])
    cache.release([1, 2, 3])
    cache.evict(used_blocks=4)  # no room for free blocks: block 3 goes, 1 and 2 are still held by the second
    assert cache.lookup([1, 2, 3], tokens=64) == 2
    cache.release([1, 2])
    cache.evict(used_blocks=3)
    assert cache.lookup([1, 2], tokens=64) == 1  # freed in reverse: the prefix block outlives its tail
