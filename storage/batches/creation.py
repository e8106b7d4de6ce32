"""Creating a batch, for every protocol: what a create asks for (`BatchTerms`) and every check it makes, in one
place and in one set of words.

The checks, in order: the completion window is one this server offers; the input is a `batch` file whose first
line names a served model able to answer the endpoint; the priority is within the tenant's cap; a spend cap is
more than $0; a trial and checks (docs/workflow.md) are well formed and bounded; the tenant's monthly budget has
room for the estimate; the tenant's quota has room for a batch (`create_batch`). A create whose requests come
inline (its protocol's own module beside this one) runs the same extension checks (`check_extensions`) on what
it streamed in, the window (`check_window`) and the model (`check_served`) among them. The estimate
(`estimate_file`; an inline create's: its protocol's module) judges the same file with the same window and model
checks, and creates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from storage.adapters.registry import adapter_bases
from storage.batches.batches import create_batch
from storage.batches.checks import attach_workflow, checks_spec
from storage.batches.control import check_priority
from storage.batches.estimates import Estimate, estimate_job
from storage.batches.trials import trial_spec
from storage.errors import InvalidRequest, InvalidValue, ModelNotFound
from storage.files.blobs import BlobStore
from storage.files.files import get_file
from storage.finance.budgets import check_file_within_budget, check_max_cost
from storage.lines.reader import clip, peek_model
from storage.models import Batch, File
from storage.planning.shapes import shape_of_jsonl
from storage.queue.expiry import ON_EXPIRY
from storage.settings import Settings
from storage.wakeups import wake_after_commit
from storage.windows import BACKGROUND_WINDOW, is_background_window

PEEK_CHUNK_BYTES = 64 * 1024  # the first line is all the model check reads


@dataclass(frozen=True)
class BatchTerms:
    """What a create asks for beside its requests."""

    endpoint: str
    completion_window: str
    priority: int = 0
    max_cost_micro_usd: int | None = None  # the spend cap (None: none)
    metadata: dict[str, str] | None = None
    output_expires_after_seconds: int | None = None
    trial: dict[str, Any] | None = None  # as asked for (docs/workflow.md); checked by `create_from_file`
    checks: dict[str, Any] | None = None  # as asked for (docs/workflow.md); checked by `create_from_file`
    on_expiry: Any = None  # as asked for (docs/workflow.md, "Partial answers at expiry"); checked by `on_expiry_spec`


def check_window(settings: Settings, completion_window: Any) -> str:
    """The completion window, if this server offers it; else a 400 naming the offered ones (the value may come from
    a body no schema checked: the extension of a create whose requests come inline, so any JSON value)."""
    if not isinstance(completion_window, str) or completion_window not in settings.completion_windows:
        offered = ", ".join(sorted(settings.completion_windows))
        shown = f"'{completion_window}'" if isinstance(completion_window, str) else clip(completion_window)
        raise InvalidRequest(
            f"Invalid completion_window {shown}: this server offers {offered}.", param="completion_window"
        )
    return completion_window


def check_extensions(
    session: Session, settings: Settings, *, tenant_id: str, priority: int, max_cost_micro_usd: int | None
) -> int | None:
    """The Backfill extensions of a create: the priority within the tenant's cap, a spend cap over $0; returns
    the cap."""
    check_priority(session, settings, tenant_id=tenant_id, priority=priority)
    return check_max_cost(max_cost_micro_usd)


def on_expiry_spec(settings: Settings, value: Any, *, completion_window: str) -> str | None:
    """What becomes of the batch's unfinished lines at expiry: None (cut short) or "continue_in_background",
    which needs the background tier offered and a window that can expire (400 `invalid_value` otherwise)."""
    if value is None:
        return None
    if value not in ON_EXPIRY:
        shown = clip(value) if isinstance(value, str) else type(value).__name__
        raise InvalidValue(
            f"on_expiry must be one of {', '.join(ON_EXPIRY)} (or absent), not {shown}.", param="on_expiry"
        )
    if BACKGROUND_WINDOW not in settings.completion_windows:
        raise InvalidValue("on_expiry: this server offers no background tier to continue in.", param="on_expiry")
    if is_background_window(completion_window):
        raise InvalidValue("on_expiry: a batch of the background tier never expires.", param="on_expiry")
    return str(value)


def served_model(
    blobs: BlobStore, settings: Settings, blob_key: str, *, endpoint: str, adapters: dict[str, str] | None = None
) -> str | None:
    """The batch's model (its first line's, or the base of the adapter it names: `adapters`, name -> base, those the
    tenant may name, docs/adapters.md), which must be served and able to answer `endpoint`."""
    chunks = blobs.open_stream(blob_key, chunk_bytes=PEEK_CHUNK_BYTES)
    model = peek_model(chunks, max_line_bytes=settings.line_max_bytes, default_models=settings.default_models())
    return check_served(settings, model, endpoint=endpoint, adapters=adapters)


def check_served(
    settings: Settings, model: str | None, *, endpoint: str, adapters: dict[str, str] | None = None
) -> str | None:
    """The model a line names (or the base of the adapter it names), which must be served and able to answer
    `endpoint` (400 `model_not_found` or `unsupported_endpoint`)."""
    served = settings.served_models()
    if model is not None and model not in served:
        model = (adapters or {}).get(model, model)
    if model is not None and model not in served:
        raise ModelNotFound(
            f"The model {clip(model)} is not served here. Served models: {', '.join(sorted(served))}.",
            param="model",
        )
    if model is not None and not served[model].serves(endpoint):
        able = sorted(name for name, spec in served.items() if spec.serves(endpoint))
        raise InvalidRequest(
            f"The model '{model}' does not support {endpoint}. Models that do: {', '.join(able) or 'none'}.",
            param="endpoint",
            code="unsupported_endpoint",
        )
    return model


def _batch_file(session: Session, *, tenant_id: str, input_file_id: str) -> File:
    source = get_file(session, tenant_id=tenant_id, file_id=input_file_id)
    if source.purpose != "batch":
        raise InvalidRequest("The input file must have purpose 'batch'.", param="input_file_id")
    return source


def create_from_file(
    session: Session, blobs: BlobStore, settings: Settings, *, tenant_id: str, input_file_id: str, terms: BatchTerms
) -> Batch:
    """Record a batch of an uploaded `batch` file in `validating` and wake ingest after commit."""
    check_window(settings, terms.completion_window)
    source = _batch_file(session, tenant_id=tenant_id, input_file_id=input_file_id)
    adapters = adapter_bases(session, settings, tenant_id=tenant_id)
    model = served_model(blobs, settings, source.blob_key, endpoint=terms.endpoint, adapters=adapters)
    cap = check_extensions(
        session, settings, tenant_id=tenant_id, priority=terms.priority, max_cost_micro_usd=terms.max_cost_micro_usd
    )
    trial = None if terms.trial is None else trial_spec(terms.trial, max_lines=settings.trial_max_lines)
    checks = None if terms.checks is None else checks_spec(terms.checks, endpoint=terms.endpoint)
    on_expiry = on_expiry_spec(settings, terms.on_expiry, completion_window=terms.completion_window)
    check_file_within_budget(
        session,
        blobs,
        settings,
        tenant_id=tenant_id,
        blob_key=source.blob_key,
        endpoint=terms.endpoint,
        model=model,
        completion_window=terms.completion_window,
    )
    batch = create_batch(
        session,
        tenant_id=tenant_id,
        input_file_id=source.id,
        endpoint=terms.endpoint,
        completion_window=terms.completion_window,
        model=model,
        metadata=terms.metadata,
        output_expires_after_seconds=terms.output_expires_after_seconds,
        priority=terms.priority,
        max_cost_micro_usd=cap,
    )
    attach_workflow(batch, trial=trial, checks=checks)
    batch.on_expiry = on_expiry
    wake_after_commit(session, "batch.ingest", batch_id=batch.id)
    return batch


def estimate_file(
    session: Session, blobs: BlobStore, settings: Settings, *, tenant_id: str, input_file_id: str, terms: BatchTerms
) -> Estimate:
    """The dry run of `create_from_file`: the job's estimated cost, start and finish behind the current backlog."""
    check_window(settings, terms.completion_window)
    source = get_file(session, tenant_id=tenant_id, file_id=input_file_id)
    adapters = adapter_bases(session, settings, tenant_id=tenant_id)
    model = served_model(blobs, settings, source.blob_key, endpoint=terms.endpoint, adapters=adapters)
    if model is None:
        raise InvalidRequest("The input file has no readable first line with 'body.model'.", param="input_file_id")
    shape = shape_of_jsonl(
        blobs.open_stream(source.blob_key, chunk_bytes=settings.stream_chunk_bytes),
        endpoint=terms.endpoint,
        max_line_bytes=settings.line_max_bytes,
        max_requests=settings.batch_max_requests,
        default_models=settings.default_models(),
        adapters=adapters,
        max_adapters=settings.batch_max_adapters,
    )
    return estimate_job(
        session,
        model=model,
        shape=shape,
        settings=settings,
        completion_window=terms.completion_window,
        tenant_id=tenant_id,
    )
