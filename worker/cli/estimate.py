"""`backfill estimate FILE`: what a JSONL job will cost to compute and when it will finish, before submitting it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from storage.adapters.registry import visible_adapters
from storage.batches.estimates import Estimate, estimate_job
from storage.db import transaction
from storage.planning.shapes import DEFAULT_MAX_TOKENS, shape_of_jsonl
from storage.planning.throughput import DEFAULT_TOKENS_PER_SECOND
from storage.settings import get_settings
from storage.windows import window_seconds

_CHUNK_BYTES = 1024 * 1024


def register(subparsers: Any) -> None:
    """Add the `estimate` subcommand to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "estimate",
        help="estimate a JSONL job's compute cost and completion time",
        description="Size a batch input file and estimate its compute cost, start and finish from the measured "
        "throughput of recent engine runs and the model's current backlog.",
    )
    parser.add_argument("file", type=Path, help="a batch input file (JSONL)")
    parser.add_argument("--model", help="served model name (default: the file's body.model)")
    parser.add_argument("--completion-window", default="24h", help="the window you will ask for (default 24h)")
    parser.add_argument(
        "--default-tokens-per-second",
        type=float,
        default=DEFAULT_TOKENS_PER_SECOND,
        help=f"throughput to assume with no measured runs (default {DEFAULT_TOKENS_PER_SECOND:g})",
    )
    parser.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="for lines without one")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.set_defaults(func=run)


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            yield chunk


def run(args: argparse.Namespace) -> int:
    """Print the estimate; 2 with a one-line error on bad input."""
    settings = get_settings()
    try:
        window_seconds(args.completion_window)
        if args.default_tokens_per_second <= 0 or args.default_max_tokens < 1:
            raise ValueError("--default-tokens-per-second and --default-max-tokens must be positive")
        with transaction() as session:  # lines may name any adapter: the server's own view, as an admin's
            visible = visible_adapters(session, settings, tenant_id=None)
        adapters = {name: ref.base_model for name, ref in visible.items()}
        shape = shape_of_jsonl(
            _chunks(args.file),
            max_line_bytes=settings.line_max_bytes,
            max_requests=settings.batch_max_requests,
            default_max_tokens=args.default_max_tokens,
            default_models=settings.default_models(),
            adapters=adapters,
            max_adapters=settings.batch_max_adapters,
        )
    except OSError as error:
        print(f"backfill estimate: error: cannot read {args.file}: {error.strerror}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"backfill estimate: error: {error}", file=sys.stderr)
        return 2
    model = args.model or shape.model
    if model is None or shape.requests == 0:
        print("backfill estimate: error: no requests with a model in the file; pass --model", file=sys.stderr)
        return 2
    if model not in settings.served_models():
        served = ", ".join(sorted(settings.served_models()))
        print(f"backfill estimate: error: model {model!r} is not served here (served: {served})", file=sys.stderr)
        return 2
    with transaction() as session:
        estimate = estimate_job(
            session,
            model=model,
            shape=shape,
            settings=settings,
            completion_window=args.completion_window,
            default_tokens_per_second=args.default_tokens_per_second,
        )
    print(json.dumps(estimate.to_json(), indent=2) if args.format == "json" else render(estimate))
    return 0


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _usd(value: Decimal) -> str:
    return f"${value.quantize(Decimal('0.0001'), ROUND_HALF_UP)}"


def render(estimate: Estimate) -> str:
    """A short human summary."""
    job, rate, cost = estimate.job, estimate.throughput, estimate.cost
    measured = f"measured over {rate.runs} recent runs" if rate.source == "measured" else "assumed: none measured"
    verdict = "fits" if estimate.fits_window else "does NOT fit"
    skipped = (
        f" ({job.skipped_lines} invalid lines skipped: the batch would fail validation)" if job.skipped_lines else ""
    )
    return "\n".join(
        [
            f"job:        {job.requests:,} requests{skipped}, ~{job.input_tokens:,} input tokens, "
            f"<= {job.output_tokens:,} output tokens ({estimate.model})",
            f"throughput: {rate.work_per_second:,.1f} work tokens/s, {rate.output_tokens_per_second:,.1f} output "
            f"tokens/s ({measured})",
            f"backlog:    {estimate.backlog.requests:,} requests ahead, ~{estimate.backlog_seconds:,.0f} s of work",
            f"compute:    {estimate.job_seconds:,.1f} s busy = {_usd(cost.compute_usd)} "
            f"({cost.gpu_seconds.quantize(Decimal('0.1'))} GPU-seconds)",
            f"price:      list {_usd(cost.list_usd)}, billed {_usd(cost.billed_usd)} "
            f"after {cost.discount_pct.quantize(Decimal('1'))}% off for {estimate.completion_window}",
            f"start:      {_when(estimate.start_at)}",
            f"finish:     {_when(estimate.finish_at)} - {verdict} the window (closes {_when(estimate.deadline_at)})",
            *render_menu(estimate),
        ]
    )


def render_menu(estimate: Estimate) -> list[str]:
    """The menu as a table: each offered window's deadline, predicted finish, price and admission's verdict."""
    if not estimate.windows:
        return []
    head = f"{'window':<12} {'deadline':<23} {'predicted finish':<23} {'list':>10} {'off':>4} {'billed':>10}  admitted"
    rows = ["", "every window this server offers (finish: admission's projection, earliest deadline first):", head]
    for option in estimate.windows:
        cost = option.cost
        deadline = "none (background)" if option.deadline_at is None else _when(option.deadline_at)
        verdict = "yes" if option.admitted else f"no: {(option.problem or {}).get('code')}"
        if option.admitted and option.problem is not None:
            verdict = f"yes, at risk ({option.problem.get('code')})"
        rows.append(
            f"{option.window:<12} {deadline:<23} {_when(option.finish_at):<23} {_usd(cost.list_usd):>10} "
            f"{cost.discount_pct.quantize(Decimal('1')):>3}% {_usd(cost.billed_usd):>10}  {verdict}"
        )
    return rows
