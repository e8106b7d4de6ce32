"""Prefix keys: which queued requests share a prompt prefix, so claims can hand them out together.

A short hash of the shared part of the prompt is stored per row at ingest, kept only when another line of
the same file shares it (see `SharedPrefixes`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from storage.endpoints import CHAT_URL, COMPLETIONS_URL, MESSAGES_URL, RESPONSES_URL

# /v1/messages is keyed like chat, with the system prompt (a separate field) leading.


def prefix_key_of(url: str, body: dict[str, Any], *, chars: int) -> str:
    """A short hash of the part of the prompt that requests are likely to share ("" if there is none).

    Chat: every message but the last (system prompt, few-shot turns) and the tools, which templates render
    first; with a single message, its first `chars` characters. Completions: the first `chars` characters
    of the (first) prompt, or its first `chars // 4` token ids. Responses: as chat, the instructions
    leading the input items. Embeddings have no prefix to share.
    """
    if url == RESPONSES_URL:  # rendered as chat: instructions become the leading system message
        url, body = CHAT_URL, {"messages": _responses_messages(body), "tools": None}
    if url == MESSAGES_URL and body.get("system"):
        body = {"messages": [{"role": "system", "content": body["system"]}, *(body.get("messages") or [])]}
        url = CHAT_URL
    if url in (CHAT_URL, MESSAGES_URL):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return ""
        if len(messages) > 1:
            shared: Any = [messages[:-1], body.get("tools")]
        else:
            only = messages[0].get("content") if isinstance(messages[0], dict) else None
            shared = only[:chars] if isinstance(only, str) else orjson.dumps(only).decode()[:chars]
    elif url == COMPLETIONS_URL:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]  # several prompts: the first one leads
        if isinstance(prompt, str):
            shared = prompt[:chars]
        elif isinstance(prompt, list):
            shared = prompt[: max(1, chars // 4)]
        else:
            return ""
    else:
        return ""
    data = url.encode() + b"\0" + orjson.dumps(shared, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _responses_messages(body: dict[str, Any]) -> list[Any]:
    items = body.get("input")
    lead = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    return lead + ([{"role": "user", "content": items}] if isinstance(items, str) else list(items or []))


class SharedPrefixes:
    """Keeps a row's prefix key only once a second row of the same file shares it.

    A prefix no other request shares gains nothing from grouping, and its hash would only shuffle the job's
    line order, so such rows keep "" and run in line order. Rows come in as the file streams: the first row
    of a key is given "" and gets the key when a second one arrives, in place while it still waits to be
    inserted, else through `late_keys` ((line number, key) pairs to UPDATE after streaming: one per shared
    prefix at most).

    Memory stays bounded whatever the file's length: a prefix seen once is remembered as two small ints
    (its key's first 64 bits, its row's line number), and only the latest `ONCE_MAX` or so of those (two
    generations of half that size: O(1) per row, where evicting a dict's oldest entry is not); prefixes
    seen twice are kept as one int each (there are few: they are what grouping is for). A prefix whose
    second row comes more than `ONCE_MAX` distinct prefixes after its first is treated as unshared: its
    rows run in line order, which changes claim order only, never what is run.
    """

    ONCE_MAX = 100_000  # ~10 MB

    def __init__(self) -> None:
        self._once: dict[int, int] = {}  # first 64 bits of a key seen once -> line of its row: this generation
        self._older: dict[int, int] = {}  # and the one before
        self._shared: set[int] = set()
        self._waiting: dict[int, dict[str, Any]] = {}  # rows not yet inserted, by line
        self.late_keys: list[tuple[int, str]] = []

    def assign(self, row: dict[str, Any], key: str) -> None:
        """Set `row["prefix_key"]` for a row about to be inserted."""
        row["prefix_key"] = ""
        self._waiting[row["line"]] = row
        if not key:
            return
        # A 64-bit collision between two distinct prefixes (~1 in 10^8 files of 500,000 lines) would only
        # group two rows that do not share a prefix: claim order, never correctness.
        short = int(key[:16], 16) if len(key) >= 16 else hash(key)
        if short in self._shared:
            row["prefix_key"] = key
            return
        first = self._once.pop(short, None)
        if first is None:
            first = self._older.pop(short, None)
        if first is None:
            self._once[short] = row["line"]
            if len(self._once) >= self.ONCE_MAX // 2:
                self._older, self._once = self._once, {}
            return
        row["prefix_key"] = key
        self._shared.add(short)
        if first in self._waiting:
            self._waiting[first]["prefix_key"] = key
        else:
            self.late_keys.append((first, key))

    def inserted(self) -> None:
        """The rows handed in so far are in the database."""
        self._waiting.clear()
