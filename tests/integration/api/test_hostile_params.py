"""Every client-sent number is bounded and every bad value is a 4xx in OpenAI's envelope (issue 14, items 4, 5, 8)."""

from __future__ import annotations

import io
import time
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import Backend, LiveServer, make_key, start_server

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})

LINE = b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "fake-model"}}\n'


@pytest.fixture
def server(backend: Backend):  # type: ignore[no-untyped-def]
    server, stop = start_server(with_worker=False)
    yield server
    stop()


def get(server: LiveServer, path: str, key: str, **params: object) -> httpx.Response:
    return httpx.get(f"{server.base_url}{path}", params=params, headers={"Authorization": f"Bearer {key}"}, timeout=10)


def assert_envelope(response: httpx.Response, status: int = 400) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize(
    "params",
    [
        {"gpus": "100000000000000000000000"},
        {"gpus": "1e23"},
        {"weights_gb": "1e308"},
        {"weights_gb": "inf"},
        {"weights_gb": "nan"},
        {"kv_bytes_per_token": "1e-320"},
        {"kv_bytes_per_token": "-1"},
        {"gpu_hour_usd": "1e999999999"},
        {"gpu_hour_usd": "nan"},
        {"context": str(2**70)},
        {"batch_sizes": "1," + str(10**30)},
    ],
)
def test_planner_refuses_out_of_range_numbers_quickly(server: LiveServer, params: dict[str, str]) -> None:
    key = make_key("acme")
    started = time.monotonic()
    error = assert_envelope(get(server, "/v1/planner", key, **params))
    assert time.monotonic() - started < 5
    assert error["param"] == next(iter(params))


def test_planner_at_its_largest_bounds_answers_in_closed_form(server: LiveServer) -> None:
    key = make_key("acme")
    started = time.monotonic()
    response = get(server, "/v1/planner", key, gpus=4096, weights_gb=0.001, kv_bytes_per_token=1, context=1)
    assert response.status_code == 200, response.text
    assert time.monotonic() - started < 5
    assert response.json()["max_batch_size"] > 10**12


@pytest.mark.parametrize("route", ["/v1/organization/costs", "/v1/organization/usage", "/v1/organization/goodput"])
@pytest.mark.parametrize(
    "params",
    [
        {"start_time": 2**64, "end_time": 2**64 + 86400},
        {"start_time": 2**63 - 10, "end_time": 2**63 + 10},
        {"start_time": -(2**70), "end_time": -(2**70) + 86400},
    ],
)
def test_finance_windows_beyond_64_bits_are_400(server: LiveServer, route: str, params: dict[str, int]) -> None:
    assert_envelope(get(server, route, make_key("acme", admin=True), **params))


def upload(server: LiveServer, key: str, name: str) -> dict[str, object]:
    response = httpx.post(
        f"{server.base_url}/v1/files",
        headers={"Authorization": f"Bearer {key}"},
        data={"purpose": "batch"},
        files={"file": (name, io.BytesIO(LINE))},
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_non_latin1_filename_downloads_with_an_rfc5987_header(server: LiveServer) -> None:
    key = make_key("acme")
    uploaded = upload(server, key, "😀 résumé.jsonl")
    assert uploaded["filename"] == "😀 résumé.jsonl"
    response = get(server, f"/v1/files/{uploaded['id']}/content", key)
    assert response.status_code == 200 and response.content == LINE
    disposition = response.headers["content-disposition"]
    assert f"filename*=UTF-8''{quote('😀 résumé.jsonl')}" in disposition
    disposition.encode("latin-1")


def test_a_path_like_filename_is_kept_verbatim_and_never_used_as_a_path(server: LiveServer, backend: Backend) -> None:
    from storage.db import transaction
    from storage.models import File

    key = make_key("acme")
    name = "../../etc/passwd"
    uploaded = upload(server, key, name)
    assert uploaded["filename"] == name  # the name is the user's label, returned as given
    with transaction() as session:
        row = session.get(File, uploaded["id"])
        assert row is not None and row.blob_key == f"acme/files/{uploaded['id']}.jsonl"  # the key is ours alone
    response = get(server, f"/v1/files/{uploaded['id']}/content", key)
    assert response.status_code == 200 and response.content == LINE
    assert 'filename="../../etc/passwd"' not in response.headers["content-disposition"]
    assert "filename*=UTF-8''..%2F..%2Fetc%2Fpasswd" in response.headers["content-disposition"]


def raw_upload(server: LiveServer, key: str, name: bytes) -> httpx.Response:
    """A multipart upload built by hand: clients escape odd bytes in names, an attacker need not."""
    body = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="'
        + name
        + b'"\r\n\r\n'
        + LINE
        + b"\r\n--b--\r\n"
    )
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "multipart/form-data; boundary=b"}
    return httpx.post(f"{server.base_url}/v1/files", headers=headers, content=body)


def test_an_over_long_or_nul_filename_is_400_and_leaves_no_object(server: LiveServer, backend: Backend) -> None:
    key = make_key("acme")
    for name in (b"x" * 600 + b".jsonl", b"a\x00b.jsonl", b"a\x1bb.jsonl"):
        assert_envelope(raw_upload(server, key, name))
    assert get(server, "/v1/files", key).json()["data"] == []
    from storage.files.blobs import get_blob_store

    store = get_blob_store()
    if hasattr(store, "root"):
        assert not [path for path in store.root.rglob("*") if path.is_file()]


def test_405_keeps_allow_and_401_carries_www_authenticate(server: LiveServer) -> None:
    response = httpx.put(f"{server.base_url}/v1/files")
    assert_envelope(response, 405)
    # Every method the path serves (Starlette alone named only the first matching route's, the upload's POST).
    assert set(response.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST", "OPTIONS"}
    unauthorized = httpx.get(f"{server.base_url}/v1/batches")
    assert_envelope(unauthorized, 401)
    assert unauthorized.headers["www-authenticate"].startswith("Bearer")


def test_openapi_documents_the_statuses_the_server_answers(server: LiveServer) -> None:
    schema = httpx.get(f"{server.base_url}/openapi.json").json()
    envelope = schema["components"]["schemas"]["ErrorResponse"]
    assert set(envelope["properties"]) == {"error"}
    assert set(schema["components"]["schemas"]["AnthropicErrorResponse"]["properties"]) == {"type", "error"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)
            if path != "/health":
                assert "401" in responses and "400" in responses, (method, path)
            wanted = "/AnthropicErrorResponse" if path.startswith("/v1/messages") else "/ErrorResponse"
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith(wanted), (method, path, status)
    assert "404" in schema["paths"]["/v1/files/{file_id}"]["get"]["responses"]
    assert "413" in schema["paths"]["/v1/files"]["post"]["responses"]
    assert "409" in schema["paths"]["/v1/batches/{batch_id}/cancel"]["post"]["responses"]
    assert "403" in schema["paths"]["/v1/organization/costs"]["get"]["responses"]


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/v1/messages/batches", "after_id"),
        ("/v1/messages/batches", "before_id"),
        ("/v1/webhooks", "after"),
        ("/v1/batches", "after"),
        ("/v1/files", "after"),
    ],
)
def test_a_64_kb_paging_cursor_is_a_short_400_that_never_echoes_it(server: LiveServer, path: str, param: str) -> None:
    key = make_key("acme")
    headers = {"Authorization": f"Bearer {key}", "x-api-key": key}
    answer = httpx.get(f"{server.base_url}{path}", params={param: "x" * 60000}, headers=headers)
    assert answer.status_code == 400 and len(answer.content) < 1000, answer.text[:300]
    assert param in answer.text
    # an id-sized cursor that names nothing is echoed clipped at most
    unknown = httpx.get(f"{server.base_url}{path}", params={param: "y" * 120}, headers=headers)
    assert len(unknown.content) < 2000 and "y" * 100 not in unknown.text


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/v1/batches", {"GET", "POST"}),
        ("/v1/files", {"GET", "POST"}),
        ("/v1/files/file-abc", {"GET", "DELETE"}),
        ("/v1/messages/batches/msgbatch_abc", {"GET", "DELETE"}),
    ],
)
def test_options_and_405_list_every_method_the_path_serves(server: LiveServer, path: str, methods: set[str]) -> None:
    options = httpx.options(f"{server.base_url}{path}")
    assert options.status_code == 204, options.text
    assert set(options.headers["allow"].replace(" ", "").split(",")) == methods | {"OPTIONS"}
    refused = httpx.request("PATCH", f"{server.base_url}{path}")
    assert refused.status_code == 405
    assert set(refused.headers["allow"].replace(" ", "").split(",")) == methods | {"OPTIONS"}
