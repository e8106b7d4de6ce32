"""Models: what this deployment serves, in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Caller, Config, DbSession
from api.openai.schemas import ModelList, ModelObject
from storage.adapters.registry import visible_adapters

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("", response_model=ModelList)
def list_models(session: DbSession, caller: Caller, settings: Config) -> ModelList:
    """The models batches may name in `body.model`: the served models, then the LoRA adapters this key may use,
    each with its base model as `parent` (docs/adapters.md)."""
    adapters = visible_adapters(session, settings, tenant_id=caller.tenant_id).values()
    models = [ModelObject(id=name, created=0) for name in settings.served_models()]
    return ModelList(
        data=models + [ModelObject(id=a.name, created=a.created_at, parent=a.base_model) for a in adapters]
    )
