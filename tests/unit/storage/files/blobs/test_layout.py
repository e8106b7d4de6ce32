"""The one key rule: every object under {prefix}/{tenant}/, tenant folders that cannot escape or collide."""

from __future__ import annotations

import pytest

from storage.files.blobs.layout import batch_object_key, batches_prefix, input_file_key, tenant_segment
from storage.settings import Settings, get_settings


@pytest.fixture
def prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKFILL_OBJECT_PREFIX", "backfill/prod")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_keys_without_a_prefix_start_with_the_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BACKFILL_OBJECT_PREFIX", raising=False)
    get_settings.cache_clear()
    assert input_file_key(tenant="acme", file_id="file-1") == "acme/files/file-1.jsonl"
    assert (
        batch_object_key(tenant="acme", batch_id="batch_1", name="manifest.json")
        == "acme/batches/batch_1/manifest.json"
    )
    get_settings.cache_clear()


def test_keys_with_a_prefix(prefix: None) -> None:
    assert input_file_key(tenant="acme", file_id="file-1") == "backfill/prod/acme/files/file-1.jsonl"
    assert (
        batch_object_key(tenant="acme", batch_id="b", name="output.jsonl")
        == "backfill/prod/acme/batches/b/output.jsonl"
    )
    assert batch_object_key(tenant="acme", batch_id="b", name="errors.jsonl").endswith("/b/errors.jsonl")
    assert batches_prefix(tenant="acme") == "backfill/prod/acme/batches/"


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("acme", "acme"),
        ("team-ml_2.eu", "team-ml_2.eu"),
        ("Acme Corp", "tenant_x"),  # a space
        ("../other", "tenant_x"),  # would escape its folder
        ("a/b", "tenant_x"),
        ("tenant_y", "tenant_x"),  # shaped like another tenant's id
        (".hidden", "tenant_x"),
        ("x" * 65, "tenant_x"),
        ("acme\n", "tenant_x"),  # `$` alone would let a trailing newline into the key
        (None, "tenant_x"),
    ],
)
def test_a_tenant_keeps_its_name_as_folder_only_when_it_is_a_plain_segment(name: str | None, folder: str) -> None:
    assert tenant_segment(tenant_id="tenant_x", tenant_name=name) == folder


@pytest.mark.parametrize("bad", ["/backfill", "backfill/", "a//b", "../x", "a b", "backfill\n"])
def test_an_object_prefix_that_is_not_plain_path_segments_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="object_prefix"):
        Settings(object_prefix=bad)


def test_presign_expiry_settings_stay_within_seven_days() -> None:
    with pytest.raises(ValueError):
        Settings(presign_max_seconds=7 * 86400 + 1)
    with pytest.raises(ValueError, match="PRESIGN_DEFAULT"):
        Settings(presign_default_seconds=7200, presign_max_seconds=3600)
