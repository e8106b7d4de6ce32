"""`GET /metrics`: the API process's Prometheus metrics, with the queue-state gauges read from the database.

In the embedded default the worker runs in this process, so its engine and event metrics are here too.
With BACKFILL_METRICS_TOKEN set, a scrape must send `Authorization: Bearer <token>`: queue depths and
tenant names are not for the public internet.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import Response

from api.deps import Config
from storage.errors import Unauthorized
from storage.metrics import exposition
from storage.metrics.events import PROCESS_INFO, prepare_windows
from storage.metrics.queue_state import QUEUE_STATE

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
def metrics(settings: Config, authorization: Annotated[str | None, Header()] = None) -> Response:
    """Prometheus text exposition of this process, plus the queue's state (cached for a few seconds)."""
    if settings.metrics_token is not None:
        sent = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(sent.encode(), settings.metrics_token.encode()):
            raise Unauthorized("Scraping /metrics needs 'Authorization: Bearer <BACKFILL_METRICS_TOKEN>'.")
    PROCESS_INFO.labels("api").set(1)
    prepare_windows(settings.completion_windows)  # each offered window's finish-error series, at zero until used
    body, content_type = exposition(QUEUE_STATE)
    return Response(body, media_type=content_type)
