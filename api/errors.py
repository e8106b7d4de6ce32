"""The one error handler: every failure leaves in the envelope of the protocol whose path it came on (api/dialects.py),
and the OpenAPI document says so."""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from api.dialects import DIALECTS, dialect_of, requires_key
from api.openai.errors import ErrorResponse
from storage.errors import BackfillError, is_unavailable
from storage.lines.reader import clip

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
ECHO_MAX_CHARS = 64  # of a bad parameter's name (the client's text) in `param`
UNAVAILABLE = (
    "The service is temporarily unavailable (its database or object storage cannot be reached). Retry shortly."
)


def install(app: FastAPI) -> None:
    """Register the handlers on `app`, and make its OpenAPI document list the statuses they answer."""

    @app.exception_handler(BackfillError)
    async def _backfill(request: Request, error: BackfillError) -> JSONResponse:
        return dialect_of(request.url.path).envelope(
            error.status, error.message, type_=error.type, code=error.code, param=error.param, headers=error.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
        param = ".".join(loc)[:ECHO_MAX_CHARS] or None  # a field name is the client's text: never echo it whole
        message = (
            f"Invalid value for '{param}': {first.get('msg', 'invalid request')}." if param else "Invalid request."
        )
        code = "invalid_request"
        if first.get("type") == "extra_forbidden":  # nothing sent is silently ignored
            message, code = f"Unrecognized request argument supplied: {clip(param, 80)}.", "unknown_parameter"
        return dialect_of(request.url.path).envelope(
            400, message, type_="invalid_request_error", code=code, param=param
        )

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> Response:
        if error.status_code == 405:  # Starlette names only the first matching route's methods
            allow = ", ".join(_methods_of(app, request.url.path))
            if request.method == "OPTIONS":
                return Response(status_code=204, headers={"Allow": allow})
            error.headers = {**(error.headers or {}), "Allow": allow}
        code = "not_found" if error.status_code == 404 else None
        # Starlette's 405 carries `Allow`; keep whatever headers the exception names.
        return dialect_of(request.url.path).envelope(
            error.status_code, str(error.detail), type_="invalid_request_error", code=code, headers=error.headers
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, error: Exception) -> JSONResponse:
        if is_unavailable(error):  # Postgres or S3 down: a retry will do, and the SDKs retry a 503 by themselves
            log.warning("backing service unavailable: %s: %s", type(error).__name__, str(error)[:300])
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
            return dialect_of(request.url.path).envelope(
                503, UNAVAILABLE, type_="server_error", code="service_unavailable", headers=headers
            )
        log.exception("unhandled error")
        dialect = dialect_of(request.url.path)
        return dialect.envelope(500, dialect.internal_error, type_="server_error", code=None)

    app.openapi = _documented(app)  # type: ignore[method-assign]


def _methods_of(app: FastAPI, path: str) -> list[str]:
    """Every method some route serves at `path`, and OPTIONS (answered here)."""
    methods = {"OPTIONS"}
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path_regex.match(path):
            methods |= route.methods
    return sorted(methods)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route or router: these statuses answer with the error envelope."""
    return {status: {"model": ErrorResponse, "description": HTTPStatus(status).phrase} for status in statuses}


def _documented(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """app.openapi with the statuses the server really answers: 400 instead of FastAPI's 422, 401 and 429 where a
    key is required, 404 where a path names an object, 413 where a body is sent; each with the error envelope."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        template = "#/components/schemas/{model}"
        for dialect in DIALECTS:
            envelope_schema = dialect.schema.model_json_schema(ref_template=template)
            for name, definition in envelope_schema.pop("$defs", {}).items():
                components.setdefault(name, definition)
            components.setdefault(dialect.schema.__name__, envelope_schema)
        for route in app.routes:
            if isinstance(route, APIRoute) and route.include_in_schema:
                for method in route.methods:
                    operation = schema["paths"].get(route.path_format, {}).get(method.lower())
                    if operation is not None:
                        _document_errors(operation, route)
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    return openapi


def _document_errors(operation: dict[str, Any], route: APIRoute) -> None:
    responses = operation.setdefault("responses", {})
    statuses = {int(status) for status in responses if status[:1] in "45" and status != "422"}
    if responses.pop("422", None) is not None:
        statuses.add(400)
    if requires_key(route.dependant):
        # 429: past the tenant's share of the request threads (api/fair_share.py); 503: the key is looked up in
        # the database, which may be down
        statuses |= {400, 401, 429, 503}
    envelope_name = dialect_of(route.path_format).schema.__name__
    if "{" in route.path_format:
        statuses.add(404)
    if route.methods & {"POST", "PUT", "PATCH"}:
        statuses.add(413)  # api/limits.py refuses bodies over their limit
    for status in sorted(statuses):
        responses[str(status)] = {
            "description": HTTPStatus(status).phrase,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{envelope_name}"}}},
        }
