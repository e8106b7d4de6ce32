"""Shared mode: the Engine protocol on an OpenAI-compatible vLLM server that also serves online users.

Nothing is loaded here: batch requests go over HTTP to a server started with `--scheduling-policy
priority`, each with `priority = batch_priority` (vLLM serves smaller values first; online clients send
the default 0), so the server serves online requests first and preempts batch sequences when its KV cache
runs short. A `DispatchBudget` (worker/engine/shared_budget.py), fed from the server's `/metrics`, decides how many
batch requests may be on the server at once; the runner reads it through `dispatch_limit()`. Optionally, prompts
are paced (worker/engine/prefill_pace.py) and staged through the server's prefix cache (prefill_stage.py). A line
naming a LoRA adapter goes out under the adapter's name, loaded on the server first if it lacks it (http_adapters.py).

Threads: the runner calls every public method from its own thread; the HTTP calls and the metrics poll
run on an asyncio loop in a background thread (their coroutines: worker/engine/http_calls.py), and hand back
what became of each call through a queue. Each send of a request carries a token, so a late answer from an
earlier send is dropped: a request yields at most one result however often it was sent (retries after 5xx,
yields to online traffic).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Collection
from typing import Any

import httpx

from storage.registry import ModelSpec, SharedModeSpec
from worker.engine import EngineRequest, EngineResult, EngineStats, Progress
from worker.engine.adapters import under_adapter
from worker.engine.http_adapters import ServerAdapters
from worker.engine.http_calls import Flight, ServerCalls
from worker.engine.http_wire import server_request
from worker.engine.prefill_stage import STAGING_AHEAD, PaceGate, PrefillStager
from worker.engine.shared_budget import DispatchBudget
from worker.engine.tools import check_capabilities
from worker.engine.wire import parse
from worker.engine.wire.base import BodyError

log = logging.getLogger(__name__)

STEP_WAIT_SECONDS = 0.05
PACED_AHEAD = 8  # with prefill pacing: requests the runner may hand over beyond those on the server


class HttpEngine(ServerCalls):
    """The Engine protocol over HTTP, with a dispatch budget that leaves the server's online users first."""

    def __init__(self, model_name: str, spec: ModelSpec, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if spec.shared is None:
            raise ValueError(f"model {model_name!r} has no `shared` server")
        self.shared: SharedModeSpec = spec.shared
        self.model_name = model_name
        self.max_num_seqs = spec.max_num_seqs
        self.base_url = self.shared.server_url.rstrip("/")
        self.budget = DispatchBudget(self.shared, slots=spec.max_num_seqs)
        self.max_model_len = spec.max_model_len  # else the server's, from /v1/models when it is asked there
        self.parsers = (
            spec.tool_parser,
            spec.reasoning_parser,
        )  # the server's (--tool-call-parser, --reasoning-parser)
        self._inflight: dict[str, Flight] = {}
        self._parked: deque[str] = deque()
        self._done: queue.Queue[tuple[str, int, EngineResult | str]] = queue.Queue()
        self._tokens = itertools.count()
        self._calls: dict[int, tuple[float, str, asyncio.Task[None]]] = {}  # token -> (started, id, task); loop only
        self._metrics_failing = False
        self.yields = 0  # calls given back to online traffic (cancelled and re-sent), since start
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"http-engine-{model_name}", daemon=True)
        self._thread.start()
        self._client: httpx.AsyncClient = self._run(self._open(transport))
        self.stager: PrefillStager | None = None  # staging: every piece and request paced on the loop, by its gate
        if self.budget.pacer is not None and self.shared.batch_prefill_stage_tokens:
            gate, stage = PaceGate(self.budget.pacer), self.shared.batch_prefill_stage_tokens
            pieces = self.shared.batch_prefill_stage_max_pieces
            self.stager = PrefillStager(self._client, self.base_url, gate, piece_tokens=stage, max_pieces=pieces)
        # LoRA adapters (worker/engine/http_adapters.py): those the server lists, loaded at run time otherwise
        self.lora = ServerAdapters(self._client, self.base_url, path_map=self.shared.adapter_path_map)
        self.takes_adapters = spec.takes_adapters
        self.zero_adapter: str | None = None  # base-model lines' model on a CPU server (base_lines_under_zero_adapter)
        try:
            self.server_model = self.shared.server_model or self._run(self._served_model())
            if spec.takes_adapters:
                self.lora.listed(self._run(self._model_cards()))
            if spec.takes_adapters and self.shared.base_lines_under_zero_adapter:
                self.zero_adapter = self._run(self.lora.load_zero(spec.path))
        except Exception:
            self.close()
            raise
        asyncio.run_coroutine_threadsafe(self._poll_metrics(), self._loop)

    # -- the Engine protocol ---------------------------------------------------------------------

    def add(self, request: EngineRequest) -> EngineResult | None:
        """Validate a body like the in-process engine does, then send it (or park it until the budget allows)."""
        rid = request.request_id
        try:
            if rid in self._inflight:
                raise BodyError(f"request {rid!r} is already in flight", code="duplicate_request")
            parsed = under_adapter(parse(request.url, request.body, seed=request.seed), request)
            adapter = parsed.generation.adapter
            if adapter is not None and not self.takes_adapters:
                raise BodyError(f"model {self.model_name!r} takes no adapters", code="model_not_found", status_code=404)
            if adapter is not None and adapter.path is None:
                message = f"The adapter '{adapter.name}' is no longer registered."
                raise BodyError(message, code="adapter_not_found", status_code=404)
            if parsed.generation.needs_media():  # the server would fetch URLs itself, past our network rules
                raise BodyError(
                    "images and documents are not run in shared mode (a vLLM server shared with online traffic)",
                    code="images_not_supported",
                    param="messages",
                )
            self._check_cap(parsed.generation, prompt_tokens=None)
            check_capabilities(  # the server's parsers, as the registry entry names them
                parsed.generation,
                model=self.model_name,
                tool_parser=self.parsers[0] is not None,
                reasoning_parser=self.parsers[1] is not None,
                max_model_len=self.max_model_len or 2**31,
            )
            url, body = server_request(parsed.generation)
        except BodyError as error:
            return error.to_result(rid)
        # A line naming an adapter goes out under the adapter's name, as the server's LoRA modules are addressed.
        model = adapter.name if adapter is not None else (self.zero_adapter or self.server_model)
        payload = {**body, "model": model, "priority": self.shared.batch_priority}
        flight = Flight(rid, url, payload, time.monotonic(), parsed, adapter=adapter)
        self.lora.tally.started(adapter)
        if self.budget.pacer is not None:
            flight.chars = len(json.dumps(payload.get("messages") or payload.get("prompt") or payload))
        self._inflight[rid] = flight
        self._parked.append(rid)
        self._dispatch()
        return None

    def step(self) -> list[EngineResult]:
        """Wait up to 50 ms for answers; return the requests that finished (yielded ones are parked again)."""
        self._dispatch()
        results: list[EngineResult] = []
        try:
            item = self._done.get(timeout=STEP_WAIT_SECONDS)
        except queue.Empty:
            return results
        while True:
            rid, token, outcome = item
            flight = self._inflight.get(rid)
            if flight is not None and flight.token == token:  # else aborted, or an answer to an earlier send
                if isinstance(outcome, EngineResult):
                    del self._inflight[rid]
                    self.lora.tally.ended(flight.adapter)
                    if self.budget.pacer is not None:
                        self.budget.pacer.learn(flight.chars, outcome.prompt_tokens)
                    outcome.engine_seconds = time.monotonic() - flight.added
                    results.append(outcome)
                else:  # yielded to online work: first to go out again, it was claimed first
                    flight.parked, flight.future = True, None
                    self._parked.appendleft(rid)
            try:
                item = self._done.get_nowait()
            except queue.Empty:
                break
        self._dispatch()
        return results

    def progress(self, request_ids: Collection[str]) -> dict[str, Progress]:
        """Nothing: a server's in-flight tokens are not visible from here, so hand-backs restart these requests."""
        return {}

    def abort(self, request_ids: list[str]) -> None:
        """Forget requests and close their connections (vLLM then aborts the sequences); no result follows."""
        for rid in request_ids:
            flight = self._inflight.pop(rid, None)
            if flight is not None:
                self.lora.tally.ended(flight.adapter)
            if flight is not None and flight.future is not None:
                flight.future.cancel()

    def cut(self, request_ids: list[str]) -> list[EngineResult]:
        """Nothing to show (a server's in-flight tokens are not visible from here): dropped, they end batch_expired."""
        self.abort(request_ids)
        return []

    def stats(self) -> EngineStats:
        """Our requests on the server (`running`) and those parked until the budget allows (`waiting`)."""
        parked = sum(1 for f in self._inflight.values() if f.parked)
        extra: dict[str, Any] = {
            "dispatch_limit": self.budget.limit,
            "urgent": self.budget.urgent,
            "yields": self.yields,
        }
        if (load := self.budget.load) is not None and (last := self.budget.last) is not None:
            extra.update(
                server_running=load.running,
                server_waiting=load.waiting,
                kv_cache_usage=load.kv_usage,
                online=last.online,
                slack_cap=last.slack_cap,
            )
        if (pacer := self.budget.pacer) is not None:
            extra.update(prefill_tokens_per_s=pacer.tokens_per_s, tokens_per_char=round(pacer.tokens_per_char, 4))
        if (stager := self.stager) is not None:
            extra.update(
                stage_pieces=stager.pieces, stage_piece_tokens=stager.piece_tokens_sent, stage_plain=stager.plain
            )
        if self.takes_adapters:
            extra.update(self.lora.tally.stats())
        if (step := self.budget.steps.fit()) is not None:
            extra.update(step_fixed_ms=round(step[0] * 1000, 3), step_per_seq_ms=round(step[1] * 1000, 4))
        return EngineStats(running=len(self._inflight) - parked, waiting=parked, extra=extra)

    def has_unfinished(self) -> bool:
        """True while a request handed to us has neither finished nor been aborted."""
        return bool(self._inflight)

    def waiting_for_inputs(self) -> int:
        """None: the server fetches what it needs (lines with images are refused in shared mode)."""
        return 0

    def dispatch_limit(self) -> int | None:
        """How many batch requests the runner may hold in flight now: the budget's current limit, and with prefill
        pacing no more than `PACED_AHEAD` beyond those on the server (rows the pacer holds back stay in the queue,
        where another worker may take them)."""
        if self.budget.pacer is None:
            return self.budget.limit
        return min(self.budget.limit, self._on_server() + PACED_AHEAD)

    def _on_server(self) -> int:
        """Our requests sent to the server and not yet answered (the rest are parked)."""
        return sum(1 for f in self._inflight.values() if not f.parked)

    def prepare(self, requests: Collection[EngineRequest]) -> None:
        """Nothing to render ahead: the server renders."""

    def set_urgent(self, urgent: bool) -> None:
        """Let work near its deadline take up to `urgent_extra_inflight` slots from online traffic."""
        self.budget.set_urgent(urgent)

    def close(self) -> None:
        """Cancel everything in flight, stop polling, close the connections and the loop thread."""
        self.abort(list(self._inflight))
        if self._loop.is_running():
            self._run(self._shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    # -- runner-thread helpers -------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Send parked requests while fewer than the budget's limit are on the server (and, with prefill pacing,
        while the pacer has prompt tokens to spare; the urgent floor goes out regardless). With staging, the pace
        gate on the loop paces each piece and request, and at most `STAGING_AHEAD` wait for it."""
        sent = self._on_server()
        pacer, now = self.budget.pacer if self.stager is None else None, time.monotonic()
        staging = sum(f.staging and not f.parked for f in self._inflight.values()) if self.stager else 0
        while self._parked and sent < self.budget.limit:
            if self.stager is not None and staging >= STAGING_AHEAD:
                break
            if pacer is not None and sent >= self.budget.floor and not pacer.allows(now, busy=sent > 0):
                break
            flight = self._inflight.get(self._parked.popleft())
            if flight is None or not flight.parked:
                continue
            if pacer is not None:
                pacer.spend(pacer.estimate(flight.chars), now)
            flight.staging = self.stager is not None
            staging += flight.staging
            flight.token, flight.parked = next(self._tokens), False
            flight.future = asyncio.run_coroutine_threadsafe(self._call(flight), self._loop)
            sent += 1

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)
