"""Images and documents of batch lines (worker/engine/media.py): what is fetched from where, the caps, the bombs.

A real HTTP server on 127.0.0.1 (tests/media_server.py), reached only because each test's policy opens
127.0.0.1/32, as BACKFILL_MEDIA_ALLOWED_NETWORKS would.
"""

from __future__ import annotations

import ipaddress
import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.media_server import MediaServer, bomb_png, data_url, deflated_pdf_bomb, png_bytes, tiny_pdf
from worker.engine.generation import BodyError, Generation
from worker.engine.media import MediaLimits, MediaResolver, media_policy
from worker.engine.media_waits import MediaWaits

LOCAL = (ipaddress.ip_network("127.0.0.1/32"),)


@pytest.fixture(scope="module")
def server() -> Iterator[MediaServer]:
    found = MediaServer()
    yield found
    found.close()


def resolver(**limits: Any) -> MediaResolver:
    networks = limits.pop("allowed_networks", LOCAL)
    return MediaResolver(MediaLimits(policy=media_policy(allowed_networks=networks), **limits))


def image(url: str, detail: str = "auto") -> Generation:
    content = [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": url, "detail": detail}},
    ]
    return Generation(kind="chat", messages=({"role": "user", "content": content},))


def document(url: str, title: str | None = "Report") -> Generation:
    part = {"type": "document", "document": {"url": url, "title": title, "context": None}}
    return Generation(kind="chat", messages=({"role": "user", "content": [part]},))


def resolve(generation: Generation, **limits: Any) -> Generation:
    media = resolver(**limits)
    try:
        return media.submit(generation).result(timeout=60)
    finally:
        media.close()


def refusal(generation: Generation, **limits: Any) -> BodyError:
    with pytest.raises(BodyError) as failed:
        resolve(generation, **limits)
    return failed.value


def test_an_inline_image_is_decoded_and_fitted_to_the_detail_size() -> None:
    big = data_url(png_bytes(1200, 600))
    high = resolve(image(big)).messages[0]["content"][1]
    low = resolve(image(big, detail="low")).messages[0]["content"][1]
    assert high["type"] == "image_pil" and high["image_pil"].size == (1200, 600)
    assert low["image_pil"].size == (512, 256)  # OpenAI's low-detail square, aspect kept
    assert resolve(image(big), image_max_side_px=300).messages[0]["content"][1]["image_pil"].size == (300, 150)


def test_a_remote_image_is_fetched_when_its_network_is_allowed(server: MediaServer) -> None:
    for path in ("/red.png", "/octet.png", "/to/red.png"):  # a generic binary type, a redirect on the same host
        part = resolve(image(server.url + path)).messages[0]["content"][1]
        assert part["image_pil"].size == (64, 48) and part["image_pil"].getpixel((0, 0)) == (200, 30, 30)


def test_private_loopback_and_metadata_addresses_are_refused_without_a_connection(server: MediaServer) -> None:
    before = dict(server.hits)
    loopback = refusal(image(server.url + "/red.png"), allowed_networks=())
    assert loopback.code == "image_fetch_failed" and "loopback" in loopback.message
    assert "BACKFILL_MEDIA_ALLOWED_NETWORKS" in loopback.message
    private = refusal(image("http://10.1.2.3/cat.png"))
    assert private.code == "image_fetch_failed" and "private address" in private.message
    metadata = refusal(
        image("http://169.254.169.254/latest/meta-data"), allowed_networks=(ipaddress.ip_network("0.0.0.0/0"),)
    )
    assert "cloud metadata" in metadata.message and "never allowed" in metadata.message
    redirected = refusal(image(server.url + "/to-private.png"))  # the redirect's target is checked again
    assert "private address" in redirected.message and "10.0.0.1" in redirected.message
    assert server.hits.get("/red.png", 0) == before.get("/red.png", 0)  # the loopback refusal never connected
    assert refusal(image("file:///etc/passwd")).code == "invalid_image_url"


def test_size_type_and_status_caps_fail_the_fetch_with_the_reason(server: MediaServer) -> None:
    declared = refusal(image(server.url + "/big.png"), max_bytes=1024 * 1024)
    assert declared.code == "image_too_large" and "BACKFILL_MEDIA_MAX_BYTES" in declared.message
    started = time.monotonic()
    streamed = refusal(image(server.url + "/endless.png"), max_bytes=1024 * 1024)
    assert streamed.code == "image_too_large" and time.monotonic() - started < 5
    html = refusal(image(server.url + "/page.html"))
    assert html.code == "image_fetch_failed" and "text/html" in html.message
    missing = refusal(image(server.url + "/missing.png"))
    assert missing.code == "image_fetch_failed" and "HTTP 404" in missing.message


def test_a_server_sending_a_byte_a_second_is_cut_off_at_the_deadline(server: MediaServer) -> None:
    started = time.monotonic()
    slow = refusal(image(server.url + "/slow.png"), fetch_timeout_seconds=1.5)
    took = time.monotonic() - started
    assert slow.code == "image_fetch_failed" and "1.5 s" in slow.message and 1.4 < took < 5


def test_a_slow_fetch_holds_no_other_line(server: MediaServer) -> None:
    """Two lines on one resolver: the slow one's fetch does not delay the other's (each runs on the loop)."""
    media = resolver(fetch_timeout_seconds=3)
    try:
        slow = media.submit(image(server.url + "/slow.png"))
        started = time.monotonic()
        quick = media.submit(image(server.url + "/red.png")).result(timeout=10)
        assert time.monotonic() - started < 1.0 and not slow.done()
        assert quick.messages[0]["content"][1]["type"] == "image_pil"
    finally:
        media.close()


def test_decompression_bombs_are_refused_from_their_header_without_decoding() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    over_cap = refusal(image(data_url(bomb_png(9000, 9000))), image_max_pixels=64_000_000)
    assert over_cap.code == "image_too_large" and "9000 x 9000" in over_cap.message
    enormous = refusal(image(data_url(bomb_png(60000, 60000))))  # past Pillow's own guard too
    assert enormous.code == "image_too_large"
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 100 * 1024  # decoding 81 megapixels would take ~240 MB


def test_bad_inline_data_gets_a_clear_code() -> None:
    assert refusal(image("data:image/png;base64,not-base64!")).code == "invalid_image"
    assert refusal(image("data:image/png;base64,AAAA")).code == "invalid_image"  # not an image
    assert refusal(image("data:text/plain;base64,AAAA")).code == "invalid_image"
    assert refusal(image("data:image/png,raw")).code == "invalid_image"  # not base64
    too_big = refusal(image(data_url(png_bytes(400, 400))), max_bytes=1024)
    assert too_big.code == "image_too_large"


def test_too_many_images_fail_the_line_before_any_fetch(server: MediaServer) -> None:
    parts = [{"type": "image_url", "image_url": {"url": server.url + f"/red.png?{i}"}} for i in range(4)]
    generation = Generation(kind="chat", messages=({"role": "user", "content": parts},))
    failed = refusal(generation, max_items=3)
    assert failed.code == "too_many_images" and "BACKFILL_MEDIA_MAX_ITEMS" in failed.message
    assert not any(path.startswith("/red.png?") for path in server.hits)


def test_a_pdf_becomes_its_pages_text(server: MediaServer) -> None:
    inline = resolve(document(data_url(tiny_pdf(["Quarterly revenue grew", "Costs fell"]), "application/pdf")))
    (part,) = inline.messages[0]["content"]
    assert part["type"] == "text" and part["text"].startswith('<document title="Report" pages="2">')
    assert "Quarterly revenue grew" in part["text"] and "Costs fell" in part["text"]
    fetched = resolve(document(server.url + "/doc.pdf", title=None)).messages[0]["content"][0]["text"]
    assert "Hello from page one" in fetched and "And page two" in fetched


def test_a_pdf_of_5000_pages_is_refused_quickly_with_its_page_count() -> None:
    pdf = tiny_pdf(blank_pages=5000)
    started = time.monotonic()
    failed = refusal(document(data_url(pdf, "application/pdf")), document_max_pages=100)
    assert failed.code == "document_too_large" and "5000 pages" in failed.message
    assert time.monotonic() - started < 15


def test_unreadable_and_hostile_pdfs_fail_their_line() -> None:
    assert refusal(document(data_url(b"hello", "application/pdf"))).code == "invalid_document"
    broken = refusal(document(data_url(b"%PDF-1.4 garbage", "application/pdf")))
    assert broken.code == "invalid_document"
    bomb = refusal(
        document(data_url(deflated_pdf_bomb(100 * 1024 * 1024), "application/pdf")), document_timeout_seconds=20
    )
    assert bomb.code == "invalid_document" and "Limit reached" in bomb.message  # pypdf stops inflating, in the child


def test_media_waits_hands_back_landed_lines_and_forgets_aborted_ones(server: MediaServer) -> None:
    waits: MediaWaits[str] = MediaWaits(lambda: resolver(fetch_timeout_seconds=5))
    try:
        waits.start("ok", image(data_url(png_bytes())), "payload-ok")
        waits.start("bad", image("data:image/png;base64,AAAA"), "payload-bad")
        waits.start("slow", image(server.url + "/slow.png"), "payload-slow")
        landed: dict[str, Any] = {}
        deadline = time.monotonic() + 10
        while len(landed) < 2 and time.monotonic() < deadline:
            waits.wait(0.5)
            landed.update({rid: (payload, found) for rid, payload, found in waits.ready()})
        assert landed["ok"][0] == "payload-ok" and isinstance(landed["ok"][1], Generation)
        assert isinstance(landed["bad"][1], BodyError) and landed["bad"][1].code == "invalid_image"
        assert "slow" in waits and len(waits) == 1
        waits.cancel(["slow"])
        assert len(waits) == 0 and waits.ready() == []
    finally:
        waits.close()
