"""The wire formats, one package per protocol, and the one parser: a batch line's body becomes a neutral
`Generation` for any engine and a reply that turns the engine's `Output` into the line's answer.

This is the table of wire formats: the one place in worker/ that picks a protocol's package (by the line's URL).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from storage.endpoints import MESSAGES_URL
from worker.engine.wire.anthropic import parse_messages
from worker.engine.wire.base import Parsed
from worker.engine.wire.openai import parse_openai

__all__ = ["Parsed", "parse"]


def parse(url: str, body: Any, *, seed: int | None = None) -> Parsed:
    """A line's body as what an engine runs and how its output is answered; BodyError (naming the field, in the
    protocol's words) if it cannot run. `seed` (a redraw's, worker/feed/redraws.py) replaces the body's."""
    parsed = parse_messages(body) if url == MESSAGES_URL else parse_openai(url, body)
    if seed is None:
        return parsed
    generation = replace(parsed.generation, sampling=replace(parsed.generation.sampling, seed=seed))
    return replace(parsed, generation=generation)
