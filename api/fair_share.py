"""Each tenant's fair share of the API's request threads: at most `limit` requests of one tenant in flight at once.

Sync routes run on AnyIO's thread pool (`api_threads`). Without a share, one tenant's many clients took every
thread and another tenant's simple GET waited behind them for seconds (issue 36 §11). This pure ASGI middleware,
the outermost, counts a tenant's requests from the moment their headers arrive until their answer is sent (an
upload's or a streamed create's body, a streamed download: all of it counts). A request past the
share waits for one of its tenant's slots, first come first served, on the event loop (no thread, its body
unread) for up to WAIT_SECONDS; if none frees it is answered 429 with `Retry-After` in its path's envelope
(api/dialects.py). The SDKs retry a 429 by themselves after
`Retry-After`. The wait smooths a burst (most of a tenant's 100 clients are served, not refused) and paces a client
that retries a 429 at once: an immediate refusal let such clients spin, and the event loop's work for thousands
of refusals a second slowed every other tenant's requests (bench/tenant_share.py).

The tenant is read from the API key (api/deps.py `api_key_of`): its SHA-256 maps to the tenant through a small
cache; a key not yet in it is looked up once, on a few threads of their own (never the routes'). Keys that name
no tenant share one bucket of the same size, so unknown keys cannot take every thread either. A request with no
key (health, metrics, the console's page) is not counted: it is answered without the database or refused at once.
The share is per API process, as its threads are. Long-polls (`GET /v1/batches/{id}/wait`) count in a bucket of
their own, LONG_POLLS_PER_TENANT slots: they hold no thread while they wait.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from api.deps import api_key_of
from api.dialects import dialect_of
from storage.db import transaction
from storage.errors import TenantBusy, is_unavailable
from storage.tenants import hash_key, tenant_of_key

RETRY_AFTER_SECONDS = 1
WAIT_SECONDS = 1.0  # a request past its tenant's share waits this long for one of its slots, then is refused
WAITING_MAX = 1000  # requests of one tenant waiting at once; past it a request only waits out WAIT_SECONDS
LOOKUP_THREADS = 4  # keys looked up at once (a key's first request only); the routes' threads are never used
CACHE_KEYS = 10_000  # key hashes remembered (least recently used go first)
_UNKNOWN = ""  # the bucket of keys that name no live tenant
LONG_POLL = re.compile(r"/v1/batches/[^/]+/wait")  # long-polls: slots of their own (below)
LONG_POLLS_PER_TENANT = 16  # as many as the route lets one tenant hold waiting (api/openai/batches.py)
_LONG_POLLS = "\x00long-polls"  # a tenant's long-poll bucket: its id and this (no tenant id holds a NUL)


@dataclass
class _Share:
    """One tenant's requests in flight and those waiting for a slot, first come first served."""

    in_flight: int = 0
    waiting: deque[anyio.Event] = field(default_factory=deque)


class TenantShare:
    """Pure ASGI middleware: see the module docstring. Its state is touched only on the event loop: no lock."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.shares: dict[str, _Share] = {}
        self._tenants: OrderedDict[str, str] = OrderedDict()
        self._lookups: anyio.CapacityLimiter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        key = api_key_of(x_api_key=headers.get("x-api-key"), authorization=headers.get("authorization"))
        tenant = None if key is None else await self._tenant_of(hash_key(key))
        if tenant is None:  # no key, or the database cannot say now: the route answers (401, 503) on its own
            await self.app(scope, receive, send)
            return
        bucket, limit = tenant, self.limit
        if scope["method"] == "GET" and LONG_POLL.fullmatch(scope["path"]):
            # A long-poll holds no thread while it waits (api/openai/batches.py `wait`): its own slots, so a client
            # watching its batches never takes the slots of the tenant's other requests.
            bucket, limit = tenant + _LONG_POLLS, LONG_POLLS_PER_TENANT
        if not await self._enter(bucket, limit):
            await _refuse(scope, receive, send, limit)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._leave(bucket)

    async def _enter(self, tenant: str, limit: int) -> bool:
        """Take one of the tenant's slots: at once if one is free and nobody waits, else after waiting in line
        for up to WAIT_SECONDS; False if none came (the request is refused, having waited)."""
        share = self.shares.setdefault(tenant, _Share())
        if share.in_flight < limit and not share.waiting:
            share.in_flight += 1
            return True
        if len(share.waiting) >= WAITING_MAX:
            await anyio.sleep(WAIT_SECONDS)  # a client that ignores Retry-After is slowed all the same
            return False
        turn = anyio.Event()
        share.waiting.append(turn)
        try:
            with anyio.move_on_after(WAIT_SECONDS):
                await turn.wait()
        except BaseException:  # cancelled while waiting (the server stops): never keep a slot or a place in line
            if turn.is_set():
                self._leave(tenant)
            else:
                share.waiting.remove(turn)
            raise
        if turn.is_set():  # a leaving request handed its slot over (even if the wait timed out just then)
            return True
        share.waiting.remove(turn)
        return False

    def _leave(self, tenant: str) -> None:
        """Hand the slot to the first request waiting for one, or give it back."""
        share = self.shares[tenant]
        if share.waiting:
            share.waiting.popleft().set()
            return
        share.in_flight -= 1
        if not share.in_flight:
            del self.shares[tenant]

    async def _tenant_of(self, key_hash: str) -> str | None:
        """The key's tenant id (`_UNKNOWN` for a key that names none), from the cache or looked up once."""
        tenant = self._tenants.get(key_hash)
        if tenant is None:
            if self._lookups is None:  # made on the event loop, where it is used
                self._lookups = anyio.CapacityLimiter(LOOKUP_THREADS)
            tenant = await anyio.to_thread.run_sync(_look_up, key_hash, limiter=self._lookups)
            if tenant is None:
                return None
            self._tenants[key_hash] = tenant
            if len(self._tenants) > CACHE_KEYS:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(key_hash)
        return tenant


def _look_up(key_hash: str) -> str | None:
    """The key's tenant id, `_UNKNOWN` if it names none, None if the database cannot say now (the request then
    goes on uncounted and its route answers 503 as any other would)."""
    try:
        with transaction() as session:
            return tenant_of_key(session, key_hash=key_hash) or _UNKNOWN
    except Exception as error:
        if is_unavailable(error):
            return None
        raise


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    """429 with Retry-After in the path's envelope; a request with a body closes its connection (the body is never
    read)."""
    error = TenantBusy(
        f"Too many requests of this tenant in flight at once (at most {limit}): retry after "
        f"{RETRY_AFTER_SECONDS} s, or send fewer requests at a time (BACKFILL_TENANT_MAX_CONCURRENT_REQUESTS)."
    )
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    request = Headers(scope=scope)
    if request.get("content-length", "0") != "0" or "transfer-encoding" in request:
        headers["Connection"] = "close"
    envelope = dialect_of(scope["path"]).envelope
    response = envelope(error.status, error.message, type_=error.type, code=error.code, headers=headers)
    await response(scope, receive, send)
