"""`backfill keys create`: a tenant's API key, printed once."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `keys` subcommand group."""
    keys = subparsers.add_parser("keys", help="manage API keys")
    sub = keys.add_subparsers(title="key commands", metavar="KEYCOMMAND")
    create = sub.add_parser("create", help="create an API key (printed once, alone on the last line)")
    create.add_argument("--tenant", required=True, help="tenant name (created if new)")
    create.add_argument("--admin", action="store_true", help="may read every tenant's cost reports")
    create.set_defaults(func=run_create)


def run_create(args: argparse.Namespace) -> int:
    """Create the key; it is shown only once."""
    from storage.db import transaction
    from storage.tenants import create_api_key

    with transaction() as session:
        key = create_api_key(session, tenant_name=args.tenant, is_admin=args.admin)
    kind = "admin key" if args.admin else "key"
    print(f"created {kind} for tenant '{args.tenant}'; it is shown only once:")
    print(key)
    return 0
