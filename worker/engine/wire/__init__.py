"""The wire formats, one module per protocol, and the one parser: a batch line's body becomes a neutral
`Generation` for any engine and a reply that turns the engine's `Output` into the line's answer.

This is the table of wire formats: the one place in worker/ that picks a protocol's module (by the line's URL).
"""

from __future__ import annotations

from typing import Any

from storage.protocols import MESSAGES_URL
from worker.engine.wire import openai_results
from worker.engine.wire.anthropic import MessagesBody, message_reply, parse_messages_body
from worker.engine.wire.base import Parsed, Reply
from worker.engine.wire.openai import Body, ChatBody, CompletionBody, EmbeddingBody, ResponsesBody, parse_openai_body

__all__ = ["Parsed", "parse", "parse_body"]


def parse_body(url: str, body: Any) -> Body | MessagesBody:
    """Validate a request body for `url` in its protocol's format; raise BodyError with a message naming the field."""
    if url == MESSAGES_URL:
        return parse_messages_body(body)
    return parse_openai_body(url, body)


def parse(url: str, body: Any) -> Parsed:
    """A line's body as what an engine runs and how its output is answered; BodyError if it cannot run."""
    parsed = parse_body(url, body)
    return Parsed(parsed.generation(), _reply(parsed))


def _reply(body: Body | MessagesBody) -> Reply:
    if isinstance(body, MessagesBody):
        return message_reply(body)
    if isinstance(body, ResponsesBody):
        return openai_results.responses_reply(body)
    if isinstance(body, ChatBody):
        return openai_results.chat_reply(body)
    if isinstance(body, CompletionBody):
        return openai_results.completion_reply(body)
    assert isinstance(body, EmbeddingBody)
    return openai_results.embedding_reply(body)
