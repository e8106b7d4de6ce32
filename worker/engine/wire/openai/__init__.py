"""OpenAI's wire format: one module per endpoint (chat, completions, embeddings, responses, moderations), each its
body's shape and its answer, and the one parser of a line's body for its URL."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from storage.endpoints import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, MODERATIONS_URL, RESPONSES_URL
from worker.engine.wire.base import TYPE_TAGS, BodyError, Parsed, Reply
from worker.engine.wire.openai.chat import ChatBody, ChatMessage, chat_reply
from worker.engine.wire.openai.completions import CompletionBody, completion_reply
from worker.engine.wire.openai.embeddings import EmbeddingBody, embedding_reply
from worker.engine.wire.openai.moderations import ModerationBody, moderation_reply
from worker.engine.wire.openai.responses import ResponsesBody, responses_reply

__all__ = [
    "Body",
    "ChatBody",
    "ChatMessage",
    "CompletionBody",
    "EmbeddingBody",
    "ModerationBody",
    "ResponsesBody",
    "parse_openai",
    "parse_openai_body",
]

# Fields accepted only at their "off" value, so a body that spells out a default still runs.
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "stream": (None, False),
    "stream_options": (None,),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "store": (None, False),
}


Body = ChatBody | CompletionBody | EmbeddingBody | ResponsesBody | ModerationBody
_BODY_TYPES: dict[str, tuple[type[Body], Any]] = {
    CHAT_URL: (ChatBody, chat_reply),
    COMPLETIONS_URL: (CompletionBody, completion_reply),
    EMBEDDINGS_URL: (EmbeddingBody, embedding_reply),
    RESPONSES_URL: (ResponsesBody, responses_reply),
    MODERATIONS_URL: (ModerationBody, moderation_reply),
}


def parse_openai(url: str, body: Any) -> Parsed:
    """An OpenAI line's body for `url` as what an engine runs and how it is answered; BodyError (an OpenAI-style
    message naming the field) if it cannot run."""
    parsed = parse_openai_body(url, body)
    reply: Reply = _BODY_TYPES[url][1](parsed)
    return Parsed(parsed.generation(), reply)


def parse_openai_body(url: str, body: Any) -> Body:
    """Validate an OpenAI request body for `url`; raise BodyError with an OpenAI-style message."""
    found = _BODY_TYPES.get(url)
    if found is None:
        raise BodyError(f"unsupported url {url!r}", code="unsupported_endpoint", param="url")
    if not isinstance(body, dict):
        raise BodyError("the body must be a JSON object", code="invalid_type", param="body")
    fields = dict(body)
    for name, allowed in _OFF_VALUES.items():
        if name in fields:
            value = fields.pop(name)
            if not any(value == ok and type(value) is type(ok) for ok in allowed):
                raise BodyError(
                    f"{name}={value!r} is not supported in batch requests", code="unsupported_parameter", param=name
                )
    try:
        return found[0].model_validate(fields)
    except ValidationError as error:
        raise _describe(error) from None


def _describe(error: ValidationError) -> BodyError:
    errors = error.errors(include_url=False)
    # A union (`input: str | list[...]`) reports its string branch first; a list's own problem says more.
    first = next((e for e in errors if not (e["loc"] and e["loc"][-1] == "str")), errors[0])
    # Union members add their type name to `loc` ("prompt.str"); the user wants the field path.
    where = ".".join(str(part) for part in first["loc"] if str(part) not in TYPE_TAGS and "[" not in str(part))
    param = str(first["loc"][0]) if first["loc"] else None
    if first["type"] == "extra_forbidden":
        return BodyError(f"unsupported parameter {where!r}", code="unsupported_parameter", param=param)
    if first["type"] == "missing":
        return BodyError(f"missing required parameter {where!r}", code="missing_required_parameter", param=param)
    message = str(first["msg"]).removeprefix("Value error, ")
    return BodyError(f"invalid value for {where!r}: {message}", code="invalid_value", param=param)
