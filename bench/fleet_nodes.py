"""Virtual GPU nodes for bench/fleet.py: many simulated 8xH100 workers multiplexed onto one process.

Each node is one GPU worker as the database sees it: a worker id of its own, and the runner's database pattern
driven through the real storage code, with the runner's own constants (worker/feed/runner.py): it keeps up to
2 x max_num_seqs rows (768) in flight and claims when it holds fewer than 768 - 192 (`claim`, one claim
outstanding), commits finished results every second or 256 results with its engine run's counters
(worker/feed/writes.py `commit`, the writer thread's own function), and renews its leases every 2 s
(`renew_leases`: renew, take back, paused check). Its writes go in order, one at a time, as the writer thread's.

The engine is the GPU-timed model without the per-step bookkeeping: a step lasts the planner's formula
(storage/planning/step_time.py, through `TimedFakeEngine.step_time`) at the workload's steady state, and a
request admitted at t (a slot free, and prefill budget: `max_num_batched_tokens` a step less the decodes)
finishes at t + output tokens x step. So a node completes requests at the rate one 8xH100 node would, and an
engine left waiting (no rows claimed in time) shows as a lower rate than the nodes' demand.

The database calls run on two pools of threads per process (`--pool` each: claims, and writes), whose connections
play PgBouncer's part (a real node keeps two: its claimer's and its writer's); the node loop ticks every 10 ms and
hands each node's calls to them.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

MAX_NUM_SEQS = 384
FLUSH_SECONDS, FLUSH_RESULTS, RENEW_SECONDS = 1.0, 256, 2.0
MAX_PENDING, MAX_COALESCED = 16, 8  # worker/feed/queue_io.py: writes queued before the engine waits; one commit
BUDGET_TOKENS = 16384
TICK = 0.01


@dataclass(frozen=True)
class Workload:
    """One of the seed's two workloads on 70B FP8 on 8xH100."""

    name: str
    prompt_tokens: int
    out_low: int
    out_high: int
    log_uniform: bool
    step_seconds: float  # the formula's step at the workload's steady state

    def output_tokens(self, request_id: str) -> int:
        """The request's output length, a function of its id (seeded: the same in every run)."""
        u = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=4).digest(), "big") / 2**32
        if self.log_uniform:
            return int(math.exp(math.log(self.out_low) + u * (math.log(self.out_high) - math.log(self.out_low))))
        return self.out_low + int(u * (self.out_high - self.out_low + 1))

    @property
    def mean_output(self) -> float:
        if self.log_uniform:
            return (self.out_high - self.out_low) / math.log(self.out_high / self.out_low)
        return (self.out_low + self.out_high) / 2

    def node_rate(self) -> float:
        """Requests/s of one perfectly fed node: slots over each request's steps, or the prefill budget."""
        by_slots = MAX_NUM_SEQS / (self.mean_output * self.step_seconds)
        # r requests/s keep r x mean x step decoding, each a token of the budget: r (prompt + mean) step = budget
        by_budget = BUDGET_TOKENS / (self.step_seconds * (self.prompt_tokens + self.mean_output))
        return min(by_slots, by_budget)


def workloads() -> dict[str, Workload]:
    """Long outputs (7-token prompts, 10-1,000 output tokens log-uniform: decode-bound at batch 384) and short
    ones (500-token prompts, 1-10 output tokens: prefill-bound, the token budget full of prompts)."""
    from worker.engine.timed_fake import TimedFakeEngine

    engine = TimedFakeEngine(timed=False)
    decode = engine.step_time(MAX_NUM_SEQS)
    short_running = 180  # decoders beside the prompts at the short workload's steady state (~32 a step x 5.5)
    mixed = engine.step_time(short_running, BUDGET_TOKENS - short_running)
    return {
        "long": Workload("long", 7, 10, 1000, True, decode),
        "short": Workload("short", 500, 1, 10, False, mixed),
    }


@dataclass
class Node:
    """One virtual GPU worker: its rows by state and its pending database calls."""

    index: int
    worker_id: str
    waiting: deque[tuple[str, int]] = field(default_factory=deque)  # claimed, not yet in a slot: (id, tokens)
    running: int = 0
    finished: list[tuple[str, int]] = field(default_factory=list)  # results waiting for the next flush
    recording: int = 0
    ids: set[str] = field(default_factory=set)  # every id held (to renew)
    claiming: bool = False
    writes: deque[tuple[str, Any]] = field(default_factory=deque)
    writing: bool = False
    budget: float = 0.0
    last_tick: float = 0.0
    last_flush: float = 0.0
    last_renew: float = 0.0
    tally: Any = None


class Fleet:
    """The nodes of one process, their engine clocks, and the pool that runs their database calls."""

    def __init__(
        self,
        workload: Workload,
        *,
        pool: int,
        process: int,
        max_num_seqs: int = MAX_NUM_SEQS,
        model: str = "fleet-model",
    ) -> None:
        self.workload, self.process, self.model = workload, process, model
        self.slots, self.max_inflight = max_num_seqs, 2 * max_num_seqs  # the runner's own (worker/feed/runner.py)
        self.refill_below = self.max_inflight - max(1, max_num_seqs // 2)
        self.executor = ThreadPoolExecutor(max_workers=pool)  # the writers' calls (results, renewals)
        # Claims on threads of their own, as the runner's claimer thread: never queued behind other nodes' writes.
        self.claimer = ThreadPoolExecutor(max_workers=pool)
        self.done: queue.SimpleQueue[tuple[Node, str, Any]] = queue.SimpleQueue()
        self.nodes: list[Node] = []
        self.events: list[tuple[float, int, Node, str, int]] = []  # (finish time, seq, node, id, tokens)
        self.seq = 0
        self.claims: list[tuple[float, float, float, int]] = []  # (asked at, latency, database seconds, rows)
        self.committed: list[tuple[float, int]] = []  # (at, results stored)
        self.claimed_ids: list[str] = []
        self.stored_ids: list[str] = []
        self.lost = 0
        self.stopping = False
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def add_node(self, index: int) -> None:
        from worker.feed.engine_run import EngineRunTally

        now = time.monotonic()
        worker_id = f"fleet-{index}"
        node = Node(index, worker_id, last_tick=now, last_flush=now, last_renew=now)
        node.tally = EngineRunTally(worker_id=worker_id, model=self.model, max_num_seqs=self.slots)
        self.nodes.append(node)

    def tick(self) -> None:
        """Apply what the pool finished, finish what the engines finished, then let each node act."""
        now = time.monotonic()
        self.settle()
        while self.events and self.events[0][0] <= now:
            _, _, node, rid, tokens = heapq.heappop(self.events)
            node.running -= 1
            node.finished.append((rid, tokens))
        for node in self.nodes:
            self._act(node, now)

    def settle(self) -> None:
        """Apply what the pool finished (claims landed, flushes recorded, leases lost)."""
        while True:
            try:
                node, kind, payload = self.done.get_nowait()
            except queue.Empty:
                break
            self._apply(node, kind, payload)

    def _act(self, node: Node, now: float) -> None:
        w = self.workload
        room = BUDGET_TOKENS - node.running  # each decoding sequence takes a token of every step's budget
        node.budget = min(room, node.budget + (now - node.last_tick) / w.step_seconds * room)
        node.last_tick = now
        if len(node.writes) >= MAX_PENDING:  # the writer is behind: the runner's engine thread waits (admits nothing)
            return
        while node.waiting and node.running < self.slots and node.budget >= w.prompt_tokens:
            rid, tokens = node.waiting.popleft()
            node.budget -= w.prompt_tokens
            node.running += 1
            self.seq += 1
            heapq.heappush(self.events, (now + tokens * w.step_seconds, self.seq, node, rid, tokens))
        held = len(node.waiting) + node.running + len(node.finished) + node.recording
        if not node.claiming and held < self.refill_below:
            node.claiming = True
            self.claimer.submit(self._claim, node, self.max_inflight - held, now)
        if node.finished and (now - node.last_flush >= FLUSH_SECONDS or len(node.finished) >= FLUSH_RESULTS):
            node.last_flush = now
            results, node.finished = node.finished, []
            node.recording += len(results)
            node.tally.counters.add_results(
                prompt_tokens=w.prompt_tokens * len(results),
                completion_tokens=sum(t for _, t in results),
                finished=len(results),
            )
            self._write(node, "flush", (results, node.tally.writer()))
        if now - node.last_renew >= RENEW_SECONDS:
            node.last_renew = now
            self._write(node, "renew", sorted(node.ids))

    def _write(self, node: Node, kind: str, payload: Any) -> None:
        node.writes.append((kind, payload))
        if not node.writing:
            node.writing = True
            self.executor.submit(self._writer, node)

    def _apply(self, node: Node, kind: str, payload: Any) -> None:
        if kind == "claimed":
            node.claiming = False
            for rid in payload:
                node.ids.add(rid)
                node.waiting.append((rid, self.workload.output_tokens(rid)))
        elif kind == "recorded":
            ids, _ = payload
            node.recording -= len(ids)
            node.ids.difference_update(ids)
        elif kind == "lost":
            node.ids.difference_update(payload)
            kept = [(rid, t) for rid, t in node.waiting if rid not in payload]
            self.lost += len(node.waiting) - len(kept)
            node.waiting = deque(kept)
        elif kind == "written":
            node.writing = False
            if node.writes and not self.stopping:
                node.writing = True
                self.executor.submit(self._writer, node)

    # --- on the pool's threads ---------------------------------------------------------------------

    def _claim(self, node: Node, limit: int, asked: float) -> None:
        from storage.db import transaction
        from storage.queue.claim import claim
        from storage.settings import get_settings

        rows: list[str] = []
        try:
            began = time.monotonic()
            with transaction() as session:
                claimed = claim(
                    session,
                    model=self.model,
                    worker_id=node.worker_id,
                    limit=limit,
                    lease_seconds=120,
                    settings=get_settings(),
                )
            rows = [row.id for row in claimed]
            ended = time.monotonic()
            with self.lock:
                self.claims.append((asked, ended - asked, ended - began, len(rows)))
                self.claimed_ids.extend(rows)
        except Exception as error:  # counted: a bench that hides failures measures nothing
            with self.lock:
                self.errors.append(f"claim: {error!r}"[:300])
        finally:
            self.done.put((node, "claimed", rows))

    def _writer(self, node: Node) -> None:
        """One transaction of the node's writes, in order: its queued flushes in one commit (up to MAX_COALESCED, as
        the writer thread coalesces when the database falls behind), or a renewal."""
        from storage.queue.results import Outcome
        from worker.feed.writes import Flush, commit, renew_leases

        try:
            if self.stopping or not node.writes:
                return
            if node.writes[0][0] == "renew":
                lost, *_ = renew_leases(node.writes.popleft()[1], {}, worker_id=node.worker_id, lease_seconds=120)
                if lost:
                    self.done.put((node, "lost", lost))
                return
            batch: list[tuple[str, int]] = []
            flushes = []
            while node.writes and node.writes[0][0] == "flush" and len(flushes) < MAX_COALESCED:
                results, write_run = node.writes.popleft()[1]
                outcomes = [Outcome(rid, 200, _body(t), self.workload.prompt_tokens, t, 0.1) for rid, t in results]
                flushes.append(Flush(node.tally.run_id, write_run, outcomes, [], {}))
                batch += results
            commit(flushes, worker_id=node.worker_id)
            with self.lock:
                self.committed.append((time.monotonic(), len(batch)))
                self.stored_ids.extend(rid for rid, _ in batch)
            self.done.put((node, "recorded", ([rid for rid, _ in batch], len(batch))))
        except Exception as error:
            with self.lock:
                self.errors.append(f"write: {error!r}"[:300])
        finally:
            self.done.put((node, "written", None))


def _body(tokens: int) -> dict[str, Any]:
    """A chat completion of `tokens` output tokens, about 4 characters each (what a result row stores)."""
    return {
        "id": "chatcmpl-fleet",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "word " * (tokens * 4 // 5)}}],
        "usage": {"completion_tokens": tokens},
    }
