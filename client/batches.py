"""`backfill batches list|show|cancel|results|retry|pause|resume|priority`: a remote server's batches."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client import batch_control, batch_retries, progress
from client.batch_workflow import (
    add_attempts,
    attempts_tally,
    continuation_text,
    report_text,
    trial_paused,
    workflow_pairs,
)
from client.remote import (
    EXIT_INTERRUPTED,
    EXIT_NOT_FINISHED,
    EXIT_OK,
    STATUS_EXIT,
    TERMINAL,
    Remote,
    add_connection_args,
    connect,
    extra,
    int_between,
    note,
    print_json,
    remote_command,
    render_table,
    when,
)

if TYPE_CHECKING:
    from openai.types import Batch


def register(subparsers: Any) -> None:
    """Add `batches` and its subcommands."""
    batches = subparsers.add_parser("batches", help="list, show, cancel a server's batches; download their results")
    sub = batches.add_subparsers(title="batch commands", metavar="BATCHCOMMAND")
    listing = sub.add_parser("list", help="your batches, newest first")
    listing.add_argument("--limit", type=int_between(1, 100), default=20, metavar="N", help="1-100 (20)")
    listing.add_argument("--after", help="the last batch id of the previous page")
    listing.set_defaults(func=run_list)
    show = sub.add_parser("show", help="one batch: status, counts, files, cost")
    show.set_defaults(func=run_show)
    cancel = sub.add_parser("cancel", help="cancel a batch (queued requests end at once)")
    cancel.set_defaults(func=run_cancel)
    results = sub.add_parser("results", help="download a finished batch's output and error files")
    results.add_argument("--output", "-o", type=Path, default=Path("."), help="directory for the files (.) or a file")
    results.add_argument("--wait", action="store_true", help="wait for the batch to end first, with a progress bar")
    batch_retries.add_stream_flags(results)
    results.set_defaults(func=run_results)
    retry = batch_retries.add_retry(sub)
    attempts = add_attempts(sub)
    batch_control.register(sub)
    for parser in (listing, show, cancel, results, retry, attempts):
        if parser is not listing:
            parser.add_argument("batch_id", metavar="BATCH_ID")
        add_connection_args(parser)


@remote_command
def run_list(args: argparse.Namespace) -> int:
    """A table of batches (one page)."""
    page = connect(args).client.batches.list(limit=args.limit, **({"after": args.after} if args.after else {}))
    if args.json:
        data = [b.model_dump(mode="json") for b in page.data]
        print_json({"object": "list", "data": data, "has_more": page.has_more})
        return EXIT_OK
    rows = [
        (
            b.id,
            b.status,
            b.model or "",
            _counts(b),
            b.request_counts.failed if b.request_counts else 0,
            when(b.created_at),
            b.endpoint,
        )
        for b in page.data
    ]
    print(render_table(("id", "status", "model", "done/total", "failed", "created", "endpoint"), rows))
    if page.has_more:
        note(f"more: backfill batches list --after {page.data[-1].id}")
    return EXIT_OK


def _counts(batch: Batch) -> str:
    counts = batch.request_counts
    if counts is None:
        return ""
    return f"{counts.completed + counts.failed}/{counts.total}"


@remote_command
def run_show(args: argparse.Namespace) -> int:
    """Everything about one batch, as `key  value` lines."""
    batch = connect(args).client.batches.retrieve(args.batch_id)
    if args.json:
        print_json(batch)
        return EXIT_OK
    print(describe(batch))
    return EXIT_OK


def describe(batch: Batch) -> str:
    """The batch as aligned `key  value` lines, with its cost block and any errors or warnings."""
    counts = batch.request_counts
    pairs: list[tuple[str, object]] = [
        ("id", batch.id),
        ("status", batch.status),
        ("model", batch.model or ""),
        ("endpoint", batch.endpoint),
        ("window", batch.completion_window),
        ("requests", f"{counts.completed} completed, {counts.failed} failed, {counts.total} total" if counts else ""),
        ("created", when(batch.created_at)),
        ("expires", when(batch.expires_at) if batch.expires_at else "never (background)"),
        ("priority", extra(batch, "priority") or 0),
    ]
    if extra(batch, "paused_at"):
        pairs.append(("paused", when(extra(batch, "paused_at"))))
    pairs += workflow_pairs(batch)
    pairs += retry_pairs(batch)
    for stamp in ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelled_at"):
        if getattr(batch, stamp, None):
            pairs.append((stamp.removesuffix("_at"), when(getattr(batch, stamp))))
    pairs += [("output file", batch.output_file_id or ""), ("error file", batch.error_file_id or "")]
    if batch.metadata:
        pairs.append(("metadata", ", ".join(f"{k}={v}" for k, v in batch.metadata.items())))
    cost = extra(batch, "cost")
    if cost:
        pairs.append(("cost", cost_text(cost)))
    if extra(batch, "max_cost_usd") is not None:
        billed = f", billed ${cost['billed_usd']} so far" if cost else ""
        pairs.append(("spend cap", f"${extra(batch, 'max_cost_usd')}{billed}"))
    for kind, listed in (("error", batch.errors), ("warning", extra(batch, "warnings"))):
        kept, total = problems(listed)
        if total:
            below = f", the first {SHOWN_PROBLEMS} below" if total > SHOWN_PROBLEMS else ""
            pairs.append((f"{kind}s", f"{total:,} in all{below}"))
        pairs += [(kind, problem_text(item)) for item in kept[:SHOWN_PROBLEMS]]
    width = max(len(key) for key, _ in pairs)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in pairs)


BUDGET_CODE = "budget_exceeded"  # the API's code for lines a spend cap or monthly budget kept from running


def retry_pairs(batch: Batch) -> list[tuple[str, object]]:
    """`retry of` (the batch this one re-runs) and `retries` (this batch's own, oldest first), when there are."""
    pairs: list[tuple[str, object]] = []
    if extra(batch, "retry_of"):
        pairs.append(("retry of", extra(batch, "retry_of")))
    if extra(batch, "retries"):
        pairs.append(("retries", ", ".join(extra(batch, "retries"))))
    return pairs


def stopped_by_budget(batch: Batch) -> str | None:
    """Why a spend cap or the tenant's monthly budget stopped the batch (the server's warning), or None."""
    kept, _ = problems(extra(batch, "warnings"))
    reason = next((str(item.get("message")) for item in kept if item.get("code") == BUDGET_CODE), None)
    if reason is None:
        return None
    return f"stopped early: {reason[:1].lower()}{reason[1:].rstrip('.')}, its unrun lines ended as {BUDGET_CODE}"


SHOWN_PROBLEMS = 10  # `batches show`
SUMMARY_PROBLEMS = 3  # the one-line summary at the end of `submit --wait` / `batches results`
_IN_ALL = re.compile(r"\(([\d,]+) in all\)")


def problems(listed: Any) -> tuple[list[dict[str, Any]], int]:
    """A batch's errors (or warnings): the entries the server kept, and how many there were in all (past
    the kept ones, the server's `too_many_errors` entry counts them)."""
    data = (listed.get("data") if isinstance(listed, dict) else getattr(listed, "data", None)) or []
    entries = [item if isinstance(item, dict) else item.model_dump() for item in data]
    kept = [item for item in entries if item.get("code") != "too_many_errors"]
    total = len(kept)
    for item in entries:
        found = _IN_ALL.search(str(item.get("message"))) if item.get("code") == "too_many_errors" else None
        total = int(found.group(1).replace(",", "")) if found else total
    return kept, total


def problem_text(item: dict[str, Any]) -> str:
    """`code: message (line N)`."""
    line = f" (line {item['line']})" if item.get("line") else ""
    return f"{item.get('code')}: {item.get('message')}{line}"


def cost_text(cost: dict[str, Any]) -> str:
    """The cost block in one phrase: billed, list price and discount, compute cost, GPU time."""
    return (
        f"billed ${cost['billed_usd']} (list ${cost['list_usd']}, {_percent(cost['discount_pct'])}% off), "
        f"compute ${cost['compute_usd']}, {cost['gpu_seconds']} GPU-s, "
        f"{cost['input_tokens']:,} in / {cost['output_tokens']:,} out tokens"
    )


def _percent(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


@remote_command
def run_cancel(args: argparse.Namespace) -> int:
    """Cancel; the batch moves to `cancelling`, then `cancelled` within seconds."""
    batch = connect(args).client.batches.cancel(args.batch_id)
    if args.json:
        print_json(batch)
    else:
        print(f"{batch.id} {batch.status}")
    return EXIT_OK


@remote_command
def run_results(args: argparse.Namespace) -> int:
    """Download the output and error files into --output; the exit code tells the batch's end state."""
    if args.follow or args.merged:
        return batch_retries.run_stream(args)
    remote = connect(args)
    batch = remote.client.batches.retrieve(args.batch_id)
    started = time.monotonic()
    if batch.status not in TERMINAL and not trial_paused(batch):
        if not args.wait:
            note(f"{batch.id} is {batch.status}: its results are written when it ends (add --wait to wait)")
            return EXIT_NOT_FINISHED
        ended = progress.watch_or_cancel(remote.client, batch, on_left_running=left_running)
        if ended is None:
            return EXIT_INTERRUPTED
        batch = ended
    return after_watch(remote, batch, args.output, started=started, as_json=args.json)


def after_watch(remote: Remote, batch: Batch, directory: Path, *, started: float, as_json: bool) -> int:
    """A watched batch: paused by its trial's report (print the report and what to do next; 75) or still running
    (75), else ended (download its files and summarise it)."""
    if batch.status in TERMINAL:
        return finish(remote, batch, directory, elapsed=time.monotonic() - started, as_json=as_json)
    if trial_paused(batch):
        if as_json:
            print_json(batch)
        else:
            print(report_text(batch))
    return EXIT_NOT_FINISHED


def left_running(batch: Batch) -> None:
    """What to tell someone who stopped watching a batch that goes on."""
    note(f"{batch.id} keeps running: `backfill batches show {batch.id}`, `backfill batches results {batch.id} --wait`")


def finish(remote: Remote, batch: Batch, directory: Path, *, elapsed: float, as_json: bool) -> int:
    """Fetch a finished batch (with its cost), download its files, print the summary; exit code by end state."""
    batch = remote.client.batches.retrieve(batch.id)
    saved: list[Path] = []
    for file_id, kind in ((batch.output_file_id, "output"), (batch.error_file_id, "errors")):
        if file_id:
            path = directory / f"{batch.id}_{kind}.jsonl"
            progress.download(remote.client, file_id, path)
            saved.append(path)
    if as_json:
        print_json({**batch.model_dump(mode="json"), "downloaded": [str(path) for path in saved]})
    else:
        print(summary(batch, saved, elapsed))
    return STATUS_EXIT.get(batch.status, EXIT_OK)


def summary(batch: Batch, saved: list[Path], elapsed: float) -> str:
    """One line: end state, counts, time, cost and where the files are."""
    counts = batch.request_counts
    parts = [f"{batch.id} {batch.status}"]
    if counts is not None:
        parts.append(f"{counts.completed} completed, {counts.failed} failed of {counts.total}")
    if elapsed >= 0.5:
        parts.append(f"in {elapsed:.1f} s")
    cost = extra(batch, "cost")
    if cost:
        parts.append(cost_text(cost))
    stopped = stopped_by_budget(batch)
    if stopped:
        parts.append(stopped)
    tally = attempts_tally(saved) if extra(batch, "checks") else None
    continued = continuation_text(batch)
    parts += [part for part in (tally, continued) if part]
    kept, total = problems(batch.errors)
    if total:  # why a batch failed (or what it was refused for): the first few, and how many in all
        first = "; ".join(problem_text(item) for item in kept[:SUMMARY_PROBLEMS])
        more = "; …" if total > SUMMARY_PROBLEMS else ""
        parts.append(f"{total:,} error{'' if total == 1 else 's'}: {first}{more}")
    parts.append("files: " + (", ".join(str(path) for path in saved) if saved else "none"))
    return " · ".join(parts)
