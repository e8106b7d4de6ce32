"""The text of a PDF's pages, extracted in a child process: `python -m worker.engine.pdf_text MAX_PAGES MAX_CHARS`
reads the PDF on stdin and writes one JSON object on stdout: {"pages": [text, ...]} or {"error": code, "detail": ...}.

A child process because a PDF is a program of sorts: pypdf is pure Python (it would hold the worker's GIL for as
long as a hostile file keeps it busy), its streams are compressed (a few kilobytes can inflate to gigabytes), and
a thread cannot be stopped. The child gets an address-space limit (MEMORY_BYTES) and its parent kills it at
`document_timeout_seconds` (worker/engine/media.py). Imports nothing of Backfill.
"""

from __future__ import annotations

import io
import json
import resource
import sys
from typing import Any

MEMORY_BYTES = 1024**3  # the child's address space: Python, pypdf and one file of up to media_max_bytes


def extract(data: bytes, *, max_pages: int, max_chars: int) -> dict[str, Any]:
    """The pages' text, or the reason there is none (`too_many_pages`, `too_much_text`, `encrypted`, `unreadable`)."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return {"error": "encrypted", "detail": "the PDF is encrypted with a password"}
        count = len(reader.pages)
        if count > max_pages:
            return {"error": "too_many_pages", "detail": f"{count} pages", "pages": count}
        texts, total = [], 0
        for page in reader.pages:
            text = page.extract_text() or ""
            total += len(text)
            if total > max_chars:
                return {"error": "too_much_text", "detail": f"more than {max_chars} characters of text"}
            texts.append(text)
        return {"pages": texts}
    except MemoryError:
        return {"error": "unreadable", "detail": "it needs more memory than a document may take"}
    except Exception as error:  # whatever a malformed file raises inside pypdf
        return {"error": "unreadable", "detail": f"{type(error).__name__}: {error}"[:300]}


def main() -> int:
    max_pages, max_chars = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    found = extract(sys.stdin.buffer.read(), max_pages=max_pages, max_chars=max_chars)
    sys.stdout.write(json.dumps(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
