"""An engine's lines waiting on their images and documents (worker/engine/media.py resolves them off the engine's
thread): `start` hands a line over, `ready` takes back those resolved or failed, `wait` sleeps until one is."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from worker.engine.generation import BodyError, Generation
from worker.engine.media import MediaLimits, MediaResolver

logger = logging.getLogger(__name__)

Payload = TypeVar("Payload")


def resolver_from_settings() -> MediaResolver:
    """A resolver with the `media_*` and `document_*` settings."""
    from storage.settings import get_settings

    return MediaResolver(MediaLimits.from_settings(get_settings()))


class MediaWaits(Generic[Payload]):
    """An engine's lines waiting on their media: `start` one, `ready` takes those resolved (or failed), `wait`
    sleeps until one is; all from the engine's thread, the resolver's threads only signal."""

    def __init__(self, resolver: Callable[[], MediaResolver] = resolver_from_settings) -> None:
        self._make = resolver
        self._resolver: MediaResolver | None = None
        self._waiting: dict[str, tuple[Payload, concurrent.futures.Future[Generation]]] = {}
        self._landed = threading.Event()

    def start(self, request_id: str, generation: Generation, payload: Payload) -> None:
        """Begin resolving `generation`'s media for `request_id` (`payload`: what the engine needs back)."""
        if self._resolver is None:
            self._resolver = self._make()
        future = self._resolver.submit(generation)
        self._waiting[request_id] = (payload, future)
        future.add_done_callback(lambda _: self._landed.set())

    def ready(self) -> list[tuple[str, Payload, Generation | BodyError]]:
        """The lines whose media are resolved (their generation) or failed (the error), in the order started."""
        self._landed.clear()
        done: list[tuple[str, Payload, Generation | BodyError]] = []
        for request_id, (payload, future) in list(self._waiting.items()):
            if not future.done():
                continue
            del self._waiting[request_id]
            try:
                done.append((request_id, payload, future.result()))
            except BodyError as error:
                done.append((request_id, payload, error))
            except Exception as error:  # a bug must fail the line, not the engine
                logger.exception("resolving the media of %s failed", request_id)
                failed = BodyError(f"the media could not be read: {error}", code="invalid_image", param="messages")
                done.append((request_id, payload, failed))
        return done

    def wait(self, seconds: float) -> None:
        """Sleep until a line's media land, at most `seconds`."""
        self._landed.wait(seconds)

    def cancel(self, request_ids: list[str]) -> None:
        """Forget these lines (aborted); their fetches are cancelled."""
        for request_id in request_ids:
            found = self._waiting.pop(request_id, None)
            if found is not None:
                found[1].cancel()

    def close(self) -> None:
        self.cancel(list(self._waiting))
        if self._resolver is not None:
            self._resolver.close()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiting

    def __len__(self) -> int:
        return len(self._waiting)
