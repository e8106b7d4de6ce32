"""`backfill report costs|usage`: the finance reports read straight from the database, as a table, CSV or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from storage.db import transaction
from storage.errors import BackfillError
from storage.finance.reports import DAY_SECONDS, Bucket, cost_report, page_json, parse_group_by, to_csv, usage_report
from storage.settings import get_settings
from storage.tenants import tenant_id_named, tenant_names

_CENTS = Decimal("0.0001")


class ReportInputError(ValueError):
    """Bad command-line input; reported as one line on stderr with exit code 2."""


def register(subparsers: Any) -> None:
    """Add `report costs` and `report usage` to the CLI's subparsers."""
    report = subparsers.add_parser("report", help="daily cost and usage reports (read from the database)")
    kinds = report.add_subparsers(title="reports", metavar="REPORT")
    kinds_help = (("costs", "list price, discount, billed, compute cost and margin"), ("usage", "tokens, requests"))
    for kind, text in kinds_help:
        parser = kinds.add_parser(kind, help=f"per UTC day: {text}")
        parser.add_argument("--from", dest="start", required=True, help="first day, YYYY-MM-DD (UTC)")
        parser.add_argument("--to", dest="end", help="last day, inclusive, YYYY-MM-DD (default: today)")
        parser.add_argument("--tenant", help="only this tenant (by name)")
        parser.add_argument(
            "--group-by", action="append", help="tenant, model, completion_window, protocol (repeat or comma-separate)"
        )
        parser.add_argument("--format", choices=["table", "csv", "json"], default="table")
        parser.set_defaults(func=run, kind=kind)


def run(args: argparse.Namespace) -> int:
    """Print the report; 2 with a one-line error on bad input."""
    try:
        start, end = _window(args.start, args.end)
        group_by = parse_group_by(args.group_by)
        with transaction() as session:
            tenant_id = _tenant_id(session, args.tenant)
            if args.kind == "costs":
                buckets = cost_report(
                    session,
                    settings=get_settings(),
                    start_time=start,
                    end_time=end,
                    tenant_id=tenant_id,
                    group_by=group_by,
                )
            else:
                buckets = usage_report(session, start_time=start, end_time=end, tenant_id=tenant_id, group_by=group_by)
            names = tenant_names(session)
    except (ReportInputError, BackfillError) as error:
        print(f"backfill report: error: {error}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(page_json(buckets), indent=2))
    elif args.format == "csv":
        sys.stdout.write(to_csv(buckets, kind=args.kind, group_by=group_by))
    else:
        print(render_table(buckets, kind=args.kind, group_by=group_by, tenant_names=names))
    return 0


def _day(text: str, flag: str) -> int:
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise ReportInputError(f"{flag} must be a date like 2026-03-01, got {text!r}") from None
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())


def _window(start: str, end: str | None) -> tuple[int, int]:
    first = _day(start, "--from")
    last = _day(end, "--to") if end else int(datetime.now(UTC).timestamp()) // DAY_SECONDS * DAY_SECONDS
    if last < first:
        raise ReportInputError("--to must not be before --from")
    return first, last + DAY_SECONDS


def _tenant_id(session: Any, name: str | None) -> str | None:
    if name is None:
        return None
    tenant_id = tenant_id_named(session, name=name)
    if tenant_id is None:
        raise ReportInputError(f"no tenant named {name!r}")
    return str(tenant_id)


_COLUMNS = {
    "costs": (
        ("requests", "num_model_requests"),
        ("input tok", "input_tokens"),
        ("output tok", "output_tokens"),
        ("list $", "list_usd"),
        ("discount $", "discount_usd"),
        ("billed $", "billed_usd"),
        ("compute $", "compute_usd"),
        ("margin $", "margin_usd"),
        ("GPU-s", "gpu_seconds"),
    ),
    "usage": (
        ("requests", "num_model_requests"),
        ("failed", "num_failed_requests"),
        ("input tok", "input_tokens"),
        ("output tok", "output_tokens"),
    ),
}


def render_table(buckets: list[Bucket], *, kind: str, group_by: tuple[str, ...], tenant_names: dict[str, str]) -> str:
    """Aligned rows for the days with data, and a total line."""
    keys = [{"tenant": "tenant_id", "model": "model", "completion_window": "completion_window"}[g] for g in group_by]
    header = ["day", *[k.removesuffix("_id") for k in keys], *(title for title, _ in _COLUMNS[kind])]
    rows: list[list[str]] = []
    totals: dict[str, Decimal] = {}
    for bucket in buckets:
        for result in bucket.results:
            data = result.to_json()
            cells = [datetime.fromtimestamp(bucket.start_time, tz=UTC).date().isoformat()]
            cells += [tenant_names.get(data[k], data[k]) if k == "tenant_id" else str(data[k]) for k in keys]
            for _, field in _COLUMNS[kind]:
                totals[field] = totals.get(field, Decimal(0)) + Decimal(data[field])
                cells.append(_cell(field, Decimal(data[field])))
            rows.append(cells)
    if not rows:
        return "no finished requests in this window"
    rows.append(["total", *[""] * len(keys), *(_cell(f, totals[f]) for _, f in _COLUMNS[kind])])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [_align(header, widths, len(keys)), _align(["-" * w for w in widths], widths, len(keys))]
    lines += [_align(row, widths, len(keys)) for row in rows]
    return "\n".join(lines)


def _cell(field: str, value: Decimal) -> str:
    if field.endswith("_usd"):
        return str(value.quantize(_CENTS, ROUND_HALF_UP))
    if field == "gpu_seconds":
        return f"{value:,.1f}"
    return f"{int(value):,}"


def _align(cells: list[str], widths: list[int], labels: int) -> str:
    left = labels + 1  # the day and the group labels are text: left-aligned
    return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
