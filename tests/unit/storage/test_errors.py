"""Which failures mean "a backing service is down, retry" (503) and which are bugs (500)."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from storage.errors import is_unavailable


def test_an_unreachable_s3_endpoint_is_unavailable_not_a_bug() -> None:
    client = boto3.client(
        "s3",
        endpoint_url="http://127.0.0.1:9",  # discard port: nothing listens
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    with pytest.raises(Exception) as raised:
        client.head_bucket(Bucket="b")
    assert is_unavailable(raised.value)


def test_s3_5xx_answers_are_unavailable_and_4xx_are_not() -> None:
    slow = ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
    denied = ClientError({"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")
    assert is_unavailable(slow) and not is_unavailable(denied)


def test_a_plain_bug_is_not_unavailable() -> None:
    assert not is_unavailable(KeyError("x")) and not is_unavailable(ValueError("bad"))
