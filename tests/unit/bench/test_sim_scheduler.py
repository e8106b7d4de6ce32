"""The GPU-timed server's scheduler on a virtual clock: vLLM's priority order, chunked prefill within the token
budget, preemption of batch work when the KV cache runs short, and every step lasting the formula's time."""

from __future__ import annotations

import pytest

from bench.sim_scheduler import BLOCK_TOKENS, SimRequest, SimScheduler, StepPlan
from storage.planning.node import HARDWARE_PRESETS, LLAMA_70B_FP8
from storage.planning.step_time import StepLoad, step_seconds

H100 = HARDWARE_PRESETS["8xH100-SXM"]
BATCH = 1_000_000  # the priority shared mode sends batch work at


def scheduler(*, seqs: int = 8, budget: int = 8192, kv_tokens: int = 1_000_000) -> SimScheduler:
    return SimScheduler(
        shape=LLAMA_70B_FP8, hardware=H100, max_num_seqs=seqs, max_num_batched_tokens=budget, kv_cache_tokens=kv_tokens
    )


class Clock:
    """Runs steps back to back on virtual time; keeps every plan."""

    def __init__(self, sched: SimScheduler) -> None:
        self.sched, self.now, self.plans = sched, 0.0, []

    def step(self) -> StepPlan:
        plan = self.sched.schedule()
        self.plans.append(plan)
        self.now += plan.seconds
        self.sched.complete(plan, self.now)
        return plan

    def until_done(self, *requests: SimRequest, limit: int = 10_000) -> None:
        for _ in range(limit):
            if all(r.finished for r in requests):
                return
            self.step()
        raise AssertionError("requests did not finish")


def test_online_work_is_admitted_before_batch_work_that_arrived_earlier() -> None:
    sched = scheduler(seqs=1)
    batch = SimRequest(prompt_tokens=10, max_tokens=3, priority=BATCH, arrival=0.0)
    online = SimRequest(prompt_tokens=10, max_tokens=3, priority=0, arrival=1.0)
    sched.add(batch)
    sched.add(online)
    clock = Clock(sched)
    clock.until_done(online)
    assert batch.first_token_at is None  # one slot: the online request took it although it came later
    clock.until_done(batch)
    assert online.finished_at is not None and batch.first_token_at is not None
    assert online.finished_at < batch.first_token_at


def test_a_running_batch_request_keeps_its_slot_when_online_work_arrives() -> None:
    sched = scheduler(seqs=1)
    batch = SimRequest(prompt_tokens=10, max_tokens=5, priority=BATCH)
    sched.add(batch)
    clock = Clock(sched)
    clock.step()
    online = SimRequest(prompt_tokens=10, max_tokens=2, priority=0, arrival=clock.now)
    sched.add(online)
    clock.until_done(batch)
    assert online.first_token_at is None and batch.preemptions == 0  # vLLM never preempts to admit
    clock.until_done(online)


def test_prompts_are_prefilled_in_chunks_within_the_token_budget_beside_the_decodes() -> None:
    sched = scheduler(budget=256)
    decoding = SimRequest(prompt_tokens=4, max_tokens=50, stream=True)  # streamed: its count is kept live
    sched.add(decoding)
    clock = Clock(sched)
    clock.step()  # its prompt, and its first token
    long = SimRequest(prompt_tokens=1000, max_tokens=2)
    sched.add(long)
    chunks = []
    while long.first_token_at is None:
        plan = clock.step()
        assert plan.tokens.sum() <= 256
        assert plan.load.decode_seqs == 1  # the decode goes first, every step
        chunks.append(int(plan.load.prefill_tokens))
    assert chunks == [255, 255, 255, 235]
    assert decoding.output_tokens == 1 + len(chunks)


def test_every_step_lasts_the_step_time_formula_for_what_it_carried() -> None:
    sched = scheduler(budget=512)
    for i in range(4):
        sched.add(SimRequest(prompt_tokens=300, max_tokens=20, arrival=float(i)))
    clock = Clock(sched)
    for _ in range(10):
        plan = clock.step()
        assert plan.seconds == step_seconds(LLAMA_70B_FP8, H100, plan.context, plan.load)
    # the first step prefills one prompt and a chunk of the next, with nothing to decode (compute-bound)
    first = clock.plans[0]
    assert first.load == StepLoad(decode_seqs=0, prefill_tokens=512, prefill_context_tokens=0)
    assert clock.plans[-1].load.decode_seqs == 4 and clock.plans[-1].load.prefill_tokens == 0


def test_the_kv_cache_running_short_preempts_the_youngest_batch_request_and_it_still_finishes() -> None:
    # Room for 12 blocks: two online requests and two batch requests of 2 blocks each grow past it.
    sched = scheduler(kv_tokens=12 * BLOCK_TOKENS)
    online = [SimRequest(prompt_tokens=16, max_tokens=40, priority=0, arrival=float(i)) for i in range(2)]
    batch = [SimRequest(prompt_tokens=16, max_tokens=40, priority=BATCH, arrival=float(10 + i)) for i in range(2)]
    for request in batch + online:
        sched.add(request)
    clock = Clock(sched)
    clock.until_done(*online, *batch)
    assert sched.counters.preemptions >= 1
    assert all(r.preemptions == 0 for r in online)
    assert batch[1].preemptions >= 1  # the youngest batch request goes first
    assert all(r.output_tokens == 40 for r in online + batch)  # recomputed, not lost


def test_no_more_than_max_num_seqs_run_and_the_rest_wait() -> None:
    sched = scheduler(seqs=384)
    requests = [SimRequest(prompt_tokens=20, max_tokens=30, priority=BATCH, arrival=float(i)) for i in range(500)]
    for request in requests:
        sched.add(request)
    clock = Clock(sched)
    clock.step()
    assert sched.running_count == 384 and sched.waiting_count == 116
    clock.until_done(*requests)
    assert sched.counters.generation_tokens["batch"] == 500 * 30


def test_an_aborted_request_frees_its_slot_for_the_next() -> None:
    sched = scheduler(seqs=1)
    first = SimRequest(prompt_tokens=10, max_tokens=1000)
    second = SimRequest(prompt_tokens=10, max_tokens=2, arrival=1.0)
    sched.add(first)
    sched.add(second)
    clock = Clock(sched)
    plan = sched.schedule()
    sched.abort(first)  # the client went away during the step
    clock.now += plan.seconds
    sched.complete(plan, clock.now)
    assert first.output_tokens == 0 and sched.running_count == 0
    clock.until_done(second)
    assert second.output_tokens == 2 and not sched.has_work()


def test_streaming_requests_hear_of_every_step_that_gave_them_a_token() -> None:
    sched = scheduler()
    heard: list[int] = []
    request = SimRequest(prompt_tokens=10, max_tokens=5, stream=True, on_tokens=lambda r: heard.append(r.output_tokens))
    sched.add(request)
    Clock(sched).until_done(request)
    assert heard == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("tokens", [0, -1])
def test_a_request_without_prompt_or_output_is_refused(tokens: int) -> None:
    with pytest.raises(ValueError):
        scheduler().add(SimRequest(prompt_tokens=tokens, max_tokens=5))


def test_a_long_prefill_threshold_caps_each_prompts_chunk_while_others_share_the_server() -> None:
    sched = SimScheduler(
        shape=LLAMA_70B_FP8,
        hardware=H100,
        max_num_seqs=8,
        max_num_batched_tokens=8192,
        kv_cache_tokens=1_000_000,
        long_prefill_token_threshold=64,
    )
    alone = SimRequest(prompt_tokens=200, max_tokens=2)
    sched.add(alone)
    clock = Clock(sched)
    assert int(clock.step().load.prefill_tokens) == 200  # nobody else: the whole prompt in one step
    pair = [SimRequest(prompt_tokens=200, max_tokens=2, arrival=float(i)) for i in range(2)]
    for request in pair:
        sched.add(request)
    assert clock.step().tokens.tolist() == [1, 64, 64]  # the decode, then a 64-token chunk of each prompt


def test_a_traced_step_tells_online_prompts_staged_pieces_and_batch_decodes_apart() -> None:
    sched = scheduler()
    sched.trace = []
    batch = SimRequest(prompt_tokens=32, max_tokens=5, priority=BATCH)
    sched.add(batch)
    clock = Clock(sched)
    clock.step()  # the batch request's prompt (a batch chunk) and its first token
    online = SimRequest(prompt_tokens=200, max_tokens=3, priority=0, arrival=clock.now)
    piece = SimRequest(prompt_tokens=32, max_tokens=1, priority=BATCH, arrival=clock.now)  # a staged piece
    sched.add(online)
    sched.add(piece)
    plan = clock.step()
    first, second = sched.trace
    assert (first.batch_prefill, first.piece_prefill, first.online_prompts) == (32, 0, 0)
    assert first.batch_seconds == first.seconds  # batch work alone: all of it is the batch's
    assert (second.online_prompts, second.online_prefill, second.online_decodes) == (1, 200, 0)
    assert (second.piece_prefill, second.batch_prefill, second.batch_decodes) == (32, 0, 1)
    assert second.end == clock.now and second.seconds == plan.seconds
    alone = step_seconds(LLAMA_70B_FP8, H100, plan.context, StepLoad(prefill_tokens=200))
    assert second.batch_seconds == pytest.approx(plan.seconds - alone)  # compute-bound: the 33 batch tokens' share
    assert second.batch_seconds > 0


def test_without_a_trace_list_nothing_is_kept() -> None:
    sched = scheduler()
    sched.add(SimRequest(prompt_tokens=10, max_tokens=2))
    Clock(sched).step()
    assert sched.trace is None
