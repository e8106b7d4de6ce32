"""`backfill batches pause|resume|priority`: control a remote server's running batch (Backfill extensions)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from client import progress
from client.remote import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_connection_args,
    connect,
    extra,
    int_between,
    note,
    print_json,
    remote_command,
)


def register(sub: Any) -> None:
    """Add the control subcommands under `batches`."""
    pause = sub.add_parser("pause", help="pause a batch: no new claims, running requests handed back")
    pause.set_defaults(func=run_pause)
    resume = sub.add_parser("resume", help="resume a paused batch")
    resume.set_defaults(func=run_resume)
    priority = sub.add_parser("priority", help="change a batch's priority (-100..100, capped by the operator)")
    priority.set_defaults(func=run_priority)
    for parser in (pause, resume, priority):
        parser.add_argument("batch_id", metavar="BATCH_ID")
        add_connection_args(parser)
    priority.add_argument("priority", type=int_between(-100, 100), metavar="N")
    resume.add_argument(
        "--wait", action="store_true", help="watch it to its end (e.g. after its trial), then download its files"
    )
    resume.add_argument("--output", "-o", type=Path, default=Path("."), help="with --wait: directory for the files (.)")


def _control(args: argparse.Namespace, verb: str, body: dict[str, Any]) -> int:
    from openai.types import Batch

    remote = connect(args)
    started = time.monotonic()
    batch = remote.client.post(f"/batches/{args.batch_id}/{verb}", body=body, cast_to=Batch)
    if getattr(args, "wait", False):
        from client.batches import after_watch, left_running  # batches registers these commands

        note(f"{batch.id} resumed; watching it to its end")
        ended = progress.watch_or_cancel(remote.client, batch, on_left_running=left_running)
        if ended is None:
            return EXIT_INTERRUPTED
        return after_watch(remote, ended, args.output, started=started, as_json=args.json)
    if args.json:
        print_json(batch)
    else:
        paused = " (paused)" if extra(batch, "paused_at") else ""
        print(f"{batch.id} {batch.status}{paused} priority {extra(batch, 'priority')}")
    return EXIT_OK


@remote_command
def run_pause(args: argparse.Namespace) -> int:
    """Pause; the batch stays `in_progress` with `paused_at` set, and its window keeps running."""
    return _control(args, "pause", {})


@remote_command
def run_resume(args: argparse.Namespace) -> int:
    """Resume; the batch's requests are claimed again (--wait: watch it to its end, as `submit --wait` does)."""
    return _control(args, "resume", {})


@remote_command
def run_priority(args: argparse.Namespace) -> int:
    """Set the batch's priority."""
    return _control(args, "priority", {"priority": args.priority})
