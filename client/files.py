"""`backfill files list|rm`: a remote server's files."""

from __future__ import annotations

import argparse
from typing import Any

from client.remote import (
    EXIT_OK,
    add_connection_args,
    connect,
    int_between,
    print_json,
    remote_command,
    render_table,
    when,
)


def register(subparsers: Any) -> None:
    """Add `files list` and `files rm`."""
    files = subparsers.add_parser("files", help="list or delete a server's files")
    sub = files.add_subparsers(title="file commands", metavar="FILECOMMAND")
    listing = sub.add_parser("list", help="your files, newest first")
    listing.add_argument("--purpose", choices=("batch", "batch_output"), help="only files of this purpose")
    listing.add_argument("--limit", type=int_between(1, 10_000), default=100, metavar="N", help="1-10000 (100)")
    add_connection_args(listing)
    listing.set_defaults(func=run_list)
    remove = sub.add_parser("rm", help="delete files (and their objects)")
    remove.add_argument("file_ids", nargs="+", metavar="FILE_ID")
    add_connection_args(remove)
    remove.set_defaults(func=run_rm)


@remote_command
def run_list(args: argparse.Namespace) -> int:
    """A table of files."""
    options: dict[str, Any] = {"limit": args.limit}
    if args.purpose:
        options["purpose"] = args.purpose
    page = connect(args).client.files.list(**options)
    if args.json:
        print_json({"object": "list", "data": [f.model_dump(mode="json") for f in page.data]})
        return EXIT_OK
    rows = [(f.id, f.purpose, f"{f.bytes:,}", when(f.created_at), f.filename) for f in page.data]
    print(render_table(("id", "purpose", "bytes", "created", "filename"), rows))
    return EXIT_OK


@remote_command
def run_rm(args: argparse.Namespace) -> int:
    """Delete each file; stop at the first one the server refuses."""
    client = connect(args).client
    deleted = []
    for file_id in args.file_ids:
        result = client.files.delete(file_id)
        deleted.append(result.model_dump(mode="json"))
        if not args.json:
            print(f"deleted {result.id}")
    if args.json:
        print_json({"object": "list", "data": deleted})
    return EXIT_OK
