"""Typed failures with a stable code and an HTTP status; the API renders OpenAI's envelope."""

from __future__ import annotations


class BackfillError(Exception):
    """Base error: `code` is stable, `status` is the HTTP status, `param` names the bad field."""

    status = 400
    code = "invalid_request_error"
    type = "invalid_request_error"
    headers: dict[str, str] | None = None  # HTTP headers the error answers with (401: WWW-Authenticate)

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidRequest(BackfillError):
    """The request is malformed or refers to something unusable."""


class InvalidValue(InvalidRequest):
    """A field whose value breaks its strict rule (money, a priority, a cursor: storage/strict.py)."""

    code = "invalid_value"


class Unauthorized(BackfillError):
    status = 401
    code = "invalid_api_key"
    type = "invalid_request_error"
    headers = {"WWW-Authenticate": 'Bearer realm="backfill"'}


class PermissionDenied(BackfillError):
    status = 403
    code = "permission_denied"


class NotFound(BackfillError):
    status = 404
    code = "not_found"


class TenantNotFound(NotFound):
    code = "tenant_not_found"


class FileNotFound(NotFound):
    code = "file_not_found"


class BatchNotFound(NotFound):
    code = "batch_not_found"


class UploadNotFound(NotFound):
    code = "upload_not_found"


class IllegalTransition(BackfillError):
    status = 409
    code = "invalid_state"


class BatchNotCancellable(IllegalTransition):
    code = "batch_not_cancellable"


class BatchNotRetryable(IllegalTransition):
    """A retry needs an ended batch (completed, expired or cancelled) whose retries have all ended too."""

    code = "batch_not_retryable"


class RetryLimitReached(BatchNotRetryable):
    """The retry tree holds as many retries as the operator allows (`retry_max_attempts`)."""

    code = "retry_limit_reached"


class NothingToRetry(InvalidRequest):
    """No request of the batch ended as an error line of a kind the retry re-runs."""

    code = "nothing_to_retry"


class UploadTooLarge(BackfillError):
    status = 413
    code = "file_too_large"


class PartTooLarge(UploadTooLarge):
    """An Uploads part over `upload_part_max_bytes` (OpenAI's 64 MB)."""

    code = "part_too_large"


class RequestTooLarge(BackfillError):
    """A request body over its size limit (a create with inline requests: its protocol's limit)."""

    status = 413
    code = "request_too_large"


class QuotaExceeded(BackfillError):
    """A tenant's operator-set quota (files, stored bytes, open batches) would be exceeded."""

    status = 429
    code = "quota_exceeded"
    type = "insufficient_quota"


class TenantBusy(BackfillError):
    """A tenant already has its fair share of the API's request threads in flight (api/fair_share.py)."""

    status = 429
    code = "rate_limit_exceeded"
    type = "requests"  # as OpenAI's own request-rate 429s say


class BudgetExceeded(InvalidRequest):
    """A batch whose estimated cost is more than what is left of its tenant's monthly budget."""

    code = "budget_exceeded"


class ModelNotFound(InvalidRequest):
    code = "model_not_found"


class WebhookEndpointNotFound(NotFound):
    code = "webhook_endpoint_not_found"


class InvalidWebhookUrl(InvalidRequest):
    """A webhook target that is malformed, not https, or resolves to an address we never send to."""

    code = "invalid_webhook_url"


class LinksUnavailable(InvalidRequest):
    """Presigned links need S3: the local-folder store has no URLs of its own."""

    code = "presigned_urls_unavailable"


class ApiKeyNotFound(NotFound):
    code = "api_key_not_found"


class ManifestNotFound(NotFound):
    code = "manifest_not_found"


def is_unavailable(error: BaseException) -> bool:
    """Whether `error` means a backing service (Postgres, S3) is unreachable or overloaded right now, so the
    request may succeed if retried: the API answers 503 with Retry-After instead of a 500."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError
    from sqlalchemy.exc import DBAPIError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(error, OperationalError | PoolTimeout | ConnectionError | HTTPClientError):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return isinstance(status, int) and status >= 500
    return False


class PriorityNotAllowed(InvalidRequest):
    """A batch priority above what the operator lets this tenant use (BACKFILL_TENANT_MAX_PRIORITY)."""

    code = "priority_not_allowed"


class BatchNotControllable(IllegalTransition):
    """Pause, resume or a priority change asked of a batch that has ended (or is ending)."""

    code = "batch_not_controllable"


class UploadNotPending(IllegalTransition):
    """A part, a complete or a cancel asked of an Upload that is completed, cancelled or expired."""

    code = "upload_not_pending"


class ChecksumMismatch(InvalidRequest):
    """The md5 given when completing an Upload is not the uploaded bytes' md5 (the upload is cancelled)."""

    code = "md5_mismatch"
