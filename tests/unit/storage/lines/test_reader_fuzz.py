"""Property tests of the one line checker (issue 14): whatever bytes a line holds, the checker answers with
data, never an exception; what it accepts is a valid `BatchRequestLine` the queue can store; what
`BatchRequestLine` rejects, it rejects. Bounded example counts keep this to a few seconds in CI."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy.orm import Session

from storage.db import make_engine
from storage.lines.openai import BatchRequestLine
from storage.lines.reader import LineChecker, LineError, ParsedLine, iter_lines
from storage.models import Base, Batch, BatchRequest, Tenant
from storage.queue.enqueue import insert_rows, new_row

CHAT = "/v1/chat/completions"
EXAMPLES = int(os.environ.get("BACKFILL_FUZZ_EXAMPLES", "200"))  # `make fuzz` runs more
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


bodies = st.one_of(
    values,
    st.fixed_dictionaries(
        {"model": st.one_of(st.just("m"), st.text(max_size=5), st.integers())},
        optional={
            "messages": values,
            "max_tokens": st.integers(min_value=-(2**66), max_value=2**66),
            "x": st.integers(min_value=0, max_value=400).map(nested),
        },
    ),
)
lines = st.fixed_dictionaries(
    {},
    optional={
        "custom_id": st.one_of(st.text(max_size=600), st.integers(), st.none()),
        "method": st.sampled_from(["POST", "GET", "post", ""]),
        "url": st.sampled_from([CHAT, "/v1/embeddings", "x" * 300]),
        "body": bodies,
        "extra": values,
    },
)

# Lines that get past the field checks, so their contents (any text, integers, depth) reach the queue.
plausible = st.fixed_dictionaries(
    {
        "custom_id": st.text(min_size=1, max_size=40),
        "method": st.just("POST"),
        "url": st.just(CHAT),
        "body": st.fixed_dictionaries(
            {"model": st.just("m"), "messages": values},
            optional={
                "max_tokens": st.integers(min_value=-(2**65), max_value=2**65),
                "x": st.integers(min_value=0, max_value=300).map(nested),
                "text": st.text(max_size=50),
            },
        ),
    }
)


def encode(item: Any) -> bytes:
    """JSON text of `item` (json, not orjson: it writes any integer and any depth, as an attacker would)."""
    return json.dumps(item).encode()


def checker() -> LineChecker:
    return LineChecker(endpoint=CHAT, max_requests=5, model="m")


_QUEUE = make_engine("sqlite://")  # an in-memory queue table, written as ingest writes it
Base.metadata.create_all(_QUEUE)
_BATCH = SimpleNamespace(id="batch_fuzz", tenant_id="tenant_fuzz", expires_at=2**40)
with Session(_QUEUE) as _setup:
    _setup.add(Tenant(id=_BATCH.tenant_id, name="fuzz", created_at=0))
    _setup.flush()
    _setup.add(
        Batch(
            id=_BATCH.id,
            tenant_id=_BATCH.tenant_id,
            input_file_id="file-fuzz",
            endpoint=CHAT,
            completion_window="24h",
            model="m",
            status="in_progress",
            created_at=0,
            expires_at=_BATCH.expires_at,
            request_total=0,
            request_completed=0,
            request_failed=0,
        )
    )
    _setup.commit()


def assert_storable(parsed: ParsedLine) -> None:
    line = BatchRequestLine.model_validate(
        {"custom_id": parsed.custom_id, "method": "POST", "url": parsed.url, "body": parsed.body}
    )
    assert orjson.loads(orjson.dumps(line.body)) == parsed.body  # what the queue's JSON column does
    row = new_row(_BATCH, parsed, line_bytes=100)  # type: ignore[arg-type]
    assert all(-(2**31) <= row[name] < 2**31 for name in ("line", "est_input_tokens", "max_output_tokens"))
    with Session(_QUEUE) as session:
        insert_rows(session, [row])
        stored = session.get(BatchRequest, row["id"])
        assert stored is not None and stored.body == parsed.body and stored.custom_id == parsed.custom_id
        session.rollback()


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes_give_data_not_an_exception(raw: bytes) -> None:
    outcome = checker().check(1, raw, max_line_bytes=200)
    assert outcome is None or isinstance(outcome, LineError | ParsedLine)
    if isinstance(outcome, LineError):
        assert len(outcome.message) < 600


@FUZZ
@given(st.one_of(plausible, lines))
def test_every_accepted_line_validates_and_round_trips_to_the_queue(item: dict[str, Any]) -> None:
    outcome = checker().check(1, encode(item), max_line_bytes=1 << 20)
    assert isinstance(outcome, LineError | ParsedLine)
    if isinstance(outcome, ParsedLine):
        assert_storable(outcome)


@FUZZ
@given(lines)
def test_what_the_declared_model_rejects_the_checker_rejects(item: dict[str, Any]) -> None:
    try:
        BatchRequestLine.model_validate(item)
    except ValidationError:
        assert isinstance(checker().check(1, encode(item), max_line_bytes=1 << 20), LineError)


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=8), st.integers(min_value=1, max_value=64))
def test_the_reader_splits_any_stream_into_bounded_lines(chunks: list[bytes], limit: int) -> None:
    for _, raw in iter_lines(chunks, max_line_bytes=limit):
        assert raw is None or len(raw) <= limit
