"""What a runner knows of its in-flight requests' checkpoints (docs/workers.md, "Checkpoints and resume").

The token ids themselves live in the engine (its `progress`) and, once stored, with the queue row
(storage/queue/checkpoints.py, which appends only the ids after those the row holds); this keeps the claim
each in-flight request runs under (a write lands only while the row is still that claim's), how many of its
tokens were last written (to pick what a periodic checkpoint writes), and counts the decode tokens a resume
saved or a restart threw away.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from storage.metrics.events import count_decode_tokens
from storage.queue.checkpoints import Generated
from storage.settings import Settings
from worker.engine import Engine, EngineResult, Progress


class Checkpoints:
    """Per runner: the claim and written token count of each in-flight request, and the last periodic write."""

    def __init__(self, engine: Engine, *, model: str, settings: Settings) -> None:
        self.engine = engine
        self.model = model
        self.settings = settings
        self.claims: dict[str, str] = {}  # in-flight request -> the claim its generation runs under
        self.ended: dict[str, Generated] = {}  # finished, result not yet handed to the writer -> its tokens
        self.stored: dict[str, int] = {}  # in-flight request -> tokens its last checkpoint write held
        self._last = time.monotonic()

    def of(self, request_ids: Iterable[str]) -> dict[str, Generated]:
        """The generated ids worth storing (exact resumes); tokens of requests that cannot resume are discarded."""
        progress = self.engine.progress(sorted(request_ids))
        discarded = sum(len(p.token_ids) for p in progress.values() if not p.exact)
        count_decode_tokens(self.model, discarded=discarded)
        return {
            rid: Generated(self.claims[rid], p.token_ids)
            for rid, p in progress.items()
            if p.exact and p.token_ids and rid in self.claims
        }

    def due(self, inflight: Iterable[str]) -> dict[str, Generated]:
        """Every `checkpoint_interval_seconds`: requests grown by `checkpoint_every_tokens` since their last one."""
        every = self.settings.checkpoint_every_tokens
        if not every or time.monotonic() - self._last < self.settings.checkpoint_interval_seconds:
            return {}
        self._last = time.monotonic()
        due = {
            rid: Generated(self.claims[rid], p.token_ids)
            for rid, p in self.engine.progress(sorted(inflight)).items()
            if p.exact and rid in self.claims and len(p.token_ids) - self.stored.get(rid, 0) >= every
        }
        self.stored.update((rid, len(g.token_ids)) for rid, g in due.items())
        return due

    def admitted(self, request_id: str, *, claim_id: str, stored: int) -> bool:
        """A claimed request is in the engine; count what its checkpoint (`stored` tokens) saved. False if the
        engine did not continue from all of it: its generation no longer extends the stored ids, and the
        caller drops them (storage/queue/checkpoints.py `restart`)."""
        self.claims[request_id] = claim_id
        if not stored:
            return True
        kept = len(self.engine.progress([request_id]).get(request_id, Progress([], False)).token_ids)
        count_decode_tokens(self.model, resumed=kept, discarded=stored - kept)
        self.stored[request_id] = stored if kept >= stored else 0
        return kept >= stored

    def relet(self, request_id: str, *, claim_id: str, stored: Sequence[int]) -> bool:
        """A request still in the engine (or finished, its result not yet handed over) was leased again by this
        worker's claim (the reaper had re-queued it): its generation goes on under `claim_id`, whose writes are the
        ones that land. False if the row's checkpoint (`stored`, another claim's) is not where this generation
        began: the caller drops it, and this generation's next write stores it from token 0."""
        if (ended := self.ended.get(request_id)) is not None:
            self.ended[request_id] = Generated(claim_id, ended.token_ids, draw=ended.draw)
            return list(ended.token_ids[: len(stored)]) == list(stored)
        if request_id not in self.claims:
            return True  # not this runner's checkpoints (a result on its way to the database)
        self.claims[request_id] = claim_id
        progress = self.engine.progress([request_id]).get(request_id, Progress([], False))
        extends = list(progress.token_ids[: len(stored)]) == list(stored)
        self.stored[request_id] = len(stored) if extends else 0
        return extends

    def finished(self, result: EngineResult) -> None:
        """A request finished: its tokens but the last, under its claim, wait with its result until stored, should a
        pause hand its row back before that (storage/queue/checkpoints.py `save`)."""
        if len(result.token_ids) > 1 and (claim_id := self.claims.get(result.request_id)):
            draw = int((result.attempts or {}).get("count", 1)) - 1  # a checked line's: the draws before this one
            self.ended[result.request_id] = Generated(claim_id, result.token_ids[:-1], draw=draw)
        self.forget([result.request_id])

    def restarted(self, request_ids: Iterable[str]) -> dict[str, str]:
        """Requests whose generation starts again from the prompt in the engine (a redraw of a checked answer):
        their stored ids resume nothing now; return {request: claim} for the caller to drop them."""
        restarted = {}
        for rid in request_ids:
            self.stored.pop(rid, None)
            if rid in self.claims:
                restarted[rid] = self.claims[rid]
        return restarted

    def kept(self, results: Iterable[EngineResult]) -> dict[str, Generated]:
        """The tokens `finished` kept of these results (handed to the writer with them)."""
        return {r.request_id: kept for r in results if (kept := self.ended.pop(r.request_id, None)) is not None}

    def forget(self, request_ids: Iterable[str]) -> None:
        """These finished, were lost or were handed back: their checkpoints are no longer this runner's."""
        for rid in request_ids:
            self.stored.pop(rid, None)
            self.claims.pop(rid, None)

    def forget_all(self) -> None:
        """A hand-back: nothing is in flight any more."""
        self.stored.clear()
        self.claims.clear()
