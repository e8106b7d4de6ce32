"""The corpus of real batch lines (tests/data/corpus/, SOURCES.md there): entries, their mapping, the report.

Each corpus file line is `{"source", "how", "vendor_refuses"?, "request"}`: `request` is the batch line exactly as
its source has it (or as its source's code emits it for the input `how` names). Running a line changes only:
- its model: to the served demo model of its kind (`served_model`): chat, Responses and completions lines to
  `backfill-demo`, or to the vision-language demo model (`*-vl`) when they carry images or documents; embeddings to
  the embedded default's embedding model, or to its Matryoshka demo model (`*-embed`) when they name one of OpenAI's
  text-embedding-3 models (Matryoshka models: `dimensions` shortens their vectors); moderations to the demo
  moderation model;
- its remote image URLs (no network here): to an image this module serves on 127.0.0.1 (`ImageServer`).
Every change is recorded in the line's `Outcome.mapped`.

How the lines run (one batch per group, through each vendor's SDK): tests/e2e/corpus_runs.py.
"""

from __future__ import annotations

import copy
import http.server
import io
import json
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
PROTOCOLS = ("openai", "anthropic")
MATRYOSHKA_MODELS = ("text-embedding-3-",)  # OpenAI's embedding models whose vectors `dimensions` shortens
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions", "/v1/moderations")


@dataclass(frozen=True)
class Entry:
    protocol: str
    index: int  # line number in its corpus file, from 1
    source: dict[str, Any]
    how: str
    vendor_refuses: str | None
    request: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.protocol}:{self.index}"

    @property
    def custom_id(self) -> str:
        return str(self.request.get("custom_id"))


@dataclass
class Outcome:
    entry: Entry
    features: list[str]
    mapped: list[str] = field(default_factory=list)
    ok: bool = False
    error: str = ""  # code: message, when the line failed


def load(protocol: str) -> list[Entry]:
    path = CORPUS / f"{protocol}.jsonl"
    entries = []
    for index, text in enumerate(path.read_text().splitlines(), 1):
        item = json.loads(text)
        entries.append(Entry(protocol, index, item["source"], item["how"], item.get("vendor_refuses"), item["request"]))
    return entries


def endpoint(entry: Entry) -> str:
    """The OpenAI batch endpoint a line belongs to (Azure's lines name it without the /v1 prefix)."""
    url = str(entry.request.get("url", ""))
    return url if url.startswith("/v1/") else "/v1" + url


# --- features -----------------------------------------------------------------------------------------------------


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _parts(value: Any) -> list[dict[str, Any]]:
    return [node for node in _walk(value) if isinstance(node, dict) and "type" in node]


def features(entry: Entry) -> list[str]:
    """What a line exercises, read off the line itself (the per-feature table's rows)."""
    return (_openai_features if entry.protocol == "openai" else _anthropic_features)(entry.request)


def _openai_features(line: dict[str, Any]) -> list[str]:
    body = line.get("body", {})
    url = endpoint(Entry("openai", 0, {}, "", None, line))
    found = {
        "/v1/embeddings": "embeddings",
        "/v1/moderations": "moderations",
        "/v1/completions": "completions",
        "/v1/responses": "responses",
    }.get(url, "chat")
    tags = {found}
    content = body.get("messages", []) + (body.get("input") if isinstance(body.get("input"), list) else [])
    for part in _parts(content):
        if part["type"] in {"image_url", "input_image"}:
            image = part.get("image_url") or part.get("url") or ""
            image = image.get("url", "") if isinstance(image, dict) else image
            tags.add("image (data URL)" if str(image).startswith("data:") else "image (http URL)")
    if body.get("tools"):
        tags.add("tools")
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        tags.add("tools: forced")
    roles = {m.get("role") for m in content if isinstance(m, dict)}
    if "tool" in roles or any(p["type"] == "function_call_output" for p in _parts(content)):
        tags.add("tools: history")
    if body.get("reasoning_effort") or body.get("reasoning"):
        tags.add("reasoning")
    fmt = body.get("response_format") or (body.get("text") or {}).get("format") or {}
    kind = fmt.get("type") or (fmt.get("format") or {}).get("type")
    if kind == "json_schema":
        tags.add("structured: json_schema")
    elif kind == "json_object":
        tags.add("structured: json_object")
    if "dimensions" in body:
        tags.add("embeddings: dimensions")
    if len(tags) == 1 and found in {"chat", "responses", "completions"}:
        tags.add("text")
    return sorted(tags)


def _anthropic_features(line: dict[str, Any]) -> list[str]:
    params = line.get("params", {})
    tags = set()
    for part in _parts(params.get("messages", [])):
        if part["type"] == "image":
            source = part.get("source", {}).get("type")
            tags.add("image (base64)" if source == "base64" else "image (url)")
        elif part["type"] == "document":
            tags.add("document (PDF)")
        elif part["type"] in {"tool_use", "tool_result"}:
            tags.add("tools: history")
    if params.get("tools"):
        tags.add("tools")
    if (params.get("tool_choice") or {}).get("type") in {"any", "tool"}:
        tags.add("tools: forced")
    if params.get("thinking"):
        tags.add("thinking")
    if params.get("output_config"):
        tags.add("structured: output_config")
    if "cache_control" in json.dumps(params):
        tags.add("cache_control")
    if params.get("system"):
        tags.add("system")
    if len(params.get("messages", [])) > 1:
        tags.add("multi-turn")
    if not tags & {"image (base64)", "image (url)", "document (PDF)", "tools", "thinking", "structured: output_config"}:
        tags.add("text")
    return sorted(tags)


# --- the mapping: models and remote URLs --------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedModels:
    """The served model each kind of line is mapped to (None: the server serves none of that kind)."""

    chat: str
    vision: str | None
    embedding: str | None
    moderation: str | None
    matryoshka: str | None = None  # for text-embedding-3 lines (None: they meet `embedding`)

    @classmethod
    def from_names(cls, names: Iterable[str], *, embedding: str | None) -> ServedModels:
        names = sorted(names)
        vision = next((n for n in names if n.endswith("-vl")), None)
        moderation = next((n for n in names if "moderation" in n), None)
        return cls(
            chat="backfill-demo",
            vision=vision,
            embedding=embedding if embedding in names else None,
            moderation=moderation,
            matryoshka=next((n for n in names if n.endswith("-embed")), None),
        )


def _multimodal(entry: Entry) -> bool:
    tags = features(entry)
    return any(tag.startswith(("image", "document")) for tag in tags)


def served_model(entry: Entry, models: ServedModels) -> str | None:
    if entry.protocol == "openai":
        url = endpoint(entry)
        if url == "/v1/embeddings":
            if models.matryoshka and str(entry.request["body"].get("model", "")).startswith(MATRYOSHKA_MODELS):
                return models.matryoshka
            return models.embedding
        if url == "/v1/moderations":
            return models.moderation
    if _multimodal(entry):
        return models.vision or models.chat  # without a vision model the line meets the text model, as it would
    return models.chat


def mapped_request(entry: Entry, models: ServedModels, image_url: str) -> tuple[dict[str, Any], list[str]]:
    """The line as it runs here, and what was changed in it."""
    request = copy.deepcopy(entry.request)
    body = request["body"] if entry.protocol == "openai" else request["params"]
    notes = []
    target = served_model(entry, models)
    if target is not None and body.get("model") != target:
        notes.append(f"model {body.get('model')!r} -> {target!r}")
        body["model"] = target
    for node in _walk(body):
        if not isinstance(node, dict):
            continue
        for key in ("url", "image_url"):
            value = node.get(key)
            if isinstance(value, str) and value.startswith(("http://", "https://")):
                notes.append(f"{key} {value} -> {image_url}")
                node[key] = image_url
    return request, notes


class ImageServer:
    """A small PNG on 127.0.0.1, standing in for every remote image a corpus line points at."""

    def __init__(self) -> None:
        from PIL import Image, ImageDraw

        image = Image.new("RGB", (96, 64), (90, 140, 200))
        ImageDraw.Draw(image).rectangle((20, 16, 76, 48), fill=(240, 200, 80))
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        body = buffer.getvalue()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/corpus-image.png"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the report ---------------------------------------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> str:
    """Pass counts per protocol and per feature (a line counts under each of its features)."""
    rows = ["| protocol | feature | passed | lines |", "|---|---|---:|---:|"]
    for protocol in PROTOCOLS:
        mine = [o for o in outcomes if o.entry.protocol == protocol]
        if not mine:
            continue
        rows.append(f"| {protocol} | **all** | {sum(o.ok for o in mine)} | {len(mine)} |")
        tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for outcome in mine:
            for feature in outcome.features:
                tally[feature][0] += outcome.ok
                tally[feature][1] += 1
        rows += [f"| {protocol} | {name} | {ok} | {total} |" for name, (ok, total) in sorted(tally.items())]
    return "\n".join(rows)


def failures(outcomes: list[Outcome]) -> str:
    lines = []
    for outcome in outcomes:
        if outcome.ok:
            continue
        entry = outcome.entry
        vendor = f" [the vendor refuses it too: {entry.vendor_refuses}]" if entry.vendor_refuses else ""
        lines.append(f"- {entry.name} ({entry.custom_id}; {', '.join(outcome.features)}): {outcome.error}{vendor}")
    return "\n".join(lines) or "(none)"
