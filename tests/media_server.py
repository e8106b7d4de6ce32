"""Images, PDFs and an image server on 127.0.0.1 for the tests of images and documents (worker/engine/media.py).

The server answers GETs by path: `/red.png` an image, `/doc.pdf` a PDF, `/big.png` an image declaring more bytes
than the cap, `/endless.png` one streaming bytes without a length, `/slow.png` one sending a byte a second,
`/page.html` the wrong content type, `/missing.png` a 404, `/to/<path>` a redirect to `<path>` on the same server,
`/to-private.png` a redirect to a private address (never followed: refused before any connection).
"""

from __future__ import annotations

import base64
import binascii
import http.server
import io
import struct
import threading
import time
import zlib


def png_bytes(width: int = 64, height: int = 48, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def bomb_png(width: int, height: int) -> bytes:
    """A valid 1 x 1 PNG whose header declares `width` x `height` pixels: what a decompression bomb shows first."""
    data = bytearray(png_bytes(1, 1))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    crc = binascii.crc32(bytes(data[ihdr : ihdr + 17]))
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def tiny_pdf(pages: list[str] | None = None, *, blank_pages: int = 0) -> bytes:
    """A PDF whose pages say `pages` (Helvetica), then `blank_pages` pages sharing one empty content stream."""
    texts = list(pages or [])
    count = len(texts) + blank_pages
    objects: list[bytes] = [b"", b""]  # 1: catalog, 2: page tree (filled below)
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")  # 3
    empty = len(objects) + 1
    objects.append(b"<< /Length 0 >>\nstream\n\nendstream")
    kids = []
    for index in range(count):
        if index < len(texts):
            content = f"BT /F1 12 Tf 72 720 Td ({texts[index]}) Tj ET".encode()
            objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
            stream = len(objects)
        else:
            stream = empty
        objects.append(b"<< /Type /Page /Parent 2 0 R /Contents %d 0 R >>" % stream)  # the rest inherited
        kids.append(b"%d 0 R" % len(objects))
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R >>"
    objects[1] = (
        b"<< /Type /Pages /Kids [%s] /Count %d /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> >>"
        % (
            b" ".join(kids),
            count,
        )
    )
    return _assemble(objects)


def _assemble(objects: list[bytes]) -> bytes:
    """A PDF file of these objects (numbered from 1, the first the catalog), with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def deflated_pdf_bomb(inflated_bytes: int) -> bytes:
    """A one-page PDF whose content stream inflates (FlateDecode) to `inflated_bytes` of text operators."""
    chunk = b"BT /F1 12 Tf 72 720 Td (aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa) Tj ET\n"
    compressor = zlib.compressobj(9)
    packed = b"".join(compressor.compress(chunk * 1024) for _ in range(inflated_bytes // (len(chunk) * 1024)))
    packed += compressor.flush()
    return _assemble(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            b"/Contents 5 0 R >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(packed), packed),
        ]
    )


class MediaServer:
    """A threaded HTTP server on 127.0.0.1 (see the module docstring); `hits` counts GETs per path."""

    def __init__(self, *, max_bytes: int = 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self.hits: dict[str, int] = {}
        self.stop = threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.hits[self.path] = owner.hits.get(self.path, 0) + 1
                try:
                    self._answer()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the fetcher hung up (a cap or its deadline): what these tests want

            def _send(self, status: int, kind: str, body: bytes, length: int | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)

            def _answer(self) -> None:
                path = self.path
                if path.startswith("/to/"):
                    self.send_response(302)
                    self.send_header("location", "/" + path.removeprefix("/to/"))
                    self.send_header("content-length", "0")
                    self.end_headers()
                elif path == "/to-private.png":
                    self.send_response(302)
                    self.send_header("location", "http://10.0.0.1/secret.png")
                    self.send_header("content-length", "0")
                    self.end_headers()
                elif path == "/red.png":
                    self._send(200, "image/png", png_bytes())
                elif path == "/octet.png":
                    self._send(200, "application/octet-stream", png_bytes())
                elif path == "/doc.pdf":
                    self._send(200, "application/pdf", tiny_pdf(["Hello from page one", "And page two"]))
                elif path == "/page.html":
                    self._send(200, "text/html", b"<html>not an image</html>")
                elif path == "/big.png":
                    self._send(200, "image/png", b"", length=50 * 1024 * 1024)
                elif path == "/endless.png":
                    self.send_response(200)
                    self.send_header("content-type", "image/png")
                    self.end_headers()
                    block = b"\0" * 65536
                    while not owner.stop.is_set():  # until the fetcher hangs up
                        self.wfile.write(block)
                elif path == "/slow.png":
                    self.send_response(200)
                    self.send_header("content-type", "image/png")
                    self.send_header("content-length", "1000")
                    self.end_headers()
                    for _ in range(1000):  # a byte a second
                        if owner.stop.wait(1.0):
                            return
                        self.wfile.write(b"\0")
                        self.wfile.flush()
                else:
                    self._send(404, "text/plain", b"missing")

        return Handler


def wait_until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)
