"""Request and response shapes, named as OpenAI names them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from storage.batches.batches import batch_errors
from storage.batches.creation import BatchTerms
from storage.batches.retries import RetryChoices
from storage.batches.trials import trial_json
from storage.endpoints import canonical_url
from storage.files.uploads import upload_status
from storage.finance.budgets import usd, usd_text
from storage.models import Batch, File, Upload, UploadPart
from storage.protocols import OPENAI
from storage.queue.usage import TokenUsage
from storage.strict import Priority, UsdAmount, micro_usd
from storage.windows import is_background_window


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = None
    expires_at: int | None = None

    @classmethod
    def of(cls, row: File) -> FileObject:
        return cls(
            id=row.id,
            bytes=row.bytes,
            created_at=row.created_at,
            filename=row.filename,
            purpose=row.purpose,
            expires_at=row.expires_at,
        )


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class ExpiresAfter(BaseModel):
    """OpenAI's expiration policy: `seconds` after the file's creation, between 1 hour and 30 days."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=30 * 86400)


class BatchCreate(BaseModel):
    """The body of `POST /v1/batches`: exactly the fields of the openai SDK's BatchCreateParams; any other is a
    400 naming it (docs/openai-compatibility.md), since nothing is silently ignored."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=128)
    endpoint: str = Field(max_length=64)
    completion_window: str = Field(default="24h", max_length=16)
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None
    priority: Priority = Field(
        default=0,
        description="Backfill extension (send it in the SDK's `extra_body`): an integer, -100..100; higher claims "
        "first among work not yet urgent; capped per tenant by the operator (BACKFILL_TENANT_MAX_PRIORITY).",
    )
    max_cost_usd: UsdAmount | None = Field(
        default=None,
        description="Backfill extension (send it with `extra_body`): the batch stops claiming once its billed "
        'cost reaches this many US dollars (a decimal string, e.g. "12.50", more than 0), at most one request '
        "past it; its unrun requests end as `budget_exceeded` lines.",
    )
    trial: dict[str, Any] | None = Field(
        default=None,
        description='Backfill extension (`extra_body`, docs/workflow.md): run a sample first, e.g. `{"lines": 50}` or '
        '`{"share": 0.01}`, with `"continue": "auto"` (go on when `min_success_rate` is met) or `"manual"` (pause).',
    )
    checks: dict[str, Any] | None = Field(
        default=None,
        description="Backfill extension (`extra_body`, docs/workflow.md): what each answer must pass (`schema`, "
        "`json_schema`, `regex`, `enum`, `max_length`); a failing answer is drawn again, up to `max_attempts` (<= 5).",
    )
    on_expiry: str | None = Field(
        default=None,
        max_length=64,
        description='Backfill extension (`extra_body`, docs/workflow.md): `"continue_in_background"` carries the lines '
        "unfinished at expiry on in a child batch of the background tier, from their last token; absent, they end "
        'with what they generated so far (`finish_reason: "length"`, `"backfill": {"cut_by": "expiry"}`).',
    )

    def terms(self) -> BatchTerms:
        """What this create asks for beside its file."""
        return BatchTerms(
            endpoint=self.endpoint,
            completion_window=self.completion_window,
            priority=self.priority,
            max_cost_micro_usd=None if self.max_cost_usd is None else micro_usd(self.max_cost_usd),
            metadata=self.metadata,
            output_expires_after_seconds=self.output_expires_after.seconds if self.output_expires_after else None,
            trial=self.trial,
            checks=self.checks,
            on_expiry=self.on_expiry,
        )

    @field_validator("endpoint")
    @classmethod
    def _endpoint_known(cls, value: str) -> str:
        value = canonical_url(value)  # Azure's spelling too ("/chat/completions")
        if value not in OPENAI.endpoints:
            raise ValueError(f"must be one of {', '.join(OPENAI.endpoints)}")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_small(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > 16:
            raise ValueError("at most 16 key-value pairs")
        for key, item in value.items():
            if len(key) > 64 or len(item) > 512:
                raise ValueError("keys are at most 64 characters and values at most 512")
        return value


class BatchRetry(BaseModel):
    """The body of `POST /v1/batches/{id}/retry` (a Backfill extension)."""

    model_config = ConfigDict(extra="forbid")

    codes: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=64,
        description="Error codes to re-run besides the default ones (batch_expired, batch_cancelled, "
        "budget_exceeded and server errors), as the protocol shows them: on OpenAI's error lines "
        "`context_length_exceeded`, ...; elsewhere the error type its results show, `invalid_request_error`, ...",
    )
    priority: Priority | None = Field(
        default=None,
        description="The retry's priority (within the tenant's cap); by default the origin's, lowered to the "
        "tenant's cap.",
    )
    max_cost_usd: UsdAmount | None = Field(
        default=None,
        description="The retry's own spend cap (a decimal string; null: none); by default what is left of the "
        "origin's cap after the origin and its retries were billed (a warning on the retry says so).",
    )

    def choices(self) -> RetryChoices:
        """What the caller chose, for storage.batches.retries.retry_batch."""
        own_cap = "max_cost_usd" in self.model_fields_set
        cap = None if self.max_cost_usd is None else micro_usd(self.max_cost_usd)
        return RetryChoices(
            codes=frozenset(self.codes), priority=self.priority, own_cap=own_cap, max_cost_micro_usd=cap
        )


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class BatchUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: dict[str, Any] | None = None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    usage: BatchUsage | None = None
    metadata: dict[str, str] | None = None
    cost: dict[str, Any] | None = Field(default=None, description="Backfill extension: the job's cost block.")
    warnings: dict[str, Any] | None = Field(
        default=None,
        description="Backfill extension: admission warnings (e.g. `deadline_at_risk`), shaped like `errors`.",
    )
    goodput: dict[str, Any] | None = Field(
        default=None,
        description="Backfill extension: requests completed before the deadline / requests accepted, with counts.",
    )
    retry_of: str | None = Field(
        default=None, description="Backfill extension: the ended batch whose failed requests this batch re-runs."
    )
    retries: list[str] | None = Field(
        default=None, description="Backfill extension: the ids of this batch's retries, oldest first."
    )
    priority: int = Field(default=0, description="Backfill extension: the batch's claim priority (-100..100).")
    paused_at: int | None = Field(
        default=None,
        description="Backfill extension: set while the batch is paused (its status stays `in_progress`).",
    )
    max_cost_usd: str | None = Field(default=None, description="Backfill extension: the batch's spend cap, if any.")
    trial: dict[str, Any] | None = Field(
        default=None, description="Backfill extension: the trial asked for, its status and, once run, its report."
    )
    checks: dict[str, Any] | None = Field(default=None, description="Backfill extension: the answers' checks.")
    on_expiry: str | None = Field(
        default=None, description="Backfill extension: `continue_in_background`, or null (cut short at expiry)."
    )

    @classmethod
    def of(
        cls,
        row: Batch,
        *,
        cost: dict[str, Any] | None = None,
        goodput: dict[str, Any] | None = None,
        usage: TokenUsage | None = None,
        retries: list[str] | None = None,
    ) -> BatchObject:
        return cls(
            id=row.id,
            endpoint=row.endpoint,
            model=row.model,
            errors=batch_errors(row.errors),
            input_file_id=row.input_file_id,
            completion_window=row.completion_window,
            status=row.status,
            output_file_id=row.output_file_id,
            error_file_id=row.error_file_id,
            created_at=row.created_at,
            in_progress_at=row.in_progress_at,
            expires_at=None if is_background_window(row.completion_window) else row.expires_at,  # no deadline
            finalizing_at=row.finalizing_at,
            completed_at=row.completed_at,
            failed_at=row.failed_at,
            expired_at=row.expired_at,
            cancelling_at=row.cancelling_at,
            cancelled_at=row.cancelled_at,
            request_counts=RequestCounts(
                total=row.request_total, completed=row.request_completed, failed=row.request_failed
            ),
            usage=BatchUsage.model_validate((usage or TokenUsage()).to_json()),
            metadata=row.metadata_,
            cost=cost,
            warnings=batch_errors(row.warnings),
            goodput=goodput,
            retry_of=row.retry_of,
            retries=retries,
            priority=row.priority,
            paused_at=row.paused_at,
            max_cost_usd=None if row.max_cost_micro_usd is None else usd_text(usd(row.max_cost_micro_usd)),
            trial=trial_json(row),
            checks=row.checks,
            on_expiry=row.on_expiry,
        )


class BatchPriority(BaseModel):
    """The body of `POST /v1/batches/{id}/priority` (a Backfill extension)."""

    model_config = ConfigDict(extra="forbid")

    priority: Priority


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "backfill"
    parent: str | None = None  # an adapter's base model, as vLLM's own server lists LoRA modules


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class UploadCreate(BaseModel):
    """The body of `POST /v1/uploads`: the fields of the openai SDK's UploadCreateParams."""

    model_config = ConfigDict(extra="forbid")

    bytes: int = Field(ge=1, le=2**53, description="The file's size; the parts listed at complete must add up to it.")
    filename: str = Field(max_length=512)
    mime_type: str = Field(max_length=255)
    purpose: str = Field(max_length=64)
    expires_after: ExpiresAfter | None = None


PartId = Annotated[str, Field(max_length=64)]


class UploadComplete(BaseModel):
    """The body of `POST /v1/uploads/{id}/complete`: the parts in the file's order, and optionally its md5."""

    model_config = ConfigDict(extra="forbid")

    part_ids: list[PartId] = Field(max_length=10_000)
    md5: str | None = Field(default=None, pattern="^[0-9a-fA-F]{32}$")


class UploadObject(BaseModel):
    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None = None

    @classmethod
    def of(cls, row: Upload, file: File | None = None) -> UploadObject:
        return cls(
            id=row.id,
            bytes=row.bytes,
            created_at=row.created_at,
            expires_at=row.expires_at,
            filename=row.filename,
            purpose=row.purpose,
            status=upload_status(row),
            file=FileObject.of(file) if file is not None else None,
        )


class UploadPartObject(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str

    @classmethod
    def of(cls, row: UploadPart) -> UploadPartObject:
        return cls(id=row.id, created_at=row.created_at, upload_id=row.upload_id)
