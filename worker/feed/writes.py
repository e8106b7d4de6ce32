"""What the runner's writer thread writes (worker/feed/queue_io.py): one message type per kind of write, done in
the order handed over, each in a transaction of its own (flushes the database fell behind on share one).

`Flush` stores finished results under the lease check with the engine run's counters; `Renewal` renews leases
(storing periodic checkpoints in the same row versions) and finds those lost or paused; `Checkpoint` stores
periodic checkpoints between renewals; `Restart` drops checkpoints an engine could not continue from (and stores a
redrawn line's failed draws); `HandBack` releases rows to the queue with their tokens (a pause, a drain, a switch,
a stop). `Written` is a flush reported back to the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from storage.batches.trials import settle_trials
from storage.db import transaction
from storage.metrics.events import count_decode_tokens
from storage.queue.backlog import done_batches
from storage.queue.checkpoints import Generated, restart, save, still_open
from storage.queue.copy_tokens import save_to_copies
from storage.queue.draws import Draws, save_draws
from storage.queue.expiry import overdue_of
from storage.queue.handback import paused_of
from storage.queue.leases import release, renew, take_back
from storage.queue.results import Outcome, record_outcomes
from storage.settings import get_settings
from worker.engine import EngineResult


@dataclass
class Flush:
    """Finished results and the engine run's counters: one commit under the lease check."""

    run_id: str
    write_run: Callable[[Session], None]  # writes the run's counters as they were at hand-over (a snapshot)
    outcomes: list[Outcome]
    results: list[EngineResult]
    kept: dict[str, Generated]  # the results' tokens but the last, under their claims (`keep_handed_back`)


@dataclass
class Renewal:
    """Renew these leases, storing the periodic checkpoints in the same write of their rows."""

    request_ids: Collection[str]
    checkpoints: dict[str, Generated]


@dataclass
class Checkpoint:
    """Periodic checkpoints of rows this worker runs, between renewals (an interval shorter than theirs)."""

    generated: dict[str, Generated]


@dataclass
class Restart:
    """Drop the checkpoints of rows whose engine restarted their generation (id -> the claim it runs under); a
    redraw of a checked line stores its failed draws so far with them (storage/queue/draws.py)."""

    claims: dict[str, str]
    draws: dict[str, Draws] = field(default_factory=dict)


@dataclass
class HandBack:
    """Release these rows to the queue with their tokens, in one transaction; tokens of rows not among them (the
    reaper re-queued them under this worker) go with them while they are still unclaimed."""

    request_ids: list[str]
    generated: dict[str, Generated]
    # Checked lines' failed draws (id -> the claim that made them, the draws), for copies of rows continued in the
    # background whose draws were written too late for the continuation (storage/queue/copy_tokens.py)
    draws: dict[str, tuple[str, Draws]] = field(default_factory=dict)
    released: int = 0  # set once written: how many rows went back


Write = Flush | Renewal | Checkpoint | Restart | HandBack


@dataclass
class Written:
    """A flush the writer is done with: its results, and whether they were committed (else dropped)."""

    results: list[EngineResult]
    committed: bool


def commit(flushes: list[Flush], *, worker_id: str) -> list[str]:
    """One transaction: each run's latest counters, then every result under the lease check; return the batches
    with nothing open left."""
    latest = {flush.run_id: flush.write_run for flush in flushes}  # counters are cumulative: the last wins
    touched, stored = set[str](), set[str]()
    with transaction() as session:
        for write_run in latest.values():
            write_run(session)
        for run_id in latest:
            outcomes = [o for flush in flushes if flush.run_id == run_id for o in flush.outcomes]
            recorded = record_outcomes(session, worker_id=worker_id, run_id=run_id, outcomes=outcomes)
            touched, stored = touched | set(recorded.batches), stored | recorded.stored
        settle_trials(session, get_settings(), batch_ids=sorted(touched))  # a trial's last line: report, pause
        done = done_batches(session, batch_ids=sorted(touched))
        keep_handed_back(session, {r: g for f in flushes for r, g in f.kept.items() if r not in stored})
    return list(done)


def keep_handed_back(session: Session, kept: dict[str, Generated]) -> None:
    """Results a pause took back before they were stored (`kept`: those `record` did not store): their tokens but
    the last go with the queued row as its checkpoint, so the next run decodes only that one again (an end of
    sequence or a stop, never past it) instead of the whole generation; those of rows the reaper continued in the
    background go with the row's copy (storage/queue/copy_tokens.py)."""
    if not kept:
        return
    if rerun := still_open(session, request_ids=sorted(kept)):
        save(session, checkpoints={rid: kept[rid] for rid in rerun})
    save_to_copies(session, generated={rid: g for rid, g in kept.items() if rid not in rerun})


def renew_leases(
    held: list[str], due: dict[str, Generated], *, worker_id: str, lease_seconds: int
) -> tuple[set[str], set[str], set[str]]:
    """Renew these leases (storing `due` checkpoints on the way); take back rows re-queued under this worker;
    return the ids lost (cancelled, expired, leased elsewhere), those of paused batches and those of batches whose
    window closed (to cut short: storage/queue/expiry.py)."""
    with transaction() as session:
        lost = renew(session, worker_id=worker_id, request_ids=held, lease_seconds=lease_seconds, checkpoints=due)
        if lost:  # re-queued under us while we still run them: ours again, the same try (docs/workers.md)
            back = take_back(session, worker_id=worker_id, request_ids=sorted(lost), lease_seconds=lease_seconds)
            lost -= back
        if lost:  # our own claimer may have leased them back meanwhile (a re-lease, see `request_claim`):
            # still ours; reported lost, the runner would abort them and leave them leased to it unrun
            lost = renew(session, worker_id=worker_id, request_ids=sorted(lost), lease_seconds=lease_seconds)
        paused = paused_of(session, worker_id=worker_id, request_ids=sorted(set(held) - lost))
        overdue = overdue_of(session, worker_id=worker_id, request_ids=sorted(set(held) - lost - paused))
    return lost, paused, overdue


def store_checkpoints(item: Checkpoint) -> None:
    """Store periodic checkpoints of rows whose claim this worker's generation still runs under."""
    with transaction() as session:
        save(session, checkpoints=item.generated)


def drop_checkpoints(item: Restart) -> None:
    """Drop the checkpoints of rows whose generation restarted; store the failed draws of those drawn again."""
    with transaction() as session:
        restart(session, claims=item.claims)
        draws = {rid: (item.claims[rid], drawn) for rid, drawn in item.draws.items() if rid in item.claims}
        save_draws(session, draws=draws)


def hand_back(item: HandBack, *, worker_id: str, model: str) -> None:
    """Release the rows with their tokens in one transaction (`item.released`: how many); count as discarded the
    tokens of rows that run again without them (claimed meanwhile by another worker)."""
    with transaction() as session:
        item.released = release(session, worker_id=worker_id, request_ids=item.request_ids, checkpoints=item.generated)
        stored = save(session, checkpoints=item.generated)  # rows the reaper re-queued too
        rerun = still_open(session, request_ids=sorted(set(item.generated) - stored))
        ended = {rid: g for rid, g in item.generated.items() if rid not in stored and rid not in rerun}
        save_to_copies(session, generated=ended, draws=item.draws)  # rows continued in the background: to their copies
    count_decode_tokens(model, discarded=sum(len(item.generated[rid].token_ids) for rid in rerun))
