"""Synthetic histories for the checker's tests (the checker is tests/chaos/history.py): a clean one, in which
everything happened as promised, the output and error lines it is built from, and the findings a check makes of
one, by kind. Each test breaks one thing in a copy and checks that the checker names it.
"""

from __future__ import annotations

from typing import Any

from tests.chaos.history import BatchRecord, FaultRecord, History, InputFile, InputLine, check

T0 = 1_000_000.0


def output_line(custom_id: str, *, prompt: int = 3, completion: int = 5) -> dict[str, Any]:
    body = {
        "id": f"chatcmpl-{custom_id}",
        "object": "chat.completion",
        "created": 1,
        "model": "chaos-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "lorem"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": f"batch_req_{custom_id}", "body": body},
        "error": None,
    }


def error_line(custom_id: str, code: str, *, status: int | None = 400) -> dict[str, Any]:
    response = None
    if status is not None:
        body = {"error": {"message": "no", "type": "invalid_request_error", "param": None, "code": code}}
        response = {"status_code": status, "request_id": f"batch_req_{custom_id}", "body": body}
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": response,
        "error": {"code": code, "message": "no"},
    }


def clean_history() -> History:
    """Three lines, one built to fail: everything as promised."""
    lines = (InputLine("a"), InputLine("b"), InputLine("c", expect_error="invalid_value"))
    record = BatchRecord(
        batch_id="batch_1",
        tenant="t",
        input_file_id="file-1",
        created_at=T0 + 1,
        status="completed",
        request_counts={"total": 3, "completed": 2, "failed": 1},
        cost={"input_tokens": 6, "output_tokens": 10},
        output_file_id="file-out",
        error_file_id="file-err",
        output_lines=[output_line("a"), output_line("b")],
        error_lines=[error_line("c", "invalid_value")],
        terminal_at=T0 + 10,
        downloaded=True,
    )
    keys = {"files/file-1": "file-1", "files/file-out": "file-out", "files/file-err": "file-err"}
    return History(
        seed=0,
        scenario="kill_gpu",
        started_at=T0,
        faults=[FaultRecord("kill_gpu", "gpu1", T0 + 2, T0 + 3)],
        inputs={"file-1": InputFile("file-1", "t", lines)},
        batches={"batch_1": record},
        objects=list(keys),
        file_keys=dict(keys),
    )


def kinds(history: History, **bound: float) -> dict[str, int]:
    return {kind: n for kind, n in check(history, **bound).summary().items() if n}
