"""`backfill tenants budget NAME --usd N`: a tenant's budget per calendar month (a Backfill extension)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `tenants` subcommand group."""
    tenants = subparsers.add_parser("tenants", help="manage tenants (monthly budgets)")
    sub = tenants.add_subparsers(title="tenant commands", metavar="TENANTCOMMAND")
    budget = sub.add_parser(
        "budget", help="show or set a tenant's budget per calendar month (UTC); past it, its batches stop"
    )
    budget.add_argument("name", help="the tenant's name")
    which = budget.add_mutually_exclusive_group()
    which.add_argument("--usd", help="US dollars per month, a decimal (e.g. 250 or 99.50)")
    which.add_argument("--remove", action="store_true", help="remove the budget")
    budget.set_defaults(func=run_budget)


def run_budget(args: argparse.Namespace) -> int:
    """Set (or show) the budget; print the month's budget, spend and what is left."""
    from storage.db import transaction
    from storage.errors import BackfillError
    from storage.finance.budgets import set_tenant_budget, tenant_budget
    from storage.settings import get_settings
    from storage.strict import parse_usd
    from storage.tenants import tenant_id_named

    settings = get_settings()
    try:
        with transaction() as session:
            if args.usd is None and not args.remove:
                tenant_id = tenant_id_named(session, name=args.name)
                if tenant_id is None:
                    raise BackfillError(f"No tenant named '{args.name}'.")
                budget = tenant_budget(session, settings, tenant_id=tenant_id)
            else:
                micro = None if args.remove else parse_usd(args.usd, param="--usd")
                budget = set_tenant_budget(session, settings, tenant=args.name, usd_micro=micro)
    except BackfillError as error:
        print(f"backfill tenants budget: {error.message}", file=sys.stderr)
        return 1
    data = budget.to_json()
    limit = data["monthly_budget_usd"]
    left = "" if limit is None else f", ${data['remaining_usd']} left"
    print(
        f"tenant '{args.name}': budget {'none' if limit is None else '$' + limit} per month, "
        f"${data['spent_usd']} spent this month{left}"
    )
    return 0
