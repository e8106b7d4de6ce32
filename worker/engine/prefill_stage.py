"""Staged prefill for shared mode: a batch prompt reaches the server's steps `batch_prefill_stage_tokens` at a time.

Prefill pacing (worker/engine/prefill_pace.py) bounds how many batch prompt tokens the server prefills per step
on average, but vLLM prefills each prompt it admits in as few steps as its token budget allows, and it schedules
a running request's prompt chunk in the same step as an arriving online prompt (running requests come first;
priority orders only the waiting queue and preemption). A 500-token batch prompt is therefore one or two long
steps, and the online requests that meet them pay in TTFT, which moves the online p99 once 1-2% of them do.
vLLM has no per-priority cap on prefill chunks (`--long-prefill-token-threshold` caps online prompts too).

Staging cuts the prompt from the client side over vLLM's automatic prefix caching (on by default in V1): before
the real request, the prompt's token ids (`POST /tokenize`, with the chat's `messages` and template fields, or a
completion's `prompt`) are sent as `/v1/completions` prompts of their first k, 2k, 3k ... tokens (k a multiple of
the server's KV block, so whole blocks are cached), one at a time, each with `max_tokens` 1 and the batch
priority, and each through the pacer's bucket. Every piece finds the blocks of the one before it cached and
prefills only its own k new tokens; the real request then prefills only its last (at most k) tokens. No step
carries more than about k prompt tokens of one staged request, and the pacer spaces the pieces.

Bounded and safe by construction:
- at most `batch_prefill_stage_max_pieces` pieces per request; a longer prompt, a prompt of k tokens or fewer,
  a body that is not plain text (images, audio), or a `/tokenize` that fails is sent as it is (paced whole);
- a piece that fails ends the staging and the real request is sent as it is: the pieces only warm the cache,
  the real request is the one whose answer, usage and errors become the line's, so staging changes no result;
- an abort, a yield to online work or a shutdown cancels the coroutine, and with it the piece in flight (its
  connection closes, the server aborts it);
- the pieces' one-token outputs are waste, not harvest (nothing counts them as the batch's); and the cached
  tokens reported for the line are those the server had cached before staging (each piece's hits beyond the
  prefix the pieces before it left), so staging never passes for a cache hit the user is billed less for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from storage.endpoints import CHAT_URL, COMPLETIONS_URL
from worker.engine.prefill_pace import PrefillPacer

STAGING_AHEAD = 4  # prompts staging at once (the pacer, not this, sets the pace; this keeps pieces flowing)
MAX_WAIT_SECONDS = 0.05  # a gate waiter looks again at least this often (the pace may change with each poll)
# The body fields that shape a chat's token ids (vLLM's TokenizeChatRequest has them too).
_TEMPLATE_FIELDS = (
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "add_special_tokens",
)


def piece_ends(prompt_tokens: int, *, piece_tokens: int, max_pieces: int) -> list[int]:
    """Where each piece ends: k, 2k, ... short of the prompt's end; none if there would be more than `max_pieces`."""
    ends = list(range(piece_tokens, prompt_tokens, piece_tokens))
    return ends if len(ends) <= max_pieces else []


def tokenize_body(url: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """What to ask `/tokenize` for a request's prompt ids (None: not stageable, or already ids: see `prompt_ids`)."""
    if url == CHAT_URL:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not all(_text_only(m) for m in messages):
            return None
        fields = {key: payload[key] for key in _TEMPLATE_FIELDS if key in payload}
        return {"model": payload.get("model"), "messages": messages, **fields}
    if url == COMPLETIONS_URL and isinstance(payload.get("prompt"), str):
        fields = {key: payload[key] for key in ("add_special_tokens",) if key in payload}
        return {"model": payload.get("model"), "prompt": payload["prompt"], **fields}
    return None


def prompt_ids(url: str, payload: dict[str, Any]) -> list[int] | None:
    """A completion whose prompt is token ids already needs no `/tokenize`."""
    prompt = payload.get("prompt")
    if url == COMPLETIONS_URL and isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


def _text_only(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content)


class PaceGate:
    """The pacer's bucket, shared by every prompt and piece on the engine's event loop: `turn(tokens)` waits until
    the bucket allows them, in arrival order (and, until the server's step time is known, for the previous turn
    to end: one batch prefill at a time, as the unstaged pacer does)."""

    def __init__(self, pacer: PrefillPacer, clock: Callable[[], float] = time.monotonic) -> None:
        self.pacer, self.clock = pacer, clock
        self.waiting = 0  # coroutines waiting for their turn (not on the server)
        self._lock = asyncio.Lock()  # FIFO: a prompt's next piece queues behind the others'

    async def enter(self, tokens: int) -> bool:
        """Wait for the bucket, spend `tokens`; True if the turn holds the gate until `leave` (pace unknown)."""
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        try:
            while (rate := self.pacer.tokens_per_s) is not None:
                now = self.clock()
                if self.pacer.allows(now, busy=True):
                    self.pacer.spend(tokens, now)
                    self._lock.release()
                    return False
                self.waiting += 1
                try:
                    await asyncio.sleep(min(MAX_WAIT_SECONDS, max(0.001, -self.pacer.bucket / rate)))
                finally:
                    self.waiting -= 1
            return True
        except BaseException:
            self._lock.release()
            raise

    def leave(self, held: bool) -> None:
        """End a turn `enter` said holds the gate."""
        if held:
            self._lock.release()


@dataclass
class Staging:
    """What staging did for one request."""

    prompt_tokens: int | None = None  # the prompt's length from /tokenize (None: unknown, not staged)
    prefix_tokens: int = 0  # the prompt's leading tokens the pieces left in the server's cache
    pieces: int = 0
    cached_before: int = 0  # of the pieces' prompts, tokens the server had cached before staging


class PrefillStager:
    """Sends a request's prompt pieces ahead of it, over the engine's HTTP client and the pace gate."""

    def __init__(
        self, client: httpx.AsyncClient, base_url: str, gate: PaceGate, *, piece_tokens: int, max_pieces: int
    ) -> None:
        self.client, self.base_url, self.gate = client, base_url, gate
        self.piece_tokens, self.max_pieces = piece_tokens, max_pieces
        self.tokenizing = 0  # requests asking /tokenize now (ours, not on the server)
        self.pieces = 0  # pieces answered, since start
        self.piece_tokens_sent = 0  # prompt tokens the answered pieces computed (their share of the pace)
        self.plain = 0  # requests sent as they are (not stageable, too long, /tokenize or a piece failed)

    async def stage(self, url: str, payload: dict[str, Any]) -> Staging:
        """Warm the server's prefix cache with the prompt's leading pieces, one after another."""
        staging = Staging()
        ids = prompt_ids(url, payload) or await self._tokenize(url, payload)
        if ids is None:
            self.plain += 1
            return staging
        staging.prompt_tokens = len(ids)
        ends = piece_ends(len(ids), piece_tokens=self.piece_tokens, max_pieces=self.max_pieces)
        if not ends:
            self.plain += 1
        for end in ends:
            held = await self.gate.enter(end - staging.prefix_tokens)
            try:
                cached = await self._piece(ids[:end], payload)
            finally:
                self.gate.leave(held)
            if cached is None:  # the real request goes now, and prefills what the pieces did not
                self.plain += 1
                break
            staging.cached_before += max(0, cached - staging.prefix_tokens)
            self.pieces += 1
            self.piece_tokens_sent += end - staging.prefix_tokens
            staging.pieces, staging.prefix_tokens = staging.pieces + 1, end
        return staging

    async def _tokenize(self, url: str, payload: dict[str, Any]) -> list[int] | None:
        body = tokenize_body(url, payload)
        if body is None:
            return None
        self.tokenizing += 1
        try:
            response = await self.client.post(f"{self.base_url}/tokenize", json=body)
            tokens = response.json().get("tokens") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        finally:
            self.tokenizing -= 1
        return tokens if isinstance(tokens, list) and all(type(t) is int for t in tokens) else None

    async def _piece(self, ids: list[int], payload: dict[str, Any]) -> int | None:
        """One piece: its prompt's cached tokens as the server reports them (0 if it does not), None if it failed."""
        piece = {"model": payload.get("model"), "prompt": ids, "max_tokens": 1, "priority": payload.get("priority")}
        if "cache_salt" in payload:  # vLLM keys cached blocks by the salt too
            piece["cache_salt"] = payload["cache_salt"]
        try:
            response = await self.client.post(f"{self.base_url}{COMPLETIONS_URL}", json=piece)
            if response.status_code != 200:
                return None
            usage = response.json().get("usage") or {}
            return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            return None
