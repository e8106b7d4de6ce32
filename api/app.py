"""The app factory: routes, the one error handler, health."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from api import errors, keys, limits, prometheus, results
from api.anthropic import message_batch_retries, message_batches
from api.console import routes as console
from api.deps import commit_in_route_threads
from api.finance import routes as costs
from api.openai import adapters, batch_retries, batches, files, models, uploads
from api.webhooks import routes as webhooks


def create_app(*, health_extra: Callable[[], dict[str, Any]] | None = None) -> FastAPI:
    """Build the API. `health_extra` lets the process report its in-process worker's state."""
    app = FastAPI(title="Backfill", version="0.1.0", description="OpenAI-compatible Batch API on your own GPUs.")
    errors.install(app)
    limits.install(app)
    app.include_router(files.router)
    app.include_router(uploads.router)
    app.include_router(batches.router)
    app.include_router(batch_retries.router)
    app.include_router(models.router)
    app.include_router(adapters.router)
    app.include_router(costs.router)
    app.include_router(keys.router)
    app.include_router(webhooks.router, prefix="/v1/webhooks")
    app.include_router(webhooks.router, prefix="/v1/webhook_endpoints")  # the path the openai SDK calls
    app.include_router(webhooks.event_types_router)
    app.include_router(results.router)
    app.include_router(prometheus.router)
    app.include_router(message_batches.router)
    app.include_router(message_batch_retries.router)
    app.include_router(console.router)
    app.include_router(console.page_router)

    @app.get("/health", tags=["health"])
    async def health() -> JSONResponse:
        """200 once the server is ready to take requests.

        On the event loop, not the request threads: it answers even while every thread serves a slow body
        (`health_extra` only reads in-memory flags)."""
        body: dict[str, Any] = {"status": "ok"}
        if health_extra is not None:
            body.update(health_extra())
        return JSONResponse(body)

    commit_in_route_threads(app)
    return app
