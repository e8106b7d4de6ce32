"""Webhook delivery: claim due deliveries from the outbox, sign, send to the checked address, record the attempt.

Runs as the Celery task `webhook.deliver` (woken after each event's commit and by beat for retries) and,
embedded, in a short-lived thread the worker loop starts (`deliver_in_background`). Every pass reads due
rows from the database, so an event committed before a crash is sent after it: at least once, with the
delivery's id as `webhook-id` on every attempt, until a 2xx or the retry window ends.

A pass keeps `webhook_concurrency` attempts in flight, each ended at its deadline, at most
`webhook_concurrency_per_tenant` of them to one tenant: whenever one ends it is recorded and the pass claims
more, so one tenant's hanging receivers cost other tenants nothing but a claim interval.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import httpx

from storage.clock import now, now_f
from storage.db import transaction
from storage.errors import InvalidWebhookUrl
from storage.metrics.events import WebhookOutcome, count_webhook_delivery
from storage.settings import Settings, get_settings
from storage.webhooks.deliveries import DueDelivery, Outcome, claim_due, record_attempt
from storage.webhooks.signing import signature_headers
from storage.webhooks.targets import Target, TargetPolicy, resolve_target

log = logging.getLogger(__name__)

USER_AGENT = "Backfill-Webhooks/0.1"
CLAIM_MARGIN_SECONDS = 30.0  # a claim outlives the attempt's deadline by this much before it is retried
CLAIM_INTERVAL_SECONDS = 0.25  # while attempts are in flight, how often a pass looks for new due deliveries


def retry_delay_seconds(
    failures: int, *, base_seconds: float, max_interval_seconds: float, rand: Callable[[], float] = random.random
) -> float:
    """Exponential backoff with equal jitter: base x 2^(failures-1), capped, then between half and all of it."""
    nominal = min(max_interval_seconds, base_seconds * 2.0 ** min(failures - 1, 60))
    return float(nominal / 2 + rand() * nominal / 2)


def next_attempt_at(due: DueDelivery, *, at: float, settings: Settings) -> float | None:
    """When to try again after this failed attempt; None once the retry window is over."""
    delay = retry_delay_seconds(
        due.attempts + 1,
        base_seconds=settings.webhook_retry_base_seconds,
        max_interval_seconds=settings.webhook_retry_max_interval_seconds,
    )
    retry_at = at + delay
    return None if retry_at > due.created_at + settings.webhook_retry_window_seconds else retry_at


def attempt(due: DueDelivery, settings: Settings) -> Outcome:
    """One signed POST of the event to the endpoint; never raises (a failure is an attempt's outcome)."""
    started, clock = now_f(), time.perf_counter()

    def done(status: int | None, error: str | None, body: str | None = None) -> Outcome:
        return Outcome(started, int((time.perf_counter() - clock) * 1000), status, error, body)

    try:
        return _attempt(due, settings, done, lambda: time.perf_counter() - clock)
    except Exception as error:  # a bug must not leave the row claimed and unrecorded, retried forever unseen
        log.exception("webhook %s: unexpected failure", due.id)
        return done(None, f"internal error: {type(error).__name__}: {error}")


def _attempt(
    due: DueDelivery, settings: Settings, done: Callable[..., Outcome], elapsed: Callable[[], float]
) -> Outcome:
    try:
        target = resolve_target(due.url, TargetPolicy.from_settings(settings))
    except InvalidWebhookUrl as error:
        return done(None, f"refused: {error.message}")
    body = due.body.encode()
    headers = {
        **signature_headers(list(due.secrets), message_id=due.id, timestamp=now(), body=body),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
    try:
        status, prefix, location = post(target, headers, body, settings)
    except (TimeoutError, httpx.TimeoutException):
        return done(None, f"timed out after {elapsed():.2f} s (deadline {settings.webhook_timeout_seconds:g} s)")
    except httpx.HTTPError as error:
        return done(None, f"{type(error).__name__}: {error}")
    problem = None
    if 300 <= status < 400:
        problem = f"redirects are not followed (HTTP {status} to {location[:200]!r})"
    elif not 200 <= status < 300:
        problem = f"HTTP {status}"
    return done(status, problem, prefix)


def _metric_outcome(outcome: Outcome, *, gave_up: bool) -> WebhookOutcome:
    """The bounded label an attempt counts under in `backfill_webhook_deliveries_total`."""
    if outcome.delivered:
        return "delivered"
    if gave_up:
        return "gave_up"
    if outcome.error is not None and outcome.error.startswith("refused"):
        return "refused"
    return "http_error" if outcome.status_code is not None else "network_error"


def post(target: Target, headers: dict[str, str], body: bytes, settings: Settings) -> tuple[int, str, str]:
    """POST to the checked address (no proxy, no redirects, one connection); return status, body prefix, Location.

    Connecting to `target.address` rather than the host name keeps a second DNS answer from changing where
    the request goes; TLS still verifies the certificate against the host name (SNI). The whole exchange
    ends `webhook_timeout_seconds` after it began (TimeoutError): httpx's own timeouts bound each read, not
    their sum, so a receiver sending a byte every few seconds would otherwise hold the attempt for hours.
    """
    return asyncio.run(_post(target, headers, body, settings))


async def _post(target: Target, headers: dict[str, str], body: bytes, settings: Settings) -> tuple[int, str, str]:
    extensions = {"sni_hostname": target.hostname} if target.scheme == "https" else {}
    limit = settings.webhook_response_prefix_bytes
    # One client per attempt: a pooled connection verified for one host must never carry another's request.
    async with (
        asyncio.timeout(settings.webhook_timeout_seconds),
        httpx.AsyncClient(timeout=settings.webhook_timeout_seconds, follow_redirects=False, trust_env=False) as client,
        client.stream(
            "POST",
            target.pinned_url(),
            headers={**headers, "host": target.host_header},
            content=body,
            extensions=extensions,
        ) as response,
    ):
        prefix = bytearray()
        if limit:
            async for chunk in response.aiter_bytes():
                prefix += chunk
                if len(prefix) >= limit:
                    break
        text = bytes(prefix[:limit]).decode("utf-8", errors="replace")
        return response.status_code, text, response.headers.get("location", "")


def deliver_due(
    *, settings: Settings | None = None, stop: threading.Event | None = None, budget_seconds: float = 60.0
) -> int:
    """Send what is due, claiming more for about `budget_seconds` as attempts end; return attempts made."""
    settings = settings or get_settings()
    deadline = time.monotonic() + budget_seconds
    running: dict[Future[Outcome], DueDelivery] = {}
    made = 0
    with ThreadPoolExecutor(settings.webhook_concurrency, thread_name_prefix="webhook") as pool:
        while True:
            if time.monotonic() < deadline and not (stop is not None and stop.is_set()):
                for item in _claim(settings, in_flight=list(running.values())):
                    running[pool.submit(attempt, item, settings)] = item
            if not running:
                return made
            finished, _ = wait(running, timeout=CLAIM_INTERVAL_SECONDS, return_when=FIRST_COMPLETED)
            for future in finished:
                _record(running.pop(future), future.result(), settings)
                made += 1


def _claim(settings: Settings, *, in_flight: list[DueDelivery]) -> list[DueDelivery]:
    """Claim due deliveries for the free slots, each tenant up to its share counting what it has in flight."""
    free = settings.webhook_concurrency - len(in_flight)
    if free <= 0:
        return []
    with transaction() as session:
        return claim_due(
            session,
            at=now_f(),
            limit=free,
            claim_seconds=settings.webhook_timeout_seconds + CLAIM_MARGIN_SECONDS,
            per_tenant=min(settings.webhook_concurrency_per_tenant, settings.webhook_concurrency),
            in_flight=Counter(item.tenant_id for item in in_flight),
        )


def _record(item: DueDelivery, outcome: Outcome, settings: Settings) -> None:
    """Store one attempt (its own short transaction) and schedule the retry, or give up."""
    retry_at = None if outcome.delivered else next_attempt_at(item, at=now_f(), settings=settings)
    with transaction() as session:
        record_attempt(session, delivery_id=item.id, outcome=outcome, retry_at=retry_at)
    count_webhook_delivery(_metric_outcome(outcome, gave_up=retry_at is None))
    log.info("webhook %s attempt %d: %s", item.id, item.attempts + 1, outcome.error or outcome.status_code)


_background: list[threading.Thread] = []
_last_start = [0.0]
_lock = threading.Lock()
EMBEDDED_POLL_SECONDS = 1.0


def deliver_in_background(*, stop: threading.Event | None = None) -> None:
    """Start a delivery pass in its own thread, at most once a second and one at a time; never blocks.

    The embedded worker calls this every loop pass, so a slow receiver never holds up batch work.
    """
    with _lock:
        if _background and _background[0].is_alive():
            return
        if time.monotonic() - _last_start[0] < min(EMBEDDED_POLL_SECONDS, get_settings().webhook_poll_seconds):
            return
        _last_start[0] = time.monotonic()
        thread = threading.Thread(target=_pass, kwargs={"stop": stop}, name="backfill-webhooks", daemon=True)
        _background[:] = [thread]
        thread.start()


def _pass(stop: threading.Event | None) -> None:
    try:
        deliver_due(stop=stop)
    except Exception:  # the next pass retries: every row is still in the database
        log.exception("webhook delivery pass failed")
