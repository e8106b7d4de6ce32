"""The OpenAI wire shapes the simulated server (bench/sim_server.py) answers with, and what it reads of a request:
whole and streamed chat/text completions, the body (or None once the client left), the client's disconnect,
and a prompt's tokens counted as the fake engines count them (one per word, with stable ids)."""

from __future__ import annotations

import time
import zlib
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request


class Reply:
    """The OpenAI wire shapes of one request's answer (chat or text completion, whole or in chunks)."""

    _serials = iter(range(1, 1 << 62))

    def __init__(self, model: str, *, chat: bool, prompt: int) -> None:
        self.model, self.chat, self.prompt = model, chat, prompt
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-sim{next(self._serials)}"
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _usage(self, tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt, "completion_tokens": tokens, "total_tokens": self.prompt + tokens}

    def whole(self, tokens: int) -> dict[str, Any]:
        text = " ".join(["x"] * tokens)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice |= {"finish_reason": "length", "logprobs": None}
        return {**self._envelope([choice], chunk=False), "usage": self._usage(tokens)}

    def chunk(self, tokens: int, *, first: bool, finish: str | None) -> bytes:
        text = "x " * tokens
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice |= {"finish_reason": finish, "logprobs": None}
        return b"data: " + orjson.dumps(self._envelope([choice], chunk=True)) + b"\n\n"

    def usage_chunk(self, tokens: int) -> bytes:
        return b"data: " + orjson.dumps({**self._envelope([], chunk=True), "usage": self._usage(tokens)}) + b"\n\n"


async def read_body(request: Request) -> dict[str, Any] | None:
    """The request's JSON body, or None if the client went away while sending it (a cancelled batch call)."""
    try:
        body: dict[str, Any] = await request.json()
    except ClientDisconnect:
        return None
    return body


async def disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body was read: only `http.disconnect` comes now)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def prompt_words(content: Any) -> int:
    """Tokens of a prompt or message content, as the fake engines count them: whitespace-separated words."""
    return len(token_ids(content))


def token_ids(content: Any) -> list[int]:
    """A prompt's or a message content's token ids: one per whitespace-separated word (at least one), the same
    word always the same id; a list of integers is taken as token ids already."""
    if isinstance(content, list) and content and all(isinstance(part, int) for part in content):
        return list(content)
    if isinstance(content, list):  # content parts
        content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    words = content.split() if isinstance(content, str) else []
    return [_word_id(word) for word in words] or [_word_id("")]


def chat_token_ids(messages: list[dict[str, Any]]) -> list[int]:
    """A chat's token ids: per message, its role's marker, its content's words and an end marker (2 + words)."""
    ids: list[int] = []
    for message in messages:
        ids += [_word_id(f"<|{message.get('role')}|>"), *token_ids(message.get("content")), _word_id("<|end|>")]
    return ids


def _word_id(word: str) -> int:
    return zlib.crc32(word.encode()) & 0x3FFFFFFF
