"""`backfill keys create` and `backfill keys revoke`: a tenant's API keys (a key is printed once)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `keys` subcommand group."""
    keys = subparsers.add_parser("keys", help="manage API keys")
    sub = keys.add_subparsers(title="key commands", metavar="KEYCOMMAND")
    create = sub.add_parser("create", help="create an API key (printed once, alone on the last line)")
    create.add_argument("--tenant", required=True, help="tenant name (created if new)")
    create.add_argument("--admin", action="store_true", help="may read every tenant's cost reports")
    create.set_defaults(func=run_create)
    revoke = sub.add_parser("revoke", help="revoke API keys: the next request with one answers 401")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="the key itself (sk-bf-…); '-' reads it from stdin, out of the shell history")
    which.add_argument("--id", dest="key_id", help="the key's id (key_…)")
    which.add_argument("--tenant", help="every live key of this tenant")
    revoke.set_defaults(func=run_revoke)


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


def run_revoke(args: argparse.Namespace) -> int:
    """Revoke the keys named; exit 1 if none was live."""
    from storage.db import transaction
    from storage.errors import BackfillError
    from storage.tenants import revoke_api_keys

    key = sys.stdin.readline().strip() if args.key == "-" else args.key
    try:
        with transaction() as session:
            revoked = revoke_api_keys(session, key=key, key_id=args.key_id, tenant=args.tenant)
    except BackfillError as error:
        print(f"backfill keys revoke: {error.message}", file=sys.stderr)
        return 1
    print(f"revoked {len(revoked)} key{'s' if len(revoked) != 1 else ''}: {', '.join(revoked)}")
    return 0
