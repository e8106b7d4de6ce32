"""What a runner knows of its in-flight requests' checkpoints (docs/workers.md, "Checkpoints").

The token ids themselves live in the engine (its `progress`) and, once stored, with the queue row
(storage/queue/checkpoints.py); this keeps how many of each request's tokens are stored, picks what a
periodic checkpoint writes, and counts the decode tokens a resume saved or a restart threw away.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from storage.metrics.events import count_decode_tokens
from storage.settings import Settings
from worker.engine import Engine, Progress


class Checkpoints:
    """Per runner: stored token counts of in-flight requests, and when the last periodic checkpoint ran."""

    def __init__(self, engine: Engine, *, model: str, settings: Settings) -> None:
        self.engine = engine
        self.model = model
        self.settings = settings
        self.stored: dict[str, int] = {}  # in-flight request -> tokens its stored checkpoint holds
        self._last = time.monotonic()

    def of(self, request_ids: Iterable[str]) -> dict[str, list[int]]:
        """The generated ids worth storing (exact resumes); tokens of requests that cannot resume are discarded."""
        progress = self.engine.progress(sorted(request_ids))
        discarded = sum(len(p.token_ids) for p in progress.values() if not p.exact)
        count_decode_tokens(self.model, discarded=discarded)
        return {rid: p.token_ids for rid, p in progress.items() if p.exact and p.token_ids}

    def due(self, inflight: Iterable[str]) -> dict[str, list[int]]:
        """Every `checkpoint_interval_seconds`: requests grown by `checkpoint_every_tokens` since their last one."""
        every = self.settings.checkpoint_every_tokens
        if not every or time.monotonic() - self._last < self.settings.checkpoint_interval_seconds:
            return {}
        self._last = time.monotonic()
        due = {
            rid: p.token_ids
            for rid, p in self.engine.progress(sorted(inflight)).items()
            if p.exact and len(p.token_ids) - self.stored.get(rid, 0) >= every
        }
        self.stored.update((rid, len(ids)) for rid, ids in due.items())
        return due

    def resumed(self, request_id: str, stored: int) -> None:
        """Count what a claimed checkpoint saved: the engine continues from its tokens, or restarted the request."""
        kept = len(self.engine.progress([request_id]).get(request_id, Progress([], False)).token_ids)
        count_decode_tokens(self.model, resumed=kept, discarded=stored - kept)
        self.stored[request_id] = stored

    def forget(self, request_ids: Iterable[str]) -> None:
        """These finished, were lost or were handed back: their checkpoints are no longer this runner's."""
        for rid in request_ids:
            self.stored.pop(rid, None)

    def forget_all(self) -> None:
        """A hand-back: nothing is in flight any more."""
        self.stored.clear()
