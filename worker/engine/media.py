"""Images and documents of a generation, made ready for an engine off the engine's thread.

A wire module leaves a line's images and PDF documents in its `Generation` as URLs (generation.py: `image_url` and
`document` parts, a data: URL or an http(s) one). Before an engine renders the chat, `MediaResolver` turns each
image into a decoded PIL image (`image_pil`, the part vLLM's chat renderer takes) and each document into a text
part, or fails the line with a clear code. It runs on threads of its own, so no engine's or claimer's thread ever
waits on a slow server, and fetches run side by side, so one tenant's slow server holds only its own lines:

- remote URLs are fetched under the webhooks' network rules (storage/webhooks/targets.py: public addresses only
  unless `media_allowed_networks` opens a network; link-local and cloud metadata never), on one event loop thread,
  `media_fetch_concurrency` at once, each connecting to the very address that was checked (no DNS rebinding),
  following at most MAX_REDIRECTS redirects, each checked again, and cut `media_fetch_timeout_seconds` after it
  began however slowly its server sends (a total deadline, not a per-read one); a declared or received body over
  `media_max_bytes` ends it, and the answer's content type must be an image's (a PDF's) or a generic binary one;
- images are decoded on DECODE_THREADS threads, their pixels checked from the header before decoding (a
  decompression bomb is refused unread), and scaled down to fit `media_image_max_side_px` (512 px for
  `detail: low`), as OpenAI scales images; formats: PNG, JPEG, WEBP, GIF (its first frame);
- a PDF's text is extracted in a child process (worker/engine/pdf_text.py) with a memory limit, a page limit
  (`document_max_pages`) and a time limit (`document_timeout_seconds`).

Engines keep their lines waiting on it in a `MediaWaits` (worker/engine/media_waits.py; docs/images.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import dataclasses
import functools
import io
import ipaddress
import json
import logging
import ssl
import subprocess
import sys
import threading
from typing import Any
from urllib.parse import urljoin

import certifi
import httpx

from storage.errors import InvalidWebhookUrl
from storage.settings import Settings
from storage.webhooks.targets import Resolver, Target, TargetPolicy, resolve_target
from worker.engine.generation import (
    DECODED_IMAGE_PART,
    DOCUMENT_PART,
    IMAGE_PART,
    MEDIA_PARTS,
    BodyError,
    Generation,
    Message,
)

logger = logging.getLogger(__name__)

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")  # the image formats both vendors take
LOW_DETAIL_SIDE_PX = 512  # `detail: low`: OpenAI's low-resolution square
MAX_REDIRECTS = 3
DECODE_THREADS = 2
DOCUMENT_THREADS = 2
DOCUMENT_MAX_CHARS = 1_000_000  # of text out of one document (the model's context refuses long before)
USER_AGENT = "Backfill-media/1"
_BINARY = "application/octet-stream"


@dataclasses.dataclass(frozen=True)
class MediaLimits:
    """The bounds of one line's images and documents (the `media_*` and `document_*` settings)."""

    max_bytes: int = 20 * 1024 * 1024
    fetch_timeout_seconds: float = 10.0
    fetch_concurrency: int = 64
    image_max_pixels: int = 8000 * 8000
    image_max_side_px: int = 2048
    max_items: int = 100
    document_max_pages: int = 100
    document_timeout_seconds: float = 30.0
    policy: TargetPolicy = dataclasses.field(default_factory=lambda: media_policy())

    @classmethod
    def from_settings(cls, settings: Settings) -> MediaLimits:
        networks = tuple(ipaddress.ip_network(n, strict=False) for n in settings.media_allowed_networks)
        return cls(
            max_bytes=settings.media_max_bytes,
            fetch_timeout_seconds=settings.media_fetch_timeout_seconds,
            fetch_concurrency=settings.media_fetch_concurrency,
            image_max_pixels=settings.media_image_max_pixels,
            image_max_side_px=settings.media_image_max_side_px,
            max_items=settings.media_max_items,
            document_max_pages=settings.document_max_pages,
            document_timeout_seconds=settings.document_timeout_seconds,
            policy=media_policy(allow_http=settings.media_allow_http, allowed_networks=networks),
        )


def media_policy(*, allow_http: bool = True, allowed_networks: tuple[Any, ...] = ()) -> TargetPolicy:
    """The webhooks' network rules, worded for images and documents."""
    return TargetPolicy(
        allow_http=allow_http,
        allowed_networks=allowed_networks,
        noun="image or document",
        rule="images and documents are fetched only from public addresses",
        networks_setting="BACKFILL_MEDIA_ALLOWED_NETWORKS",
    )


def _failed(code: str, message: str) -> BodyError:
    return BodyError(message, code=code, param="messages")


class MediaResolver:
    """Resolves generations' images and documents on threads of its own; `submit` returns at once."""

    def __init__(self, limits: MediaLimits | None = None, *, resolver: Resolver | None = None) -> None:
        self.limits = limits or MediaLimits()
        self._resolver = resolver
        self._loop = asyncio.new_event_loop()
        self._slots = asyncio.Semaphore(self.limits.fetch_concurrency)
        self._tls = ssl.create_default_context(cafile=certifi.where())  # built once: each is ~10 ms of CPU
        self._decode = concurrent.futures.ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="backfill-media-decode")
        self._documents = concurrent.futures.ThreadPoolExecutor(DOCUMENT_THREADS, thread_name_prefix="backfill-pdf")
        self._thread = threading.Thread(target=self._loop.run_forever, name="backfill-media", daemon=True)
        self._thread.start()

    def submit(self, generation: Generation) -> concurrent.futures.Future[Generation]:
        """The generation with its images decoded and its documents as text (or a BodyError), when ready."""
        return asyncio.run_coroutine_threadsafe(self._resolve(generation), self._loop)

    def close(self) -> None:
        """Cancel what is running and stop the loop and the pools."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        self._decode.shutdown(wait=False, cancel_futures=True)
        self._documents.shutdown(wait=False, cancel_futures=True)

    async def _shutdown(self) -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop.stop()

    async def _resolve(self, generation: Generation) -> Generation:
        try:
            return await self._resolved(generation)
        except BodyError as error:
            error.param = generation.where  # "messages", or a classifier's "input"
            raise

    async def _resolved(self, generation: Generation) -> Generation:
        items = generation.parts(*MEDIA_PARTS)
        if len(items) > self.limits.max_items:
            raise _failed(
                "too_many_images",
                f"The request has {len(items)} images and documents; at most {self.limits.max_items} are allowed "
                "(BACKFILL_MEDIA_MAX_ITEMS).",
            )
        try:
            async with asyncio.TaskGroup() as group:  # the first failure cancels the rest
                tasks = [group.create_task(self._one(number, part)) for number, part in enumerate(items, 1)]
        except* BodyError as failures:
            raise failures.exceptions[0] from None
        found = {id(part): task.result() for part, task in zip(items, tasks, strict=True)}
        messages = tuple(_replaced(message, found) for message in generation.messages)
        return dataclasses.replace(generation, messages=messages)

    async def _one(self, number: int, part: dict[str, Any]) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        if part["type"] == IMAGE_PART:
            spec = part[IMAGE_PART]
            what = f"image {number}"
            data = await self._bytes(str(spec["url"]), what=what, document=False)
            side = LOW_DETAIL_SIDE_PX if spec.get("detail") == "low" else self.limits.image_max_side_px
            decode = functools.partial(
                decode_image, data, max_pixels=self.limits.image_max_pixels, max_side=side, what=what
            )
            return [{"type": DECODED_IMAGE_PART, DECODED_IMAGE_PART: await loop.run_in_executor(self._decode, decode)}]
        spec = part[DOCUMENT_PART]
        what = f"document {number}"
        data = await self._bytes(str(spec["url"]), what=what, document=True)
        extract = functools.partial(
            document_text,
            data,
            max_pages=self.limits.document_max_pages,
            timeout=self.limits.document_timeout_seconds,
            what=what,
        )
        pages = await loop.run_in_executor(self._documents, extract)
        text = document_block(pages, title=spec.get("title"), context=spec.get("context"), paged=True)
        return [{"type": "text", "text": text}]

    async def _bytes(self, url: str, *, what: str, document: bool) -> bytes:
        if url.startswith("data:"):
            return data_url_bytes(url, what=what, max_bytes=self.limits.max_bytes, document=document)
        if not url.lower().startswith(("http://", "https://")):
            code = "invalid_document" if document else "invalid_image_url"
            raise _failed(code, f"{what}: the url must be a data: URL or an http(s) URL, not {url[:60]!r}.")
        async with self._slots:
            return await self._fetch(url, what=what, document=document)

    async def _fetch(self, url: str, *, what: str, document: bool) -> bytes:
        code = "document_fetch_failed" if document else "image_fetch_failed"
        limits, shown = self.limits, url[:200]
        loop = asyncio.get_running_loop()
        resolve = functools.partial(resolve_target, policy=limits.policy)
        if self._resolver is not None:
            resolve = functools.partial(resolve, resolver=self._resolver)
        try:
            async with asyncio.timeout(limits.fetch_timeout_seconds):
                for _ in range(MAX_REDIRECTS + 1):
                    target = await loop.run_in_executor(None, resolve, url)  # DNS blocks: off the loop
                    body, location = await self._get(target, what=what, document=document)
                    if location is None:
                        return body
                    url = urljoin(url, location)
        except TimeoutError:
            raise _failed(
                code,
                f"{what} could not be fetched from {shown}: no complete answer within "
                f"{limits.fetch_timeout_seconds:g} s (BACKFILL_MEDIA_FETCH_TIMEOUT_SECONDS).",
            ) from None
        except InvalidWebhookUrl as error:
            raise _failed(code, f"{what} could not be fetched from {shown}: {error.message}") from None
        except httpx.HTTPError as error:
            raise _failed(
                code, f"{what} could not be fetched from {shown}: {type(error).__name__}: {error}"[:500]
            ) from None
        raise _failed(code, f"{what} could not be fetched from {shown}: more than {MAX_REDIRECTS} redirects.")

    async def _get(self, target: Target, *, what: str, document: bool) -> tuple[bytes, str | None]:
        """One GET to the checked address: (body, None), or (b"", where a redirect points)."""
        code = "document_fetch_failed" if document else "image_fetch_failed"
        extensions = {"sni_hostname": target.hostname} if target.scheme == "https" else {}
        headers = {
            "host": target.host_header,
            "user-agent": USER_AGENT,
            "accept": "application/pdf" if document else "image/*",
            "accept-encoding": "identity",  # the bytes counted are the bytes decoded: no gzip bomb
        }
        timeout = self.limits.fetch_timeout_seconds
        # One client per fetch: a connection verified for one host never carries another's request.
        async with (
            httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False, verify=self._tls) as client,
            client.stream("GET", target.pinned_url(), headers=headers, extensions=extensions) as response,
        ):
            if response.is_redirect and response.headers.get("location"):
                return b"", response.headers["location"]
            if response.status_code != 200:
                raise _failed(code, f"{what} could not be fetched: its server answered HTTP {response.status_code}.")
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if not (kind == _BINARY or (kind == "application/pdf" if document else kind.startswith("image/"))):
                expected = "application/pdf" if document else "an image/* type"
                raise _failed(
                    code, f"{what} could not be used: its server sent content type {kind[:80]!r}, not {expected}."
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.limits.max_bytes:
                raise self._too_large(what, document=document)
            body = bytearray()
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > self.limits.max_bytes:
                    raise self._too_large(what, document=document)
            return bytes(body), None

    def _too_large(self, what: str, *, document: bool) -> BodyError:
        return _failed(
            "document_too_large" if document else "image_too_large",
            f"{what} is larger than {self.limits.max_bytes} bytes (BACKFILL_MEDIA_MAX_BYTES).",
        )


def _replaced(message: Message, found: dict[int, list[dict[str, Any]]]) -> Message:
    content = message.get("content")
    if not isinstance(content, list) or not any(id(part) in found for part in content):
        return message
    parts: list[Any] = []
    for part in content:
        parts.extend(found.get(id(part), [part]))
    return {**message, "content": parts}


def data_url_bytes(url: str, *, what: str, max_bytes: int, document: bool = False) -> bytes:
    """The bytes of a base64 data: URL, checked against `max_bytes` before decoding."""
    head, comma, payload = url.partition(",")
    kind = head.removeprefix("data:").split(";")[0].strip().lower()
    code = "invalid_document" if document else "invalid_image"
    if not comma or not head.endswith(";base64"):
        raise _failed(code, f"{what}: a data: URL must be base64 (data:<media type>;base64,<data>).")
    if kind and not (kind == _BINARY or (kind == "application/pdf" if document else kind.startswith("image/"))):
        expected = "application/pdf" if document else "an image/* type"
        raise _failed(code, f"{what}: the data: URL's media type is {kind[:80]!r}, not {expected}.")
    if len(payload) // 4 * 3 > max_bytes:
        raise _failed(
            "document_too_large" if document else "image_too_large",
            f"{what} is larger than {max_bytes} bytes (BACKFILL_MEDIA_MAX_BYTES).",
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _failed(code, f"{what}: the data: URL is not valid base64.") from None


def decode_image(data: bytes, *, max_pixels: int, max_side: int, what: str) -> Any:
    """An RGB PIL image of `data`, fitted into `max_side` x `max_side`; its pixels are checked before decoding."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise _failed(
                    "image_too_large",
                    f"{what} is {width} x {height} pixels, more than {max_pixels} "
                    "(BACKFILL_MEDIA_IMAGE_MAX_PIXELS); it was not decoded.",
                )
            image.draft("RGB", (max_side, max_side))  # JPEG: decode at the smallest scale still large enough
            rgb = image.convert("RGB")  # decodes (a GIF's first frame)
    except BodyError:
        raise
    except Image.DecompressionBombError as error:  # Pillow's own guard, past MAX_IMAGE_PIXELS x 2
        raise _failed("image_too_large", f"{what} is too large to decode ({error}).") from None
    except UnidentifiedImageError:
        raise _failed("invalid_image", f"{what} is not a PNG, JPEG, WEBP or GIF image.") from None
    except (OSError, ValueError, SyntaxError) as error:  # truncated or corrupt
        raise _failed("invalid_image", f"{what} could not be decoded ({error})."[:500]) from None
    rgb.thumbnail((max_side, max_side))
    return rgb


def document_text(data: bytes, *, max_pages: int, timeout: float, what: str) -> list[str]:
    """A PDF's pages' text, from a child process (worker/engine/pdf_text.py) killed at `timeout` seconds."""
    if not data.startswith(b"%PDF-"):
        raise _failed("invalid_document", f"{what} is not a PDF (only PDF documents are supported).")
    command = [sys.executable, "-m", "worker.engine.pdf_text", str(max_pages), str(DOCUMENT_MAX_CHARS)]
    try:
        done = subprocess.run(command, input=data, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise _failed(
            "invalid_document",
            f"{what}: its text could not be extracted within {timeout:g} s (BACKFILL_DOCUMENT_TIMEOUT_SECONDS).",
        ) from None
    try:
        found = json.loads(done.stdout)
    except ValueError:
        logger.warning("PDF text extraction exited %s: %s", done.returncode, done.stderr[-500:])
        raise _failed("invalid_document", f"{what}: its text could not be extracted (the extractor failed).") from None
    if found.get("error") == "too_many_pages":
        raise _failed(
            "document_too_large",
            f"{what} has {found.get('pages')} pages; at most {max_pages} are allowed (BACKFILL_DOCUMENT_MAX_PAGES).",
        )
    if "error" in found:
        code = "document_too_large" if found["error"] == "too_much_text" else "invalid_document"
        raise _failed(code, f"{what}: its text could not be extracted ({found.get('detail')}).")
    return [str(text) for text in found["pages"]]


def document_block(pages: list[str], *, title: Any = None, context: Any = None, paged: bool = False) -> str:
    """How a document's text reaches the model: one text part, its pages in order (a PDF's: `paged`, the count
    said), between document tags, its title and context first."""
    head = f'<document title="{title}"' if title else "<document"
    lines = [f'{head} pages="{len(pages)}">' if paged else f"{head}>"]
    if context:
        lines.append(f"<context>{context}</context>")
    lines += [text.strip() for text in pages]
    lines.append("</document>")
    return "\n\n".join(lines)
