"""How the corpus (tests/e2e/corpus.py) runs on a live server, through each vendor's official SDK.

OpenAI lines run as one batch per (endpoint, model), split further where two lines share a `custom_id` (their
sources are independent files); Anthropic requests as one message batch per model, likewise. Lines fail
individually, so one batch per group measures each line as its own batch would.
"""

from __future__ import annotations

import io
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from tests.e2e.corpus import Entry, Outcome, endpoint


def groups(entries: list[Entry], key: Callable[[Entry], Any]) -> list[list[Entry]]:
    """Entries grouped by `key`, each group split so that no two of its lines share a custom_id."""
    by_key: dict[Any, list[list[Entry]]] = defaultdict(list)
    for entry in entries:
        buckets = by_key[key(entry)]
        bucket = next((b for b in buckets if all(e.custom_id != entry.custom_id for e in b)), None)
        if bucket is None:
            bucket = []
            buckets.append(bucket)
        bucket.append(entry)
    return [bucket for buckets in by_key.values() for bucket in buckets]


def run_openai(client: Any, outcomes: list[Outcome], requests: dict[str, dict[str, Any]], timeout: float) -> None:
    """One batch per group through the official SDK; each line's outcome from the output and error files."""
    from openai.types import Completion, CreateEmbeddingResponse, ModerationCreateResponse
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

    parse = {
        "/v1/chat/completions": ChatCompletion,
        "/v1/responses": Response,
        "/v1/embeddings": CreateEmbeddingResponse,
        "/v1/moderations": ModerationCreateResponse,
        "/v1/completions": Completion,
    }
    by_name = {o.entry.name: o for o in outcomes}
    pending = []
    # One file per source's endpoint (Azure's lines name it `/chat/completions`, and so does its batch create).
    for group in groups(
        [o.entry for o in outcomes], key=lambda e: (e.request["url"], served_model_of(requests[e.name]))
    ):
        data = b"".join(json.dumps(requests[e.name]).encode() + b"\n" for e in group)
        uploaded = client.files.create(file=("corpus.jsonl", io.BytesIO(data)), purpose="batch")
        url = endpoint(group[0])
        try:
            batch = client.batches.create(
                input_file_id=uploaded.id, endpoint=group[0].request["url"], completion_window="24h"
            )
        except Exception as error:  # refused whole at create: every line of the group failed with that reason
            for e in group:
                by_name[e.name].error = f"refused at create: {_sdk_error(error)}"
            continue
        pending.append((batch.id, url, group))
    for batch_id, url, group in pending:
        batch = _wait(lambda b_id=batch_id: client.batches.retrieve(b_id), lambda b: b.status in _OPENAI_DONE, timeout)
        if batch.status != "completed":
            found = (batch.errors.data if batch.errors else None) or []
            errors = "; ".join(f"line {x.line}: {x.code}: {x.message}" for x in found)
            for e in group:
                by_name[e.name].error = f"batch {batch.status}: {errors}"[:300]
            continue
        results = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                for text in client.files.content(file_id).text.splitlines():
                    line = json.loads(text)
                    results[line["custom_id"]] = line
        for e in group:
            outcome = by_name[e.name]
            line = results.get(e.custom_id)
            if line is None:
                outcome.error = "no result line"
                continue
            response = line.get("response") or {}
            if response.get("status_code") == 200:
                try:
                    parse[url].model_validate(response["body"])
                    outcome.ok = True
                except Exception as error:  # the SDK's own type refuses the answer
                    outcome.error = f"answer does not parse as {parse[url].__name__}: {str(error)[:200]}"
            else:
                problem = (response.get("body") or {}).get("error") or line.get("error") or {}
                outcome.error = f"{problem.get('code')}: {problem.get('message')}"[:300]


def run_anthropic(client: Any, outcomes: list[Outcome], requests: dict[str, dict[str, Any]], timeout: float) -> None:
    """One message batch per group through the official SDK; each request's outcome from the results."""
    from anthropic.types import Message

    by_name = {o.entry.name: o for o in outcomes}
    pending = []
    for group in groups([o.entry for o in outcomes], key=lambda e: requests[e.name]["params"].get("model")):
        try:
            batch = client.messages.batches.create(requests=[requests[e.name] for e in group])
        except Exception as error:
            for e in group:
                by_name[e.name].error = f"refused at create: {_sdk_error(error)}"
            continue
        pending.append((batch.id, group))
    for batch_id, group in pending:
        _wait(
            lambda b_id=batch_id: client.messages.batches.retrieve(b_id),
            lambda b: b.processing_status == "ended",
            timeout,
        )
        results = {result.custom_id: result.result for result in client.messages.batches.results(batch_id)}
        for e in group:
            outcome = by_name[e.name]
            result = results.get(e.custom_id)
            if result is None:
                outcome.error = "no result"
            elif result.type == "succeeded":
                Message.model_validate(result.message.model_dump())
                outcome.ok = True
            elif result.type == "errored":
                problem = result.error.error
                outcome.error = f"{problem.type}: {problem.message}"[:300]
            else:
                outcome.error = result.type


_OPENAI_DONE = {"completed", "failed", "expired", "cancelled"}


def served_model_of(request: dict[str, Any]) -> Any:
    return (request.get("body") or request.get("params") or {}).get("model")


def _wait(fetch: Callable[..., Any], done: Callable[[Any], bool], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        current = fetch()
        if done(current) or time.monotonic() > deadline:
            return current
        time.sleep(0.25)


def _sdk_error(error: Exception) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        problem = body.get("error", body)
        if isinstance(problem, dict):
            return f"{problem.get('code') or problem.get('type')}: {problem.get('message')}"[:300]
    return str(error)[:300]
