"""`backfill submit FILE --estimate`: what the server predicts for a job on each completion window it offers (its
finish, its price, whether admission takes it), before anything is created (POST /v1/batches/estimate)."""

from __future__ import annotations

from typing import Any

from client.remote import Remote, note, render_table, when


def estimate(remote: Remote, body: dict[str, Any]) -> dict[str, Any]:
    """The server's estimate of a create with this body (nothing is created)."""
    answer = remote.client.post("/batches/estimate", body=body, cast_to=object)
    if not isinstance(answer, dict):
        raise TypeError(f"the server's estimate is not an object: {str(answer)[:80]!r}")
    return answer


def render(answer: dict[str, Any], *, file_name: str) -> str:
    """The job in one line, then the menu: one row per offered window, shortest first, background last."""
    rate = answer.get("throughput") or {}
    measured = f"measured over {rate.get('runs')} recent runs" if rate.get("source") == "measured" else "assumed"
    skipped = answer.get("skipped_lines") or 0
    invalid = f" ({skipped:,} invalid lines: a batch of it would fail validation)" if skipped else ""
    backlog = answer.get("backlog") or {}
    head = [
        f"{file_name}: {answer.get('requests', 0):,} requests{invalid} for {answer.get('model')}",
        f"throughput {float(rate.get('output_tokens_per_second') or 0):,.1f} output tokens/s ({measured}); "
        f"{backlog.get('requests', 0):,} requests queued ahead",
    ]
    rows = []
    for option in answer.get("windows") or []:
        price = option.get("price") or {}
        deadline = "none (background)" if option.get("deadline_at") is None else when(option["deadline_at"])
        rows.append(
            (
                option.get("completion_window"),
                deadline,
                when(option.get("finish_at")),
                f"${price.get('list_usd')}",
                f"{_percent(str(price.get('discount_pct', '0')))}%",
                f"${price.get('billed_usd')}",
                _verdict(option),
            )
        )
    if not rows:  # a server without the menu: its estimate for the window asked for
        return "\n".join([*head, f"finish {when(answer.get('finish_at'))} (window {answer.get('completion_window')})"])
    header = ("window", "deadline", "predicted finish", "list", "off", "billed", "admitted")
    return "\n".join([*head, "", render_table(header, rows)])


def _verdict(option: dict[str, Any]) -> str:
    if not option.get("admitted"):
        return f"no: {(option.get('reason') or {}).get('code')}"
    if option.get("warning"):
        return f"yes, at risk ({option['warning'].get('code')})"
    return "yes"


def _percent(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def hint(answer: dict[str, Any], *, file_name: str) -> None:
    """How to create the batch on a window the menu admits."""
    admitted = [option["completion_window"] for option in answer.get("windows") or [] if option.get("admitted")]
    if admitted:
        note(f"nothing was created; to submit on one of them: backfill submit {file_name} --window {admitted[0]}")
    else:
        note("nothing was created; no window offered here admits this job now")
