"""A batch's workflow in the client commands (docs/workflow.md): its trial and the trial's report, its checks, what
expiry does, and each result line's attempts (`backfill batches attempts`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client.remote import EXIT_OK, connect, extra, int_between, note, print_json, remote_command, render_table

if TYPE_CHECKING:
    from openai.types import Batch

CHECKS_FAILED = "checks_failed"  # the error code of a line no draw satisfied
CONTINUE_IN_BACKGROUND = "continue_in_background"
SHOWN_ERROR_CODES = 5  # a trial report's failed lines by code, the most frequent first
MESSAGE_CHARS = 80  # a failed draw's message in the attempts table
DECISIONS = {
    "paused": "paused: resume to run the rest, or cancel",
    "continued": "continued by itself",
    "completed": "the trial was the whole batch",
    "ended": "the batch was cancelled or expired during its trial",
}


def add_attempts(sub: Any) -> argparse.ArgumentParser:
    """Add `batches attempts`."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "attempts", help="a page of a batch's result lines: each one's outcome, attempts and the checks it failed"
    )
    parser.add_argument("--limit", type=int_between(1, 100), default=20, metavar="N", help="lines, 1-100 (20)")
    parser.add_argument("--after", metavar="CURSOR", help="the cursor the previous page printed (rs_…)")
    parser.set_defaults(func=run_attempts)
    return parser


def trial_paused(batch: Batch) -> bool:
    """Paused by its trial's report (manual, or the success rate missed): nothing more runs until it is resumed
    or cancelled, so a watcher stops here."""
    report = (extra(batch, "trial") or {}).get("report") or {}
    return bool(extra(batch, "paused_at")) and report.get("decision") == "paused" and batch.status == "in_progress"


def trial_running(batch: Batch) -> bool:
    """Its trial's lines are running (nothing else of the batch runs yet)."""
    return (extra(batch, "trial") or {}).get("status") == "in_progress"


def workflow_pairs(batch: Batch) -> list[tuple[str, object]]:
    """`batches show`'s rows for the trial, its report, the checks and what expiry does (only those asked for)."""
    pairs: list[tuple[str, object]] = []
    trial = extra(batch, "trial")
    if trial:
        pairs.append(("trial", trial_text(trial)))
        if trial.get("report"):
            pairs += [(f"trial {key}", value) for key, value in report_pairs(trial["report"])]
    checks = extra(batch, "checks")
    if checks:
        pairs.append(("checks", checks_text(checks)))
    if extra(batch, "on_expiry") == CONTINUE_IN_BACKGROUND:
        pairs.append(("on expiry", "unfinished lines continue in the background (a child batch)"))
    return pairs


def trial_text(trial: dict[str, Any]) -> str:
    """`50 lines first, then pauses (manual) · reported`."""
    lines = trial.get("lines")
    size = f"{lines:,} lines" if lines is not None else f"{_share(trial.get('share'))} of the lines"
    if trial.get("continue") == "auto":
        then = f"goes on by itself when at least {_share(trial.get('min_success_rate'))} succeed, else pauses"
    else:
        then = "then pauses (manual)"
    return f"{size} first, {then} · {trial.get('status')}"


def report_pairs(report: dict[str, Any]) -> list[tuple[str, str]]:
    """A trial report as `(name, text)` rows: lines run, success, failures by code, checks, tokens, cost, decision."""
    cost = report.get("projected_cost") or {}
    rows = [
        ("lines run", f"{report['lines_run']:,}" + (f" of {cost['lines']:,}" if cost.get("lines") else "")),
        ("success", f"{_share(report.get('success_rate'))} ({report.get('succeeded', 0):,} succeeded)"),
    ]
    errors = sorted((report.get("errors") or {}).items(), key=lambda item: -int(item[1]))
    if errors:
        shown = ", ".join(f"{code} {count:,}" for code, count in errors[:SHOWN_ERROR_CODES])
        rows.append(("failed", shown + (", …" if len(errors) > SHOWN_ERROR_CODES else "")))
    checks = report.get("checks")
    if checks:
        rows.append(
            (
                "checks",
                f"{checks['passed']:,} passed ({checks['passed_first_time']:,} at the first draw), "
                f"{checks['redrawn']:,} drawn again, {checks['failed']:,} failed every draw",
            )
        )
    tokens = report.get("tokens_per_line") or {}
    rows.append(("tokens", f"{tokens.get('input', 0):g} in / {tokens.get('output', 0):g} out per line"))
    if cost:
        rows.append(
            (
                "projected",
                f"${cost['estimate_usd']} for the whole batch ({_share(cost.get('confidence', 0.95))}: "
                f"${cost['low_usd']} to ${cost['high_usd']}); the trial cost ${cost['trial_usd']}",
            )
        )
    rows.append(("decision", DECISIONS.get(str(report.get("decision")), str(report.get("decision")))))
    return rows


def report_text(batch: Batch) -> str:
    """The trial's report as aligned lines, then what to do next (for `submit --wait` stopping at it)."""
    report = (extra(batch, "trial") or {}).get("report") or {}
    rows = report_pairs(report)
    width = max(len(name) for name, _ in rows)
    lines = [f"{batch.id} paused after its trial:"] + [f"  {name.ljust(width)}  {text}" for name, text in rows]
    lines += [
        f"run the rest: backfill batches resume {batch.id} --wait",
        f"or stop it:   backfill batches cancel {batch.id}",
    ]
    return "\n".join(lines)


def checks_text(checks: dict[str, Any]) -> str:
    """`the line's own schema · regex yes|no · 3 draws at most`."""
    parts = []
    if checks.get("schema"):
        parts.append("the line's own schema")
    if "json_schema" in checks:
        parts.append("JSON schema " + json.dumps(checks["json_schema"])[:120])
    if "regex" in checks:
        parts.append(f"regex {checks['regex']}")
    if "enum" in checks:
        values = [str(value) for value in checks["enum"]]
        parts.append("one of " + ", ".join(values[:8]) + (", …" if len(values) > 8 else ""))
    if "max_length" in checks:
        parts.append(f"at most {checks['max_length']:,} characters")
    attempts = checks.get("max_attempts")
    parts.append(f"{attempts} draw{'' if attempts == 1 else 's'} at most")
    return " · ".join(parts)


def _share(value: Any) -> str:
    return f"{float(value or 0) * 100:.1f}".rstrip("0").rstrip(".") + "%"


def attempts_tally(paths: Iterable[Path]) -> str | None:
    """What the checks did over downloaded result files (read a line at a time): `12 lines passed at the first draw,
    3 drawn again, 1 failed every draw (checks_failed)`; None when no line carries attempts."""
    first = again = failed = 0
    for path in paths:
        with path.open("rb") as handle:
            for raw in handle:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                count = int(((line.get("attempts") if isinstance(line, dict) else None) or {}).get("count") or 0)
                if not count:
                    continue
                if outcome(line) == CHECKS_FAILED:
                    failed += 1
                elif count > 1:
                    again += 1
                else:
                    first += 1
    if not first + again + failed:
        return None
    return (
        f"checks: {first:,} passed at the first draw, {again:,} drawn again, "
        f"{failed:,} failed every draw ({CHECKS_FAILED})"
    )


def outcome(line: dict[str, Any]) -> str:
    """A result line's outcome: `answered`, or its error code (a Messages line: its result type or error type)."""
    error = line.get("error")
    if isinstance(error, dict):
        return str(error.get("code") or "error")
    result = line.get("result")
    if isinstance(result, dict) and result.get("type") != "succeeded":
        inner = (result.get("error") or {}).get("error") or {}
        return str(inner.get("type") or result.get("type"))
    return "answered"


def continuation_text(batch: Batch) -> str | None:
    """For an expired batch whose unfinished lines carry on in a background child: where, and how to get them."""
    if batch.status != "expired" or extra(batch, "on_expiry") != CONTINUE_IN_BACKGROUND or not extra(batch, "retries"):
        return None
    child = extra(batch, "retries")[0]  # made at expiry, before any retry of the expired batch could be
    return (
        f"its unfinished lines continue in the background in {child}: `backfill batches results {child} --wait`, "
        f"then `backfill batches results {batch.id} --merged` (each line once)"
    )


@remote_command
def run_attempts(args: argparse.Namespace) -> int:
    """A table of one page of result lines with their attempts; the next page's cursor on stderr."""
    import httpx

    params: dict[str, Any] = {"limit": args.limit, **({"after": args.after} if args.after else {})}
    response = connect(args).client.get(
        f"/batches/{args.batch_id}/results", cast_to=httpx.Response, options={"params": params}
    )
    lines = [json.loads(raw) for raw in response.text.splitlines() if raw.strip()]
    cursor = response.headers.get("X-Next-After")
    more, incomplete = response.headers.get("X-Has-More") == "true", response.headers.get("X-Incomplete") == "true"
    if args.json:
        data = [_attempts_of(line) for line in lines]
        print_json({"object": "list", "data": data, "next_after": cursor, "has_more": more})
        return EXIT_OK
    print(attempts_table(lines))
    if more:
        note(f"more: backfill batches attempts {args.batch_id} --after {cursor}")
    elif incomplete:
        note(f"the batch runs: more lines come (backfill batches attempts {args.batch_id} --after {cursor})")
    return EXIT_OK


def _attempts_of(line: dict[str, Any]) -> dict[str, Any]:
    return {
        "custom_id": line.get("custom_id"),
        "outcome": outcome(line),
        "attempts": line.get("attempts") or {"count": 1, "failed": []},
        "cut_by": _cut_by(line),
    }


def _cut_by(line: dict[str, Any]) -> str | None:
    response = line.get("response") or {}
    result = line.get("result") or {}
    body = response.get("body") if isinstance(response, dict) else None
    body = body if isinstance(body, dict) else result.get("message") if isinstance(result, dict) else None
    marks = (body or {}).get("backfill") if isinstance(body, dict) else None
    return str(marks["cut_by"]) if isinstance(marks, dict) and marks.get("cut_by") else None


def attempts_table(lines: list[dict[str, Any]]) -> str:
    """custom_id, outcome, attempts, and each failed draw's check and message."""
    rows = []
    for line in lines:
        shown = _attempts_of(line)
        failed = shown["attempts"].get("failed") or []
        checks = "; ".join(
            f"{draw.get('attempt')}: {draw.get('check')} ({str(draw.get('message') or '')[:MESSAGE_CHARS]})"
            for draw in failed
        )
        result = shown["outcome"] + (f", cut at {shown['cut_by']}" if shown["cut_by"] else "")
        rows.append((shown["custom_id"] or "", result, shown["attempts"].get("count", 1), checks or "none"))
    return render_table(("custom_id", "outcome", "attempts", "failed draws"), rows)
