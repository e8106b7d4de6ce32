"""The checker's rules on a batch's counts, its cost block and the bucket (docs/chaos.md "What the checker
guarantees": `other` and `orphan`), split from tests/chaos/history.py."""

from __future__ import annotations

from tests.chaos.history import BatchRecord, Finding, History, InputLine, RowRecord, Verdict


def check_counts(verdict: Verdict, record: BatchRecord, planned: dict[str, InputLine]) -> None:
    counts = record.request_counts
    enqueued = 0 if record.cancel_requested and not counts.get("total") else len(planned)
    want = {"total": enqueued, "completed": len(record.output_lines), "failed": len(record.error_lines)}
    got = {name: counts.get(name) for name in want}
    if got != want:
        verdict.findings.append(Finding("other", record.batch_id, f"request_counts {got} but the files hold {want}"))


def check_cost(verdict: Verdict, record: BatchRecord, rows: list[RowRecord] | None = None) -> None:
    usage = [((line.get("response") or {}).get("body") or {}).get("usage") or {} for line in record.output_lines]
    want = {
        "input_tokens": sum(int(u.get("prompt_tokens", 0)) for u in usage),
        "output_tokens": sum(int(u.get("completion_tokens", 0)) for u in usage),
    }
    cost = record.cost or {}
    if record.checks and rows is not None:  # failed draws are billed too: the rows hold what each line was billed
        want = {"output_tokens": sum(row.completion_tokens for row in rows if row.status == "completed")}
    got = {name: int(cost.get(name, 0)) for name in want}
    if got != want:
        verdict.findings.append(
            Finding("other", record.batch_id, f"cost tokens {got} but the output usage sums to {want}")
        )


def check_objects(verdict: Verdict, history: History) -> None:
    stored = set(history.objects)
    for key in sorted(stored - set(history.file_keys)):
        verdict.findings.append(Finding("orphan", None, f"object {key} belongs to no file row"))
    for key in sorted(set(history.file_keys) - stored):
        verdict.findings.append(Finding("other", None, f"file {history.file_keys[key]} has no object {key}"))
