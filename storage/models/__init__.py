"""ORM models, one module per domain (accounts, files, batches, workers, webhooks, adapters), all importable
from here: `from storage.models import Batch`. Importing this package registers every table on `Base.metadata`."""

from storage.models.accounts import ApiKey, Tenant
from storage.models.adapters import Adapter
from storage.models.base import NAMING_CONVENTION, Base
from storage.models.batches import Batch, BatchRequest, Checkpoint, CheckpointChunk
from storage.models.files import File, Upload, UploadPart
from storage.models.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from storage.models.workers import EngineRun, Lease, ModelBacklog, WorkerHeartbeat

__all__ = [
    "NAMING_CONVENTION",
    "Adapter",
    "ApiKey",
    "Base",
    "Batch",
    "BatchRequest",
    "Checkpoint",
    "CheckpointChunk",
    "EngineRun",
    "File",
    "Lease",
    "ModelBacklog",
    "Tenant",
    "Upload",
    "UploadPart",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEvent",
    "WorkerHeartbeat",
]
