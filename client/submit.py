"""`backfill submit FILE`: upload a JSONL job with a progress bar, create the batch, optionally watch it to the end
(or, with --estimate, create nothing and show each offered window's predicted finish and price)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from client import estimates, progress
from client.batches import after_watch, left_running
from client.remote import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    Remote,
    UsageError,
    add_connection_args,
    connect,
    int_between,
    note,
    print_json,
    remote_command,
)
from storage.protocols import OPENAI

ENDPOINTS = OPENAI.endpoints  # the server's own list: the CLI offers exactly what it serves
METADATA_MAX_PAIRS = 16
FIRST_LINE_SEARCH = 100  # blank lines skipped before the first line whose url names the endpoint
LINE_READ_BYTES = 1024 * 1024
CHECKS_MAX_ATTEMPTS = 5  # the server's bound on `checks.max_attempts` (docs/workflow.md)


def register(subparsers: Any) -> None:
    """Add the `submit` subcommand."""
    parser = subparsers.add_parser("submit", help="upload a JSONL job and create a batch (--wait: watch it to the end)")
    parser.add_argument("file", type=Path, metavar="FILE", help="JSONL, one OpenAI batch request per line")
    parser.add_argument("--endpoint", choices=ENDPOINTS, help="default: the first line's url")
    parser.add_argument("--window", default="24h", help="completion window (24h; 'background': no deadline)")
    parser.add_argument("--priority", type=int_between(-100, 100), default=0, metavar="N", help="-100..100 (0)")
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    parser.add_argument(
        "--max-cost-usd", metavar="USD", help="stop the batch once it is billed this much (a Backfill extension)"
    )
    parser.add_argument(
        "--trial",
        metavar="JSON",
        help='run a sample first, e.g. \'{"lines": 50, "continue": "auto"}\' (docs/workflow.md)',
    )
    parser.add_argument(
        "--checks", metavar="JSON", help='check each answer, draw failing ones again, e.g. \'{"regex": "yes|no"}\''
    )
    parser.add_argument(
        "--max-attempts",
        type=int_between(1, CHECKS_MAX_ATTEMPTS),
        metavar="N",
        help=f"answers drawn at most per line, 1-{CHECKS_MAX_ATTEMPTS} (alone: check each answer against the line's "
        "own schema)",
    )
    parser.add_argument(
        "--on-expiry",
        choices=("continue_in_background",),
        help="lines unfinished at expiry carry on in a background child batch (default: cut short; docs/workflow.md)",
    )
    then = parser.add_mutually_exclusive_group()
    then.add_argument("--wait", action="store_true", help="watch the batch to its end, then download its files")
    then.add_argument(
        "--estimate",
        action="store_true",
        help="create nothing: show each window's predicted finish, price and whether it is admitted",
    )
    parser.add_argument("--output", "-o", type=Path, default=Path("."), help="with --wait: directory for the files (.)")
    add_connection_args(parser)
    parser.set_defaults(func=run)


def parse_metadata(pairs: list[str]) -> dict[str, str] | None:
    """`k=v` flags into the batch's metadata (the server bounds sizes)."""
    if len(pairs) > METADATA_MAX_PAIRS:
        raise UsageError(f"at most {METADATA_MAX_PAIRS} --metadata pairs")
    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--metadata takes KEY=VALUE, got {pair!r}")
        metadata[key] = value
    return metadata or None


def endpoint_of(path: Path, given: str | None) -> str:
    """The flag, else the `url` of the file's first line (blank lines skipped), else chat completions; a url the
    server does not serve is a usage error here rather than a batch whose every line fails."""
    if given:
        return given
    first = b""
    with path.open("rb") as handle:
        for _ in range(FIRST_LINE_SEARCH):
            line = handle.readline(LINE_READ_BYTES)
            first = line.lstrip(b"\xef\xbb\xbf").strip()
            if first or not line:
                break
    try:
        url = json.loads(first).get("url") if first else None
    except (ValueError, AttributeError):
        url = None
    if isinstance(url, str) and url not in ENDPOINTS:
        served = ", ".join(ENDPOINTS)
        raise UsageError(f"{path.name}: the url of its first line, {url[:80]!r}, is not an endpoint here ({served})")
    return url if isinstance(url, str) else ENDPOINTS[0]


@remote_command
def run(args: argparse.Namespace) -> int:
    """Upload, create, and with --wait watch, download and summarise; the exit code tells the end state."""
    path: Path = args.file
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    metadata = parse_metadata(args.metadata)
    endpoint = endpoint_of(path, args.endpoint)
    extensions = _extensions(args)
    remote = connect(args)
    started = time.monotonic()
    uploaded = progress.upload(remote.client, path)
    if args.estimate:
        return _estimate(remote, path, uploaded.id, {**(extensions or {}), "endpoint": endpoint}, args)
    try:
        batch = remote.client.batches.create(
            input_file_id=uploaded.id,
            endpoint=endpoint,  # type: ignore[arg-type]
            completion_window=args.window,
            metadata=metadata,
            extra_body=extensions,
        )
    except BaseException:
        _drop_upload(remote.client, uploaded.id)
        raise
    note(f"uploaded {path.name} as {uploaded.id}; created {batch.id} ({endpoint}, window {batch.completion_window})")
    if not args.wait:
        if args.json:
            print_json(batch)
        else:
            print(batch.id)
        return EXIT_OK
    ended = progress.watch_or_cancel(remote.client, batch, on_left_running=left_running)
    if ended is None:
        return EXIT_INTERRUPTED
    return after_watch(remote, ended, args.output, started=started, as_json=args.json)


def _estimate(remote: Remote, path: Path, file_id: str, body: dict[str, object], args: argparse.Namespace) -> int:
    """The server's menu of windows for this file; the upload is deleted after, as nothing was created."""
    try:
        answer = estimates.estimate(remote, {**body, "input_file_id": file_id, "completion_window": args.window})
    finally:
        _drop_upload(remote.client, file_id, quiet=True)
    if args.json:
        print_json(answer)
    else:
        print(estimates.render(answer, file_name=path.name))
        estimates.hint(answer, file_name=str(path))
    return EXIT_OK


def _drop_upload(client: Any, file_id: str, *, quiet: bool = False) -> None:
    """A refused create (or an estimate) leaves nothing behind: delete the file just uploaded for it (or say it
    stays)."""
    import openai

    try:
        client.files.delete(file_id)
    except openai.OpenAIError:
        note(f"the uploaded file {file_id} stays: delete it with `backfill files rm {file_id}`")
    else:
        if not quiet:
            note(f"the batch was not created; deleted the uploaded file {file_id}")


def _extensions(args: argparse.Namespace) -> dict[str, object] | None:
    """The Backfill extensions of a create (sent in the SDK's `extra_body`), or None."""
    extra: dict[str, object] = {}
    if args.priority:
        extra["priority"] = args.priority
    if args.max_cost_usd:
        extra["max_cost_usd"] = args.max_cost_usd
    if args.on_expiry:
        extra["on_expiry"] = args.on_expiry
    for name in ("trial", "checks"):  # checked by the server, which names a bad field
        if (given := getattr(args, name)) is not None:
            try:
                extra[name] = json.loads(given)
            except ValueError:
                raise UsageError(f"--{name} takes a JSON object, got {given[:64]!r}") from None
    if args.max_attempts is not None:
        extra["checks"] = _with_max_attempts(extra.get("checks", {}), args.max_attempts)
    return extra or None


def _with_max_attempts(checks: object, attempts: int) -> dict[str, object]:
    """--checks with --max-attempts folded in (alone: the line's own schema, the server's default check)."""
    if not isinstance(checks, dict):
        raise UsageError("--checks takes a JSON object when --max-attempts is given")
    if checks.get("max_attempts", attempts) != attempts:
        raise UsageError(f"--checks says max_attempts {checks['max_attempts']!r}, --max-attempts {attempts}: give one")
    return {**checks, "max_attempts": attempts}
