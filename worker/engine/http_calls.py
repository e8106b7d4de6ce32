"""Shared mode's calls to the server: what runs on `HttpEngine`'s event loop (worker/engine/http_engine.py).

A mixin of `HttpEngine`, kept apart so the engine's two threads each have their module: the engine holds what
the runner calls from its own thread (add, step, dispatch under the budget), this holds the coroutines on the
loop thread: opening and closing the client, reading the server's model cards, each request's send (staged
through the prefix cache, retried after 5xx, under its LoRA adapter), what its answer becomes, and the metrics
poll that feeds the dispatch budget and gives slots back to online traffic. Each outcome goes back to the runner
through the done-queue, tagged with the send's token.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import time
from dataclasses import dataclass
from typing import Any

import httpx

from storage.registry import SharedModeSpec
from worker.engine import EngineResult
from worker.engine.generation import Adapter, Generation, context_length_error
from worker.engine.http_adapters import ServerAdapters
from worker.engine.http_wire import ServerRetry, output_of, refusal, server_answer
from worker.engine.prefill_stage import PrefillStager, Staging
from worker.engine.shared_budget import DispatchBudget, MetricsError, parse_load
from worker.engine.wire import Parsed
from worker.engine.wire.base import BodyError, server_error

log = logging.getLogger(__name__)

RETRY_BASE_SECONDS = 0.5
RETRY_MAX_SECONDS = 8.0
_YIELDED = "yielded"  # marker on the done-queue: the call was cancelled to free a slot for online work


@dataclass
class Flight:
    """A request the runner handed us: its payload, its current send (token) and whether it waits to be sent."""

    request_id: str
    url: str  # the server's endpoint the generation amounts to (http_wire.server_request)
    payload: dict[str, Any]
    added: float
    parsed: Parsed  # what runs and how the server's answer becomes the line's
    token: int = -1
    future: concurrent.futures.Future[None] | None = None
    parked: bool = True
    chars: int = 0  # the size of its body: the prefill pacer estimates its prompt tokens from it
    staging: bool = False  # sent to the loop to be staged, its own request not yet past the pace gate
    staged: Staging | None = None  # what staging did (the line's cached tokens leave the pieces' hits out)
    adapter: Adapter | None = None  # the LoRA adapter the line named: the server serves it under its name


class ServerCalls:
    """The loop-thread side of `HttpEngine`; reads the engine's state from the attributes it sets."""

    model_name: str
    server_model: str
    max_model_len: int | None
    shared: SharedModeSpec
    base_url: str
    budget: DispatchBudget
    stager: PrefillStager | None
    lora: ServerAdapters
    yields: int
    _client: httpx.AsyncClient
    _done: queue.Queue[tuple[str, int, EngineResult | str]]
    _calls: dict[int, tuple[float, str, asyncio.Task[None]]]
    _metrics_failing: bool

    async def _open(self, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.shared.request_timeout_seconds, connect=10.0)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        return httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)

    async def _shutdown(self) -> None:
        """Cancel the metrics poll and every call still running, wait for them to unwind, close the client."""
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

    async def _model_cards(self) -> list[dict[str, Any]]:
        response = await self._client.get(f"{self.base_url}/v1/models", timeout=10)
        response.raise_for_status()
        return list(response.json()["data"])

    async def _served_model(self) -> str:
        card = (await self._model_cards())[0]
        if self.max_model_len is None and isinstance(card.get("max_model_len"), int):
            self.max_model_len = card["max_model_len"]  # vLLM's model card carries the context length
        return str(card["id"])

    async def _call(self, flight: Flight) -> None:
        rid, token, task = flight.request_id, flight.token, asyncio.current_task()
        assert task is not None
        self._calls[token] = (time.monotonic(), rid, task)
        try:
            result = await (self._attempts(flight) if self.stager is None else self._staged(flight, self.stager))
        finally:
            self._calls.pop(token, None)
        self._done.put((rid, token, result))

    async def _staged(self, flight: Flight, stager: PrefillStager) -> EngineResult:
        """Stage the prompt's pieces, then send the request itself through the pace gate with the tokens left."""
        try:  # the pieces go out under the line's adapter too (a prefix cached under one adapter is its own)
            await self.lora.ready(flight.adapter)
        except BodyError as error:
            return error.to_result(flight.request_id)
        except (httpx.HTTPError, ServerRetry):
            pass  # the request's own attempts load it again
        staged = flight.staged = await stager.stage(flight.url, flight.payload)
        known = staged.prompt_tokens
        left = stager.gate.pacer.estimate(flight.chars) if known is None else known - staged.prefix_tokens
        held = await stager.gate.enter(left)
        flight.staging = False
        try:
            return await self._attempts(flight)
        finally:
            stager.gate.leave(held)

    async def _attempts(self, flight: Flight) -> EngineResult:
        rid, last = flight.request_id, ""
        for attempt in range(self.shared.max_attempts):
            if attempt:
                await asyncio.sleep(min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** (attempt - 1)))
            try:
                await self.lora.ready(flight.adapter)
                response = await self._client.post(f"{self.base_url}{flight.url}", json=flight.payload)
                return self._result(flight, response)
            except BodyError as error:  # its adapter cannot be loaded: this line fails, and no other
                return error.to_result(rid)
            except (httpx.HTTPError, ServerRetry) as error:
                last = f"{type(error).__name__}: {error}"
                log.info("attempt %d of %s failed: %s", attempt + 1, rid, last)
        return server_error(rid, f"the inference server failed this request {self.shared.max_attempts} times ({last})")

    def _result(self, flight: Flight, response: httpx.Response) -> EngineResult:
        rid, body = flight.request_id, server_answer(response)
        if response.status_code == 404 and flight.adapter is not None:  # the server lost it (restarted, unloaded)
            self.lora.forget(flight.adapter.name)
            raise ServerRetry(f"the server no longer has the adapter {flight.adapter.name!r}")
        if response.status_code >= 300:
            return refusal(rid, response.status_code, body, names=(self.server_model, self.model_name))
        usage = body.get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        # Reported when the server runs with --enable-prompt-tokens-details; 0 otherwise.
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        if (staged := flight.staged) is not None and staged.pieces:  # the pieces' own hits are not the line's
            cached = staged.cached_before + max(0, cached - staged.prefix_tokens)
        generation = flight.parsed.generation
        try:
            self._check_cap(generation, prompt_tokens=prompt)  # the server clamps; OpenAI refuses (not billed)
        except BodyError as error:
            return error.to_result(rid)
        output = output_of(rid, generation, body, cached_tokens=cached)
        return flight.parsed.answer(output, self.model_name if flight.adapter is None else flight.adapter.name)

    def _check_cap(self, generation: Generation, *, prompt_tokens: int | None) -> None:
        """Refuse an output cap the context cannot hold: alone at `add`, with the prompt once the server counted it
        (a clamping limit stops at the context's end instead, as the server does)."""
        limit = generation.limit
        if self.max_model_len is None or generation.kind == "embed" or limit.clamp or limit.requested is None:
            return
        if limit.requested + (prompt_tokens or 0) <= self.max_model_len:
            return
        raise context_length_error(generation, max_model_len=self.max_model_len, prompt_tokens=prompt_tokens)

    async def _poll_metrics(self) -> None:
        """Feed the budget from /metrics; give slots back (cancel the youngest calls) when it says so."""
        while True:
            try:
                response = await self._client.get(f"{self.base_url}/metrics", timeout=5)
                response.raise_for_status()
                decision = self.budget.update(parse_load(response.text), ours=self._ours_on_server())
                if decision.yield_count:
                    self._yield(decision.yield_count)
                self._metrics_failing = False
            except (httpx.HTTPError, MetricsError) as error:
                if not self._metrics_failing:  # once per outage
                    log.warning("reading %s/metrics failed, sending nothing new: %s", self.base_url, error)
                self._metrics_failing = True
                self.budget.unreachable()
            await asyncio.sleep(self.shared.poll_seconds)

    def _ours_on_server(self) -> int:
        """Our calls, less those asking /tokenize or waiting at the pace gate (the server does not see them)."""
        stager = self.stager
        return len(self._calls) - (0 if stager is None else stager.tokenizing + stager.gate.waiting)

    def _yield(self, count: int) -> None:
        youngest = sorted(self._calls.items(), key=lambda item: item[1][0], reverse=True)[:count]
        for token, (_, rid, task) in youngest:
            if task.cancel():
                self.yields += 1
                self._done.put((rid, token, _YIELDED))
