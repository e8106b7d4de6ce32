"""`backfill submit` reads endpoints from the server's own list: a flag or a file's first url the server serves
is never refused or guessed as chat completions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.submit import endpoint_of
from storage.protocols import OPENAI
from worker.cli.main import build_parser

ENDPOINTS = OPENAI.endpoints


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_endpoint_the_server_serves_is_detected_from_the_first_line(tmp_path: Path, endpoint: str) -> None:
    source = tmp_path / "job.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": endpoint, "body": {"model": "m"}}
    source.write_text(json.dumps(line) + "\n")
    assert endpoint_of(source, None) == endpoint


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_endpoint_the_server_serves_is_accepted_as_a_flag(tmp_path: Path, endpoint: str) -> None:
    args = build_parser().parse_args(["submit", str(tmp_path / "job.jsonl"), "--endpoint", endpoint])
    assert args.endpoint == endpoint


def test_a_responses_file_is_submitted_to_responses(tmp_path: Path) -> None:
    """Issue 19 bug 1: a /v1/responses file was guessed as chat completions and every line failed."""
    source = tmp_path / "responses.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/responses", "body": {"model": "m", "input": "hi"}}
    source.write_text(json.dumps(line) + "\n")
    assert endpoint_of(source, None) == "/v1/responses"


def test_a_moderations_file_is_submitted_to_moderations_past_leading_blank_lines(tmp_path: Path) -> None:
    source = tmp_path / "moderations.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/moderations", "body": {"input": "hello"}}
    source.write_text("\n  \n" + json.dumps(line) + "\n")
    assert endpoint_of(source, None) == "/v1/moderations"


def test_a_file_for_an_endpoint_the_server_does_not_serve_is_refused_before_upload(tmp_path: Path) -> None:
    from client.remote import UsageError

    source = tmp_path / "images.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/images/generations", "body": {"prompt": "a cat"}}
    source.write_text(json.dumps(line) + "\n")
    with pytest.raises(UsageError, match="'/v1/images/generations', is not an endpoint here"):
        endpoint_of(source, None)
