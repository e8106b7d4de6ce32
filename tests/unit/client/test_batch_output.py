"""What the client commands print about a batch: summaries, `batches show`, the progress bar (issue 19 bug 7)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from openai.types import Batch
from tqdm import tqdm

from client.batches import describe, summary
from client.progress import _show


def batch(status: str, *, total: int = 0, completed: int = 0, failed: int = 0, **extra: Any) -> Batch:
    return Batch.model_validate(
        {
            "id": "batch_1",
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "input_file_id": "file-1",
            "completion_window": "24h",
            "status": status,
            "created_at": 1_700_000_000,
            "request_counts": {"total": total, "completed": completed, "failed": failed},
            **extra,
        }
    )


def line_errors(count: int, kept: int = 100) -> dict[str, Any]:
    data: list[dict[str, Any]] = [
        {"code": "invalid_json", "message": f"Line {n} is not valid JSON.", "param": None, "line": n}
        for n in range(1, min(count, kept) + 1)
    ]
    if count > kept:
        message = f"{count - kept:,} more lines have errors ({count:,} in all); the first {kept} are shown."
        data.append({"code": "too_many_errors", "message": message, "param": None, "line": None})
    return {"object": "list", "data": data}


def test_a_failed_batch_summary_says_why_and_how_many_errors() -> None:
    text = summary(batch("failed", errors=line_errors(1500)), [], elapsed=2.0)
    assert "batch_1 failed" in text and "files: none" in text
    assert "invalid_json: Line 1 is not valid JSON. (line 1)" in text and "1,500 errors" in text


def test_a_failed_batch_with_one_error_shows_it() -> None:
    refused = {"code": "token_limit_exceeded", "message": "Enqueued token limit reached.", "param": None, "line": None}
    text = summary(batch("failed", errors={"object": "list", "data": [refused]}), [], elapsed=0)
    assert "token_limit_exceeded: Enqueued token limit reached." in text and "1 error" in text


def test_batches_show_says_how_many_errors_there_are() -> None:
    text = describe(batch("failed", errors=line_errors(1500)))
    assert "1,500 in all, the first 10 below" in text
    assert text.count("invalid_json") == 10
    assert "12 in all" not in describe(batch("failed", errors=line_errors(3)))
    assert "3 in all" in describe(batch("failed", errors=line_errors(3)))


def shown(state: Batch) -> str:
    bar: tqdm[Any] = tqdm(total=0, unit="req", file=io.StringIO(), disable=False)
    _show(bar, state)
    text = str(bar)
    bar.close()
    return text


def test_the_bar_of_a_validating_batch_shows_no_empty_rate() -> None:
    text = shown(batch("validating"))
    assert text.startswith("validating") and "?req/s" not in text and "0req" not in text


def test_the_bar_of_a_cancelled_batch_counts_only_what_ran() -> None:
    goodput = {"object": "batch.goodput", "cancelled": 2500, "expired": 0, "failed": 0}
    text = shown(batch("cancelled", total=4000, completed=1500, failed=2500, goodput=goodput))
    assert "100%" not in text and "1500/4000" in text and "cancelled=2500" in text


def test_the_bar_of_a_running_batch_counts_finished_requests(tmp_path: Path) -> None:
    text = shown(batch("in_progress", total=40, completed=10, failed=2))
    assert "12/40" in text and "failed=2" in text
