"""`backfill batches retry` and the streamed forms of `backfill batches results` (--follow, --merged)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client import progress
from client.remote import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    STATUS_EXIT,
    Remote,
    connect,
    extra,
    fail,
    note,
    print_json,
    remote_command,
)

if TYPE_CHECKING:
    pass

FOLLOW_SECONDS = 2.0  # between two reads of what is new


def add_retry(sub: Any) -> argparse.ArgumentParser:
    """Add `batches retry`."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "retry", help="re-run an ended batch's failed requests as a new batch, keeping its successes"
    )
    parser.add_argument(
        "--codes",
        nargs="+",
        default=[],
        metavar="CODE",
        help="also re-run error lines with these codes (e.g. context_length_exceeded)",
    )
    parser.add_argument("--wait", action="store_true", help="wait for the retry to end, with a progress bar")
    parser.set_defaults(func=run_retry)
    return parser


def add_stream_flags(parser: argparse.ArgumentParser) -> None:
    """`batches results --follow | --merged`."""
    parser.add_argument(
        "--follow", action="store_true", help="append result lines to a file as they land, until the batch ends"
    )
    parser.add_argument("--merged", action="store_true", help="one line per request over the batch and all its retries")


@remote_command
def run_retry(args: argparse.Namespace) -> int:
    """Create the retry; with --wait, watch it to its end (the exit code tells its end state)."""
    from openai.types import Batch

    remote = connect(args)
    batch = remote.client.post(f"/batches/{args.batch_id}/retry", body={"codes": args.codes}, cast_to=Batch)
    started = time.monotonic()
    if args.wait:
        ended = progress.watch_or_cancel(remote.client, batch, on_left_running=lambda b: note(f"{b.id} keeps running"))
        if ended is None:
            return EXIT_INTERRUPTED
        batch = remote.client.batches.retrieve(batch.id)
    counts = batch.request_counts
    total, failed = (counts.total, counts.failed) if counts else (0, 0)
    # A retry exists to fix failed lines: one that ended with every line failed again fixed nothing, so its
    # exit code is not a success even though the batch "completed" (docs/cli.md).
    failed_again = args.wait and batch.status == "completed" and total > 0 and failed == total
    if args.json:
        print_json(batch)
    else:
        took = f" in {time.monotonic() - started:.1f} s" if args.wait else ""
        line = f"{batch.id} {batch.status}{took}: retry of {extra(batch, 'retry_of')}, {total} requests"
        if failed_again:
            line += f": every one of its {total} requests failed again (`backfill batches show {batch.id}`)"
        elif args.wait and counts:
            line += f": {counts.completed} completed, {failed} failed again"
        print(line)
    if not args.wait:
        return EXIT_OK
    return EXIT_FAILED if failed_again else STATUS_EXIT.get(batch.status, EXIT_OK)


@remote_command
def run_stream(args: argparse.Namespace) -> int:
    """Write the batch's result lines to a file: the merged view once, or (--follow) what is new until it ends."""
    remote = connect(args)
    kind = "merged" if args.merged else "results"
    path: Path = args.output / f"{args.batch_id}_{kind}.jsonl" if args.output.is_dir() else args.output
    params: dict[str, str] = {"merged": "true"} if args.merged else {}
    lines = 0
    with path.open("wb") as sink:
        try:
            while True:
                answer = _fetch(remote, args.batch_id, params, sink)
                if answer is None:
                    return EXIT_ERROR
                count, incomplete, cursor = answer
                lines += count
                if not (args.follow and incomplete):
                    break
                params = {"after": cursor} if cursor else params
                time.sleep(FOLLOW_SECONDS)
        except KeyboardInterrupt:
            note(f"stopped following {args.batch_id}: {lines} lines in {path}")
            return EXIT_INTERRUPTED
    batch = remote.client.batches.retrieve(args.batch_id)
    note(f"{lines} lines in {path}" + (" (the batch has not ended: more may come)" if incomplete else ""))
    return STATUS_EXIT.get(batch.status, EXIT_OK)


def _fetch(remote: Remote, batch_id: str, params: dict[str, str], sink: Any) -> tuple[int, bool, str | None] | None:
    """Stream one answer into `sink`: (lines, whether more may come, the next cursor); None on an error."""
    import httpx

    url = f"{remote.base_url}/batches/{batch_id}/results"  # base_url ends in /v1
    headers = {"Authorization": f"Bearer {remote.client.api_key}"}
    with httpx.stream("GET", url, params=params, headers=headers, timeout=600) as response:
        if response.status_code != 200:
            response.read()
            fail(f"{_message(response)} (HTTP {response.status_code})")
            return None
        count = 0
        for chunk in response.iter_bytes():
            sink.write(chunk)
            count += chunk.count(b"\n")
        sink.flush()
        return count, response.headers.get("X-Incomplete") == "true", response.headers.get("X-Next-After")


def _message(response: Any) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return str(response.text[:200])
