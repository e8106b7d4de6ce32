"""HTML pages served by the API (the finance page; a later console): one response with a strict policy.

A page holds an API key, so it runs only its own inline script and style (allowed by their SHA-256, no
'unsafe-inline'), talks only to this origin, cannot be framed (clickjacking), sends no Referer and is
never cached. Pages keep their markup free of style attributes and inline handlers: the policy refuses both.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re

from fastapi.responses import HTMLResponse

_BLOCKS = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.S) for tag in ("script", "style")}


def _hashes(html: str, tag: str) -> str:
    digests = (hashlib.sha256(block.encode()).digest() for block in _BLOCKS[tag].findall(html))
    return " ".join(f"'sha256-{base64.b64encode(digest).decode()}'" for digest in digests) or "'none'"


@functools.lru_cache(maxsize=8)
def content_security_policy(html: str) -> str:
    """A policy allowing exactly this page's inline blocks, its own origin's API, and nothing else."""
    return "; ".join(
        (
            "default-src 'none'",
            f"script-src {_hashes(html, 'script')}",
            f"style-src {_hashes(html, 'style')}",
            "img-src 'self' data:",
            "connect-src 'self'",
            "form-action 'self'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        )
    )


def page_response(html: str) -> HTMLResponse:
    """`html` with the security headers every page of the API sends."""
    return HTMLResponse(
        html,
        headers={
            "Content-Security-Policy": content_security_policy(html),
            "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        },
    )
