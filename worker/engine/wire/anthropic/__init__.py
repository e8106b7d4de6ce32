"""Anthropic's wire format: the Messages request (`params` of a Message Batch request) and its answer."""

from __future__ import annotations

from worker.engine.wire.anthropic.messages import (
    MessagesBody,
    anthropic_message,
    anthropic_stop,
    message_reply,
    parse_messages,
    parse_messages_body,
)

__all__ = [
    "MessagesBody",
    "anthropic_message",
    "anthropic_stop",
    "message_reply",
    "parse_messages",
    "parse_messages_body",
]
