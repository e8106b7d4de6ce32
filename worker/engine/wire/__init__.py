"""The wire formats an engine speaks, one module per protocol (openai, anthropic), and the one parser."""

from __future__ import annotations

from typing import Any

from storage.protocols import MESSAGES_URL
from worker.engine.wire.anthropic import MessagesBody, parse_messages_body
from worker.engine.wire.openai import Body, parse_openai_body


def parse_body(url: str, body: Any) -> Body | MessagesBody:
    """Validate a request body for `url` in its protocol's format; raise BodyError with a message naming the field."""
    if url == MESSAGES_URL:
        return parse_messages_body(body)
    return parse_openai_body(url, body)
