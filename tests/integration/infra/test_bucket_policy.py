"""infra/s3/bucket-policy.json on moto with IAM enforced: the services write, finance only reads results.

moto checks identity policies, not bucket policies, so each principal's statements of the example policy
become that principal's user policy (Principal removed); the deny-plain-HTTP statement is left out (the test
server speaks HTTP). Two moto (5.2) gaps are bridged: it evaluates a statement's Condition but passes it no
`s3:prefix`, so it would deny every conditioned list (the prefix condition is checked here with AWS's StringLike
rules instead), and it asks for the action `s3:ListObjectsV2` where AWS asks for `s3:ListBucket`. Then Backfill runs a real batch with the services' keys, and a finance user who has
only its keys and the bucket (no API key) finds the batch's results from its manifest.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError

from storage.lines.openai import BatchResultLine
from tests.conftest import Backend, configure, make_key, start_server
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

POLICY = Path(__file__).resolve().parents[3] / "infra" / "s3" / "bucket-policy.json"
EXAMPLE_BUCKET = "backfill-results"
ROLES = {"services": "role/backfill-services", "finance": "role/backfill-finance-readonly"}

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_OBJECT_PREFIX": "backfill"})


def string_like(pattern: str, value: str) -> bool:
    """AWS's StringLike: `*` matches any run of characters (`/` included), `?` one character."""
    return (
        re.fullmatch("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), value)
        is not None
    )


def finance_may_list(prefix: str) -> bool:
    """Whether the example policy lets finance list the bucket under `prefix` (its s3:prefix condition)."""
    for statement in json.loads(POLICY.read_text())["Statement"]:
        principal = statement["Principal"]
        for_finance = isinstance(principal, dict) and principal["AWS"].endswith(ROLES["finance"])
        if for_finance and "s3:ListBucket" in statement["Action"]:
            patterns = statement["Condition"]["StringLike"]["s3:prefix"]
            return any(string_like(pattern, prefix) for pattern in patterns)
    return False


def test_finance_may_list_under_the_prefix_only() -> None:
    """docs/operations.md: finance may list the prefix (key names), and get only results (see below)."""
    assert finance_may_list("backfill/acme/batches/") and finance_may_list("backfill/acme/batches/batch_1/")
    assert finance_may_list("backfill/") and finance_may_list("backfill/acme/")  # walking down to the batches
    assert not finance_may_list("") and not finance_may_list("other/") and not finance_may_list("backfill")


def user_policy(role: str, bucket: str) -> dict[str, object]:
    """The example policy's statements for one principal, as an identity policy on `bucket`."""
    text = POLICY.read_text().replace(f"arn:aws:s3:::{EXAMPLE_BUCKET}", f"arn:aws:s3:::{bucket}")
    statements = []
    for statement in json.loads(text)["Statement"]:
        principal = statement["Principal"]
        if isinstance(principal, dict) and principal["AWS"].endswith(role):
            statement = {key: value for key, value in statement.items() if key not in ("Principal", "Condition")}
            if statement["Action"] == "s3:ListBucket":  # moto 5.2 asks for "s3:ListObjectsV2" on a v2 list
                statement["Action"] = ["s3:ListBucket", "s3:ListObjectsV2"]
            statements.append(statement)
    assert statements, role
    return {"Version": "2012-10-17", "Statement": statements}


@pytest.fixture
def iam_users(backend: Backend, moto_endpoint: str) -> Iterator[dict[str, dict[str, str]]]:
    """Two IAM users on moto (services, finance) with the example policy's statements; IAM enforced meanwhile."""
    if backend.name != "postgres":
        pytest.skip("bucket policies are an S3 matter")
    iam = boto3.client("iam", endpoint_url=moto_endpoint, region_name="us-east-1")
    keys = {}
    for name, role in ROLES.items():
        user = f"bucket-policy-{name}"
        try:
            iam.create_user(UserName=user)
        except ClientError:
            pass
        policy = user_policy(role, backend.env["BACKFILL_S3_BUCKET"])
        iam.put_user_policy(UserName=user, PolicyName="backfill", PolicyDocument=json.dumps(policy))
        created = iam.create_access_key(UserName=user)["AccessKey"]
        keys[name] = {"aws_access_key_id": created["AccessKeyId"], "aws_secret_access_key": created["SecretAccessKey"]}
    previous = httpx.post(f"{moto_endpoint}/moto-api/reset-auth", content=b"0").json()
    try:
        yield keys
    finally:
        restore = str(previous["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]).encode()
        httpx.post(f"{moto_endpoint}/moto-api/reset-auth", content=restore)


def test_finance_with_read_access_only_finds_a_batchs_results_from_its_manifest(
    backend: Backend, moto_endpoint: str, iam_users: dict[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = iam_users["services"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", services["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", services["aws_secret_access_key"])
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # botocore caches the credentials it resolved
    configure(monkeypatch, backend.env)  # the services' blob store is built again, with their keys
    server, stop = start_server(with_worker=True)
    try:
        client = server.client(make_key("acme"))
        source = upload(client, to_jsonl([chat_line(i) for i in range(4)] + [chat_line(7, temperature="hot")]))
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
        done = wait_for(client, batch.id)
    finally:
        stop()
    assert done.status == "completed"

    bucket = backend.env["BACKFILL_S3_BUCKET"]
    finance = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", **iam_users["finance"])
    # What finance is told: the batch id and the layout in docs/operations.md.
    manifest = json.loads(
        finance.get_object(Bucket=bucket, Key=f"backfill/acme/batches/{done.id}/manifest.json")["Body"].read()
    )
    assert manifest["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    assert manifest["cost"]["billed_usd"] == done.model_extra["cost"]["billed_usd"]
    for kind in ("output", "errors"):
        entry = manifest[kind]
        data = finance.get_object(Bucket=bucket, Key=entry["key"])["Body"].read()
        assert len(data) == entry["bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
        lines = [BatchResultLine.model_validate_json(line) for line in data.splitlines()]
        assert len(lines) == entry["lines"]
    assert finance_may_list("backfill/acme/batches/")
    listed = finance.list_objects_v2(Bucket=bucket, Prefix="backfill/acme/batches/")
    assert {item["Key"] for item in listed["Contents"]} >= {manifest["output"]["key"], manifest["errors"]["key"]}

    def refused(call, **kwargs) -> str:  # type: ignore[no-untyped-def]
        with pytest.raises(ClientError) as caught:
            call(Bucket=bucket, **kwargs)
        return str(caught.value.response["Error"]["Code"])

    assert refused(finance.get_object, Key=manifest["input_file"]["key"]) == "AccessDenied"  # prompts stay private
    assert refused(finance.put_object, Key=manifest["output"]["key"], Body=b"forged") == "AccessDenied"
    assert refused(finance.delete_object, Key=manifest["output"]["key"]) == "AccessDenied"
    stranger = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="x",
    )
    assert refused(stranger.get_object, Key=manifest["output"]["key"]) == "InvalidAccessKeyId"
