"""`backfill webhooks add|list|rm|deliveries`: a tenant's webhook endpoints on a remote server."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit

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

EVENT_TYPES = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


def register(subparsers: Any) -> None:
    """Add `webhooks` and its subcommands."""
    webhooks = subparsers.add_parser("webhooks", help="register signed webhooks for batch events")
    sub = webhooks.add_subparsers(title="webhook commands", metavar="WEBHOOKCOMMAND")
    add = sub.add_parser("add", help="register an endpoint; prints its signing secret once")
    add.add_argument("url", metavar="URL", help="https URL that receives the events")
    add.add_argument("--name", help="a label (default: the URL's host)")
    add.add_argument(
        "--events", help=f"comma-separated event types (default: all of {', '.join(EVENT_TYPES)})", default=None
    )
    add.set_defaults(func=run_add)
    listing = sub.add_parser("list", help="your endpoints")
    listing.set_defaults(func=run_list)
    remove = sub.add_parser("rm", help="delete an endpoint (its pending deliveries are dropped)")
    remove.add_argument("endpoint_id", metavar="ENDPOINT_ID")
    remove.set_defaults(func=run_rm)
    deliveries = sub.add_parser("deliveries", help="an endpoint's deliveries and their attempts")
    deliveries.add_argument("endpoint_id", metavar="ENDPOINT_ID")
    deliveries.add_argument("--limit", type=int_between(1, 100), default=20, metavar="N", help="1-100 (20)")
    deliveries.set_defaults(func=run_deliveries)
    for parser in (add, listing, remove, deliveries):
        add_connection_args(parser)


@remote_command
def run_add(args: argparse.Namespace) -> int:
    """Create the endpoint with the SDK's `webhooks.create`; the secret is shown only now."""
    events = [kind.strip() for kind in args.events.split(",") if kind.strip()] if args.events else list(EVENT_TYPES)
    name = args.name or urlsplit(args.url).hostname or args.url[:200]
    endpoint = connect(args).client.webhooks.create(url=args.url, name=name, event_types=events)  # type: ignore[arg-type]
    if args.json:
        print_json({**endpoint.model_dump(mode="json"), "signing_secret": endpoint.signing_secret})
        return EXIT_OK
    print(f"created {endpoint.id} -> {endpoint.url} ({', '.join(endpoint.event_types)})")
    print("signing secret (shown only once; verify deliveries with it):")
    print(endpoint.signing_secret)
    return EXIT_OK


@remote_command
def run_list(args: argparse.Namespace) -> int:
    """A table of endpoints."""
    page = connect(args).client.webhooks.list(limit=100)
    if args.json:
        print_json({"object": "list", "data": [e.model_dump(mode="json") for e in page.data]})
        return EXIT_OK
    rows = [(e.id, e.name, e.url, ",".join(e.event_types), when(e.created_at)) for e in page.data]
    print(render_table(("id", "name", "url", "events", "created"), rows))
    return EXIT_OK


@remote_command
def run_rm(args: argparse.Namespace) -> int:
    """Delete an endpoint."""
    result = connect(args).client.webhooks.delete(args.endpoint_id)
    if args.json:
        print_json(result)
    else:
        print(f"deleted {result.id}")
    return EXIT_OK


@remote_command
def run_deliveries(args: argparse.Namespace) -> int:
    """A table of deliveries (a Backfill extension, read through the SDK's generic GET)."""
    page: Any = connect(args).client.get(
        f"/webhooks/{args.endpoint_id}/deliveries", cast_to=object, options={"params": {"limit": args.limit}}
    )
    if args.json:
        print_json(page)
        return EXIT_OK
    rows = []
    for item in page["data"]:
        last = item["attempts"][-1] if item["attempts"] else {}
        rows.append(
            (
                item["id"],
                item["event"]["type"],
                item["event"]["data"]["id"],
                item["status"],
                item["attempt_count"],
                last.get("status_code") or "",
                (last.get("error") or "")[:60],
                when(item["created_at"]),
            )
        )
    print(render_table(("id", "event", "batch", "status", "attempts", "last", "last error", "created"), rows))
    return EXIT_OK
