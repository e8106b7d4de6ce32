"""The adapter registry: which LoRA adapters exist, of which base model, and who may name them (docs/adapters.md).

Two sources: the model registry's `adapters` (settings; every tenant may use them) and the `adapters` table
(`POST /v1/adapters`; an adapter may be scoped to one tenant). Names are one namespace with the served models: a
line's `body.model` is a model or an adapter, and an adapter of another tenant answers as an unknown model does.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from storage.adapters.weights import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterFacts,
    InvalidAdapter,
    check_adapter,
    lora_config,
)
from storage.clock import now
from storage.errors import InvalidRequest, NotFound, QuotaExceeded
from storage.files.blobs import BlobStore
from storage.files.files import get_file
from storage.ids import new_id
from storage.models import Adapter
from storage.settings import Settings

ADAPTER_PURPOSE = "adapter"  # the Files API purpose of an adapter's two files
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")
REGISTERED_FOLDER = "adapters/registered"  # under data_dir: the folders of adapters registered from files


class AdapterNotFound(NotFound):
    code = "adapter_not_found"


@dataclass(frozen=True)
class AdapterRef:
    """One adapter as lines, claims and engines need it."""

    name: str
    base_model: str
    path: str
    tenant_id: str | None = None  # None: every tenant's
    id: str | None = None  # None: from the model registry (settings)
    rank: int | None = None
    created_at: int = 0

    def to_json(self) -> dict[str, object]:
        """The adapter object of `/v1/adapters`."""
        return {
            "id": self.id or self.name,
            "object": "adapter",
            "name": self.name,
            "base_model": self.base_model,
            "tenant_id": self.tenant_id,
            "rank": self.rank,
            "created_at": self.created_at,
            "source": "registered" if self.id else "registry",
        }


def _configured(settings: Settings) -> dict[str, AdapterRef]:
    return {
        name: AdapterRef(name, model, path)
        for model, spec in settings.served_models().items()
        for name, path in spec.adapters.items()
    }


def _ref(row: Adapter) -> AdapterRef:
    return AdapterRef(row.name, row.base_model, row.path, row.tenant_id, row.id, row.rank, row.created_at)


def visible_adapters(session: Session, settings: Settings, *, tenant_id: str | None) -> dict[str, AdapterRef]:
    """Adapters a tenant's lines may name (None: an admin's view, every adapter), name -> adapter."""
    query = select(Adapter)
    if tenant_id is not None:
        query = query.where(or_(Adapter.tenant_id.is_(None), Adapter.tenant_id == tenant_id))
    rows = session.scalars(query.order_by(Adapter.name)).all()
    return {**_configured(settings), **{row.name: _ref(row) for row in rows}}


def adapter_bases(session: Session, settings: Settings, *, tenant_id: str) -> dict[str, str]:
    """name -> base model of the adapters a tenant's lines may name (what the line checker resolves)."""
    return {name: ref.base_model for name, ref in visible_adapters(session, settings, tenant_id=tenant_id).items()}


def adapter_paths(session: Session, settings: Settings, *, names: Collection[str]) -> dict[str, str]:
    """name -> folder of these adapters (a claim's); a name no longer registered is absent."""
    wanted = set(names)
    if not wanted:
        return {}
    found = {name: ref.path for name, ref in _configured(settings).items() if name in wanted}
    rows = session.execute(select(Adapter.name, Adapter.path).where(Adapter.name.in_(sorted(wanted)))).all()
    return {**found, **{name: path for name, path in rows}}


def adapter_ranks(
    session: Session, settings: Settings, *, names: Collection[str]
) -> dict[str, tuple[int, list[str] | str]]:
    """name -> (rank, target_modules) of these adapters (what the planner's LoRA overhead needs): registered ones as
    registration recorded them, the model registry's from their adapter_config.json; an unknown one is absent."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    found: dict[str, tuple[int, list[str] | str]] = {}
    for name, ref in _configured(settings).items():
        config = lora_config(Path(ref.path)) if name in wanted else None
        if config is not None:
            found[name] = config
    rows = session.execute(
        select(Adapter.name, Adapter.rank, Adapter.target_modules).where(Adapter.name.in_(wanted))
    ).all()
    return {**found, **{name: (rank, targets) for name, rank, targets in rows}}


def get_adapter(session: Session, settings: Settings, *, name_or_id: str, tenant_id: str | None) -> AdapterRef:
    """One adapter by name or id, as `tenant_id` sees it (None: an admin); AdapterNotFound otherwise."""
    refs = visible_adapters(session, settings, tenant_id=tenant_id)
    found = refs.get(name_or_id) or next((ref for ref in refs.values() if ref.id == name_or_id), None)
    if found is None:
        raise AdapterNotFound(f"No adapter '{name_or_id[:200]}'.", param="adapter_id")
    return found


def register_adapter(
    session: Session,
    settings: Settings,
    *,
    name: str,
    base_model: str,
    tenant_id: str | None,
    folder: Path,
) -> AdapterRef:
    """Check the PEFT adapter in `folder` against `base_model` and record it under `name`."""
    spec = settings.served_models().get(base_model)
    if spec is None:
        raise InvalidRequest(f"The model '{base_model[:200]}' is not served here.", param="base_model")
    if not spec.takes_adapters:
        raise InvalidRequest(
            f"The model '{base_model}' takes no adapters (its registry entry sets neither enable_lora nor adapters).",
            param="base_model",
        )
    _check_name(session, settings, name)
    if tenant_id is not None:
        count = session.scalar(select(func.count()).select_from(Adapter).where(Adapter.tenant_id == tenant_id)) or 0
        if count >= settings.adapters_per_tenant_max:
            raise QuotaExceeded(
                f"The tenant already has {count} adapters (BACKFILL_ADAPTERS_PER_TENANT_MAX); delete one first."
            )
    facts: AdapterFacts = check_adapter(
        folder, base_path=spec.path, max_rank=spec.max_lora_rank, max_bytes=settings.adapter_max_bytes
    )
    row = Adapter(
        id=new_id("adapter_"),
        name=name,
        base_model=base_model,
        tenant_id=tenant_id,
        path=str(folder.resolve()),
        rank=facts.rank,
        size_bytes=facts.size_bytes,
        target_modules=facts.target_modules,
        created_at=now(),
    )
    session.add(row)
    session.flush()
    return _ref(row)


def _check_name(session: Session, settings: Settings, name: str) -> None:
    if not NAME.match(name):
        raise InvalidRequest(
            "An adapter's name is 1-200 characters: letters, digits and . _ : / - (starting with a letter or digit).",
            param="name",
        )
    taken = name in settings.served_models() or name in _configured(settings)
    if taken or session.scalar(select(Adapter.id).where(Adapter.name == name)) is not None:
        raise InvalidRequest(f"The name '{name}' is already a model or an adapter.", param="name", code="name_taken")


def adapter_folder_from_files(
    session: Session, blobs: BlobStore, settings: Settings, *, tenant_id: str, config_file: str, weights_file: str
) -> Path:
    """A new local folder holding the adapter's two uploaded files (purpose `adapter`), copied from object storage
    in bounded chunks; InvalidAdapter when a file is not an adapter file or they are too large together."""
    files = [get_file(session, tenant_id=tenant_id, file_id=file_id) for file_id in (config_file, weights_file)]
    for file in files:
        if file.purpose != ADAPTER_PURPOSE:
            raise InvalidAdapter(f"File {file.id} has purpose '{file.purpose}', not '{ADAPTER_PURPOSE}'.")
    if sum(file.bytes for file in files) > settings.adapter_max_bytes:
        raise InvalidAdapter(f"The adapter's files are larger than {settings.adapter_max_bytes} bytes together.")
    folder = (settings.data_dir / REGISTERED_FOLDER / new_id("files_")).resolve()
    folder.mkdir(parents=True)
    try:
        for file, target in zip(files, (CONFIG_FILE, WEIGHTS_FILE), strict=True):
            _copy(blobs.open_stream(file.blob_key, chunk_bytes=settings.stream_chunk_bytes), folder / target)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _copy(chunks: Iterable[bytes], target: Path) -> None:
    with target.open("wb") as out:
        for chunk in chunks:
            out.write(chunk)


def delete_adapter(session: Session, settings: Settings, *, name_or_id: str) -> AdapterRef:
    """Remove a registered adapter (and the folder registration made for it); lines still queued that name it
    fail with `adapter_not_found`. Adapters of the model registry are settings: not deletable here."""
    ref = get_adapter(session, settings, name_or_id=name_or_id, tenant_id=None)
    if ref.id is None:
        raise InvalidRequest(f"The adapter '{ref.name}' comes from the model registry (settings).", param="adapter_id")
    row = session.get(Adapter, ref.id)
    assert row is not None
    session.delete(row)
    session.flush()
    registered = (settings.data_dir / REGISTERED_FOLDER).resolve()
    if Path(ref.path).parent == registered:
        shutil.rmtree(ref.path, ignore_errors=True)
    return ref
