"""Carrying on in the background: a batch created with `on_expiry: "continue_in_background"` whose window closes
hands its unfinished lines to a child batch of the background tier (docs/workflow.md, "Partial answers at expiry").

The child is a retry of the origin, built as retries are (storage/batches/retries.py): it joins the origin's retry
tree, its rows copy the unfinished rows (same line, custom_id, body) and each copy takes its source's checkpoint
(and a checked line's failed draws, storage/queue/draws.py), so the claim that runs it continues the generation
from the last stored token (token-exact resume, docs/workers.md). A paused origin's lines continue the same way,
whether they were running or handed back by the pause, but the child starts paused: a pause is the tenant's word
that the batch must not run now (a manual trial awaiting its review, a spend to stop), and an expiry must not
overrule it; the tenant resumes the child (or cancels it) as any paused batch.
In the reaper's transaction the origin's unfinished rows end as `batch_expired` error lines naming the child (the
origin ends `expired`, its own files show them so), and the merged view of the tree (`GET /v1/batches/{id}/results
?merged=true`) gives each custom_id once: the child's answer once it has one. What a line's worker held past
that checkpoint (a generation going on, an answer finished but not stored) it hands to the copy when it learns the
row is gone (storage/queue/copy_tokens.py); where it cannot (a worker gone, a copy already claimed) the tokens after
the last periodic checkpoint are generated again, identically where the resume is exact. Where no child can be
made (the tenant's open-batch quota, a spend cap already spent) the batch expires as one without the option, its
lines still generating cut short, and says why in its `warnings`.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.batches import create_batch
from storage.batches.checks import attach_workflow
from storage.batches.retries import RetryChoices, inherited_cap, retry_tree
from storage.clock import now
from storage.errors import BackfillError
from storage.models import Batch, BatchRequest
from storage.protocols import protocol_of
from storage.queue import checkpoints
from storage.queue.batch_rows import close_open_requests, queued_models
from storage.queue.draws import carry_draws
from storage.queue.expiry import CONTINUE_IN_BACKGROUND
from storage.queue.retry_rows import requeue_copies
from storage.settings import Settings
from storage.wakeups import wake_after_commit
from storage.windows import BACKGROUND_WINDOW

log = logging.getLogger(__name__)

NOT_CONTINUED = "not_continued"
_COPY_CHUNK = 2000  # rows copied per statement (as a retry copies them)


def continue_overdue(session: Session, settings: Settings) -> list[str]:
    """Move the unfinished lines of every overdue batch that continues in the background into its child; return
    the children's ids. Batches another reaper holds are skipped (the next pass takes them)."""
    overdue = session.scalars(
        select(Batch)
        .where(
            Batch.status == lifecycle.IN_PROGRESS,
            Batch.expires_at <= now(),
            Batch.on_expiry == CONTINUE_IN_BACKGROUND,
        )
        .with_for_update(skip_locked=True)
    )
    children = []
    for origin in list(overdue):
        try:
            with session.begin_nested():
                child = continue_batch(session, settings, origin=origin)
        except BackfillError as error:  # no child: it expires as a batch without the option does
            log.warning("batch %s cannot continue in the background: %s", origin.id, error)
            origin.on_expiry = None
            note = {"code": NOT_CONTINUED, "message": f"Not continued in the background: {error}", "line": None}
            origin.warnings = [*(origin.warnings or []), {**note, "param": "on_expiry"}]
            continue
        if child is not None:
            children.append(child.id)
    return children


def continue_batch(session: Session, settings: Settings, *, origin: Batch) -> Batch | None:
    """The child batch carrying on the origin's unfinished lines from their checkpoints (None: none was left)."""
    rows = session.execute(
        select(BatchRequest.id, BatchRequest.checkpoint_tokens).where(
            BatchRequest.batch_id == origin.id, BatchRequest.status.in_(sorted(lifecycle.REQ_OPEN))
        )
    ).all()
    if not rows:
        return None
    tokens = checkpoints.load(session, counts={rid: count for rid, count in rows})  # before the rows end
    tree = retry_tree(session, batch=origin)
    cap, _ = inherited_cap(session, settings, origin=origin, tree=tree, choices=RetryChoices())
    child = create_batch(
        session,
        tenant_id=origin.tenant_id,
        input_file_id=origin.input_file_id,
        endpoint=origin.endpoint,
        completion_window=BACKGROUND_WINDOW,
        model=origin.model,
        metadata=origin.metadata_,
        output_expires_after_seconds=origin.output_expires_after_seconds,
        protocol=protocol_of(origin),
        priority=origin.priority,
        max_cost_micro_usd=cap,
    )
    child.retry_of, child.retry_root = origin.id, tree[0].id
    child.attempt = max(batch.attempt for batch in tree) + 1
    attach_workflow(child, trial=None, checks=origin.checks)
    close_open_requests(
        session,
        batch=origin,
        statuses=tuple(sorted(lifecycle.REQ_OPEN)),
        status=lifecycle.REQ_EXPIRED,
        code="batch_expired",
        message=f"The completion window expired before this request finished; it continues in the background in "
        f"batch {child.id}.",
    )
    ids = [rid for rid, _ in rows]
    child.request_total = sum(
        requeue_copies(session, batch=child, root_id=tree[0].id, request_ids=ids[start : start + _COPY_CHUNK])
        for start in range(0, len(ids), _COPY_CHUNK)
    )
    copies = dict(
        session.execute(select(BatchRequest.id, BatchRequest.copy_of).where(BatchRequest.batch_id == child.id)).all()
    )
    checkpoints.seed(session, tokens={copy: tokens[source] for copy, source in copies.items() if source in tokens})
    carry_draws(session, copies={copy: source for copy, source in copies.items() if source is not None})
    lifecycle.transition(child, lifecycle.IN_PROGRESS)
    if origin.paused_at is not None:  # paused as its origin was (the module docstring): resumed by the tenant
        child.paused_at = now()
    session.flush()
    if child.paused_at is None:
        for model in queued_models(session, batch_id=child.id):
            wake_after_commit(session, "batch.run", model=model)
    return child
