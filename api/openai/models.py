"""Models: what this deployment serves, in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Caller, Config
from api.openai.schemas import ModelList, ModelObject

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("", response_model=ModelList)
def list_models(caller: Caller, settings: Config) -> ModelList:
    """The models batches may name in `body.model`."""
    return ModelList(data=[ModelObject(id=name, created=0) for name in settings.served_models()])
