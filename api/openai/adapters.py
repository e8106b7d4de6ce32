"""`/v1/adapters`: admin keys register, list and delete LoRA adapters of the served models (docs/adapters.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.deps import Blobs, Caller, Config, DbSession
from api.errors import error_responses
from storage.adapters.registry import (
    adapter_folder_from_files,
    delete_adapter,
    get_adapter,
    register_adapter,
    visible_adapters,
)
from storage.errors import PermissionDenied
from storage.tenants import Principal, find_tenant

router = APIRouter(prefix="/v1/adapters", tags=["adapters"], responses=error_responses(400, 403, 404))


class AdapterFiles(BaseModel):
    """The adapter's two files, uploaded with purpose `adapter`."""

    model_config = ConfigDict(extra="forbid")

    config: str = Field(max_length=64, description="The file id of adapter_config.json.")
    weights: str = Field(max_length=64, description="The file id of adapter_model.safetensors.")


class AdapterCreate(BaseModel):
    """A name (one namespace with the models), the base model, and the weights: uploaded files or a server folder."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200)
    base_model: str = Field(max_length=200)
    files: AdapterFiles | None = None
    path: str | None = Field(default=None, max_length=4096, description="A PEFT folder on the server.")
    tenant: str | None = Field(default=None, max_length=256, description="Only this tenant may use it (name or id).")

    @model_validator(mode="after")
    def _one_source(self) -> AdapterCreate:
        if (self.files is None) == (self.path is None):
            raise ValueError("give exactly one of 'files' and 'path'")
        return self


def _admin(caller: Principal) -> None:
    if not caller.is_admin:
        raise PermissionDenied("Only admin keys may manage adapters.")


@router.post("", response_model=dict[str, Any], responses=error_responses(429))
def create(body: AdapterCreate, session: DbSession, caller: Caller, blobs: Blobs, settings: Config) -> dict[str, Any]:
    """Register a PEFT LoRA adapter of a served model; its weights are checked now (format, rank, shapes, size)."""
    _admin(caller)
    tenant_id = find_tenant(session, tenant=body.tenant) if body.tenant is not None else None
    if body.files is not None:
        folder = adapter_folder_from_files(
            session, blobs, settings, tenant_id=caller.tenant_id, config_file=body.files.config,
            weights_file=body.files.weights,
        )  # fmt: skip
    else:
        folder = Path(str(body.path))
    ref = register_adapter(
        session, settings, name=body.name, base_model=body.base_model, tenant_id=tenant_id, folder=folder
    )
    return ref.to_json()


@router.get("", response_model=dict[str, Any])
def list_all(session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Every adapter (admin keys)."""
    _admin(caller)
    adapters = visible_adapters(session, settings, tenant_id=None).values()
    return {"object": "list", "data": [ref.to_json() for ref in adapters]}


@router.get("/{adapter_id}", response_model=dict[str, Any])
def retrieve(adapter_id: str, session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """One adapter, by id or name (admin keys)."""
    _admin(caller)
    return get_adapter(session, settings, name_or_id=adapter_id, tenant_id=None).to_json()


@router.delete("/{adapter_id}", response_model=dict[str, Any])
def delete(adapter_id: str, session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Delete a registered adapter; lines still queued that name it fail with `adapter_not_found`."""
    _admin(caller)
    ref = delete_adapter(session, settings, name_or_id=adapter_id)
    return {"id": ref.id, "object": "adapter.deleted", "deleted": True}
